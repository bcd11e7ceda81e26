"""One vLLM job's blocks moved between pool rows and the KV server, pipelined.

Runs on the network tier's transfer threads (engine-core process), the only
place values cross the network while serving. A job is a prefix's blocks
(vLLM submits one per request and step): a load is one round trip per
``BATCH_BLOCKS`` names, a store one per batch of SETs, so a job costs a
round trip per batch, not per block, and at most a batch of values (8 x
2.9 MB for the default model) is in this process's memory at once. In a
cluster a batch is one round trip per node it touches, all nodes at once,
with one MGET per slot (server_link.py); a node that does not answer makes
misses of its keys only.

A load has one deadline, a timeout from its submission (the request waits
from then): every send and socket read of its round trips honours it
(round_trips.py), and what is not back by then is a miss (``engine_slow``),
recomputed. A store's round trips each have a timeout, so a store lasts at
most a timeout per batch, and a KV server that takes none of it costs one
timeout: it is down then, and the rest fail at once. A value is read only
up to one block's value bytes: a longer one is refused unread (its
connection dropped), counted as a bad value, and deleted from the KV server.

A function here never touches the tier's state: it says what happened in
a ``TransferDone`` that the scheduler thread applies (tier.py), one per
job; one that raises (a bug) ends its job as misses all the same.

The threads are the lower tier's (lower_tier/threads.py), two of them,
``uma-kv-net-{i}``: the first runs loads only, the other a load first
whenever one waits, else a store. A store to a slow KV server holds its
thread for up to a timeout per batch (round_trips.py), so a priority alone
would let a load wait behind it; with a thread of its own, a load waits
only for the loads before it, and its deadline runs from its submission:
a load queued too long is a miss at once, not a late one. Two threads, not
more: a load can overlap a store, or another load, and the sockets release
the GIL; more would fight the server for this machine's two cores. A job a
stop drops ends as misses (``engine_down``).
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from enum import Enum

from valkey.exceptions import OutOfMemoryError

from vllm_uma.kv_offload.disk.block_file import BadBlock
from vllm_uma.kv_offload.lower_tier.threads import TierThreads
from vllm_uma.kv_offload.mac_keys import KeyRing, KeySource
from vllm_uma.kv_offload.network import round_trips
from vllm_uma.kv_offload.network.reply_bounds import OversizedReply
from vllm_uma.kv_offload.network.round_trips import TooSlow, Unread
from vllm_uma.kv_offload.network.server_link import (
    LINK_ERRORS,
    REDIRECTIONS,
    NodeRefused,
    ServerLink,
)
from vllm_uma.kv_offload.network.value_format import pack_value, unpack_value, value_bytes

BATCH_BLOCKS = 8
TRANSFER_THREADS = 2


class Miss(Enum):
    """Why a block was not moved, beside a bad value's BadReason (metric label).

    The KV server's three keep "engine" in their label values, the word this
    project used for the KV server before: dashboards and alerts match them."""

    ABSENT = "absent"  # a load found no value: evicted by the KV server, or never stored
    SERVER_DOWN = "engine_down"  # no answer in time, or the link is down
    SERVER_SLOW = "engine_slow"  # answers, but not all of a load by its deadline
    SERVER_FULL = "engine_full"  # a store refused with an OOM error
    MOVED = "moved"  # a cluster's slot moved (MOVED, ASK): its map is read again
    NODE_REFUSED = "node_refused"  # the slot's primary is not trusted (node_trust.py)
    REFUSED = "refused"  # another error reply (an ACL's NOPERM, ...)
    ERROR = "error"  # a bug of ours; the block is a miss all the same
    OVERSIZED = "oversized"  # a value over one block's bytes: refused unread (a bad value)
    UNREAD = "unread"  # after an oversized value on its connection, which was dropped


@dataclass(frozen=True, slots=True)
class Transfer:
    """One vLLM job as a transfer thread sees it."""

    job_id: int
    is_load: bool
    keys: tuple[bytes, ...]
    names: tuple[bytes, ...]  # the KV server's key per block (value_format.py)
    rows: tuple[memoryview, ...]  # the primary rows, pinned by vLLM until the result
    deadline: float | None = None  # time.monotonic(): a load's, from its submission


@dataclass(slots=True)
class TransferDone:
    job_id: int
    is_load: bool
    failed: dict[bytes, str] = field(default_factory=dict)  # key -> Miss or BadReason value
    moved: list[bytes] = field(default_factory=list)
    nbytes: int = 0
    start: float = float("inf")  # perf_counter at the start and end of the round trips
    end: float = 0.0
    bad: list[str] = field(default_factory=list)  # what was wrong with each bad value


def failed_all(transfer: Transfer, reason: Miss) -> TransferDone:
    done = TransferDone(transfer.job_id, transfer.is_load)
    done.failed = dict.fromkeys(transfer.keys, reason.value)
    return done


def start_transfer_threads(
    done: queue.SimpleQueue, num_threads: int = TRANSFER_THREADS
) -> TierThreads[Transfer]:
    """The tier's transfer threads: each job's ``TransferDone`` on ``done``."""
    return TierThreads(
        "uma-kv-net",
        num_threads,
        done,
        failed=_failed_by_bug,
        dropped=_dropped,
        load_only=1,
    )


# A pin refresh (pin_refresh.py) shares the threads: it has no job to end.
def _failed_by_bug(transfer: Transfer, exc: Exception) -> TransferDone | None:
    if not isinstance(transfer, Transfer):
        return None
    done = failed_all(transfer, Miss.ERROR)
    done.bad.append(f"{type(exc).__name__}: {exc}")
    return done


def _dropped(transfer: Transfer) -> TransferDone | None:
    return failed_all(transfer, Miss.SERVER_DOWN) if isinstance(transfer, Transfer) else None


def run_transfer(
    link: ServerLink, namespace: bytes, keys: KeySource | None, transfer: Transfer
) -> TransferDone:
    """``keys`` None: values unsigned, by the user's choice (value_format.py)."""
    if link.fail_fast():
        return failed_all(transfer, Miss.SERVER_DOWN)
    move = load_blocks if transfer.is_load else store_blocks
    # One key ring per job: a rotation lands between jobs, never inside one.
    return move(link, namespace, transfer, None if keys is None else keys.keys())


