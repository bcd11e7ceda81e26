"""The servers of the peer comparison: what each kind runs, its start timed, its memory.

Four kinds, each started fresh by the benchmark (peers.py), one at a time:

    llama.cpp       llama-server -m M.gguf -c CONTEXT -np 1 -t CORES (its default
                    host prompt cache, --cache-ram 8 GiB)
    vllm-uma        vllm-uma serve, compiled, 32-token KV blocks (its defaults)
    vllm-uma-bs128  the same with --block-size 128 (vLLM CPU's own default:
                    a hit recomputes up to 127 tokens, plugin/block_size.py)
    vllm-uma-disk   vllm-uma with a host pool and a disk tier (not in the
                    default set: what a restart can restore)
    stock-vllm      vLLM's own OpenAI server, no plugin (servers.StockServer);
                    it may refuse to start (it checks the NUMA node's free
                    memory: docs/memory.md), which the run records and goes on

Every vLLM server gets the same context (--max-model-len), the run's
precision (--dtype, bfloat16 unless the run says float32: a zoo build's
config may say either) and --enable-prompt-tokens-details (each reply says
how many prompt tokens were found cached); llama.cpp gets the same context
and the GGUF of the same directory in the same precision (bf16 or f32).
All are vllm_uma.server_process.Server, so readiness, logs and stop are one
code path; llama-server runs through exec_tied (it dies with the
benchmark, as `vllm-uma serve` does through its lifeline), which adds
Python's start-up (about 0.05 s) to its start-to-ready time.

Start to ready is polled every 50 ms (Server.wait_ready polls once a second,
too coarse for llama.cpp's 2 s). Memory is the whole process tree's RSS
and PSS: vLLM's API server and engine core are separate processes that
share libraries, so their RSS sum counts those twice and their PSS sum
does not.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import requests

from tools.benchmark.lib import servers
from tools.peers.exec_tied import tied_command
from vllm_uma.server_process import READY_TIMEOUT_S, Server

LLAMA_CPP = "llama.cpp"
KINDS = ("llama.cpp", "vllm-uma", "vllm-uma-bs128", "vllm-uma-disk", "stock-vllm")
DEFAULT_KINDS = ("llama.cpp", "vllm-uma", "vllm-uma-bs128", "stock-vllm")
POLL_S = 0.05
# A compiled vLLM server took 55-70 s to start on this machine (2 cores);
# stock vLLM compiles too.
START_TIMEOUT_S = max(READY_TIMEOUT_S, 900)


@dataclass(frozen=True)
class Setup:
    """What every server of one run shares."""

    model_dir: Path
    served_name: str
    serve_args: list[str]  # vllm-uma's model arguments (model_choice)
    gguf: Path
    llama_server: Path
    context: int
    threads: int
    dtype: str = "bfloat16"  # every server's precision (--dtype)


class LlamaServer(Server):
    """llama.cpp's server on the GGUF, tied to this process."""

    def __init__(self, setup: Setup, log_path: Path):
        super().__init__(tied_command([str(setup.llama_server)]), llama_args(setup), log_path)

    def command(self, prefix: list[str], args: list[str]) -> list[str]:
        return [*prefix, *args, "--host", self.host, "--port", str(self.port)]


def llama_args(setup: Setup) -> list[str]:
    """One slot (-np 1: llama-server splits -c among its slots, so one slot
    gives one request the whole context; four requests at once then queue,
    docs/benchmark.md), the cores as threads, and the name the requests use."""
    return [
        "-m", str(setup.gguf), "-c", str(setup.context), "-np", "1",
        "-t", str(setup.threads), "--alias", setup.served_name,
    ]  # fmt: skip


def vllm_flags(setup: Setup) -> list[str]:
    return [
        "--max-model-len", str(setup.context), "--dtype", setup.dtype,
        "--enable-prompt-tokens-details",
    ]  # fmt: skip


def factory(kind: str, setup: Setup, log_path: Path, work: Path) -> Callable[[], Server]:
    """A function that starts one server of ``kind`` (not yet ready).
    ``work``: this kind's directory for the round (vllm-uma-disk's tier
    lives there, so a restart finds what the first start stored)."""
    env = dict(servers.OFFLINE)
    if kind == LLAMA_CPP:
        return lambda: LlamaServer(setup, log_path)
    if kind == "stock-vllm":
        return lambda: servers.StockServer(
            setup.model_dir, setup.served_name, vllm_flags(setup), log_path, env
        )
    extra = {
        "vllm-uma": [],
        "vllm-uma-bs128": ["--block-size", "128"],
        "vllm-uma-disk": servers.disk_tier_args(work / "kv", cap_gib=4, auto_pool=True),
    }[kind]
    args = [*setup.serve_args, *vllm_flags(setup), *extra]
    return lambda: Server(servers.EXE, args, log_path, env=env)


def start_timed(
    make: Callable[[], Server], timeout: float = START_TIMEOUT_S
) -> tuple[Server, float]:
    """A server that answers /health, and the seconds from its launch to
    that answer. A server that exits first raises (its log's tail in the
    message); it is stopped on any failure."""
    started = time.perf_counter()
    server = make()
    try:
        while not _healthy(server):
            if server.proc.poll() is not None:
                # Server's own handling: a port taken meanwhile starts it
                # again on another; a refusal raises with the log.
                server.wait_ready(max(1.0, timeout - (time.perf_counter() - started)))
                continue
            if time.perf_counter() - started > timeout:
                raise TimeoutError(
                    f"{server.url} not ready after {timeout:.0f} s; log: {server.log_path}"
                )
            time.sleep(POLL_S)
    except BaseException:
        server.stop()
        raise
    return server, time.perf_counter() - started


def _healthy(server: Server) -> bool:
    try:
        return requests.get(f"{server.url}/health", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def memory(server: Server) -> dict[str, int]:
    """RSS and PSS summed over the server's whole process tree, in bytes."""
    rss = pss = 0
    try:
        root = psutil.Process(server.proc.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {"rss": 0, "pss": 0, "processes": 0}
    for proc in procs:
        try:
            info = proc.memory_full_info()
        except psutil.Error:
            continue  # exited meanwhile
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
    return {"rss": rss, "pss": pss, "processes": len(procs)}


def cores() -> int:
    """The cores this process may run on: llama.cpp's -t, as vLLM CPU binds its own."""
    return len(os.sched_getaffinity(0))
