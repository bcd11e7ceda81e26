"""Checks run by ``vllm-uma serve`` before vLLM starts.

vLLM finds a missing model or a busy port only deep inside its start-up, and
reports it with a long traceback, sometimes after the weights have loaded.
These checks run first, in the command's own process, and fail with one line
that says what is wrong and what to do. They are deliberately conservative:
anything they cannot decide (a hub model id, say) is left to vLLM.
"""

from __future__ import annotations

import difflib
import errno
import socket
from collections.abc import Collection
from pathlib import Path

# Files whose presence makes a directory a model vLLM can load: a Hugging Face
# config, or Mistral's native format.
MODEL_MARKERS = ("config.json", "params.json")


class PreflightError(ValueError):
    """A problem found before start-up; ``str()`` is the whole message."""


def looks_like_local_path(model: str) -> bool:
    """True if ``model`` can only be meant as a path on this machine.

    A hub id has the form ``name`` or ``org/name``; anything absolute,
    relative (``./``, ``../``, ``~``) or with more than one ``/`` is a path.
    """
    if model.startswith(("/", "./", "../", "~")) or model in (".", ".."):
        return True
    return model.rstrip("/").count("/") > 1 or model.endswith("/")


def check_model(model: str, recipes: Collection[str] = ()) -> None:
    """Refuse a local model path that does not exist or is not a model, and
    a bare name that is one letter or case away from a recipe's name
    (``recipes``): vLLM would look for it on the hub, and fail slowly."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not any((path / marker).is_file() for marker in MODEL_MARKERS):
            raise PreflightError(
                f"model directory {model!r} is not a model: it has no "
                f"config.json. Pass a Hugging Face model directory (config.json "
                f"and weights), or leave MODEL out to serve the default model."
            )
        return
    if path.is_file():
        if path.suffix == ".gguf":
            return  # vLLM decides whether it can load a GGUF file.
        raise PreflightError(
            f"model {model!r} is a file, not a model directory. Pass the "
            f"directory that holds config.json, or leave MODEL out to serve "
            f"the default model."
        )
    if looks_like_local_path(model):
        raise PreflightError(
            f"model directory {model!r} does not exist. Check the path, or "
            f"leave MODEL out to serve the default model."
        )
    near = _near_recipe(model, recipes)
    if near is not None:
        raise PreflightError(
            f"model {model!r} is neither a local directory nor a model vllm-uma builds; "
            f"did you mean {near!r}? The models vllm-uma builds are "
            f"{', '.join(sorted(recipes))} (`vllm-uma prepare-model --help`)."
        )


def _near_recipe(model: str, recipes: Collection[str]) -> str | None:
    # Hub ids of the form org/name are never taken for a typo.
    if "/" in model or model in recipes:
        return None
    by_lower = {name.lower(): name for name in recipes}
    near = difflib.get_close_matches(model.lower(), list(by_lower), n=1, cutoff=0.8)
    return by_lower[near[0]] if near else None


def _who_listens(port: int) -> str:
    """Best-effort description of the process bound to ``port``."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.pid:
                return f" by pid {conn.pid} ({psutil.Process(conn.pid).name()})"
    except Exception:  # noqa: BLE001 - purely informative, never fatal
        pass
    return ""


def check_port(host: str | None, port: int) -> None:
    """Refuse a port another process is listening on.

    Binds the way vLLM will (SO_REUSEADDR, so a socket in TIME_WAIT from a
    server that just stopped does not count) and closes at once.
    """
    bind_host = host or ""
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind_host, port))
    except OSError as exc:
        where = f"{host}:{port}" if host else f"port {port} (all interfaces)"
        if exc.errno == errno.EADDRINUSE:
            raise PreflightError(
                f"{where} is already in use{_who_listens(port)}. Stop that "
                f"server, or choose another port with --port."
            ) from None
        if exc.errno == errno.EACCES:
            raise PreflightError(
                f"not allowed to listen on {where}: ports below 1024 need "
                f"root. Choose another port with --port."
            ) from None
        if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
            raise PreflightError(
                f"cannot listen on {where}: {host!r} is not an address of this "
                f"machine. Use --host 127.0.0.1 (local only) or --host 0.0.0.0."
            ) from None
        raise PreflightError(f"cannot listen on {where}: {exc.strerror}.") from None
    finally:
        sock.close()
