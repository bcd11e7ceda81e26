"""The servers a benchmark measures: start, wait until ready, read, stop.

`vllm-uma serve` is vllm_uma.server_process.Server, as the tests and the
runtime start it; stock vLLM CPU is the same class with another command.

Every server runs in its own session on a free loopback port, its log in a
file; Server.stop ends everything it started, also on Ctrl-C (the callers
stop in ``finally``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from vllm_uma.plugin.block_size import DEFAULT_BLOCK_TOKENS
from vllm_uma.plugin.memory import BREAKDOWN_PREFIX, parse_breakdown
from vllm_uma.server_process import READY_TIMEOUT_S, Server

EXE = str(Path(sys.executable).parent / "vllm-uma")
# The model is on the disk already (models.prepare): no benchmark waits on
# the Hugging Face hub.
OFFLINE = {"HF_HUB_OFFLINE": "1"}


class StockServer(Server):
    """Stock vLLM CPU, no plugin (VLLM_PLUGINS="" keeps vLLM from loading any
    out-of-tree plugin): vLLM's OpenAI API server on ``model_dir``, served as
    ``served_name`` so that the same requests reach both servers."""

    def __init__(
        self, model_dir: Path, served_name: str, args: list[str], log_path: Path, env: dict
    ):
        model = ["--model", str(model_dir), "--served-model-name", served_name]
        api_server = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        super().__init__(api_server, [*model, *args], log_path, env={**env, "VLLM_PLUGINS": ""})

    def command(self, prefix: list[str], args: list[str]) -> list[str]:
        return [*prefix, *args, "--host", "127.0.0.1", "--port", str(self.port)]


def start(
    args: list[str], log_path: Path, env: dict | None = None, timeout: float = READY_TIMEOUT_S
) -> Server:
    """A `vllm-uma serve ARGS` that answers /health; stopped if it does not."""
    server = Server(EXE, args, log_path, env=env)
    try:
        return server.wait_ready(timeout)
    except BaseException:
        server.stop()
        raise


def ready(server: Server, timeout: float) -> bool:
    """True once ``server`` answers /health; False if it exits first (a
    refusal, which its log says); TimeoutError if it does neither."""
    try:
        server.wait_ready(timeout)
    except RuntimeError:
        return False
    except TimeoutError:
        raise TimeoutError(
            f"server on port {server.port} not healthy after {timeout:.0f} s"
        ) from None
    return True


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    """``server`` until the block ends, however it ends; then stopped."""
    try:
        yield server
    finally:
        server.stop()


def breakdown(server: Server) -> dict[str, int]:
    """The server's `memory breakdown:` line, parsed (vllm_uma/plugin/memory.py)."""
    line = next((x for x in server.log().splitlines() if BREAKDOWN_PREFIX in x), None)
    if line is None:
        raise RuntimeError(f"no '{BREAKDOWN_PREFIX}' line in {server.log_path}")
    return parse_breakdown(line)


def disk_tier_args(
    root_dir: Path, cap_gib: float, auto_pool: bool = False, secret_file: Path | None = None
) -> list[str]:
    """The `vllm-uma serve` flags of a disk tier (L3) at ``root_dir``.
    ``auto_pool``: the connector named without a size, so the server sizes
    the host pool itself (the disk tier's staging area); else the pool's
    size comes from ``--kv-offloading-size``. ``secret_file``: block files
    signed and checked with its key (kv_offload/block_mac.py)."""
    tier = {"type": "fs", "root_dir": str(root_dir), "max_size_gib": cap_gib}
    if secret_file is not None:
        tier["secret_file"] = str(secret_file)
    config: dict = {"kv_connector_extra_config": {"secondary_tiers": [tier]}}
    if auto_pool:
        config.update(kv_connector="OffloadingConnector", kv_role="kv_both")
    return ["--kv-transfer-config", json.dumps(config)]


def block_tokens(serve_args: list[str]) -> int:
    """The servers' block size: --block-size N or --block-size=N, else ours."""
    for i, flag in enumerate(serve_args):
        if flag == "--block-size" and i + 1 < len(serve_args):
            return int(serve_args[i + 1])
        if flag.startswith("--block-size="):
            return int(flag.split("=", 1)[1])
    return DEFAULT_BLOCK_TOKENS


def kill_listener(url: str) -> None:
    """SIGKILL the process group of whatever listens on ``url``'s port (a
    server's death, as the fleet benchmarks stage it: the API server and its
    engine core at once). Raises if nothing listens there, so a benchmark
    never measures a death that did not happen."""
    import psutil

    port = int(url.rsplit(":", 1)[1])
    for conn in psutil.net_connections("tcp"):
        if conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            os.killpg(os.getpgid(conn.pid), signal.SIGKILL)
            return
    raise RuntimeError(f"no process listens on {url}")
