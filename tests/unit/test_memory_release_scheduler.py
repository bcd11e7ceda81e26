"""The release thread's decision each tick (vllm_uma/memory_release/scheduler.py).

The scheduler is built without vLLM's constructor (``object.__new__``) and
given only what ``_tick`` reads: a releaser and a pressure watch that log,
the settings, the request clock, and a connector whose stats count.
"""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

import pytest

from vllm_uma.kv_offload import metrics
from vllm_uma.memory_release.pressure import NO_PRESSURE, Pressure
from vllm_uma.memory_release.releaser import ReleaseReport
from vllm_uma.memory_release.scheduler import UmaAsyncScheduler, UmaScheduler
from vllm_uma.plugin.uma_settings import UmaSettings


class Releaser:
    def __init__(self, given_back: int = 4096):
        self.calls: list[tuple] = []
        self.given_back = given_back
        self.idle_ran = threading.Event()

    def idle_pass(self) -> ReleaseReport:
        self.calls.append(("idle",))
        self.idle_ran.set()
        return ReleaseReport(steps={"free L1 blocks": self.given_back})

    def pressure_pass(self, shortfall: int, idle: bool = False) -> ReleaseReport:
        self.calls.append(("pressure", shortfall))
        return ReleaseReport(steps={"pool rows": self.given_back})


class Stats:
    def __init__(self):
        self.counters: dict[str, int] = {}

    def increase_counter(self, name: str, value: int) -> None:
        self.counters[name] = self.counters.get(name, 0) + value


def scheduler(uma: UmaSettings, idle_for: float, busy: bool = False, cls=UmaScheduler):
    s = object.__new__(cls)
    s._release_lock = threading.RLock()
    s._uma = uma
    s._last_active = time.monotonic() - idle_for
    s._released_since_request = False
    s._under_pressure = False
    s._quiet_ticks = 0
    s._releaser = Releaser()
    s.pressure = NO_PRESSURE
    s.room = 1 << 40
    watch = SimpleNamespace(read=lambda: s.pressure, room=lambda: s.room)
    s._watch = watch if uma.memory_pressure == "psi" else None
    s.stats = Stats()
    s.connector = SimpleNamespace(connector_scheduler=SimpleNamespace(_connector_stats=s.stats))
    s.has_requests = lambda: busy
    s._warmed_once = False
    s._stop = threading.Event()
    return s


class Reserve:
    """A warm reserve that logs: ``ranges`` under the lock, ``warm`` after."""

    def __init__(self, made: int = 8192, fails: str | None = None):
        self.calls: list[str] = []
        self.made, self.fails = made, fails
        self.failed: str | None = None
        self.lock_held_in_ranges: bool | None = None

    def ranges(self):
        self.calls.append("ranges")
        return [(0, 4096)]

    def bytes(self) -> tuple[int, int]:
        return 4096, 0

    def warm(self, ranges, stop) -> int:
        self.calls.append("warm")
        if self.fails:
            self.failed = self.fails
            return 0
        return self.made


IDLE = UmaSettings(release_idle_seconds=60)


@pytest.mark.parametrize("cls", [UmaScheduler, UmaAsyncScheduler])
def test_idle_long_enough_gives_back_once_per_quiet_spell(cls):
    s = scheduler(IDLE, idle_for=61, cls=cls)
    s._tick()
    s._tick()
    assert s._releaser.calls == [("idle",)]
    assert s.stats.counters == {metrics.KV_GIVEN_BACK_IDLE: 4096}
    s._released_since_request = False  # what add_request does
    s._tick()
    assert s._releaser.calls == [("idle",), ("idle",)]


def test_not_idle_long_enough_gives_nothing_back():
    s = scheduler(IDLE, idle_for=59)
    s._tick()
    assert s._releaser.calls == [] and s.stats.counters == {}
    assert not s._released_since_request


@pytest.mark.parametrize("cls", [UmaScheduler, UmaAsyncScheduler])
def test_an_engine_step_is_activity_and_new_requests_rearm(cls, monkeypatch):
    # A request that came in long ago but ran until just now: its last step
    # starts the quiet spell, not its arrival.
    from vllm.v1.core.sched.scheduler import Scheduler

    monkeypatch.setattr(Scheduler, "schedule", lambda self, *a, **k: "output")
    monkeypatch.setattr(Scheduler, "add_request", lambda self, request: None)
    s = scheduler(IDLE, idle_for=3600, cls=cls)
    assert cls.schedule(s) == "output"
    s._tick()
    assert s._releaser.calls == []
    s._last_active -= 61
    s._tick()
    assert s._releaser.calls == [("idle",)]
    cls.add_request(s, object())
    assert not s._released_since_request


