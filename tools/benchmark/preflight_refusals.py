"""How long ``vllm-uma serve`` takes to refuse a command line it can judge alone.

    .venv/bin/python -m tools.benchmark.preflight_refusals [--exe .venv/bin/vllm-uma] [--repeats 3]

Each case runs the real command (the venv's console script) on a command
line its preflight refuses (vllm_uma/commands/serve.py's ``preflight``,
before vLLM or torch is imported: 10-40 s on a 2-core machine) and prints
the wall time (the best of ``--repeats``, the run least disturbed by other
work on the machine), the exit status and the one-line message, against a
target of TARGET_S. A benchmark, not a test: the e2e test
tests/e2e/test_preflight_imports.py checks deterministically that vLLM is
not imported. Every case ends in about a second; no server starts.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

TARGET_S = 3.0
REPO = Path(__file__).resolve().parents[2]


def _tier_config(tier: dict) -> list[str]:
    extra = {"kv_connector_extra_config": {"secondary_tiers": [tier]}}
    return ["--kv-offloading-size", "1", "--kv-transfer-config", json.dumps(extra)]


def cases(work: Path, stack: ExitStack) -> list[tuple[str, list[str]]]:
    """(name, serve's arguments) of each refusal, its files made under ``work``."""
    a_file = work / "model.safetensors"
    a_file.write_bytes(b"\0")
    not_a_model = work / "weights-only"
    not_a_model.mkdir()
    (not_a_model / "model.safetensors").write_bytes(b"\0")
    model = work / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    open_root = work / "kv-open"
    open_root.mkdir()
    open_root.chmod(0o777)
    holder = stack.enter_context(socket.socket())
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    busy = str(holder.getsockname()[1])
    free = ["--port", "0"]
    return [
        ("missing model directory", [str(work / "no-such-model"), *free]),
        ("a file, not a directory", [str(a_file), *free]),
        ("directory without config.json", [str(not_a_model), *free]),
        ("busy port", [str(model), "--host", "127.0.0.1", "--port", busy]),
        ("bad JSON in --kv-transfer-config", [str(model), *free,
                                              "--kv-transfer-config", '{"kv_connector": ']),
        ("untrusted disk root (mode 0777)",
         [str(model), *free, *_tier_config({"type": "fs", "root_dir": str(open_root)})]),
        ("unknown tier type", [str(model), *free, *_tier_config({"type": "s3"})]),
        ("lmcache backend", [str(model), *free, "--kv-offloading-backend", "lmcache",
                             "--kv-offloading-size", "1"]),
    ]  # fmt: skip


def run_once(exe: str, args: list[str]) -> tuple[float, int, str]:
    start = time.monotonic()
    result = subprocess.run(
        [exe, "serve", *args], capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip
    elapsed = time.monotonic() - start
    lines = result.stderr.strip().splitlines()
    return elapsed, result.returncode, lines[-1] if lines else "(no output)"


def best_of(repeats: int, run: Callable[[], tuple[float, int, str]]) -> tuple[float, int, str]:
    return min((run() for _ in range(repeats)), key=lambda r: r[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exe", default=str(REPO / ".venv" / "bin" / "vllm-uma"))
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args(argv)
    print(f"vllm-uma serve refusals (best of {opts.repeats}; target {TARGET_S:g} s each)")
    slow = 0
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        for name, args in cases(Path(tmp), stack):
            seconds, status, message = best_of(
                opts.repeats, lambda args=args: run_once(opts.exe, args)
            )
            verdict = "ok" if seconds <= TARGET_S and status == 2 else "MISSED"
            slow += verdict != "ok"
            print(f"{name:34s} {seconds:6.2f} s  exit {status}  {verdict}")
            print(f"    {message}")
    print("all within the target" if not slow else f"{slow} case(s) missed the target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
