"""The network tier: a vLLM SecondaryTierManager ("valkey" in secondary_tiers).

Runs in the engine-core process. vLLM's TieringOffloadingManager calls every
method on the scheduler thread, and none may block on the network:

- lookups answer from verdicts a lookup thread fetched (probes.py): a key
  not asked yet is RETRY for one step while one pipelined EXISTS per batch
  asks the KV server; a gone KV server is a MISS at once (server_link.py);
- stores and loads become one ``Transfer`` per vLLM job, run on two
  transfer threads (the lower tier's, lower_tier/threads.py; one runs
  loads only, so a load never waits behind a store) as pipelined SETs and
  MGETs (transfers.py); a load has one deadline, a timeout from its
  submission;
- ``get_finished_jobs`` applies what came back, on the scheduler thread, and
  returns exactly one JobResult per job;
- beside a disk tier (whose ledger holds pins), the pinned blocks of the
  namespace are touched every few seconds on the same threads, so that the
  KV server's LRU keeps them (pin_refresh.py, ``keep_pinned``).

What crosses: keys and the primary tier's rows (the L2 host pool, which
vLLM keeps pinned until the job's JobResult), values (value_format.py: a
disk-tier block file with the fleet's MAC, checked before a byte lands in a
row), JobResults, metric counts. The MAC's keys are read here at start-up
and again by the transfer threads when their file changes (mac_keys.py).
The cap and the eviction are the KV server's (server_check.py).
"""

from __future__ import annotations

import collections
import functools
import queue
import time
from collections.abc import Iterable
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from vllm_uma.kv_offload.lower_tier.jobs import Job, JobBook
from vllm_uma.kv_offload.lower_tier.reports import TierReports, Warnings
from vllm_uma.kv_offload.lower_tier.threads import Priority, drain
from vllm_uma.kv_offload.mac_keys import KeySource
from vllm_uma.kv_offload.network import metrics as m
from vllm_uma.kv_offload.network.key_names import descriptor_name
from vllm_uma.kv_offload.network.node_checks import check_again, check_at_start
from vllm_uma.kv_offload.network.pin_refresh import (
    PIN_REFRESH_S,
    PinnedKeys,
    PinRefresher,
    PinsRefreshed,
)
from vllm_uma.kv_offload.network.probes import ServerProbes
from vllm_uma.kv_offload.network.server_check import (
    ServerRefused,
    keep_descriptor,
    namespace_share,
)
from vllm_uma.kv_offload.network.server_link import LINK_ERRORS, RETRY_INTERVAL_S, ServerLink
from vllm_uma.kv_offload.network.settings import NetworkTierSettings
from vllm_uma.kv_offload.network.tls import wrong_transport
from vllm_uma.kv_offload.network.transfers import (
    Miss,
    Transfer,
    TransferDone,
    run_transfer,
    start_transfer_threads,
)
from vllm_uma.kv_offload.network.value_format import value_name
from vllm_uma.log import get_logger
from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)

logger = get_logger(__name__)

# Keys this server stored or restored lately: a store of one of them is
# skipped (another server's, or ours, is in the KV server; if the KV server
# evicted it since, the next store after it is forgotten here puts it back).
# 64k keys is about 10 MB here, and 180 GB of the default model's blocks.
RECENT_KEYS = 65536
# At most one warning per reason of bad values in this many seconds.
BAD_VALUE_WARNING_S = 60.0


