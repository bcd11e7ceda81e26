"""A stand-in for `vllm-uma serve` in supervisor unit tests: run as
``python fake_serve.py serve ... --port P``, it runs vllm-uma's real port
check (commands/preflight.py), then answers /health with 200, or, with
$FAKE_SERVE_HANG=1, never answers (a start that hangs). SIGTERM ends it,
and, as the real one, the exit of the process that started it.
"""

import http.server
import os
import sys
import time

from vllm_uma import lifeline
from vllm_uma.commands.preflight import PreflightError, check_port


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def main() -> int:
    lifeline.stop_with_supervisor()  # as commands/serve.py's main
    port = int(sys.argv[sys.argv.index("--port") + 1])
    try:
        check_port("127.0.0.1", port)
    except PreflightError as exc:
        print(f"vllm-uma serve: error: {exc}", flush=True)
        return 2
    if os.environ.get("FAKE_SERVE_HANG") == "1":
        while True:
            time.sleep(60)
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
