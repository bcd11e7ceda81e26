"""Contract entries of the KV memory release: pool rows, the release lock, L1 blocks and pages.

Our pool manager (kv_offload/pool_manager.py) keeps the book of rows of
vLLM's manager and releases idle rows with vLLM's own step; memory_release/
evicts L1 blocks the way vLLM's block pool does and holds its lock over
vLLM's Scheduler; each member they read or call is listed here. The
l1_pages entry (a module that imports no vLLM module) is a text read from
vLLM's file, so that checking it imports nothing.
"""

from __future__ import annotations

from vllm_uma.plugin.vllm_contract import scheduler_methods
from vllm_uma.plugin.vllm_contract.kinds import (
    Attribute,
    InstanceAttribute,
    Method,
    PublicNames,
    Text,
)
from vllm_uma.plugin.vllm_contract.members import members

MANAGER = "vllm.v1.kv_offload.cpu.manager:CPUOffloadingManager"
POLICY = "vllm.v1.kv_offload.cpu.policies.base:CachePolicy"
CHUNK = "vllm.v1.kv_offload.cpu.policies.base:ChunkStatus"
EVENT = "vllm.v1.kv_offload.base:OffloadingEvent"
SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
TIERING = "vllm.v1.kv_offload.tiering.manager:TieringOffloadingManager"
BLOCK_POOL = "vllm.v1.core.block_pool:BlockPool"
FREE_QUEUE = "vllm.v1.core.kv_cache_utils:FreeKVCacheBlockQueue"
BLOCK = "vllm.v1.core.kv_cache_utils:KVCacheBlock"
LRU = "vllm.v1.kv_offload.cpu.policies.lru:LRUCachePolicy"

PM = ("vllm_uma.kv_offload.pool_manager",)
RELEASE = ("vllm_uma.memory_release.scheduler",)
BLOCKS = ("vllm_uma.memory_release.l1_blocks",)
PINS = ("vllm_uma.kv_offload.pins.pool_policy",)
# The lower tiers announce their stores and removals with the same event.
TIER_REPORTS = ("vllm_uma.kv_offload.lower_tier.reports",)


def _reviewed(scheduler: str) -> PublicNames:
    return PublicNames(
        scheduler,
        "",
        RELEASE,
        "each public method is reviewed: locked or not (scheduler_methods.py)",
        names=frozenset(scheduler_methods.LOCKED) | frozenset(scheduler_methods.UNLOCKED),
    )


