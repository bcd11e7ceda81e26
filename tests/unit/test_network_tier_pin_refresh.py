"""The network tier's pin refresh (vllm_uma/kv_offload/network/pin_refresh.py)
on stand-ins: the batches and their TOUCHes, what counts as present, the
metrics, the timer's one refresh in flight. Whether it keeps pinned blocks
in a real KV server under eviction: tests/integration/test_network_tier_pins.py."""

from __future__ import annotations

import logging
import queue
import time

from disk_tier_kit import NS, counters, key
from vllm.v1.kv_offload.base import Locality, Medium

from vllm_uma.kv_offload.lower_tier.reports import TierReports, Warnings
from vllm_uma.kv_offload.lower_tier.threads import Priority
from vllm_uma.kv_offload.network import metrics as m
from vllm_uma.kv_offload.network import pin_refresh, round_trips, transfers
from vllm_uma.kv_offload.network.pin_refresh import (
    PIN_REFRESH_S,
    PinRefresher,
    PinsRefreshed,
    Refresh,
    touch_all,
)
from vllm_uma.kv_offload.network.server_link import NoAnswer
from vllm_uma.kv_offload.network.value_format import value_name


class Link:
    """A link whose nodes are all up (or all down)."""

    def __init__(self, down: bool = False):
        self.down = down

    def fail_fast(self) -> bool:
        return self.down


def recorded_round_trips(monkeypatch, reply=lambda name: 1) -> list:
    """each_slot replaced: records (names, verb, deadline); each name is a
    slot of its own (a cluster's), answered ``reply(name)``."""
    calls = []

    def each_slot(link, names, verb, what, deadline):
        calls.append((list(names), verb, deadline))
        return [(1, reply(name)) for name in names]

    monkeypatch.setattr(round_trips, "each_slot", each_slot)
    return calls


def names(count: int) -> tuple[bytes, ...]:
    return tuple(value_name(NS, key(i)) for i in range(count))


def test_a_refresh_touches_every_name_a_batch_per_round_trip(monkeypatch):
    calls = recorded_round_trips(monkeypatch)
    monkeypatch.setattr(pin_refresh, "REFRESH_BATCH", 4)
    all_names = names(10)
    deadline = time.monotonic() + 60
    done = touch_all(Link(), all_names, deadline)
    assert [len(batch) for batch, _, _ in calls] == [4, 4, 2]
    assert [n for batch, _, _ in calls for n in batch] == list(all_names)
    assert {verb for _, verb, _ in calls} == {"TOUCH"}
    assert {d for _, _, d in calls} == {deadline}  # every round trip ends by the next refresh
    assert done == PinsRefreshed(10, 10, reached=True)


def test_present_counts_the_ones_touch_found_only(monkeypatch):
    gone, unanswered = names(3)[0], names(3)[1]

    def reply(name):
        if name == gone:
            return 0  # evicted: TOUCH answers 0
        return NoAnswer("its node is down") if name == unanswered else 1

    recorded_round_trips(monkeypatch, reply)
    done = touch_all(Link(), names(3), time.monotonic() + 60)
    assert (done.pinned, done.present, done.reached) == (3, 1, True)


def test_every_node_down_sends_nothing(monkeypatch):
    calls = recorded_round_trips(monkeypatch)
    done = touch_all(Link(down=True), names(3), time.monotonic() + 60)
    assert calls == [] and done == PinsRefreshed(3, 0, reached=False)


def test_a_refresh_past_its_deadline_stops_and_the_rest_are_missing(monkeypatch):
    calls = recorded_round_trips(monkeypatch)
    monkeypatch.setattr(pin_refresh, "REFRESH_BATCH", 2)
    done = touch_all(Link(), names(6), time.monotonic() - 1)
    assert calls == [] and done == PinsRefreshed(6, 0, reached=True)


def reports() -> TierReports:
    warnings = Warnings(logging.getLogger("test-pin-refresh"), 60.0)
    return TierReports(m.NAMES, Medium.STORAGE, Locality.REMOTE, False, warnings)


def test_a_refresh_sets_the_gauges_and_counts_one(monkeypatch):
    tier = reports()
    PinsRefreshed(5, 3, reached=True).report(tier, block_bytes=100)
    stats = counters(tier.stats.take())
    assert stats[(m.PINNED_BLOCKS, ())] == 3 and stats[(m.PINNED_MISSING, ())] == 2
    assert stats[(m.PINNED_BYTES, ())] == 300
    assert stats[(m.PIN_REFRESHES, ())] == 1
    # Nothing reached: the gauges say so, no refresh counted.
    PinsRefreshed(5, 0, reached=False).report(tier, block_bytes=100)
    stats = counters(tier.stats.take())
    assert stats[(m.PINNED_BLOCKS, ())] == 0 and stats[(m.PINNED_MISSING, ())] == 5
    assert (m.PIN_REFRESHES, ()) not in stats
    # The last pin gone: zeros, no refresh counted.
    PinsRefreshed(0, 0, reached=True).report(tier, block_bytes=100)
    stats = counters(tier.stats.take())
    assert stats[(m.PINNED_MISSING, ())] == 0 and (m.PIN_REFRESHES, ()) not in stats


