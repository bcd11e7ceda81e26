"""A staging pool stores only what its lower tiers lack (kv_offload/staging_store.py),
on vLLM's real tiering manager, its CPU primary tier over a real buffer, and
our real disk tier on a real directory."""

from __future__ import annotations

import time

import pytest
from vllm.v1.kv_offload.base import ReqContext, ScheduleEndContext
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager

from tests.unit.disk_tier_kit import ROWS, Primary, key, make_tier
from vllm_uma.kv_offload.pool_manager import UmaPrimaryTier
from vllm_uma.kv_offload.staging_store import StagingTieringManager


class Region:
    """The primary tier's mmap_region: the two calls it makes."""

    def __init__(self, primary: Primary):
        self.primary = primary

    def create_kv_memoryview(self) -> memoryview:
        return self.primary.view

    def cleanup(self) -> None:
        pass


def served(manager, req: str, keys: list[bytes]) -> list[bytes]:
    """One request storing ``keys``, as the connector does; what the pool
    was asked to store. Waits until the disk tier has written them."""
    ctx = ReqContext(req_id=req)
    manager.on_new_request(ctx)
    out = manager.prepare_store(keys, ctx)
    stored = list(out.keys_to_store)
    manager.complete_store(stored, ctx)  # the copy from L1 has "ended"
    disk = manager.secondary_tiers[0]
    deadline = time.monotonic() + 10
    while not all(disk.holds(k) for k in stored) or manager.has_pending_work():
        assert time.monotonic() < deadline, "the disk tier did not write the blocks"
        manager.on_schedule_end(ScheduleEndContext((), ()))
        time.sleep(0.01)
    manager.on_request_finished(ctx)
    manager.on_schedule_end(ScheduleEndContext((), ()))
    return stored


@pytest.fixture(params=[TieringOffloadingManager, StagingTieringManager])
def manager(request, tmp_path):
    primary = Primary(aligned=True)
    pool = UmaPrimaryTier(num_chunks=ROWS, mmap_region=Region(primary))
    disk = make_tier(tmp_path / "kv", primary)
    built = request.param(primary_tier=pool, secondary_tiers=[disk])
    yield built
    built.shutdown()


def test_a_block_the_disk_holds_is_not_copied_into_the_pool_again(manager):
    first = [key(i) for i in range(4)]
    assert served(manager, "a", first) == first
    # Others fill the pool's 8 rows: the first request's blocks leave it,
    # and stay on the disk.
    served(manager, "b", [key(i) for i in range(100, 100 + ROWS)])
    assert all(manager.secondary_tiers[0].holds(k) for k in first)
    again = served(manager, "c", [*first, key(200)])  # an L1 hit, and one new block
    if isinstance(manager, StagingTieringManager):
        assert again == [key(200)]  # only what the disk lacks
    else:
        assert again == [*first, key(200)]  # vLLM's own: copied into the pool again


def test_it_applies_only_where_every_lower_tier_answers_without_io(tmp_path):
    disk = make_tier(tmp_path / "kv", Primary())
    try:
        assert StagingTieringManager.applies([disk])
        assert not StagingTieringManager.applies([disk, object()])  # e.g. the network tier
        assert not StagingTieringManager.applies([])
    finally:
        disk.shutdown()
