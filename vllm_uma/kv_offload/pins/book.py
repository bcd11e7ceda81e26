"""The pins in the store's ledger: make, list, unpin, with the budget checked.

Any process that opens the store's ledger: the API server (http_api.py),
the engine core's feed thread (the live keys, the pruning of expired
pins), ``vllm-uma kv-store``. Each call is one short transaction
(disk/ledger/db.py), so two servers pinning at once are ordered and each
checks the budget against what the other committed.

A pin is (namespace, name) -> expiry, prompt tokens, block size, and its
keys in prefix order (``pin_blocks``). Pinning a name again replaces it (a
new expiry, new keys): that is how a pin is renewed. A pin may name blocks
that are not stored yet (a warm-up's stores land after its request ends):
the pin holds them from the moment they land.
"""

from __future__ import annotations

import math
import re
import sqlite3
import time
from dataclasses import dataclass

from vllm_uma.kv_offload.disk.index import BlockState
from vllm_uma.kv_offload.disk.ledger.db import LedgerDB
from vllm_uma.log import human_size

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A pin may live this long at most (ten years): a larger number is a mistake.
MAX_TTL_S = 10 * 365 * 86400.0

_LIVE = "(p.expires IS NULL OR p.expires>?)"


class PinError(ValueError):
    """A pin request the store refuses; the message has the numbers and the fix."""


class PinNotFound(PinError):
    """No live pin of that name."""


class PinOverBudget(PinError):
    """The pin would take pins over a tier's budget."""


@dataclass(frozen=True)
class PinBudget:
    """What pins may hold: a share of the disk tier's cap and of the pool."""

    share: float
    cap_bytes: int | None  # the disk tier's cap; None: no cap, no disk budget
    pool_rows: int | None = None  # the host pool's rows (this server's), if known

    @property
    def disk_bytes(self) -> int | None:
        return None if self.cap_bytes is None else int(self.cap_bytes * self.share)

    @property
    def pool_blocks(self) -> int | None:
        return None if self.pool_rows is None else int(self.pool_rows * self.share)


@dataclass(frozen=True)
class Pin:
    namespace: bytes
    name: str
    tokens: int
    blocks: int
    block_bytes: int
    created: float
    expires: float | None
    blocks_on_disk: int = 0

    @property
    def bytes(self) -> int:
        return self.blocks * self.block_bytes

    def as_json(self, now: float) -> dict:
        return {
            "name": self.name,
            "namespace": self.namespace.hex(),
            "tokens": self.tokens,
            "blocks": self.blocks,
            "bytes": self.bytes,
            "blocks_on_disk": self.blocks_on_disk,
            "created": self.created,
            "expires": self.expires,
            "ttl_s": None if self.expires is None else max(0.0, self.expires - now),
        }


def check_name(name) -> str:
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise PinError(
            f"pin name {name!r} is not valid: 1 to 64 characters of letters, digits, '.', "
            f"'_' or '-', starting with a letter or digit."
        )
    return name


def namespace_arg(value: str | None, listed_by: str) -> bytes | None:
    """A namespace given as hex (None: not given); ``listed_by`` names
    where the user finds them, for the error."""
    if value is None:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise PinError(f"namespace={value!r} is not hex ({listed_by} shows them)") from None


def check_ttl(ttl_s) -> float | None:
    """Seconds a pin lives; None (or absent): until unpinned."""
    if ttl_s is None:
        return None
    if (
        isinstance(ttl_s, bool)
        or not isinstance(ttl_s, int | float)
        or not math.isfinite(ttl_s)
        or not 0 < ttl_s <= MAX_TTL_S
    ):
        raise PinError(
            f"ttl_s {ttl_s!r} is not valid: a number of seconds above 0 and at most "
            f"{MAX_TTL_S:.0f} (ten years), or null to keep the pin until it is unpinned."
        )
    return float(ttl_s)


