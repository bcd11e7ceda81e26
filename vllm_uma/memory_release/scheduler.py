"""vLLM's scheduler with a release thread: KV memory follows the working set.

Extension point: ``scheduler_config.scheduler_cls`` (set by the platform in
the API server when ``release_free_kv`` or ``memory_pressure`` is on; vLLM's
engine core builds the scheduler in its own process). The subclass of
vLLM's Scheduler, or of its AsyncScheduler when async scheduling is on,
adds one lock and one thread.

Why a thread: an idle engine core blocks on its input queue, so no scheduler
code runs while the server is idle, which is when giving back matters most,
and when a memory hog arrives. The thread wakes every ``POLL_SECONDS``,
reads the pressure signals (pressure.py) and the time since the last
request, and when there is something to do takes the lock and runs the
releaser (releaser.py) on the scheduler's own objects.

Idle means no request for ``release_idle_seconds`` since the last engine
step (a long request is work until its last step).

Why a lock: the engine's main thread changes the block pool, the pool's
manager and the disk tier's index in ``schedule``, ``update_from_output``,
``add_request``, ``finish_requests``, ``reset_prefix_cache``,
``reset_connector_cache`` and ``make_stats``; each of those holds the lock,
so the release thread never sees them half-changed. The list is
``plugin/vllm_contract/scheduler_methods.LOCKED``, beside the reasons the
other public methods need no lock; the contract fails this module's import
when vLLM's Scheduler gains a public method that is in neither list. The
model's forward runs outside the lock: it writes only the blocks of
scheduled requests (``ref_cnt > 0``, never touched), and the stores that
still read freed blocks are skipped (l1_blocks.py). Taking an uncontended
lock costs well under a microsecond a call.

What crosses processes: nothing. The L1 page map and the host pool come
from the worker in this process, through the engine's context
(plugin/engine_context.py, the 'uni' executor); counters go to /metrics with the
KV connector's stats of the next engine step.
"""

from __future__ import annotations

import threading
import time

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_uma import exit_without_collection
from vllm_uma.kv_offload import metrics
from vllm_uma.log import get_logger
from vllm_uma.memory_release.l1_blocks import L1Blocks
from vllm_uma.memory_release.pool_rows import PoolRows
from vllm_uma.memory_release.pressure import PressureWatch
from vllm_uma.memory_release.releaser import Releaser, ReleaseReport
from vllm_uma.memory_release.tiers import BlockHolder
from vllm_uma.memory_release.warm_reserve import WarmReserve, reserve_size
from vllm_uma.plugin import vllm_contract
from vllm_uma.plugin.engine_context import engine_context
from vllm_uma.plugin.settings_plan import read_plan
from vllm_uma.plugin.vllm_contract.scheduler_methods import LOCKED

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)

logger = get_logger(__name__)

POLL_SECONDS = 0.5
QUIET_TICKS = 20  # 10 s without pressure end an episode (for the log)


def _locked(name: str):
    def method(self, *args, **kwargs):
        with self._release_lock:
            return getattr(super(ReleasingScheduler, self), name)(*args, **kwargs)

    method.__name__ = name
    return method


def _lock_the_rest(cls):
    """Every LOCKED method the class does not write out itself: vLLM's, under
    the lock. Done once, as the class is defined, from the contract's list, so
    that the list that is checked against vLLM is the list that is locked."""
    for name in LOCKED:
        if name not in vars(cls):
            setattr(cls, name, _locked(name))
    return cls


