"""The connector's scheduler side (vllm_uma/kv_offload/connector.py) on vLLM's own scheduler.

vLLM's real OffloadingConnectorScheduler, CPUOffloadingManager (as our
pool_manager.py's subclass) and Request run here; only the configs are
stand-ins, and ``Engine`` plays vLLM's scheduler: it schedules whole
prompts, finishes requests and reports the worker's completed copies.
Blocks are 4 tokens, a prompt 8 tokens: two blocks, two pool rows.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import KVCacheBlock, get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.kv_offload.base import OffloadingKVEventsConfig
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus

from vllm_uma.kv_offload import metrics
from vllm_uma.kv_offload.connector import (
    UmaConnectorMetadata,
    UmaConnectorScheduler,
    UmaOffloadingConnector,
)
from vllm_uma.kv_offload.holds import Holds
from vllm_uma.kv_offload.pool_manager import UmaPoolManager

BLOCK = 4
init_none_hash(sha256)
HASHER = get_request_block_hasher(BLOCK, sha256)


class Spec(SimpleNamespace):
    def get_manager(self):
        return self.manager


class Engine:
    def __init__(self, pool_rows: int, max_busy_steps: int = 8, scheduler_cls=None):
        spec = Spec(
            config=SimpleNamespace(groups=[SimpleNamespace(group_id=0, tokens_per_block=BLOCK)]),
            blocks_per_chunk=1,
            tokens_per_block=(BLOCK,),
            tokens_per_hash=BLOCK,
            offload_prompt_only=True,
            num_chunks=pool_rows,
            manager=UmaPoolManager(num_chunks=pool_rows),
            kv_events_config=OffloadingKVEventsConfig(False, False),
        )
        vllm_config = SimpleNamespace(
            cache_config=SimpleNamespace(
                prefix_cache_retention_interval=0, enable_prefix_caching=True
            ),
            speculative_config=None,
            parallel_config=SimpleNamespace(world_size=1, decode_context_parallel_size=1),
        )
        attention = FullAttentionSpec(
            block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float16
        )
        groups = [KVCacheGroupSpec(["l0"], attention)]
        kv_cache_config = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups)
        if scheduler_cls is None:
            holds = Holds(pool_rows, max_busy_steps)
            self.sched = UmaConnectorScheduler(spec, vllm_config, kv_cache_config, holds)
        else:
            self.sched = scheduler_cls(spec, vllm_config, kv_cache_config)
        self.finished: set[str] = set()  # since the last step
        self.next_block = 1
        self.counters: dict[str, float] = {}

    def add(self, req_id: str, first_token: int = 0, tokens: int = 8) -> Request:
        prompt = list(range(first_token, first_token + tokens))
        req = Request(req_id, prompt, SamplingParams(max_tokens=1), None, block_hasher=HASHER)
        self.sched.on_new_request(req)
        return req

    def step(self, *prefills: Request, busy: bool | None = None) -> UmaConnectorMetadata:
        """One schedule: whole-prompt prefills of new requests, or nothing."""
        out = SchedulerOutput.make_empty()
        for req in prefills:
            assert self.sched.get_num_new_matched_tokens(req, 0) == (0, False)
            blocks = list(range(self.next_block, self.next_block + req.num_prompt_tokens // BLOCK))
            self.next_block += len(blocks)
            new = SimpleNamespace(req_id=req.request_id, block_ids=(blocks,))
            out.scheduled_new_reqs.append(new)
            out.num_scheduled_tokens[req.request_id] = req.num_prompt_tokens
        out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())
        if busy:  # tokens scheduled for requests this test does not model
            out.total_num_scheduled_tokens += 1
        out.finished_req_ids, self.finished = self.finished, set()
        meta = self.sched.build_connector_meta(out)
        for req in prefills:  # what vLLM's _update_after_schedule does
            req.num_computed_tokens = req.num_prompt_tokens
        self._collect_stats()
        return meta

    def finish(self, req: Request, status=RequestStatus.FINISHED_LENGTH_CAPPED) -> bool:
        """True if the connector keeps the request's blocks."""
        if status is not RequestStatus.FINISHED_ABORTED:
            req.append_output_token_ids(7)
        req.status = status
        self.finished.add(req.request_id)
        delay, _ = self.sched.request_finished(req)
        self._collect_stats()
        return delay

    def copies_done(self, meta: UmaConnectorMetadata) -> None:
        """The worker reports every job of ``meta`` finished."""
        jobs = {job: 1 for job in (*meta.store_jobs, *meta.load_jobs)}
        worker_meta = OffloadingWorkerMetadata(completed_jobs=jobs)
        self.sched.update_connector_output(KVConnectorOutput(kv_connector_worker_meta=worker_meta))
        self._collect_stats()

    def _collect_stats(self) -> None:
        stats = self.sched.get_stats()
        for name, value in ({} if stats is None else stats.reduce()).items():
            self.counters[name] = self.counters.get(name, 0) + value

    def count(self, name: str) -> float:
        return self.counters.get(name, 0)


