"""vLLM's Scheduler's public methods, each reviewed: under the release lock or not, and why.

The release thread (memory_release/scheduler.py) reads and changes the block
pool, the host pool's manager and the disk tier's index. Every public
Scheduler method that changes one of those, or reaches a method that does,
holds the lock: ``ReleasingScheduler`` wraps each name in ``LOCKED``. The
others are in ``UNLOCKED`` with the reason. The contract checks that vLLM's
Scheduler (and AsyncScheduler) has exactly these public names, so a method
added by a vLLM upgrade fails the scheduler module's import until someone
puts it in one list or the other; tests/unit/test_scheduler_lock.py checks
that every ``LOCKED`` name really takes the lock.
"""

from __future__ import annotations

LOCKED: dict[str, str] = {
    "schedule": "allocates and frees blocks, builds the connector's store and load jobs",
    "update_from_output": "frees finished requests' blocks, completes transfers in the pool",
    "add_request": "a new request: the connector starts tracking it, idleness ends",
    "finish_requests": "aborts free blocks and finish requests in the connector",
    "reset_prefix_cache": "empties the prefix cache and, with the connector, the host pool",
    "reset_connector_cache": "empties the host pool's manager (reset_cache); also reached "
    "through reset_prefix_cache",
    "make_stats": "takes the prefix-cache and connector counters (reset on read)",
}

UNLOCKED: dict[str, str] = {
    "get_ec_connector": "returns an attribute",
    "get_kv_connector": "returns an attribute",
    "get_kv_event_publisher_config": "reads the publisher's config",
    "get_kv_cache_usage": "reads one number from the block pool; a pass in progress "
    "only moves free blocks, which it does not count",
    "get_num_unfinished_requests": "reads queue lengths",
    "get_request_counts": "reads queue lengths",
    "has_finished_requests": "reads queue lengths",
    "has_unfinished_requests": "reads queue lengths",
    "has_requests": "read-only; the release thread calls it under the lock itself",
    "pause_state": "a property: reads one attribute",
    "set_pause_state": "stores one attribute, read atomically through has_requests",
    "get_grammar_bitmask": "structured-output state only, never blocks or pool rows",
    "update_draft_token_ids": "speculative tokens of requests only",
    "update_draft_token_ids_in_output": "speculative tokens of one scheduler output only",
    "make_spec_decoding_stats": "builds a stats object from its arguments",
    "reset_encoder_cache": "the encoder cache, which the release thread never touches",
    "shutdown": "ours stops and joins the release thread before vLLM's shutdown runs",
}