@_lock_the_rest
class ReleasingScheduler:
    """The mixin; ``UmaScheduler`` and ``UmaAsyncScheduler`` below."""

    def __init__(self, *args, **kwargs):
        # Reentrant: update_from_output calls make_stats.
        self._release_lock = threading.RLock()
        super().__init__(*args, **kwargs)
        settings = read_plan(self.vllm_config)
        self._uma = settings.uma
        offload = settings.offload
        # An automatic pool in front of a lower tier is a staging area: kept
        # resident whole by the warm reserve (warm_reserve.py).
        self._staging_pool = (
            offload is not None and offload.pool.auto and offload.lower_tier is not None
        )
        # Last step or request arrival: idleness counts from the end of the
        # work, not from when the last request came in.
        self._last_active = time.monotonic()
        self._released_since_request = False
        self._under_pressure = False
        self._quiet_ticks = 0
        self._warmed_once = False
        self._stop = threading.Event()
        # What the worker left for us (the page map, the host pool).
        self._engine = engine_context(self.vllm_config)
        self._borrowed_pool = None  # our reference to the host pool, if we hold one
        self._releaser = self._build_releaser()
        self._watch = PressureWatch() if self._uma.memory_pressure == "psi" else None
        self._thread = None
        if self._releaser is not None:
            # The reserve's first fill, before the engine core reports ready:
            # the first requests find their blocks resident (a second or
            # two at Qwen3-0.6B's size on these machines, docs/memory.md).
            self._warm()
            self._thread = threading.Thread(target=self._run, name="uma-kv-release", daemon=True)
            self._thread.start()

    def schedule(self, *args, **kwargs):
        with self._release_lock:
            self._last_active = time.monotonic()
            return super().schedule(*args, **kwargs)

    def add_request(self, request) -> None:
        with self._release_lock:
            self._last_active = time.monotonic()
            self._released_since_request = False
            super().add_request(request)

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._borrowed_pool is not None:
            self._borrowed_pool.release()
            self._borrowed_pool = None
        super().shutdown()
        # A stop on purpose exits without its last garbage collection, 1.5 s
        # sooner; a fatal error (this runs then too) exits as before.
        exit_without_collection.arm_engine_core()

    # -- building the releaser from the scheduler's parts ---------------------

    def _build_releaser(self) -> Releaser | None:
        page_map = self._engine.l1_pages.get()
        if page_map is None:
            logger.warning(
                "KV memory release is off: the worker's KV cache is not in this "
                "process (vllm-uma releases KV memory with the in-process 'uni' "
                "executor only)."
            )
            return None
        offload = getattr(self.get_kv_connector(), "connector_scheduler", None)
        busy = (lambda: blocks_in_transfer(offload)) if offload is not None else frozenset
        l1 = L1Blocks(self.kv_cache_manager.block_pool, page_map, busy)
        pool_rows, disk = None, None
        if offload is not None:
            manager = offload.manager
            primary = getattr(manager, "primary_tier", manager)
            tiers = getattr(manager, "secondary_tiers", [])
            shared = self._engine.host_pool
            existing = shared.existing()
            if existing is not None:
                # Our own reference: the pool stays mapped until the release
                # thread has stopped, whatever the engine shuts down first.
                pool = shared.open(existing.num_rows, existing.row_bytes)
                self._borrowed_pool = shared
                pool_rows = PoolRows(primary, pool)
            holders = [t for t in tiers if isinstance(t, BlockHolder)]
            if holders:
                disk = holders[0]
        logger.info(
            "KV memory release: %s; memory pressure watch %s.",
            f"free KV blocks given back after {self._uma.release_idle_seconds} s idle"
            if self._uma.release_free_kv
            else "idle release off",
            "on (PSI, MemAvailable, cgroup)" if self._uma.memory_pressure == "psi" else "off",
        )
        return Releaser(l1, pool_rows, disk, self._build_reserve(l1, pool_rows, page_map))

    def _build_reserve(self, l1: L1Blocks, pool_rows: PoolRows | None, page_map):
        tokens = self._uma.warm_kv_tokens
        size = reserve_size(
            tokens,
            self.vllm_config.cache_config.block_size,
            page_map.num_blocks,
            page_map.block_bytes,
            pool_rows.num_rows if pool_rows is not None else 0,
            pool_rows.row_bytes if pool_rows is not None else 0,
            staging_pool=self._staging_pool and pool_rows is not None,
        )
        if size.l1_blocks == 0 and size.pool_rows == 0:
            logger.info("KV warm reserve: off (warm_kv_tokens=%d).", tokens)
            return None
        reserve = WarmReserve(l1, pool_rows, size)
        l1_bytes, pool_bytes = reserve.bytes()
        logger.info(
            "KV warm reserve: the next %d free KV blocks (%s)%s stay resident ahead of use "
            "(warm_kv_tokens=%d, at most half of each%s; 0 turns it off).",
            size.l1_blocks,
            _gib(l1_bytes),
            f" and {size.pool_rows} host pool rows ({_gib(pool_bytes)})" if size.pool_rows else "",
            tokens,
            ", the whole staging pool" if self._staging_pool and size.pool_rows else "",
        )
        return reserve

    # -- the release thread ---------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                # Held for the tick: the worker cannot free the KV cache under
                # a pass (it closes the registry first when it shuts down).
                with self._engine.l1_pages.held() as page_map:
                    if page_map is None:
                        return
                    self._tick()
            except Exception:
                logger.exception("KV memory release failed; it is off from now on.")
                return

    def _tick(self) -> None:
        if self._watch is not None:
            pressure = self._watch.read()
            if pressure.under:
                with self._release_lock:
                    idle = not self.has_requests()
                    report = self._releaser.pressure_pass(pressure.shortfall, idle)
                self._count(report, metrics.KV_GIVEN_BACK_PRESSURE)
                if report.total or not self._under_pressure:
                    logger.warning(
                        "KV memory: under memory pressure (%s): gave back %s (%s); "
                        "KV kept: %.2f GiB.",
                        pressure.reason,
                        _gib(report.total),
                        report.describe(),
                        report.live_bytes / 2**30,
                    )
                self._under_pressure = True
                self._quiet_ticks = 0
                return
            # An episode ends after QUIET_TICKS readings without pressure, so
            # a signal that flickers logs one episode, not one per flicker.
            self._quiet_ticks += 1
            if self._under_pressure and self._quiet_ticks >= QUIET_TICKS:
                logger.info("KV memory: memory pressure over; the KV cache grows back on use.")
                self._under_pressure = False
        self._idle_release()
        self._warm()

    def _idle_release(self) -> None:
        if not self._uma.release_free_kv or self._released_since_request:
            return
        with self._release_lock:
            idle = time.monotonic() - self._last_active
            if self.has_requests() or idle < self._uma.release_idle_seconds:
                return
            report = self._releaser.idle_pass()
            self._released_since_request = True
        self._count(report, metrics.KV_GIVEN_BACK_IDLE)
        if not report.total:
            return  # e.g. at start-up: the lazy KV cache holds nothing yet
        logger.info(
            "KV memory: idle for %.0f s: gave back %s (%s); KV kept: %.2f GiB.",
            idle,
            _gib(report.total),
            report.describe(),
            report.live_bytes / 2**30,
        )

    def _warm(self) -> None:
        """Refill the warm reserve while the engine has no request and
        memory is not short (warm_reserve.py)."""
        reserve = getattr(self._releaser, "reserve", None)
        if reserve is None or reserve.failed is not None or self._under_pressure:
            return
        if self._watch is not None and self._watch.room() < sum(reserve.bytes()):
            return  # filling it would bring the pressure pass straight back
        with self._release_lock:
            if self.has_requests():
                return
            ranges = reserve.ranges()
        start = time.monotonic()
        made = reserve.warm(ranges, self._stop)
        if reserve.failed is not None:
            logger.warning(
                "KV warm reserve: off from now on: %s. Requests fault their KV pages "
                "in as they are written (slower restores on a fresh server).",
                reserve.failed,
            )
        if not made:
            return
        self._count_bytes(made, metrics.KV_WARMED)
        log = logger.info if not self._warmed_once else logger.debug
        self._warmed_once = True
        log("KV warm reserve: made %s resident in %.2f s.", _gib(made), time.monotonic() - start)

    def _count(self, report: ReleaseReport, name: str) -> None:
        self._count_bytes(report.total, name)

    def _count_bytes(self, count: int, name: str) -> None:
        offload = getattr(self.get_kv_connector(), "connector_scheduler", None)
        if offload is not None and count:
            with self._release_lock:
                offload._connector_stats.increase_counter(name, count)


def blocks_in_transfer(offload) -> set[int]:
    """L1 blocks a transfer may still read or write although they are free.

    vLLM fences a store's source blocks only once their request finishes
    (``_block_id_to_pending_jobs``); a preempted request's blocks are free at
    once while its store is still to run, and a finished request's blocks can
    still be named by a store built at the next step. So: every store job's
    source blocks, the fenced ones, and the blocks of finished requests the
    connector still tracks."""
    busy = set(offload._block_id_to_pending_jobs)
    for job in offload._jobs.values():
        busy.update(job.fenced_block_ids or ())
        busy.update(job.deferred_fence_block_ids or ())
    for status in offload._req_status.values():
        if status.req.is_finished():
            for group in status.group_states:
                busy.update(group.block_ids)
    return busy


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


class UmaScheduler(ReleasingScheduler, Scheduler):
    pass


class UmaAsyncScheduler(ReleasingScheduler, AsyncScheduler):
    pass