def _batches(transfer: Transfer):
    for i in range(0, len(transfer.keys), BATCH_BLOCKS):
        end = i + BATCH_BLOCKS
        yield i, zip(transfer.keys[i:end], transfer.names[i:end], transfer.rows[i:end], strict=True)


def load_blocks(
    link: ServerLink, namespace: bytes, transfer: Transfer, keys: KeyRing | None
) -> TransferDone:
    done = TransferDone(transfer.job_id, transfer.is_load)
    bad_names: list[bytes] = []
    start = time.perf_counter()
    largest = value_bytes(transfer.rows[0].nbytes)
    for i, batch in _batches(transfer):
        if transfer.deadline is not None and time.monotonic() >= transfer.deadline:
            # The request waited a timeout already: the rest is recomputed
            # rather than waited for.
            done.failed.update(dict.fromkeys(transfer.keys[i:], Miss.SERVER_SLOW.value))
            break
        blocks = list(batch)
        names = [name for _, name, _ in blocks]
        values = round_trips.mget(link, names, "a load", largest, transfer.deadline)
        for (key, name, row), value in zip(blocks, values, strict=True):
            if value is None:
                done.failed[key] = Miss.ABSENT.value
            elif isinstance(value, OversizedReply):
                done.failed[key] = Miss.OVERSIZED.value
                # No server of ours writes one: something else writes under our names.
                done.bad.append(
                    f"{name.decode()}: {value}; deleted. Only this fleet's servers should write "
                    f"to the KV server: give it a password or an ACL user of its own"
                )
                bad_names.append(name)
            elif isinstance(value, Exception):
                done.failed[key] = miss_of(value).value
            elif _unpacked(done, key, name, namespace, row, value, keys):
                done.moved.append(key)
                done.nbytes += row.nbytes
            else:
                bad_names.append(name)
    done.start, done.end = start, time.perf_counter()
    _forget(link, bad_names, transfer.deadline)
    return done


def _unpacked(done: TransferDone, key, name, namespace, row, value, keys) -> bool:
    try:
        unpack_value(value, name, key, namespace, row, keys=keys)
        return True
    except BadBlock as bad:
        done.failed[key] = bad.reason.value
        done.bad.append(str(bad))
        return False


def miss_of(error: Exception) -> Miss:
    """The miss a key's error reply makes (NoAnswer: its node did not answer)."""
    if isinstance(error, NodeRefused):
        return Miss.NODE_REFUSED
    if isinstance(error, OversizedReply):
        return Miss.OVERSIZED
    if isinstance(error, Unread):
        return Miss.UNREAD
    if isinstance(error, TooSlow):
        return Miss.SERVER_SLOW
    if isinstance(error, LINK_ERRORS):
        return Miss.SERVER_DOWN
    text = str(error)
    if text.startswith(REDIRECTIONS):  # the link reads the cluster's map again
        return Miss.MOVED
    if text.startswith("CLUSTERDOWN"):  # the cluster lost a node's slots
        return Miss.SERVER_DOWN
    return Miss.REFUSED


def _forget(link: ServerLink, names: list[bytes], deadline: float | None) -> None:
    """Delete values that can never be served, so that no lookup finds them
    again. A good copy another server stored meanwhile may go too: a miss,
    never wrong bytes. An error reply (the ACL may forbid DEL), or the
    load's deadline gone, leaves the value a counted miss."""
    if names:
        commands = [("DEL", name) for name in names]
        round_trips.each_key(link, names, commands, "deleting bad values", deadline)


def store_blocks(
    link: ServerLink, namespace: bytes, transfer: Transfer, keys: KeyRing | None
) -> TransferDone:
    done = TransferDone(transfer.job_id, transfer.is_load)
    start = time.perf_counter()
    for _, batch in _batches(transfer):
        blocks = list(batch)
        names = [name for _, name, _ in blocks]
        # The batch's values live until its round trip ends, no longer.
        commands = [
            ("SET", name, pack_value(key, namespace, row, keys=keys)) for key, name, row in blocks
        ]
        replies = round_trips.each_key(link, names, commands, "a store")
        del commands
        for (key, name, row), reply in zip(blocks, replies, strict=True):
            if isinstance(reply, OutOfMemoryError):
                link.refused_write(link.node_of(name), reply)
                done.failed[key] = Miss.SERVER_FULL.value
            elif isinstance(reply, Exception):
                done.failed[key] = miss_of(reply).value
            else:
                done.moved.append(key)
                done.nbytes += row.nbytes
                link.took_write(link.node_of(name))  # ends a full node's episode, if one was on
    done.start, done.end = start, time.perf_counter()
    return done
