"""KV memory that follows the working set: free KV pages go back to the system.

On one RAM the KV cache (L1) and the host pool (L2) share memory with
everything else, and a page once touched stays resident: a server that was
busy once would hold its peak for ever. This package gives back what is
worth less than its RAM, when the server has been idle a while and when the
kernel says memory is short.

Where each piece runs (all in the engine-core process, the 'uni' executor):

    worker (UmaWorker)                 scheduler (UmaScheduler, its lock)
    l1_pages.py: block -> byte ranges  l1_blocks.py: free L1 blocks, by value
        |  (addresses only)            pool_rows.py: free / idle pool rows,
        |                                  asked of kv_offload/pool_manager.py
        +--> the engine's context -->  releaser.py:  idle pass, pressure pass
                                       tiers.py:     BlockHolder, the question
                                                     asked of the pool and disk
                                       pressure.py:  PSI, MemAvailable, cgroup
                                       warm_reserve.py: the blocks and rows
                                                     the next request gets,
                                                     kept resident
                                       scheduler.py: the release thread
    pages.py: madvise (DONTNEED for L1, REMOVE for the shmem pool,
              POPULATE_WRITE for the warm reserve),
              mincore (what was resident, counted exactly)
    resident.py: a server's resident KV from /proc/PID/smaps (tools, tests)

Invariant: a block or row leaves every index that could find it (vLLM's
prefix cache, the pool manager's policy) before its pages go back, so a later
hit is a restore or a recompute, never stale bytes; nothing in use or read
by a copy in flight is touched. The worker closes the page map (waiting for a
pass in progress) before it frees the KV cache; the scheduler keeps its own
reference to the pool until its thread has stopped.

Settings (``--additional-config '{"vllm_uma": {...}}'``, plugin/uma_settings.py):
``release_free_kv`` (default true), ``release_idle_seconds`` (60),
``memory_pressure`` ("psi" or "off"; default "psi"), ``warm_kv_tokens``
(8192; 0 turns the warm reserve off). docs/memory.md.
"""
