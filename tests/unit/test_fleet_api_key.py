"""The fleet's API key (vllm_uma/fleet/api_key.py), how a server takes it
(``vllm-uma serve --api-key-file``, fleet/server_guard.py) and how the fleet
hands it over: a file's path on every command line, never the key.

In one process: the key file's rules on real files, the guard on a Starlette
app through vLLM's own middleware registration. What crosses processes and
hosts is tests/integration/test_fleet_gate.py and test_fleet_hosts_admin.py.
"""

from __future__ import annotations

import argparse
import os

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from vllm_uma.commands.fleet import fleet_api_key
from vllm_uma.commands.preflight import PreflightError
from vllm_uma.commands.serve import apply_api_key_file, preflight
from vllm_uma.fleet.api_key import ApiKeyError, ApiKeys, generate_key_file, read_key_file
from vllm_uma.fleet.server_guard import KEY_FILE_ENV, GuardEveryPath

KEY = "a" * 64
OLD_KEY = "b" * 64


def key_file(tmp_path, text=KEY + "\n", mode=0o600):
    path = tmp_path / "fleet-api.key"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_key_file_is_read_the_first_key_sent_every_key_accepted(tmp_path):
    keys = read_key_file(key_file(tmp_path, f"{KEY}\n{OLD_KEY}\n"))
    assert keys.sent == KEY and keys.header() == {"Authorization": f"Bearer {KEY}"}
    assert keys.accepts(f"Bearer {KEY}") and keys.accepts(f"bearer {OLD_KEY}")
    for wrong in (None, "", "Bearer", f"Basic {KEY}", f"Bearer {KEY[:-1]}", f"Bearer {KEY}x"):
        assert not keys.accepts(wrong), wrong
    assert KEY not in repr(keys) and KEY not in str(keys)


@pytest.mark.parametrize(
    "mode, text, message",
    [
        (0o644, KEY, "has mode 0644: other users may read the fleet's API key.*chmod 600"),
        (0o660, KEY, "has mode 0660"),
        (0o600, "", "holds no key: put one on its first line.*openssl rand -hex 32"),
        (0o600, "short\n", "key 1 of .* has 5 characters: a key needs at least 32"),
    ],
)
def test_a_key_file_others_may_read_or_without_a_good_key_is_refused_with_the_fix(
    tmp_path, mode, text, message
):
    path = key_file(tmp_path, text, mode)
    with pytest.raises(ApiKeyError, match=message) as refused:
        read_key_file(path)
    assert str(path) in str(refused.value)
    if text:
        assert text.strip() not in str(refused.value)  # a message never shows a key


def test_a_missing_file_a_link_or_a_directory_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ApiKeyError, match="cannot be read .No such file.*umask 077"):
        read_key_file(tmp_path / "none")
    link = tmp_path / "link"
    link.symlink_to(key_file(tmp_path))
    with pytest.raises(ApiKeyError, match="cannot be read"):
        read_key_file(link)  # someone who may write the directory could point it elsewhere
    (tmp_path / "dir").mkdir(mode=0o700)
    with pytest.raises(ApiKeyError, match="is not a regular file"):
        read_key_file(tmp_path / "dir")


