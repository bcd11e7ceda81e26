"""Where ``vllm-uma serve`` publishes KV cache events: private unless the user
chooses otherwise.

vLLM's default publisher endpoint is ``tcp://*:5557``: any host that can
reach the machine may subscribe (and read block hashes: with sha256 and a
public seed, an oracle for "was this prompt served?"). When the user turns
events on (``--kv-events-config``) without naming an ``endpoint``, vllm-uma
publishes on an ``ipc://`` socket instead, in a directory only this user
may enter (mode 0700, checked, never followed through a symlink):
``$XDG_RUNTIME_DIR/vllm-uma`` when that exists, else the cache root's
``run/`` (vllm_uma/models/publish.py). vLLM binds ``ipc://`` endpoints (its
ZmqEventPublisher), so a subscriber connects to that path; the log line says
which. The API server removes that socket file when it exits (also when stopped
during its start-up: startup_stop.py).

An endpoint the user names is theirs: it is kept as given, and when it is
reachable beyond this user (TCP on any address, loopback included: every
local user can connect) the log says so in one warning, and so for a
``replay_endpoint``.

Runs in the API server, in ``vllm-uma serve`` (commands/serve.py), before
vLLM builds its config; the engine core's publisher reads the endpoint
from that config.
"""

from __future__ import annotations

import atexit
import json
import os
import stat
from pathlib import Path

from vllm_uma import startup_stop
from vllm_uma.commands.argv import FlagValueMissing, given, take
from vllm_uma.commands.preflight import PreflightError
from vllm_uma.log import get_logger
from vllm_uma.models import default_cache_root
from vllm_uma.plugin import vllm_contract

# vLLM behaviour relied on, checked now (texts read from vLLM's files).
vllm_contract.require(__name__)

logger = get_logger(__name__)

FLAG = "--kv-events-config"
# A Unix socket's path must fit sockaddr_un.sun_path (108 bytes with its NUL).
MAX_SOCKET_PATH = 107


def endpoint_given(argv: list[str], key: str = "endpoint") -> bool:
    """Whether the command line names ``key`` of --kv-events-config (as JSON
    or in vLLM's dotted form, ``--kv-events-config.endpoint``)."""
    if given(argv, f"{FLAG}.{key}"):
        return True
    rest = list(argv)
    while True:
        try:
            value = take(rest, FLAG)  # each occurrence in turn
        except FlagValueMissing:
            return False  # vLLM's parser refuses it with its own message
        if value is None:
            return False
        try:
            parsed = json.loads(value)
        except ValueError:
            continue  # the same
        if isinstance(parsed, dict) and key in parsed:
            return True


def reach(endpoint: str) -> str | None:
    """Who besides this user can connect to ``endpoint``; None: no one."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return None
    address = endpoint.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if address.startswith("127.") or address in ("localhost", "::1"):
        return "every user of this machine"
    return "any host that can reach this machine"


def private_dir() -> Path:
    """This user's directory for the socket, created 0700 and checked."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        directory = Path(runtime) / "vllm-uma"
    else:
        directory = default_cache_root() / "run"
    return checked_private_dir(
        directory,
        "the KV events socket must be reachable by this user only",
        "or name an endpoint with --kv-events-config.endpoint",
    )


def checked_private_dir(directory: Path, why: str, other_fix: str) -> Path:
    """``directory``, created 0700 if missing, refused unless it is a real
    directory of this user's that no other user may enter. ``why`` and
    ``other_fix`` complete the refusal's message."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(directory)
    problem = None
    if stat.S_ISLNK(info.st_mode):
        problem = "a symbolic link"
    elif not stat.S_ISDIR(info.st_mode):
        problem = "not a directory"
    elif info.st_uid != os.geteuid():
        problem = f"owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
    elif info.st_mode & 0o077:
        problem = f"open to other users (mode {stat.S_IMODE(info.st_mode):o})"
    if problem:
        raise PreflightError(
            f"{directory} is {problem}: {why}. Remove it (vllm-uma creates it again "
            f"with mode 700), {other_fix}."
        )
    return directory


def choose_endpoint(args, argv: list[str]) -> None:
    """Point a default endpoint at a private socket; warn about an open one."""
    events = getattr(args, "kv_events_config", None)
    if events is None or not events.enable_kv_cache_events:
        return
    if endpoint_given(argv):
        _warn_if_open("endpoint", events.endpoint)
    else:
        name = f"kv-events-{args.port}.sock" if not args.uds else f"kv-events-{os.getpid()}.sock"
        path = private_dir() / name
        if len(str(path)) > MAX_SOCKET_PATH:
            raise PreflightError(
                f"the KV events socket {path} is {len(str(path))} characters long, over "
                f"the {MAX_SOCKET_PATH} a Unix socket allows. Set a shorter "
                f"VLLM_UMA_CACHE_DIR, or name an endpoint with --kv-events-config.endpoint."
            )
        events.endpoint = f"ipc://{path}"
        # vLLM's publisher leaves its socket file behind: ours goes with us.
        atexit.register(remove_socket_file, path)
        startup_stop.on_stop(lambda: remove_socket_file(path))
        logger.info(
            "KV events: published on %s (this user only). To publish elsewhere, name an "
            "endpoint: --kv-events-config.endpoint tcp://127.0.0.1:5557.", events.endpoint,
        )  # fmt: skip
    if events.replay_endpoint is not None:
        _warn_if_open("replay_endpoint", events.replay_endpoint)


def remove_socket_file(path: Path) -> None:
    """Unlink ``path`` if it is a socket (never another kind of file)."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError:
        pass  # gone already, or not ours to remove: nothing to do at exit


def _warn_if_open(key: str, endpoint: str) -> None:
    who = reach(endpoint)
    if who is not None:
        logger.warning(
            "KV events: %s %s is reachable by %s, who can read the block hashes of what "
            "this server caches. Use an ipc:// endpoint to keep them to this user.",
            key, endpoint, who,
        )  # fmt: skip
