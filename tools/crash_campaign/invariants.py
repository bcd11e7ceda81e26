"""What a shared disk store must hold after any kill, at any moment.

Checked by the campaign's driver while every server of the store is frozen
(SIGSTOP) or dead: the files and the ledger are then what a power cut would
leave, writes and deletes in flight included. Read only: the ledger through
a read-only SQLite connection, the files by name (never followed).

- every block file reads back as a restore would read it (``kv-store
  verify``'s check: header, key, namespace, length, checksum);
- every block file has a ledger row (a store reserves its row before its
  file exists, an eviction drops the row after the file is gone), and every
  present row has its file, of the row's size;
- the ledger's ``used`` and ``deleting`` totals are the sums of its rows,
  and ``used`` less the bytes being deleted is within the cap;
- the bytes on disk stay within the cap plus one block per I/O thread of
  each live server (its writes in flight);
- after a restart (whose start-up scan and reconcile settle what the dead
  left), no temp file and no unfinished row belongs to a dead process. On
  a full disk the reconcile cannot write the ledger and is put off
  (vllm_uma/kv_offload/disk/full_disk.py): ``settled=False`` then
  spares the dead processes' rows (they still count in the totals and the
  cap), never their temp files, which the scan removes.

``strict`` is for a store whose servers all stopped cleanly: no write or
delete may be left in flight at all, and the bytes on disk are ``used``.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Collection
from pathlib import Path

from vllm_uma.kv_offload.disk import admin
from vllm_uma.kv_offload.disk.block_file import is_temp_name, key_from_name, writer_pid
from vllm_uma.kv_offload.disk.index import BlockState
from vllm_uma.kv_offload.disk.layout import NOINDEX
from vllm_uma.kv_offload.disk.ledger.db import LEDGER_FILE


def check_store(
    root: Path,
    *,
    cap_bytes: int,
    file_bytes: int,
    live_pids: Collection[int],
    io_threads: int,
    strict: bool = False,
    settled: bool = True,
) -> list[str]:
    """Every invariant the store at ``root`` breaks, one line each."""
    found: list[str] = []
    report = admin.verify(root, remove=False)
    found += [f"kv-store verify: {path}: {why}" for path, why in report.bad]
    files, temps = _files(root / NOINDEX)
    rows, used, deleting = _ledger(root / NOINDEX / LEDGER_FILE)
    for ref, size in files.items():
        row = rows.get(ref)
        if row is None:
            found.append(f"block file {_name(ref)} ({size} bytes) has no ledger row")
    for ref, (size, state, pid) in rows.items():
        if state == BlockState.PRESENT and files.get(ref) != size:
            have = "no file" if ref not in files else f"a file of {files[ref]} bytes"
            found.append(f"present row {_name(ref)} of {size} bytes has {have}")
        elif state != BlockState.PRESENT:
            if strict:
                found.append(f"row {_name(ref)} left {BlockState(state).name} by pid {pid}")
            elif pid not in live_pids and settled:
                found.append(
                    f"row {_name(ref)} left {BlockState(state).name} by dead pid {pid} "
                    "after a restart's reconcile"
                )
    sums = sum(size for size, _, _ in rows.values())
    sums_deleting = sum(size for size, state, _ in rows.values() if state == BlockState.DELETING)
    if used != sums or deleting != sums_deleting:
        found.append(
            f"ledger totals used={used} deleting={deleting}, its rows sum to "
            f"{sums} and {sums_deleting}"
        )
    if used - deleting > cap_bytes:  # victims being unlinked are counted till gone
        found.append(
            f"ledger used {used} bytes ({deleting} being deleted), over the cap of {cap_bytes}"
        )
    on_disk = sum(files.values()) + sum(size for _, size, _ in temps)
    allowed = cap_bytes + len(live_pids) * io_threads * file_bytes
    if on_disk > allowed:
        found.append(f"{on_disk} bytes on disk, over cap + writes in flight ({allowed})")
    for name, size, pid in temps:
        if strict or pid not in live_pids:
            found.append(f"temp file {name} ({size} bytes) of pid {pid} outlived its writer")
    if strict and on_disk != used:
        found.append(f"{on_disk} bytes on disk after a clean stop, the ledger counts {used}")
    return found


def _files(noindex: Path) -> tuple[dict[tuple[str, bytes], int], list[tuple[str, int, int]]]:
    """Block files {(namespace hex, key): size} and temps [(name, size, pid)]."""
    files: dict[tuple[str, bytes], int] = {}
    temps: list[tuple[str, int, int]] = []
    for parent, _, names in os.walk(noindex):
        namespace = Path(parent).relative_to(noindex).parts[:1]
        for name in names:
            st = os.lstat(os.path.join(parent, name))
            if not stat.S_ISREG(st.st_mode):
                continue
            if is_temp_name(name):
                temps.append((name, st.st_size, writer_pid(name) or -1))
                continue
            key = key_from_name(name)
            if key is not None and namespace:
                files[(namespace[0], key)] = st.st_size
    return files, temps


def _ledger(path: Path) -> tuple[dict[tuple[str, bytes], tuple[int, int, int]], int, int]:
    """Rows {(namespace hex, key): (size, state, writer pid)}, used, deleting."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        rows = {
            (ns.hex(), key): (size, state, pid)
            for ns, key, size, state, pid in db.execute(
                "SELECT ns, key, size, state, writer_pid FROM blocks"
            )
        }
        meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
    finally:
        db.close()
    return rows, meta["used"], meta["deleting"]


def _name(ref: tuple[str, bytes]) -> str:
    return f"{ref[0][:8]}/{ref[1][:8].hex()}"