def pin(
    ledger: LedgerDB,
    namespace: bytes,
    name: str,
    keys: list[bytes],
    *,
    block_bytes: int,
    tokens: int,
    ttl_s: float | None,
    budget: PinBudget,
    now: float | None = None,
) -> Pin:
    """Make (or replace) the pin; PinError, with nothing changed, if it is
    empty or would take pins over the budget."""
    check_name(name)
    ttl_s = check_ttl(ttl_s)
    if not keys:
        raise PinError(
            f"pin {name!r} holds no block: its prompt of {tokens} tokens is shorter than one "
            f"KV block. Pin a longer prefix."
        )
    now = time.time() if now is None else now
    expires = None if ttl_s is None else now + ttl_s
    with ledger.transaction() as db:
        _prune(db, now)
        _drop(db, namespace, name)
        db.execute(
            "INSERT INTO pins VALUES (?,?,?,?,?,?)",
            (namespace, name, expires, now, tokens, block_bytes),
        )
        db.executemany(
            "INSERT INTO pin_blocks VALUES (?,?,?,?)",
            [(namespace, name, pos, key) for pos, key in enumerate(keys)],
        )
        _check_budget(db, namespace, name, len(keys), block_bytes, budget, now)
        on_disk = _on_disk(db, namespace, name)
    return Pin(namespace, name, tokens, len(keys), block_bytes, now, expires, on_disk)


def _check_budget(db, namespace, name, blocks, block_bytes, budget: PinBudget, now) -> None:
    """Inside the transaction, the new pin's rows in: over a budget raises
    (and the transaction rolls back)."""
    size = human_size(blocks * block_bytes)
    cap = human_size(budget.cap_bytes or 0)
    limit = budget.disk_bytes
    if limit is not None:
        total = db.execute(
            "SELECT coalesce(sum(bb), 0) FROM (SELECT max(p.block_bytes) bb FROM pin_blocks pb "
            f"JOIN pins p ON p.ns=pb.ns AND p.name=pb.name WHERE {_LIVE} GROUP BY pb.ns, pb.key)",
            (now,),
        ).fetchone()[0]
        if total > limit:
            raise PinOverBudget(
                f"pin {name!r} refused: its {blocks} blocks ({size}) would bring the disk "
                f"tier's pinned blocks to {human_size(total)}, over the pin budget of "
                f"{human_size(limit)} (pin_share {budget.share:g} of the {cap} cap). Unpin a "
                f"prefix (GET /v1/uma/pins lists them), or raise pin_share or max_size_gib in "
                f"the fs tier's settings."
            )
    rows = budget.pool_blocks
    if rows is not None:
        count = db.execute(
            "SELECT count(DISTINCT pb.key) FROM pin_blocks pb JOIN pins p ON p.ns=pb.ns AND "
            f"p.name=pb.name WHERE pb.ns=? AND {_LIVE}",
            (namespace, now),
        ).fetchone()[0]
        if count > rows:
            raise PinOverBudget(
                f"pin {name!r} refused: its {blocks} blocks ({size}) would bring this model's "
                f"pinned blocks to {count}, over the host pool's pin budget of {rows} blocks "
                f"(pin_share {budget.share:g} of its {budget.pool_rows} rows). Unpin a prefix "
                f"(GET /v1/uma/pins lists them), or raise --kv-offloading-size or pin_share."
            )


def unpin(ledger: LedgerDB, name: str, namespace: bytes | None = None) -> list[Pin]:
    """Remove the pin of that name (in ``namespace``, or the only one of
    that name); what was removed. PinError if none, or several namespaces
    have one and none was given."""
    now = time.time()
    with ledger.transaction() as db:
        found = [p for p in _pins(db, now, namespace) if p.name == name]
        if not found:
            where = "" if namespace is None else f" in namespace {namespace.hex()}"
            raise PinNotFound(f"no pin named {name!r}{where}: GET /v1/uma/pins lists the pins.")
        if len(found) > 1:
            spaces = ", ".join(p.namespace.hex() for p in found)
            raise PinError(
                f"pins named {name!r} exist in {len(found)} namespaces ({spaces}): say which "
                f"with namespace=<hex>."
            )
        _drop(db, found[0].namespace, name)
    return found


def pins(ledger: LedgerDB, namespace: bytes | None = None) -> list[Pin]:
    """The live pins (of one namespace, or all), oldest first (one read: no
    write lock, so listing never waits for, nor delays, a server's store)."""
    return _pins(ledger.read(), time.time(), namespace)


