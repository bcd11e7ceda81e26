"""The lower tiers' threads (vllm_uma/kv_offload/lower_tier/threads.py):
the order they take work in, a load-only thread, a task that raises, and a
stop that drains stores within its deadline and drops loads."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from vllm_uma.kv_offload.lower_tier.threads import Priority, TierThreads, drain


def threads(num_threads: int = 1, results=None, **kw) -> TierThreads:
    return TierThreads(
        "test-tier",
        num_threads,
        queue.SimpleQueue() if results is None else results,
        failed=lambda item, exc: ("failed", item, repr(exc)),
        **kw,
    )


def held(pool: TierThreads, priority: Priority = Priority.STORE) -> threading.Event:
    """A piece that holds one thread until the event is set."""
    go, started = threading.Event(), threading.Event()

    def hold(item):
        started.set()
        go.wait(5)

    pool.submit(priority, hold, "held")
    assert started.wait(5)
    return go


def test_loads_then_deletes_then_stores_each_first_in_first_out():
    results = queue.SimpleQueue()
    pool = threads(1, results)
    go = held(pool)
    for priority, item in [
        (Priority.STORE, "s1"),
        (Priority.DELETE, "d1"),
        (Priority.LOAD, "l1"),
        (Priority.STORE, "s2"),
        (Priority.LOAD, "l2"),
        (Priority.DELETE, "d2"),
    ]:
        pool.submit(priority, lambda item: item, item)
    go.set()
    pool.wait_idle()
    assert list(drain(results)) == ["l1", "l2", "d1", "d2", "s1", "s2"]
    assert pool.shutdown().stuck_threads == 0


def test_a_load_runs_while_every_other_thread_is_in_a_store():
    results = queue.SimpleQueue()
    pool = threads(2, results, load_only=1)
    go = held(pool, Priority.STORE)  # the one thread that takes stores
    pool.submit(Priority.STORE, lambda item: item, "a store")
    pool.submit(Priority.LOAD, lambda item: item, "a load")
    assert results.get(timeout=5) == "a load"
    assert results.empty()  # the store waits for the thread in a store
    go.set()
    assert results.get(timeout=5) == "a store"
    assert [t.name for t in pool._threads] == ["test-tier-0", "test-tier-1"]
    pool.shutdown()


def test_a_load_only_thread_never_takes_a_store():
    results = queue.SimpleQueue()
    pool = threads(2, results, load_only=1)
    names = []
    for i in range(20):
        pool.submit(Priority.STORE, lambda item: names.append(threading.current_thread().name), i)
    pool.wait_idle()
    assert set(names) == {"test-tier-1"}
    pool.shutdown()


def test_a_task_that_raises_still_gives_a_result_and_the_thread_goes_on():
    results = queue.SimpleQueue()
    pool = threads(1, results)
    pool.submit(Priority.LOAD, lambda item: 1 / 0, "bad")
    pool.submit(Priority.LOAD, lambda item: None, "no result")
    pool.submit(Priority.LOAD, lambda item: item, "good")
    pool.wait_idle()
    assert list(drain(results)) == [
        ("failed", "bad", "ZeroDivisionError('division by zero')"),
        "good",
    ]
    pool.shutdown()


def test_a_stop_runs_the_stores_queued_before_it_and_drops_the_loads():
    results = queue.SimpleQueue()
    pool = threads(1, results, dropped=lambda item: ("dropped", item))
    go = held(pool)
    for i in range(3):
        pool.submit(Priority.STORE, lambda item: item, f"store {i}")
    pool.submit(Priority.LOAD, lambda item: item, "a load")
    threading.Timer(0.1, go.set).start()
    stopped = pool.shutdown(timeout_s=2.0)
    # The load was dequeued first, during the stop: dropped, its result given.
    assert list(drain(results)) == [("dropped", "a load"), "store 0", "store 1", "store 2"]
    assert stopped.stuck_threads == 0 and stopped.dropped == {Priority.LOAD: 1}


def test_a_stop_gives_up_queued_stores_at_its_deadline():
    """The stop waits ``timeout_s`` at most: stores still queued then are
    dropped and counted; queued loads are dropped at once."""
    ran = []

    def slow_store(io):
        time.sleep(0.1)
        ran.append(io)  # 20 of them take 2 s: past the stop's deadline

    pool = threads(1)
    go = held(pool)
    for i in range(20):
        pool.submit(Priority.STORE, slow_store, i)
    pool.submit(Priority.LOAD, lambda io: ran.append(io), "a load")
    threading.Timer(0.1, go.set).start()  # the stop is under way by then
    started = time.monotonic()
    stopped = pool.shutdown(timeout_s=1.0)
    assert time.monotonic() - started < 1.5
    time.sleep(0.2)  # a store in hand at the deadline ends (a thread left behind)
    assert "a load" not in ran and stopped.dropped[Priority.LOAD] == 1
    assert len(ran) >= 2 and stopped.dropped[Priority.STORE] == 20 - len(ran)


def test_a_thread_stuck_at_the_deadline_is_left_behind_and_counted():
    pool = threads(2)
    go = held(pool)
    pool.submit(Priority.STORE, lambda item: item, "queued")
    started = time.monotonic()
    stopped = pool.shutdown(timeout_s=0.3)
    assert time.monotonic() - started < 1.0
    assert stopped.stuck_threads == 1 and stopped.dropped == {}  # the other thread ran it
    go.set()


def test_wait_idle_returns_once_every_result_is_put():
    results = queue.SimpleQueue()
    pool = threads(3, results)
    for i in range(30):
        pool.submit(Priority.STORE, lambda item: (time.sleep(0.001), item)[1], i)
    pool.wait_idle()
    assert sorted(drain(results)) == list(range(30))
    pool.shutdown()


@pytest.mark.parametrize(
    "num_threads, load_only, message",
    [
        (0, 0, "num_threads=0 is invalid: it must be >= 1"),
        (1, 1, "num_threads=1 is invalid: it must be >= 2 (1 thread(s) run loads only"),
    ],
)
def test_too_few_threads_are_refused(num_threads, load_only, message):
    with pytest.raises(ValueError) as refused:
        threads(num_threads, load_only=load_only)
    assert str(refused.value).startswith(message)
