"""What tests and benchmarks read about a running server beyond what the
runtime needs: the process that holds the model, a /metrics series, a
/proc/PID/status field.

The process that holds the model and the KV cache is the worker
("VLLM::Worker") with vLLM's 'mp' executor, or the engine-core process
("VLLM::EngineCore") with 'uni', vllm-uma's default for one worker. Tests
and benchmarks read its RSS and VmLck. Runs in the test or tool process.
"""

from __future__ import annotations

import re

import psutil

from vllm_uma.server_process import Server, free_port

__all__ = ["Server", "free_port", "metric", "model_process", "proc_status"]


def model_process(server_pid: int) -> psutil.Process:
    """The descendant of ``server_pid`` that runs the model."""
    by_title: dict[str, psutil.Process] = {}
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            by_title.setdefault(child.name(), child)
        except psutil.Error:
            continue
    for prefix in ("VLLM::Worker", "VLLM::EngineCore"):
        for title, proc in by_title.items():
            if title.startswith(prefix):
                return proc
    raise LookupError(f"no VLLM::Worker or VLLM::EngineCore process under pid {server_pid}")


def metric(text: str, name: str, label: str = "") -> float:
    """Sum of a /metrics series over the samples whose labels contain ``label``."""
    pattern = rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$"
    return sum(float(v) for labels, v in re.findall(pattern, text, re.M) if label in labels)


def proc_status(pid: int, key: str) -> int:
    """A kB field of /proc/PID/status, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)
