"""L3 ledger: making room under the cap, the least recent blocks of any server first.

Runs inside the ledger's write transactions (blocks.py), on the I/O threads
and at start-up of engine-core processes. A victim is chosen, then condemned
(DELETING: still counted, its name taken) in the same transaction; its file
is unlinked and its row released after it (``Ledger._delete_files``), so the
unlink never holds every server's lock.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from enum import Enum
from typing import NamedTuple

from vllm_uma.kv_offload.disk.block_file import pid_is_alive
from vllm_uma.kv_offload.disk.index import BlockState
from vllm_uma.kv_offload.disk.layout import BlockRef
from vllm_uma.kv_offload.disk.ledger.db import add_used, log_change, meta_value, used

# A row being written or deleted this long is abandoned whatever its pid
# says (the pid may have been reused, or be another host's).
STALE_WRITE_S = 3600
_PAGE = 256  # victim candidates read per query

# A block that a live pin holds (pins/book.py): never a victim of the LRU.
# One parameter, the time now; correlated with the row of ``blocks`` read.
PINNED_BLOCK = (
    "EXISTS (SELECT 1 FROM pin_blocks pb JOIN pins p ON p.ns=pb.ns AND p.name=pb.name "
    "WHERE pb.ns=blocks.ns AND pb.key=blocks.key AND (p.expires IS NULL OR p.expires>?))"
)

Protected = Callable[[BlockRef], bool]


class Refusal(Enum):
    """Why a store cannot get room (also the metric label)."""

    TOO_BIG = "too_big"  # the block alone is larger than the cap
    NO_ROOM = "no_room"  # the rest is pinned or being written right now


class Victim(NamedTuple):
    ref: BlockRef
    size: int
    state: BlockState  # PRESENT, or an abandoned WRITING / DELETING row


def make_room(
    db: sqlite3.Connection,
    size: int,
    cap: int | None,
    protected: Protected,
    partial: bool = False,
) -> list[Victim] | None:
    """Victims that bring ``used + size`` within ``cap``; None if there are
    not enough (or, if ``partial``, as many as there are)."""
    if cap is None:
        return []
    # Bytes already being deleted are freed by whoever deletes them: not
    # counting them here keeps concurrent stores from evicting the same
    # room twice (and from running out of victims).
    excess = used(db) - meta_value(db, "deleting") + size - cap
    chosen: list[Victim] = []
    if excess <= 0:
        return chosen
    freed = 0
    for victim in _candidates(db):
        if victim.state is BlockState.PRESENT and protected(victim.ref):
            continue
        chosen.append(victim)
        freed += victim.size
        if freed >= excess:
            return chosen
    return chosen if partial else None


def _candidates(db: sqlite3.Connection) -> Iterator[Victim]:
    """Present blocks no live pin holds, least recent first, then rows a
    dead process left being written or deleted."""
    after = (-1, b"", b"")
    while True:
        page = db.execute(
            "SELECT ns, key, size, last_use FROM blocks WHERE state=? "
            f"AND (last_use, ns, key) > (?, ?, ?) AND NOT {PINNED_BLOCK} "
            "ORDER BY last_use, ns, key LIMIT ?",
            (BlockState.PRESENT, *after, time.time(), _PAGE),
        ).fetchall()
        for ns, key, size, _ in page:
            yield Victim(BlockRef(ns, key), size, BlockState.PRESENT)
        if len(page) < _PAGE:
            break
        after = (page[-1][3], page[-1][0], page[-1][1])
    now = time.time()
    for ns, key, size, state, pid, since in db.execute(
        "SELECT ns, key, size, state, writer_pid, since FROM blocks WHERE state!=?",
        (BlockState.PRESENT,),
    ).fetchall():
        if now - since > STALE_WRITE_S or not pid_is_alive(pid):
            yield Victim(BlockRef(ns, key), size, BlockState(state))


def condemn(db: sqlite3.Connection, victims: list[Victim], writer: str) -> list[Victim]:
    """Inside the transaction: every victim becomes DELETING, ours (still
    counted, its name taken); returns what ``Ledger._delete_files`` must
    finish. A present one is announced as removed. An abandoned write may
    have its file already: a writer killed between the rename and the commit
    left a complete file the row no longer described, so its file is
    unlinked like any victim's (a missing one is no error) and its bytes are
    released after, never before."""
    doomed = []
    for victim in victims:
        ref = victim.ref
        db.execute(
            "UPDATE blocks SET state=?, writer=?, writer_pid=?, since=? WHERE ns=? AND key=?",
            (BlockState.DELETING, writer, os.getpid(), time.time(), ref.namespace, ref.key),
        )
        if victim.state is BlockState.PRESENT:
            log_change(db, ref, victim.size, added=False, writer=writer)
        if victim.state is not BlockState.DELETING:  # a dead deleter's: counted already
            add_used(db, victim.size, "deleting")
        doomed.append(victim)
    return doomed
