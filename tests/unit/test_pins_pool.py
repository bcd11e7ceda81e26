"""The host pool keeps pinned blocks (vllm_uma/kv_offload/pins/pool_policy.py):
vLLM's own prepare_store eviction and our release_idle skip them, on the real
CPUOffloadingManager with the pin-aware twins of vLLM's LRU and ARC."""

from __future__ import annotations

import pytest
from vllm.v1.kv_offload.base import ReqContext

from vllm_uma.kv_offload.pins.pool_policy import PinAware, pin_aware_policy
from vllm_uma.kv_offload.pool_manager import UmaPoolManager

CTX = ReqContext(req_id="r")
ROWS = 3


def k(i: int) -> bytes:
    return bytes([i]) * 8


def store(manager, keys) -> list[bytes] | None:
    out = manager.prepare_store(keys, CTX)
    if out is None:
        return None
    manager.complete_store(out.keys_to_store, CTX)
    return list(out.evicted_keys)


@pytest.fixture(params=["lru", "arc"])
def manager(request):
    name = pin_aware_policy(request.param, None)
    pool = UmaPoolManager(num_chunks=ROWS, cache_policy=name, enable_events=True)
    assert isinstance(pool._policy, PinAware)
    return pool


def test_vllms_eviction_skips_a_pinned_block(manager):
    pinned = {k(0)}
    assert manager.keep_pinned(lambda key: key in pinned)
    store(manager, [k(0), k(1), k(2)])
    assert store(manager, [k(3)]) == [k(1)]  # not k0, the least recent
    assert store(manager, [k(4)]) == [k(2)]
    assert manager.holds(k(0))
    pinned.clear()  # unpinned: the next victim is the least recent again
    assert store(manager, [k(5)]) == [k(0)]


def test_a_pool_full_of_pins_refuses_the_store_as_vllm_does(manager):
    manager.keep_pinned(lambda key: True)
    store(manager, [k(0), k(1), k(2)])
    assert store(manager, [k(3)]) is None  # vLLM's "eviction failed": nothing changed
    assert all(manager.holds(k(i)) for i in range(3))


def test_the_memory_release_keeps_pinned_rows():
    # LRU only: the release takes no row of ARC's, which lists no entries.
    manager = UmaPoolManager(num_chunks=ROWS, cache_policy=pin_aware_policy("lru", None))
    manager.keep_pinned(lambda key: key == k(1))
    store(manager, [k(0), k(1), k(2)])
    released = manager.release_idle(3)
    assert len(released) == 2 and manager.holds(k(1))


def test_a_users_own_policy_is_kept_and_pins_stay_on_disk_only():
    assert pin_aware_policy("lru", "my.module") is None
    assert pin_aware_policy("mine", None) is None
    pool = UmaPoolManager(num_chunks=ROWS, cache_policy="lru")
    assert not pool.keep_pinned(lambda key: True)
