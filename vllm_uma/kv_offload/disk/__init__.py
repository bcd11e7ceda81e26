"""L3, the disk tier: KV blocks in content-addressed files under a root_dir.

Engine-core process. vLLM's tiering (``vllm/v1/kv_offload/tiering/``) loads
:class:`tier.DiskTier` as a secondary tier behind the host pool (L2) and
hands it the pool's memory; blocks move between pool rows and files on the
tier's own I/O threads (the lower tier's skeleton, ../lower_tier/), so
serving never waits on the disk.

The tier vLLM calls (scheduler thread):
    tier.py              DiskTier: lookups, store and load submission, life cycle
    tier_startup.py      open the store, load what it holds (once, before serving)
    completion.py        a disk job (../lower_tier/jobs.py, its pins and deadline); the
                         I/O's outcomes applied to the index; jobs finished
    index.py             which blocks are on disk, for lookups without a syscall; a
                         block's states (WRITING / PRESENT / DELETING), index and ledger
    full_disk.py         a full volume: stores paused, retried, resumed; the start-up's
                         settling, when a full disk put it off
    reports.py           its /metrics counters besides the shared ones (../lower_tier/),
                         and what it logs: full disk, bad blocks, stop, each kind once
The files (I/O threads, start-up):
    block_file.py        one block per file: the header, the names, BadBlock
    block_write.py       a block file written atomically (temp file, rename); whether
                         rows and the volume take O_DIRECT
    block_read.py        a block file read back checked, or why it cannot be served
    layout.py            directories under root_dir, walked without following a link
    store_scan.py        the start-up scan: block files found, stale temp files removed;
                         whether a temp file's or a ledger row's writer is alive
    io_tasks.py          one block file stored, loaded or deleted, the ledger kept; the
                         I/O threads that run them (../lower_tier/threads.py: loads first)
    io_descriptors.py    what is submitted (BlockIO) and what comes back (Outcome)
    trust.py             who could have written the store, checked at start-up
    progress.py          a long start-up step that says how far it got
The store shared by every server on it:
    ledger/              the SQLite ledger: one cap, one LRU order, a change feed
Settings and identity (API server and engine core):
    settings.py          the fs tier's JSON, checked once (cap, root_dir)
    namespace.py         what shapes the KV bytes -> a 16-byte namespace id
    namespace_inputs.py  those inputs, read once from the server's configuration
The administrator's process:
    admin.py             ``vllm-uma kv-store``: ls, du, verify, prune, clear
"""