ENTRIES = (
    # -- kv_offload/pool_manager.py: vLLM's manager with the book of rows ours
    members(
        MANAGER,
        *(
            InstanceAttribute(
                MANAGER,
                field,
                PM,
                "a property of PoolManager over its RowBook: vLLM's methods keep our book; "
                "a rename would leave the book behind vLLM's own field",
            )
            for field in ("_num_allocated_chunks", "_free_list", "_num_evictable_cache_chunks")
        ),
        Text(
            MANAGER,
            "_allocate_chunks",
            PM,
            "PoolManager.next_rows: fresh rows past the mark first, then the free list's end",
            text="chunks.append(ChunkStatus(self._free_list.pop()))",
        ),
        InstanceAttribute(MANAGER, "_policy", PM, "the cache policy: idle rows, LRU order (read)"),
        InstanceAttribute(MANAGER, "events", PM, "where a release is announced"),
        InstanceAttribute(MANAGER, "medium", PM, "the medium of that announcement"),
        Text(
            MANAGER,
            "prepare_store",
            PM,
            "PoolManager.release_idle is this eviction step: counted out of the idle rows...",
            text="self._num_evictable_cache_chunks -= len(evicted)",
        ),
        Text(
            MANAGER,
            "_free_chunk",
            PM,
            "...and onto the free list, as _free_chunk does",
            text="self._free_list.append(chunk.chunk_id)",
        ),
        Method(
            MANAGER,
            "__init__",
            PM,
            "PoolManager.__init__ passes num_chunks on by keyword",
            params=(
                "num_chunks",
                "cache_policy",
                "cache_policy_module_path",
                "enable_events",
                "store_threshold",
                "max_tracker_size",
            ),
        ),
    ),
    members(
        POLICY,
        Method(POLICY, "evict", PM, "takes idle rows, LRU first", ("n", "protected")),
        Method(POLICY, "get", PM, "does the pool hold a key", ("key",)),
    ),
    # -- and kv_offload/pins/pool_policy.py: vLLM's policies, pinned keys protected
    members(
        LRU,
        InstanceAttribute(
            LRU,
            "chunks",
            PM,
            "read with a default (ARC has none): a rename would silently release nothing",
        ),
        Text(
            LRU,
            "evict",
            PINS,
            "asks only `in` of its protected set (ours adds pinned keys to `in`)",
            text="if key in protected",
        ),
    ),
    Text(
        "vllm.v1.kv_offload.cpu.policies.arc:ARCCachePolicy",
        "evict",
        PINS,
        "asks only `in` of its protected set (ours adds pinned keys to `in`)",
        text="key not in protected",
    ),
    Method(
        "vllm.v1.kv_offload.cpu.policies.factory:CachePolicyFactory",
        "register_cache_policy",
        PINS,
        "registers the pin-aware twins under names of ours",
        ("name", "module_path", "class_name"),
    ),
    members(
        CHUNK,
        Attribute(CHUNK, "ref_cnt", PM, "0 means idle"),
        Attribute(CHUNK, "chunk_id", PM, "the row number"),
        Attribute(CHUNK, "is_ready", PM, "written and readable"),
    ),
    members(
        EVENT,
        Attribute(EVENT, "keys", PM + TIER_REPORTS, "built by keyword"),
        Attribute(EVENT, "medium", PM + TIER_REPORTS, "built by keyword"),
        Attribute(EVENT, "removed", PM + TIER_REPORTS, "built by keyword"),
        Attribute(EVENT, "locality", TIER_REPORTS, "built by keyword"),
        Attribute(EVENT, "ownership", TIER_REPORTS, "built by keyword"),
    ),
    # -- memory_release/scheduler.py: the release lock over vLLM's Scheduler
    members(
        SCHEDULER,
        _reviewed(SCHEDULER),
        Method(SCHEDULER, "add_request", RELEASE, "overridden: notes activity", ("request",)),
        Method(SCHEDULER, "shutdown", RELEASE, "overridden: stops the release thread first", ()),
        Method(SCHEDULER, "has_requests", RELEASE, "idle means no request", ()),
        Method(
            SCHEDULER, "get_kv_connector", RELEASE, "the offloading connector, if any (public)", ()
        ),
        InstanceAttribute(SCHEDULER, "kv_cache_manager", RELEASE, "its block_pool is L1"),
    ),
    _reviewed("vllm.v1.core.sched.async_scheduler:AsyncScheduler"),
    members(
        TIERING,
        InstanceAttribute(
            TIERING,
            "primary_tier",
            RELEASE,
            "read with a default: a rename would give back rows of the wrong object",
        ),
        InstanceAttribute(
            TIERING,
            "secondary_tiers",
            RELEASE,
            "read with a default: a rename would forget the disk tier's holds",
        ),
    ),
    # -- memory_release/l1_blocks.py: takes free blocks out of vLLM's prefix cache
    members(
        BLOCK_POOL,
        Method(
            BLOCK_POOL, "evict_blocks", BLOCKS, "drops blocks from the prefix cache", ("block_ids",)
        ),
        InstanceAttribute(BLOCK_POOL, "blocks", BLOCKS, "every block by id"),
        InstanceAttribute(BLOCK_POOL, "free_block_queue", BLOCKS, "free blocks, eviction order"),
        Text(
            BLOCK_POOL,
            "get_new_blocks",
            BLOCKS,
            "the warm reserve is the front of the free queue: allocations take it first",
            text="self.free_block_queue.popleft_n(num_blocks)",
        ),
    ),
    members(
        FREE_QUEUE,
        Method(FREE_QUEUE, "get_all_free_blocks", BLOCKS, "free blocks, LRU first", ()),
        Method(FREE_QUEUE, "remove", BLOCKS, "moves a given-back block", ("block",)),
        Method(FREE_QUEUE, "prepend_n", BLOCKS, "to the front: reused first", ("blocks",)),
        InstanceAttribute(
            FREE_QUEUE, "fake_free_list_head", BLOCKS, "next_free walks from the front"
        ),
        InstanceAttribute(FREE_QUEUE, "fake_free_list_tail", BLOCKS, "next_free stops at the end"),
    ),
    members(
        BLOCK,
        Attribute(BLOCK, "next_free_block", BLOCKS, "the free queue's links"),
        Attribute(BLOCK, "ref_cnt", BLOCKS, "in use when > 0"),
        Attribute(BLOCK, "is_null", BLOCKS, "the null block is never given back"),
        Attribute(BLOCK, "block_id", BLOCKS, "the block's id"),
        Attribute(BLOCK, "block_hash", BLOCKS, "cached when set"),
    ),
    # -- memory_release/l1_pages.py (imports no vLLM module: a text)
    Text(
        "vllm.v1.kv_cache_interface",
        "",
        ("vllm_uma.memory_release.l1_pages",),
        "read with a default: a rename would map every layer of a uniform group wrongly",
        text="    kv_cache_specs: dict[str, KVCacheSpec]",
    ),
)
