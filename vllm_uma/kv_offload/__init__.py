"""KV offloading on the unified-memory platform: L1 -> L2 -> L3.

    L1  vLLM's own KV cache (RAM), managed by vLLM
    L2  host_pool.py (anonymous shared memory), filled and read by mover.py
        on the worker side
    L3  disk/ (block files under a root_dir) and network/ (a Valkey/Redis
        server every host reads), secondary tiers behind L2, each on the
        lower tiers' skeleton (lower_tier/: threads and jobs)

Scheduler side (engine core, decides what is where): connector.py and
holds.py (no block lost when the pool is full), pool_manager.py (vLLM's
pool manager, the book of rows ours), disk/index.py. Worker side
(moves bytes): mover.py, disk/io_tasks.py, network/transfers.py. config.py
turns vLLM's flags into the spec that spec.py builds both sides from,
refusals.py refuses what offloading cannot serve, pool_size.py sizes the
host pool; metrics.py counts.
The network tier (network/) signs every value with the fleet's secret:
mac_keys.py reads the keys, block_mac.py puts the tag in a block's header.
"""
