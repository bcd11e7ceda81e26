"""Every public method of vLLM's Scheduler that changes state runs under the release lock.

The reviewed lists are the contract's (plugin/vllm_contract/scheduler_methods.py):
LOCKED (wrapped by memory_release/scheduler.py) and UNLOCKED (each with its
reason). A public method vLLM adds is in neither, and fails here (and the
scheduler module's import, through the contract).
"""

from __future__ import annotations

import inspect

import pytest
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_uma.memory_release.scheduler import ReleasingScheduler, UmaAsyncScheduler, UmaScheduler
from vllm_uma.plugin.vllm_contract.kinds import public_names
from vllm_uma.plugin.vllm_contract.scheduler_methods import LOCKED, UNLOCKED

PAIRS = [(UmaScheduler, Scheduler), (UmaAsyncScheduler, AsyncScheduler)]


class RecordingLock:
    """Counts the calls whose body (vLLM's method) ran while it was held."""

    def __init__(self) -> None:
        self.held = False
        self.ran_inside = 0

    def __enter__(self):
        self.held = True

    def __exit__(self, exc_type, *_):
        # vLLM's method runs on a scheduler without state, so it raises: an
        # exception through __exit__ means it ran inside the lock.
        self.held = False
        self.ran_inside += exc_type is not None
        return False


def runs_under_the_lock(cls, name: str, vllm_cls) -> bool:
    s = object.__new__(cls)
    s._release_lock = lock = RecordingLock()
    params = inspect.signature(getattr(vllm_cls, name)).parameters.values()
    args = [
        None for p in list(params)[1:] if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    try:
        getattr(s, name)(*args)
    except Exception:  # noqa: BLE001 - expected: vLLM's code without its state
        pass
    return lock.ran_inside == 1


def test_the_reviewed_lists_do_not_overlap():
    assert not LOCKED.keys() & UNLOCKED.keys()
    assert all(UNLOCKED.values()) and all(LOCKED.values())  # each has its reason


@pytest.mark.parametrize("ours, vllms", PAIRS)
def test_every_public_method_is_reviewed(ours, vllms):
    unreviewed = public_names(vllms) - LOCKED.keys() - UNLOCKED.keys()
    assert not unreviewed, (
        f"vLLM's {vllms.__name__} has public methods nobody reviewed: {sorted(unreviewed)}. "
        f"Add each to LOCKED (it changes the block pool, the pool's manager or the disk "
        f"index) or UNLOCKED with the reason, in plugin/vllm_contract/scheduler_methods.py."
    )


@pytest.mark.parametrize("ours, vllms", PAIRS)
def test_every_other_public_method_runs_under_the_release_lock(ours, vllms):
    state_changing = sorted(public_names(vllms) - UNLOCKED.keys())
    assert state_changing, "vLLM's Scheduler has no public method left to lock?"
    unlocked = [n for n in state_changing if not runs_under_the_lock(ours, n, vllms)]
    assert not unlocked, f"{sorted(unlocked)} of {ours.__name__} skip the release lock"


def test_shutdown_stops_the_release_thread_itself():
    # UNLOCKED's reason for shutdown: ours joins the thread before vLLM's runs.
    assert "shutdown" in vars(ReleasingScheduler)
