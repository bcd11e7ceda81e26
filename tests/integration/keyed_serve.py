"""A stand-in for `vllm-uma serve --api-key-file` in fleet tests, without vLLM:
run as ``python keyed_serve.py serve ... --api-key-file F --host H --port P``
(the line the fleet's supervisor starts), it serves, behind the real
fleet/server_guard.py with the keys of F, /health, /metrics, /v1/models
(one model, "stand-in") and, for any other path, the path it was asked for
as JSON. SIGTERM ends it, and, as the real one, the exit of the process that
started it.
"""

import sys

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from vllm_uma import lifeline
from vllm_uma.fleet.api_key import read_key_file
from vllm_uma.fleet.server_guard import GuardEveryPath

MODEL = "stand-in"


async def models(request):
    return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


async def health(request):
    return PlainTextResponse("")


async def metrics(request):
    return PlainTextResponse("# a stand-in's metrics\n")


async def anything(request):
    return JSONResponse({"path": request.url.path, "method": request.method})


def flag(name: str) -> str:
    return sys.argv[sys.argv.index(name) + 1]


def main() -> int:
    lifeline.stop_with_supervisor()  # as commands/serve.py's main
    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/metrics", metrics),
            Route("/v1/models", models),
            Route("/{path:path}", anything, methods=["GET", "POST", "DELETE"]),
        ]
    )
    guarded = GuardEveryPath(app, read_key_file(flag("--api-key-file")))
    uvicorn.run(guarded, host=flag("--host"), port=int(flag("--port")), log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
