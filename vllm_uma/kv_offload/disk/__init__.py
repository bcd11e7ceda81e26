"""L3, the disk tier: KV blocks in content-addressed files under a root_dir.

Engine-core process. vLLM's tiering (``vllm/v1/kv_offload/tiering/``) loads
:class:`tier.DiskTier` as a secondary tier behind the host pool (L2) and
hands it the pool's memory; blocks move between pool rows and files on the
tier's own I/O threads, so serving never waits on the disk.

    config.py            the fs tier's JSON, checked once (cap, root_dir)
    namespace.py         what shapes the KV bytes -> a 16-byte namespace id
    layout.py            directories under root_dir; the start-up scan
    block_file.py        one block per file: format, atomic write, checked read
    index.py             which blocks are on disk, LRU, cap, pins (scheduler side)
    io_threads.py        the threads that read and write block files
    jobs.py              a store or load job across its blocks
    tier.py              the tier vLLM calls: lookups, stores, loads, eviction
    metrics.py           its /metrics counters
    messages.py          what the tier logs: start-up, full disk, bad blocks, stop
"""