def test_a_finished_request_is_held_until_the_pool_has_room():
    engine = Engine(pool_rows=2)
    a, b = engine.add("A"), engine.add("B", first_token=100)
    first = engine.step(a, b)  # A takes both rows; B's store fails
    assert [job.req_id for job in first.store_jobs.values()] == ["A"]
    assert engine.finish(a) is False  # stored: freed at once
    assert engine.finish(b) is True  # held
    # A's copy has not ended, its rows are pinned: B waits.
    assert engine.step().released_req_ids == set()
    assert engine.sched.has_pending_push_work()
    engine.copies_done(first)
    third = engine.step()  # B's retry evicts A's rows
    assert [job.req_id for job in third.store_jobs.values()] == ["B"]
    assert third.released_req_ids == {"B"}
    engine.copies_done(third)
    assert engine.count(metrics.BLOCKS_STORED) == 4
    assert engine.count(metrics.STORE_RETRIES) == 1
    assert engine.count("vllm:kv_offload_allocation_failure") == 2
    assert engine.count(metrics.BLOCKS_DROPPED) == 0
    assert not engine.sched.has_pending_push_work()
    assert engine.sched._req_status == {}


def test_vllms_own_scheduler_never_stores_the_finished_requests_blocks():
    """The behaviour this module changes."""
    engine = Engine(pool_rows=2, scheduler_cls=OffloadingConnectorScheduler)
    a, b = engine.add("A"), engine.add("B", first_token=100)
    first = engine.step(a, b)
    assert engine.finish(b) is False  # B's blocks go back to L1 now
    engine.finish(a)
    assert engine.step().store_jobs == {}  # the one retry fails: A's rows are pinned
    engine.copies_done(first)
    assert engine.step().store_jobs == {}  # room now, but B is forgotten
    assert "B" not in engine.sched._req_status


def test_held_stores_go_before_running_ones():
    engine = Engine(pool_rows=2)
    a, b, c = engine.add("A"), engine.add("B", first_token=100), engine.add("C", first_token=200)
    first = engine.step(a, b)
    engine.finish(a), engine.finish(b)
    engine.step()
    engine.copies_done(first)
    # C's prefill and B's retry compete for the two rows: B wins.
    meta = engine.step(c)
    assert [job.req_id for job in meta.store_jobs.values()] == ["B"]
    assert meta.released_req_ids == {"B"}


def test_the_wait_is_bounded_in_busy_steps():
    engine = Engine(pool_rows=2, max_busy_steps=3)
    a, b = engine.add("A"), engine.add("B", first_token=100)
    engine.step(a, b)  # A's copy never ends: its rows stay pinned
    engine.finish(a), engine.finish(b)
    released = [engine.step(busy=True).released_req_ids for _ in range(3)]
    assert released == [set(), set(), {"B"}]
    assert engine.count(metrics.BLOCKS_DROPPED) == 2
    assert engine.count(metrics.STORE_RETRIES) == 2
    assert "B" not in engine.sched._req_status


