"""Find the process of a running server that holds the model and the KV cache.

With vLLM's 'mp' executor that is the worker ("VLLM::Worker"); with 'uni'
(vllm-uma's default for one worker) the worker lives in the engine-core
process ("VLLM::EngineCore"). Tests and benchmarks read its RSS and VmLck.
"""

from __future__ import annotations

import psutil


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
