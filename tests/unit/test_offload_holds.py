"""The hold rules for finished requests (vllm_uma/kv_offload/holds.py), on plain ids."""

from __future__ import annotations

from vllm_uma.kv_offload.holds import AtFinish, HoldOutcome, Holds


def test_only_requests_with_chunks_left_that_can_fit_are_held():
    holds = Holds(pool_rows=4)
    assert holds.on_finished("stored", unstored=0, loading=False) is AtFinish.FREE
    assert holds.on_finished("loading", unstored=2, loading=True) is AtFinish.FREE
    assert holds.on_finished("too-big", unstored=5, loading=False) is AtFinish.TOO_BIG
    assert holds.on_finished("a", unstored=4, loading=False) is AtFinish.HOLD
    assert holds.on_finished("b", unstored=1, loading=False) is AtFinish.HOLD
    assert holds.held() == ["a", "b"]


def test_a_held_request_is_released_once_stored_and_the_retries_counted():
    holds = Holds(pool_rows=4)
    holds.on_finished("a", unstored=2, loading=False)
    holds.on_finished("b", unstored=2, loading=False)
    first = holds.update("a", unstored=2, busy=True, in_flight=True)
    assert first.outcome is HoldOutcome.WAITING and not first.retry
    assert holds.update("b", 2, busy=True, in_flight=True).outcome is HoldOutcome.WAITING
    second = holds.update("a", unstored=0, busy=True, in_flight=True)
    assert second.outcome is HoldOutcome.STORED and second.retry
    assert holds.held() == ["b"]


def test_only_busy_steps_count_towards_the_bounded_wait():
    holds = Holds(pool_rows=4, max_busy_steps=3)
    holds.on_finished("a", unstored=1, loading=False)
    for _ in range(50):  # idle steps: nobody needs the L1 blocks
        assert holds.update("a", 1, busy=False, in_flight=True).outcome is HoldOutcome.WAITING
    assert holds.update("a", 1, busy=True, in_flight=True).outcome is HoldOutcome.WAITING
    assert holds.update("a", 1, busy=True, in_flight=True).outcome is HoldOutcome.WAITING
    last = holds.update("a", 1, busy=True, in_flight=True)
    assert last.outcome is HoldOutcome.DROPPED and "3 busy steps" in last.reason
    assert len(holds) == 0


def test_a_failed_retry_with_nothing_in_flight_gives_up_at_once():
    holds = Holds(pool_rows=4)
    holds.on_finished("a", unstored=3, loading=False)
    dropped = holds.update("a", 3, busy=False, in_flight=False)
    assert dropped.outcome is HoldOutcome.DROPPED and "no transfer in flight" in dropped.reason
    assert "a" not in holds


def test_drain_returns_every_held_id():
    holds = Holds(pool_rows=4)
    holds.on_finished("a", 1, loading=False)
    holds.on_finished("b", 1, loading=False)
    assert holds.drain() == ["a", "b"]
    assert holds.held() == []