def test_the_metrics_are_defined_and_say_the_interval():
    definitions = m.definitions()
    ours = {m.PINNED_BLOCKS, m.PINNED_BYTES, m.PINNED_MISSING, m.PIN_REFRESHES}
    assert ours <= definitions.keys()
    help_text = definitions[m.PIN_REFRESHES].documentation
    assert f"every {PIN_REFRESH_S:.0f} s (PIN_REFRESH_S)" in help_text


class Threads:
    """The tier's threads, held: submitted refreshes wait for ``run_all``."""

    def __init__(self):
        self.queued: queue.SimpleQueue = queue.SimpleQueue()
        self.submitted = 0

    def submit(self, priority, task, item):
        self.queued.put((priority, task, item))
        self.submitted += 1

    def run_all(self) -> list:
        results = []
        while not self.queued.empty():
            _, task, item = self.queued.get()
            results.append(task(item))
        return results


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not met in time"
        time.sleep(0.005)


def test_the_timer_keeps_one_refresh_in_flight_and_names_the_pinned_keys(monkeypatch):
    recorded_round_trips(monkeypatch)
    pinned = {"keys": frozenset({key(1), key(2)})}
    threads = Threads()
    refresher = PinRefresher(
        Link(), threads, lambda: pinned["keys"], lambda k: value_name(NS, k), every_s=0.01
    )
    try:
        wait_until(lambda: threads.submitted == 1)
        time.sleep(0.05)  # many intervals: the first is still out, none more
        assert threads.submitted == 1
        priority, _, refresh = threads.queued.get()
        assert priority is Priority.STORE  # FIFO with the stores, never before a load
        assert sorted(refresh.names) == sorted(value_name(NS, k) for k in (key(1), key(2)))
        threads.queued.put((priority, refresher.run, refresh))
        # Queued for many intervals, it still runs whole: its time runs from its start.
        assert threads.run_all() == [PinsRefreshed(2, 2, reached=True)]
        wait_until(lambda: threads.submitted == 2)  # the next one, once it came back
        threads.run_all()
        pinned["keys"] = frozenset()  # the last pin gone: one refresh says 0, then none
        wait_until(lambda: threads.submitted == 3)
        assert threads.run_all() == [PinsRefreshed(0, 0, reached=True)]
        time.sleep(0.05)
        assert threads.submitted == 3
    finally:
        refresher.stop(timeout_s=1.0)


def test_a_refresh_that_runs_after_the_stop_sends_nothing(monkeypatch):
    calls = recorded_round_trips(monkeypatch)
    refresher = PinRefresher(Link(), Threads(), lambda: frozenset({key(1)}), bytes, every_s=60)
    refresher.stop(timeout_s=1.0)
    assert refresher.run(Refresh(names(1))) is None and calls == []


def test_a_refresh_that_raises_is_a_result_never_a_dead_thread(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(round_trips, "each_slot", broken)
    refresher = PinRefresher(Link(), Threads(), frozenset, bytes, every_s=60)
    try:
        done = refresher.run(Refresh(names(2)))
    finally:
        refresher.stop(timeout_s=1.0)
    assert done == PinsRefreshed(2, 0, False, "RuntimeError: a bug")


def test_the_transfer_threads_end_no_job_for_a_refresh():
    """A refresh dropped at a stop, or failed by a bug, has no job to end."""
    refresh = Refresh(names(1))
    assert transfers._dropped(refresh) is None
    assert transfers._failed_by_bug(refresh, RuntimeError("a bug")) is None


def test_a_refresh_on_the_real_threads_comes_back_on_the_results_queue(monkeypatch):
    recorded_round_trips(monkeypatch)
    done: queue.SimpleQueue = queue.SimpleQueue()
    threads = transfers.start_transfer_threads(done)
    refresher = PinRefresher(Link(), threads, lambda: frozenset({key(1)}), bytes, every_s=0.01)
    try:
        result = done.get(timeout=5)
    finally:
        refresher.stop(timeout_s=1.0)
        threads.shutdown()
    assert result == PinsRefreshed(1, 1, reached=True)
