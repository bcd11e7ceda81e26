"""Shared test set-up.

End-to-end tests (marked ``slow``) need the default model; ``make test``
prepares it before pytest starts, and the fixture below prepares it when a
test is run on its own.

``make test`` runs the suite on two pytest-xdist workers, one module at a
time each (``--dist loadscope``): a server's start-up is mostly one core
importing Python, so two modules' servers start side by side. Each worker's
servers get their own cores (VLLM_CPU_OMP_THREADS_BIND, which vLLM's CPU
worker binds its OpenMP threads to), and torch in the worker as many
threads: OpenMP threads of two processes spinning on the same cores slow
each other down far more than half. The
modules that start the most servers are sent first, so that neither worker
is left with a long module at the end.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

# End-to-end modules, costliest first (seconds of server start-ups and
# traffic, measured on a 2-core machine); the rest keep their order after.
COSTLIEST_FIRST = [
    # Seven server starts, the KV server's faults, two families' references:
    # 216-250 s alone, the longest module since issue 24.
    "tests/e2e/test_model_zoo.py",
    "tests/e2e/test_serve.py",
    "tests/e2e/test_disk_tier.py",
    "tests/e2e/test_offload_sliding_window.py",
    "tests/e2e/test_shared_store.py",
    "tests/e2e/test_offload.py",
    "tests/e2e/test_fleet.py",
    "tests/e2e/test_fleet_hosts.py",
    "tests/e2e/test_startup_errors.py",
    "tests/e2e/test_served_check.py",
]


def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ... under xdist
    if worker is None or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    from vllm_uma.fleet.plan import cores_for, cpu_ranges

    allowed = sorted(os.sched_getaffinity(0))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > len(allowed):
        return  # more workers than cores: no share of its own to give
    # The fleet's own split: disjoint, contiguous, every core given out.
    share = cores_for(workers, allowed)[int(worker[2:])]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_ranges(share)
    # And torch in this process (the transformers reference): no more
    # threads than the worker's cores, set before torch is first imported.
    os.environ.setdefault("OMP_NUM_THREADS", str(len(share)))


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(COSTLIEST_FIRST)}

    def cost_rank(item):
        path = Path(str(item.fspath)).relative_to(REPO).as_posix()
        return rank.get(path, len(rank))

    # A stable sort: within a module, and among the rest, the order is pytest's.
    items.sort(key=cost_rank)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    from vllm_uma import models

    return models.prepare()


@pytest.fixture(scope="session")
def vllm_uma_exe() -> str:
    exe = VENV_BIN / "vllm-uma"
    assert exe.exists(), f"{exe} missing: run `make install` first"
    return str(exe)


@pytest.fixture(autouse=True)
def _no_user_hf_offline_surprises(monkeypatch):
    # Tests never reach a model hub (none is reachable here anyway).
    monkeypatch.setenv("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "1"))


@pytest.fixture(scope="session")
def gemma_model_dir() -> Path:
    """Gemma 3 270M (a sliding-window model), built by its recipe; ``make
    test`` prepares it before pytest starts."""
    from vllm_uma import models

    return models.prepare("gemma-3-270m")