def test_a_new_key_file_is_private_and_an_existing_one_is_kept(tmp_path):
    path = tmp_path / "k"
    assert generate_key_file(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    first = read_key_file(path).sent
    assert len(first) == 64
    assert not generate_key_file(path) and read_key_file(path).sent == first


def test_the_fleet_creates_its_key_once_and_says_where(tmp_path, capsys):
    path = tmp_path / "sub" / "fleet-api.key"
    assert fleet_api_key(path) is None
    assert f"created {path} with a new API key" in capsys.readouterr().err
    assert fleet_api_key(path) is None and capsys.readouterr().err == ""
    path.chmod(0o644)
    assert "chmod 600" in fleet_api_key(path)


# -- vllm-uma serve --api-key-file --------------------------------------------


def serve_args(path, api_key=None) -> argparse.Namespace:
    return argparse.Namespace(api_key_file=path, api_key=api_key, middleware=[])


def test_serve_takes_vllms_api_key_from_the_file_and_guards_every_other_path(tmp_path):
    path = key_file(tmp_path, f"{KEY}\n{OLD_KEY}\n")
    args, environ = serve_args(str(path)), {}
    apply_api_key_file(args, environ)
    assert args.api_key == [KEY, OLD_KEY]  # vLLM's own --api-key, every key accepted
    assert args.middleware == ["vllm_uma.fleet.server_guard.GuardEveryPath"]
    assert environ == {KEY_FILE_ENV: str(path)}  # the path, never the key
    assert not hasattr(args, "api_key_file")  # ours: vLLM's code never sees it
    plain = serve_args(None)
    apply_api_key_file(plain, environ)
    assert plain.api_key is None and plain.middleware == []


def test_serve_refuses_a_key_on_the_command_line_beside_the_file(tmp_path):
    with pytest.raises(ApiKeyError, match="--api-key and --api-key-file.*/proc/PID/cmdline"):
        apply_api_key_file(serve_args(str(key_file(tmp_path)), api_key=[KEY]), {})


def test_serves_preflight_refuses_a_key_file_others_may_read(tmp_path):
    path = key_file(tmp_path, mode=0o640)
    with pytest.raises(PreflightError, match="mode 0640.*chmod 600"):
        preflight(["--api-key-file", str(path), "--port", "0"], {})


def app_behind_vllms_middleware(tmp_path, monkeypatch) -> TestClient:
    """A Starlette app with the middleware vLLM's API server adds from the
    serve arguments (vLLM's own function), after --api-key-file."""
    from fastapi import FastAPI
    from vllm.entrypoints.serve.middleware.register import init_entrypoints_middleware

    environ = {}
    args = serve_args(str(key_file(tmp_path)))
    apply_api_key_file(args, environ)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    args = argparse.Namespace(
        **vars(args), allowed_origins=["*"], allow_credentials=False, allowed_methods=["*"],
        allowed_headers=["*"], enable_request_id_headers=False,
    )  # fmt: skip
    app = FastAPI()
    for path in ("/health", "/metrics", "/tokenize", "/abort_requests", "/v1/models"):
        app.add_api_route(path, lambda: PlainTextResponse("ok"), methods=["GET", "POST"])
    init_entrypoints_middleware(args, app, supported_tasks=())
    return TestClient(app)


def test_a_server_with_the_key_file_refuses_every_path_without_the_key_but_health_and_metrics(
    tmp_path, monkeypatch
):
    client = app_behind_vllms_middleware(tmp_path, monkeypatch)
    with_key = {"Authorization": f"Bearer {KEY}"}
    for path in ("/tokenize", "/abort_requests", "/v1/models"):
        # /v1/models: vLLM's own check; the others: only the guard's.
        assert client.post(path).status_code == 401, path
        assert client.post(path, headers={"Authorization": "Bearer x" * 8}).status_code == 401
        assert client.post(path, headers=with_key).status_code == 200, path
    assert client.get("/health").status_code == 200
    assert client.get("/metrics").status_code == 200
    assert client.options("/tokenize").status_code != 401  # a CORS preflight, as vLLM


def test_the_guard_alone_and_without_its_file(monkeypatch):
    async def ok(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/tokenize", ok, methods=["POST"])])
    guarded = TestClient(GuardEveryPath(app, ApiKeys("test", (KEY,))))
    assert guarded.post("/tokenize").status_code == 401
    assert guarded.post("/tokenize", headers={"Authorization": f"Bearer {KEY}"}).text == "ok"
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    with pytest.raises(RuntimeError, match="vllm-uma serve --api-key-file PATH"):
        GuardEveryPath(app)