def test_more_blocks_than_pool_rows_are_dropped_at_once():
    engine = Engine(pool_rows=1)
    a = engine.add("A")
    engine.step(a)
    assert engine.finish(a) is False
    assert engine.count(metrics.BLOCKS_DROPPED) == 2


def test_reset_cache_releases_the_held_requests():
    engine = Engine(pool_rows=2)
    a, b = engine.add("A"), engine.add("B", first_token=100)
    engine.step(a, b)
    engine.finish(a), engine.finish(b)
    engine.step()
    engine.sched.reset_cache()
    assert engine.sched.has_pending_push_work()
    assert engine.step().released_req_ids == {"B"}
    assert "B" not in engine.sched._req_status


def test_a_request_aborted_while_loading_is_not_held():
    engine = Engine(pool_rows=4)
    a = engine.add("A")
    engine.copies_done(engine.step(a))
    engine.finish(a)
    engine.step()
    again = engine.add("again")  # the same prompt: restored from the pool
    hit, is_async = engine.sched.get_num_new_matched_tokens(again, 0)
    assert hit == 8 and is_async
    blocks = SimpleNamespace(blocks=([KVCacheBlock(20), KVCacheBlock(21)],))
    engine.sched.update_state_after_alloc(again, blocks, hit)
    # vLLM frees it itself when the load ends (finished_recving).
    assert engine.finish(again, RequestStatus.FINISHED_ABORTED) is False
    load = engine.step()
    assert len(load.load_jobs) == 1 and load.released_req_ids == set()
    engine.copies_done(load)
    assert engine.count(metrics.BLOCKS_RESTORED) == 2
    assert engine.count(metrics.RESTORE_HITS) == 1


def test_the_worker_reports_released_requests_as_finished_sending():
    connector = UmaOffloadingConnector.__new__(UmaOffloadingConnector)
    connector.connector_worker = SimpleNamespace(get_finished=lambda ids: (set(), {"loaded"}))
    connector._connector_metadata = UmaConnectorMetadata(
        load_jobs={}, store_jobs={}, released_req_ids={"B", "C"}
    )
    assert connector.get_finished(set()) == ({"B", "C"}, {"loaded"})


def test_only_a_step_with_nothing_scheduled_waits_for_loads():
    engine = Engine(pool_rows=4)
    a = engine.add("A")
    assert engine.step(a).idle_step is False
    assert engine.step(busy=True).idle_step is False
    assert engine.step().idle_step is True
    calls = []
    connector = UmaOffloadingConnector.__new__(UmaOffloadingConnector)
    connector.connector_worker = SimpleNamespace(
        get_finished=lambda ids: calls.append("get_finished") or (set(), set())
    )
    connector._engine = SimpleNamespace(
        mover=SimpleNamespace(wait_for_a_load=lambda: calls.append("wait"))
    )
    for idle in (False, True):
        connector._connector_metadata = UmaConnectorMetadata(
            load_jobs={}, store_jobs={}, idle_step=idle
        )
        connector.get_finished(set())
    # The wait comes first, so a load that ends during it is reported in
    # this step, not the next.
    assert calls == ["get_finished", "wait", "get_finished"]


def test_every_counter_reaches_prometheus():
    """Each name the scheduler counts is registered in the API server's metrics."""
    import functools

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )

    registry = CollectorRegistry()
    types = {cls: functools.partial(cls, registry=registry) for cls in (Counter, Gauge, Histogram)}
    extra = {"spec_name": "UmaOffloadingSpec", "spec_module_path": "vllm_uma.kv_offload.spec"}
    vllm_config = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra)
    )
    prom = UmaOffloadingConnector.build_prom_metrics(vllm_config, types, ["engine"], {0: ["0"]})
    stats = OffloadingConnectorStats()
    for i, name in enumerate(metrics.DEFINITIONS, start=1):
        stats.increase_counter(name, i)
    prom.observe(stats.data, engine_idx=0)
    for i, name in enumerate(metrics.DEFINITIONS, start=1):
        assert registry.get_sample_value(f"{name}_total", {"engine": "0"}) == i
