"""What our namespaces hold in the KV server, counted in bounded steps.

Used by the tier at start-up (its share of the KV server, in its log line)
and by ``vllm-uma kv-store URL`` (commands/kv_store_server.py). Only
names of ours (key_names.py) are read or deleted: other applications may
share the KV server.

How the KV server is walked: SCAN with MATCH on our prefix (never KEYS, which
blocks the KV server for the whole keyspace), ``SCAN_BATCH`` names a call, and
for each batch one pipeline of MEMORY USAGE. MEMORY USAGE, not STRLEN:
STRLEN resets a key's LRU clock (seen on valkey-server 9.1.2: OBJECT
IDLETIME back to 0) and a survey would make every block look fresh to
``allkeys-lru``; MEMORY USAGE leaves it, and it counts what the KV server
counts against ``maxmemory`` (the value and its overhead).

The descriptor: a small JSON (model, KV dtype, weights' hash, block
bytes, vLLM version: the head of the disk tier's namespace.json) the tier
writes at start-up and at each reconnect, since a value's header holds the
namespace id only. The
KV server may evict it like any key; ``ls`` then shows ``?`` for the model
until a server of that namespace starts or reconnects.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

from vllm_uma.kv_offload.network.key_names import (
    descriptor_name,
    match_blocks,
    match_ours,
    namespace_of,
)

SCAN_BATCH = 1000
# What a descriptor keeps of the namespace's description (disk/namespace.py).
DESCRIPTOR_FIELDS = ("model", "kv_dtype", "weights_blake3", "worker_kv_bytes_per_block")


@dataclass
class Usage:
    """One namespace's blocks in the KV server; ``complete`` False: at least these."""

    blocks: int = 0
    bytes: int = 0
    complete: bool = True


@dataclass
class NamespaceUsage(Usage):
    namespace: str = ""  # hex id
    info: dict | None = None  # the descriptor, if the KV server still holds it

    @property
    def model(self) -> str:
        return str((self.info or {}).get("model", "?"))

    @property
    def kv_dtype(self) -> str:
        return str((self.info or {}).get("kv_dtype", "?"))


def write_descriptor(client, namespace: bytes, info: dict) -> None:
    kept = {k: info[k] for k in DESCRIPTOR_FIELDS if k in info}
    vllm = (info.get("server") or {}).get("vllm")
    if vllm is not None:
        kept["vllm"] = vllm
    client.set(descriptor_name(namespace), json.dumps(kept, sort_keys=True).encode())


def read_descriptors(client, namespaces: list[str]) -> dict[str, dict]:
    """The descriptors the KV server still holds, by namespace hex."""
    if not namespaces:
        return {}
    # GETs, not one MGET: a cluster would refuse an MGET across its nodes.
    pipe = client.pipeline(transaction=False)
    for ns in namespaces:
        pipe.get(descriptor_name(bytes.fromhex(ns)))
    values = pipe.execute()
    found = {}
    for ns, value in zip(namespaces, values, strict=True):
        try:
            info = json.loads(value) if value is not None else None
        except ValueError:
            info = None  # not one we wrote: shown as unknown
        if isinstance(info, dict):
            found[ns] = info
    return found


class Walk:
    """The names matching ``match``, each once, in batches of up to about
    ``SCAN_BATCH`` (SCAN's COUNT is a hint). Cut at the first batch past
    ``deadline`` (a ``time.monotonic()``) or once ``max_keys`` names came;
    ``complete`` says afterwards whether the whole keyspace was walked."""

    def __init__(
        self, client, match: bytes, deadline: float | None = None, max_keys: int | None = None
    ):
        self._client = client
        self._match = match
        self._deadline = deadline
        self._max_keys = max_keys
        self.complete = False

    def __iter__(self) -> Iterator[list[bytes]]:
        # SCAN may return a name twice while the KV server resizes its table:
        # the names seen are kept, so that nothing is counted twice.
        cursor, seen = 0, set()
        while True:
            cursor, names = self._client.scan(cursor, match=self._match, count=SCAN_BATCH)
            names = [name for name in dict.fromkeys(names) if name not in seen]
            seen.update(names)
            if names:
                yield names
            if cursor == 0:
                self.complete = True
                return
            if self._deadline is not None and time.monotonic() >= self._deadline:
                return
            if self._max_keys is not None and len(seen) >= self._max_keys:
                return


def sizes(client, names: list[bytes]) -> list[int]:
    """MEMORY USAGE of each name, one round trip; 0 for one gone meanwhile."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.memory_usage(name)
    return [int(n or 0) for n in pipe.execute()]


def namespace_usage(
    client, namespace: bytes, deadline: float | None = None, max_keys: int | None = None
) -> Usage:
    """The blocks of one namespace: count and bytes, cut short by either bound."""
    usage = Usage()
    walk = Walk(client, match_blocks(namespace), deadline, max_keys)
    for names in walk:
        usage.blocks += len(names)
        usage.bytes += sum(sizes(client, names))
    usage.complete = walk.complete
    return usage


def survey(client) -> list[NamespaceUsage]:
    """Every namespace of ours with its blocks, bytes and descriptor; the
    largest first. A whole walk: the command's, not the tier's."""
    found: dict[str, NamespaceUsage] = {}
    for names in Walk(client, match_ours()):
        blocks: list[tuple[bytes, NamespaceUsage]] = []
        for name in names:
            what = namespace_of(name)
            if what is None:
                continue  # under our prefix, but not a shape we write: not ours
            usage = found.setdefault(what[0], NamespaceUsage(namespace=what[0]))
            if what[1]:
                blocks.append((name, usage))
        for (_, usage), nbytes in zip(blocks, sizes(client, [n for n, _ in blocks]), strict=True):
            usage.blocks += 1
            usage.bytes += nbytes
    descriptors = read_descriptors(client, sorted(found))
    for ns, usage in found.items():
        usage.info = descriptors.get(ns)
    return sorted(found.values(), key=lambda u: (-u.bytes, u.namespace))


def clear(client, namespace: str | None = None) -> tuple[int, int]:
    """UNLINK every name of ours (of ``namespace`` only, if given): how many
    names (blocks and descriptors) and their bytes. UNLINK frees a large
    value on the KV server's background thread, so a batch of blocks does not
    stall the KV server's other clients."""
    removed = nbytes = 0
    for names in Walk(client, match_ours(namespace)):
        ours = [name for name in names if _in(name, namespace)]
        if not ours:
            continue
        freed = sizes(client, ours)
        removed += client.unlink(*ours)
        nbytes += sum(freed)
    return removed, nbytes


def _in(name: bytes, namespace: str | None) -> bool:
    """A name of ours, and of ``namespace`` when one is given."""
    what = namespace_of(name)
    return what is not None and namespace in (None, what[0])