def test_requests_in_flight_are_not_idle():
    s = scheduler(IDLE, idle_for=3600, busy=True)
    s._tick()
    assert s._releaser.calls == []


def test_idle_release_off_waits_for_pressure_only():
    s = scheduler(UmaSettings(release_free_kv=False), idle_for=3600)
    s._tick()
    assert s._releaser.calls == []
    s.pressure = Pressure(True, "PSI memory some avg10=20.0%", 5 << 20)
    s._tick()
    assert s._releaser.calls == [("pressure", 5 << 20)]


def test_pressure_comes_first_and_counts_as_pressure():
    s = scheduler(IDLE, idle_for=3600)
    s.pressure = Pressure(True, "MemAvailable low", 123)
    s._tick()
    s._tick()
    assert s._releaser.calls == [("pressure", 123), ("pressure", 123)]
    assert s.stats.counters == {metrics.KV_GIVEN_BACK_PRESSURE: 2 * 4096}
    assert s._under_pressure
    s.pressure = NO_PRESSURE
    s._tick()  # no pressure now: the idle pass runs as usual
    assert s._releaser.calls[-1] == ("idle",)
    assert s._under_pressure  # the episode ends after 10 s without pressure


def test_a_flickering_signal_is_one_episode_in_the_log(caplog):
    from vllm_uma.memory_release.scheduler import QUIET_TICKS, logger

    caplog.set_level(logging.INFO, logger=logger.name)
    s = scheduler(IDLE, idle_for=0)
    s._releaser.given_back = 0  # nothing left: only the episode's first line
    for under in (True, False, True, False, True):
        s.pressure = Pressure(True, "PSI", 1) if under else NO_PRESSURE
        s._tick()
    s.pressure = NO_PRESSURE
    for _ in range(QUIET_TICKS):
        s._tick()
    lines = [r.getMessage() for r in caplog.records if "KV memory" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "under memory pressure (PSI)" in lines[0] and "pressure over" in lines[1]


def test_pressure_watch_off_reads_nothing():
    s = scheduler(UmaSettings(memory_pressure="off"), idle_for=3600)
    assert s._watch is None
    s._tick()
    assert s._releaser.calls == [("idle",)]


def test_nothing_given_back_counts_nothing():
    s = scheduler(IDLE, idle_for=3600)
    s._releaser.given_back = 0
    s._tick()
    assert s._releaser.calls == [("idle",)] and s.stats.counters == {}
    assert s._released_since_request  # not retried before the next request


def test_blocks_in_transfer_are_every_store_source_and_finished_requests_blocks():
    from vllm_uma.memory_release.scheduler import blocks_in_transfer

    def job(fenced=None, deferred=None):
        return SimpleNamespace(fenced_block_ids=fenced, deferred_fence_block_ids=deferred)

    def status(finished: bool, *groups):
        req = SimpleNamespace(is_finished=lambda: finished)
        return SimpleNamespace(req=req, group_states=[SimpleNamespace(block_ids=g) for g in groups])

    offload = SimpleNamespace(
        _block_id_to_pending_jobs={1: {7}},
        # A running request's store (sources fenced only at its finish, so a
        # preemption frees them first), a sliding-window store, a load.
        _jobs={7: job(deferred=[2, 3]), 8: job(fenced=[4]), 9: job()},
        # A finished request whose store may still be built next step, and a
        # running one (its blocks are in use: ref_cnt > 0 protects them).
        _req_status={"a": status(True, [5, 6]), "b": status(False, [10, 11])},
    )
    assert blocks_in_transfer(offload) == {1, 2, 3, 4, 5, 6}


def test_the_release_thread_stops_once_the_worker_closed_the_kv_cache(monkeypatch):
    from vllm_uma.memory_release import scheduler as module
    from vllm_uma.memory_release.l1_pages import L1PageRegistry

    registry = L1PageRegistry()
    registry.set(object())
    monkeypatch.setattr(module, "POLL_SECONDS", 0.01)
    s = scheduler(IDLE, idle_for=3600)
    s._engine = SimpleNamespace(
        l1_pages=registry
    )  # what the worker left (plugin/engine_context.py)
    s._stop = threading.Event()
    thread = threading.Thread(target=s._run)
    thread.start()
    assert s._releaser.idle_ran.wait(timeout=10)
    assert s._releaser.calls == [("idle",)]  # ran while the map was there
    registry.close()
    thread.join(timeout=2)
    assert not thread.is_alive()


def test_closing_the_registry_waits_for_a_pass_in_progress():
    from vllm_uma.memory_release.l1_pages import L1PageRegistry

    class CountingLock:
        """The registry's lock, counting who asked for it, so the test knows
        that close() is waiting without sleeping."""

        def __init__(self):
            self.inner, self.asked = threading.Lock(), threading.Semaphore(0)

        def __enter__(self):
            self.asked.release()
            return self.inner.__enter__()

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

    registry, order = L1PageRegistry(), []
    registry._lock = lock = CountingLock()
    registry.set("map")
    assert lock.asked.acquire(timeout=1)  # set()'s turn
    inside, finish = threading.Event(), threading.Event()

    def a_pass():
        with registry.held() as page_map:
            inside.set()
            assert finish.wait(timeout=10)
            order.append(("pass ends", page_map))

    def closer():
        registry.close()
        order.append("closed")

    worker = threading.Thread(target=a_pass)
    worker.start()
    assert inside.wait(timeout=10) and lock.asked.acquire(timeout=1)  # the pass holds it
    closing = threading.Thread(target=closer)
    closing.start()
    assert lock.asked.acquire(timeout=10)  # close() has asked for the lock ...
    finish.set()  # ... and only now may the pass end
    worker.join(timeout=10)
    closing.join(timeout=10)
    assert order == [("pass ends", "map"), "closed"]


def test_the_warm_step_refills_the_reserve_while_idle_and_counts_it(caplog):
    from vllm_uma.memory_release.scheduler import logger

    caplog.set_level(logging.DEBUG, logger=logger.name)
    s = scheduler(IDLE, idle_for=0)
    s._releaser.reserve = reserve = Reserve()
    s._tick()
    s._tick()
    assert reserve.calls == ["ranges", "warm"] * 2
    assert s.stats.counters == {metrics.KV_WARMED: 2 * 8192}
    lines = [
        (r.levelno, r.getMessage()) for r in caplog.records if "warm reserve" in r.getMessage()
    ]
    assert [level for level, _ in lines] == [logging.INFO, logging.DEBUG]  # the first at INFO
    assert "made 0.00 GiB resident" in lines[0][1]


def test_the_warm_step_waits_for_no_request_and_no_pressure():
    s = scheduler(IDLE, idle_for=0, busy=True)
    s._releaser.reserve = reserve = Reserve()
    s._tick()
    assert reserve.calls == []  # a request is in: its blocks fault in as it writes
    s.has_requests = lambda: False
    s.pressure = Pressure(True, "MemAvailable low", 123)
    s._tick()
    assert reserve.calls == []  # the pressure pass just gave the reserve back
    s.pressure = NO_PRESSURE
    s._tick()
    assert reserve.calls == []  # and the episode is not over yet
    s._under_pressure = False
    s._tick()
    assert reserve.calls == ["ranges", "warm"]


def test_a_kernel_refusal_is_one_warning_and_the_reserve_stays_off(caplog):
    from vllm_uma.memory_release.scheduler import logger

    caplog.set_level(logging.INFO, logger=logger.name)
    s = scheduler(IDLE, idle_for=0)
    s._releaser.reserve = reserve = Reserve(fails="this kernel has no MADV_POPULATE_WRITE")
    s._tick()
    s._tick()
    assert reserve.calls == ["ranges", "warm"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "KV warm reserve: off from now on: this kernel has no MADV_POPULATE_WRITE. Requests "
        "fault their KV pages in as they are written (slower restores on a fresh server)."
    ]
    assert s.stats.counters == {}


def test_the_warm_step_waits_for_room_above_the_pressure_mark():
    # A hog still holds memory after the pressure pass: filling the reserve
    # now would bring the pressure straight back.
    s = scheduler(IDLE, idle_for=0)
    s._releaser.reserve = reserve = Reserve()
    reserve.bytes = lambda: (3000, 2000)
    s.room = 4999
    s._tick()
    assert reserve.calls == []
    s.room = 5000
    s._tick()
    assert reserve.calls == ["ranges", "warm"]