def live_keys(ledger: LedgerDB, namespace: bytes, now: float | None = None) -> frozenset[bytes]:
    """The keys live pins of ``namespace`` hold (a read, no write lock)."""
    now = time.time() if now is None else now
    rows = ledger.read().execute(
        f"SELECT DISTINCT pb.key FROM pin_blocks pb JOIN pins p ON p.ns=pb.ns AND "
        f"p.name=pb.name WHERE pb.ns=? AND {_LIVE}",
        (namespace, now),
    )
    return frozenset(key for (key,) in rows)


def pinned_on_disk(ledger: LedgerDB, namespace: bytes, now: float | None = None) -> tuple[int, int]:
    """Blocks of ``namespace`` on disk that live pins hold, and their bytes."""
    now = time.time() if now is None else now
    row = (
        ledger.read()
        .execute(
            "SELECT count(*), coalesce(sum(b.size), 0) FROM blocks b WHERE b.ns=? AND b.state=? "
            "AND EXISTS (SELECT 1 FROM pin_blocks pb JOIN pins p ON p.ns=pb.ns AND p.name=pb.name "
            f"WHERE pb.ns=b.ns AND pb.key=b.key AND {_LIVE})",
            (namespace, BlockState.PRESENT, now),
        )
        .fetchone()
    )
    return row[0], row[1]


def prune_expired(ledger: LedgerDB, now: float | None = None) -> int:
    """Remove the pins whose time is up; how many."""
    with ledger.transaction() as db:
        return _prune(db, time.time() if now is None else now)


def pinned_keys(ledger: LedgerDB, namespace: bytes, name: str) -> list[bytes]:
    """One live pin's keys, in prefix order (for an export)."""
    now = time.time()
    rows = ledger.read().execute(
        f"SELECT pb.key FROM pin_blocks pb JOIN pins p ON p.ns=pb.ns AND p.name=pb.name "
        f"WHERE pb.ns=? AND pb.name=? AND {_LIVE} ORDER BY pb.pos",
        (namespace, name, now),
    )
    return [key for (key,) in rows]


def _pins(db: sqlite3.Connection, now: float, namespace: bytes | None) -> list[Pin]:
    where, args = (f"WHERE {_LIVE}", [now]) if namespace is None else (
        f"WHERE p.ns=? AND {_LIVE}", [namespace, now]
    )  # fmt: skip
    rows = db.execute(
        "SELECT p.ns, p.name, p.tokens, p.block_bytes, p.created, p.expires, "
        "(SELECT count(*) FROM pin_blocks pb WHERE pb.ns=p.ns AND pb.name=p.name), "
        "(SELECT count(*) FROM pin_blocks pb JOIN blocks b ON b.ns=pb.ns AND b.key=pb.key "
        f" WHERE pb.ns=p.ns AND pb.name=p.name AND b.state={int(BlockState.PRESENT)}) "
        f"FROM pins p {where} ORDER BY p.created",
        args,
    ).fetchall()
    return [
        Pin(ns, name, tokens, blocks, block_bytes, created, expires, on_disk)
        for ns, name, tokens, block_bytes, created, expires, blocks, on_disk in rows
    ]


def _on_disk(db: sqlite3.Connection, namespace: bytes, name: str) -> int:
    return db.execute(
        "SELECT count(*) FROM pin_blocks pb JOIN blocks b ON b.ns=pb.ns AND b.key=pb.key "
        "WHERE pb.ns=? AND pb.name=? AND b.state=?",
        (namespace, name, BlockState.PRESENT),
    ).fetchone()[0]


def _drop(db: sqlite3.Connection, namespace: bytes, name: str) -> None:
    db.execute("DELETE FROM pin_blocks WHERE ns=? AND name=?", (namespace, name))
    db.execute("DELETE FROM pins WHERE ns=? AND name=?", (namespace, name))


def _prune(db: sqlite3.Connection, now: float) -> int:
    expired = db.execute(
        "SELECT ns, name FROM pins WHERE expires IS NOT NULL AND expires<=?", (now,)
    ).fetchall()
    for ns, name in expired:
        _drop(db, ns, name)
    return len(expired)