class NetworkTier(SecondaryTierManager):
    medium: ClassVar[Medium] = Medium.STORAGE
    # Not DISK (the fs tier's): vLLM has no source for a shared remote
    # store, and EXTERNAL_UNSPECIFIED is its name for "a remote store", so
    # /metrics tells a network hit from a disk hit.
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.EXTERNAL_UNSPECIFIED

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        return m.definitions()

    def __init__(
        self,
        offloading_spec,
        primary_kv_view: memoryview,
        tier_type: str,
        *,
        settings: NetworkTierSettings,
        namespace_id: bytes,
        namespace_info: dict[str, Any] | None = None,
        backpressure_detector=None,
        retry_interval_s: float = RETRY_INTERVAL_S,
        pin_refresh_s: float = PIN_REFRESH_S,
    ):
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = Locality.REMOTE
        self._ns = namespace_id
        self._info = namespace_info  # its descriptor's source (server_usage.py)
        self._rows = primary_kv_view.cast("B")
        # KV events (vLLM's --kv-events-config): this server can restore
        # what it stored, from a cache every host reads. A KV-aware router
        # files an event with an ``ownership`` under that cache and credits
        # the server that published it (docs/fleet.md). A warning of each
        # kind at most once a minute: a KV server's episodes come and go.
        warnings = Warnings(logger, BAD_VALUE_WARNING_S)
        self._reports = TierReports(
            m.NAMES, self.medium, self.locality, settings.kv_events, warnings, settings.cache_id
        )
        # Before the link: a secret gone since the settings were checked
        # fails the start with its fix (mac_keys.SecretError), no socket opened.
        self._keys = _key_source(settings)
        self._link = ServerLink(settings, self._check_again, retry_interval_s)
        try:
            self._check_at_start(settings)
        except BaseException:
            self._link.close()
            raise
        self._probes = ServerProbes(self._link, self._name, tier_type)
        self._done: queue.SimpleQueue[TransferDone | PinsRefreshed] = queue.SimpleQueue()
        self._move = functools.partial(run_transfer, self._link, namespace_id, self._keys)
        self._threads = start_transfer_threads(self._done)
        self._jobs: JobBook[Job] = JobBook()
        self._recent: collections.OrderedDict[OffloadKey, None] = collections.OrderedDict()
        self._pin_refresh_s = pin_refresh_s
        self._pins: PinRefresher | None = None  # with a disk tier only (keep_pinned)
        self._closed = False

    def _name(self, key: OffloadKey) -> bytes:
        return value_name(self._ns, key)

    # -- the KV server's set-up -----------------------------------------------

    def _check_at_start(self, settings: NetworkTierSettings) -> None:
        """Blocking is fine here: vLLM builds the tier before serving. An
        KV server that does not answer is served without; one reached over the
        wrong transport, or whose certificate fails, refuses the start: it
        will not answer any better later (tls.py)."""
        url = self._link.url
        try:
            report = check_at_start(self._link)
        except LINK_ERRORS as exc:
            problem = wrong_transport(settings, settings.host, settings.port, url, exc)
            if problem is not None:
                raise ServerRefused(problem) from None
            self._link.start_down(exc)
            logger.info("KV offloading: network tier at %s, %s.", url, self._signing())
            return
        if report.refuse:
            raise ServerRefused(report.problem)
        if report.problem is not None:
            logger.warning("network KV tier: %s", report.problem)
        if self._link.cluster is not None:
            # One node's count over the whole cluster's cap would understate
            # the share; the descriptor goes to the node of its slot.
            node = self._descriptor_node()
            try:
                if node is not None:
                    keep_descriptor(node.client, self._ns, self._info)
            except LINK_ERRORS as exc:  # a line, never a failed start
                self._link.node_down(node, exc, "writing the namespace's descriptor")
            held = "its blocks not counted on a cluster"
        else:
            try:
                held = namespace_share(self._link.seed.client, self._ns, self._info, report)
            except LINK_ERRORS as exc:  # gone since the check: a line, never a failed start
                self._link.node_down(self._link.seed, exc, "counting the namespace's blocks")
                held = "its blocks not counted: the KV server stopped answering"
        at = f"{url} ({report.summary()}), namespace {self._ns.hex()}"
        self._reports.started("KV offloading: network tier", at, [held, self._signing()])

    def _signing(self) -> str:
        """What the start-up line says of the values' MAC: a key id, never a key."""
        if self._keys is None:
            return (
                'values unsigned by the user\'s choice ("unsigned": true): anyone who can '
                "write to the KV server can plant KV this server serves"
            )
        return "values " + self._keys.keys().describe()

    def _check_again(self, node) -> None:
        """The watch thread, when a gone node answers (it may be another
        KV server now) or joins a cluster's map. Only warned of: the server is
        serving by now. The namespace's descriptor is written again where it
        lives, if that is this node (a new KV server has none)."""
        problem = check_again(self._link, node)
        if problem is not None:
            logger.warning("network KV tier: %s", problem)
        if self._descriptor_node() is node:
            keep_descriptor(node.client, self._ns, self._info)

    def _descriptor_node(self):
        """The node that holds the namespace's descriptor: the node of its
        key's slot (the KV server itself when it is not a cluster)."""
        return self._link.node_of(descriptor_name(self._ns))

    # -- lookups (scheduler thread, no I/O) -----------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if not self._link.up:
            return LookupResult.MISS  # no request waits for a gone KV server
        found = self._probes.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY  # asked at this step's end
        if not found:
            return LookupResult.MISS
        self._reports.hit()
        return LookupResult.HIT

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._probes.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._probes.flush()  # this step's lookups, to the lookup thread

    # -- stores and loads ------------------------------------------------------

    def submit_store(self, job_metadata: TransferJob) -> None:
        pairs = [
            (key, chunk)
            for key, chunk in zip(job_metadata.keys, job_metadata.chunk_ids, strict=True)
            if key not in self._recent
        ]
        self._reports.store_skipped(len(job_metadata.keys) - len(pairs))
        self._submit(job_metadata.job_id, False, pairs)

    def submit_load(self, job_metadata: TransferJob) -> None:
        pairs = list(zip(job_metadata.keys, job_metadata.chunk_ids, strict=True))
        self._submit(job_metadata.job_id, True, pairs)

    def _submit(self, job_id: int, is_load: bool, pairs: list) -> None:
        keys = tuple(key for key, _ in pairs)
        job = Job(job_id, list(keys), is_load, pending=1 if pairs else 0)
        self._jobs.track(job)
        if not pairs:  # every block skipped: done at once
            self._jobs.finish(job)
            return
        row_bytes = self.block_size_bytes
        transfer = Transfer(
            job_id,
            is_load,
            keys,
            tuple(self._name(key) for key, _ in pairs),
            tuple(self._rows[int(c) * row_bytes : (int(c) + 1) * row_bytes] for _, c in pairs),
            # A request waits for its load from now: a timeout, then recomputed.
            time.monotonic() + self._link.timeout_s if is_load else None,
        )
        self._threads.submit(Priority.LOAD if is_load else Priority.STORE, self._move, transfer)

    # -- pins ------------------------------------------------------------------

    def keep_pinned(self, pinned_keys: PinnedKeys) -> None:
        """Keep the blocks ``pinned_keys()`` names (the disk tier's: pins
        live in its ledger) alive in the KV server: touched every
        ``pin_refresh_s`` on the transfer threads (pin_refresh.py)."""
        if self._pins is None and not self._closed:
            self._pins = PinRefresher(
                self._link, self._threads, pinned_keys, self._name, self._pin_refresh_s
            )

    # -- completion (scheduler thread) -----------------------------------------

    def get_finished_jobs(self) -> Iterable[JobResult]:
        for done in drain(self._done):
            if isinstance(done, PinsRefreshed):
                done.report(self._reports, self.block_size_bytes)
                continue
            job = self._jobs[done.job_id]
            self._apply(done)
            job.failed.extend(done.failed)
            job.part_done(done.nbytes, done.start, done.end)  # its one part
            self._jobs.finish(job)
        return self._jobs.take_results()

    def _apply(self, done: TransferDone) -> None:
        reports = self._reports
        for key in done.moved:
            self._remember(key)
        reports.moved(done.is_load, len(done.moved), done.nbytes)
        if done.is_load:
            for reason in done.failed.values():
                reports.stats.count(m.LOAD_MISSES, reason=reason)
            if done.failed:
                # vLLM would promote the same keys again on the verdicts.
                self._probes.mark_miss(done.failed)
                for key in done.failed:
                    self._recent.pop(key, None)
        else:
            for reason in done.failed.values():
                reports.store_failed(reason)
            reports.event(list(done.moved), removed=False)
        # A bad value was deleted from the KV server: no server can restore it.
        reports.event(
            [k for k, why in done.failed.items() if why not in _QUIET | _NOT_THE_VALUE],
            removed=True,
        )
        self._report_bad(done)

    def take_events(self) -> Iterable[OffloadingEvent]:
        return self._reports.take_events()

    def _remember(self, key: OffloadKey) -> None:
        self._recent[key] = None
        self._recent.move_to_end(key)
        if len(self._recent) > RECENT_KEYS:
            self._recent.popitem(last=False)

    def _report_bad(self, done: TransferDone) -> None:
        """Bad values counted; one warning per reason a minute for them and
        for refusals and bugs (a gone or full KV server has its episode's)."""
        reasons = collections.Counter(done.failed.values())
        for reason in reasons.keys() - _QUIET:
            args = (
                reasons[reason],
                "restore" if done.is_load else "store",
                reason,
                f": {done.bad[0]}" if done.bad else "",
                BAD_VALUE_WARNING_S,
            )
            if reason in _NOT_THE_VALUE:
                self._reports.warnings.warn("bad " + reason, _UNUSABLE, *args)
            else:
                self._reports.bad(reason, reasons[reason], _UNUSABLE, *args)

    # -- life cycle --------------------------------------------------------------

    def get_stats(self):
        stats = self._reports.stats
        stats.gauge(m.SERVER_UP, int(self._link.up))
        stats.gauge(m.REFUSED_NODES, self._link.refused_nodes)
        return stats.take()

    def has_pending_work(self) -> bool:
        return self._jobs.has_pending_work()

    def drain_jobs(self) -> None:
        self._threads.wait_idle()

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pins is not None:
            self._pins.stop(timeout_s=1.0)  # a refresh queued now ends without a round trip
        stuck = self._threads.shutdown().stuck_threads
        self.get_finished_jobs()  # none comes after this; the counts are kept
        self._probes.shutdown()
        self._link.close()
        if stuck:
            # A thread left in a socket read holds a slice of the rows:
            # nothing is released, the process is stopping.
            logger.warning("network KV tier: %d transfer thread(s) did not stop in time.", stuck)
            return
        self._rows.release()


def _key_source(settings: NetworkTierSettings) -> KeySource | None:
    if settings.unsigned:
        return None
    return KeySource(
        env=settings.secret_env,
        path=settings.secret_file,
        on_problem=lambda message: logger.warning("network KV tier: %s", message),
    )


# Misses that are the KV server's state, logged once per episode by the link.
_QUIET = frozenset(
    miss.value
    for miss in (
        Miss.ABSENT,
        Miss.SERVER_DOWN,
        Miss.SERVER_SLOW,
        Miss.SERVER_FULL,
        Miss.MOVED,
        Miss.NODE_REFUSED,  # warned once per node by the cluster's map
    )
)
# A refused or bad value's warning: how many, which transfer, why, the
# value's detail, how long the next ones are only counted.
_UNUSABLE = (
    "network KV tier: %d block(s) of a %s could not be used (%s%s); recomputed. "
    "The next ones for this reason are only counted for %.0f s."
)
# Failures that are not about the value found.
_NOT_THE_VALUE = frozenset({Miss.REFUSED.value, Miss.ERROR.value, Miss.UNREAD.value})
