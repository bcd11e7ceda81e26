"""L2: the host pool, one anonymous shared mapping of fixed-size rows.

Runs in the engine-core process, shared by the worker side and the
scheduler side (plugin/engine_context.py). The worker's mover copies KV blocks into and out of rows;
the scheduler side hands out row numbers (chunk ids) through vLLM's
CPUOffloadingManager and, when the disk tier (L3) is on, lets that tier read
and write rows through ``kv_memoryview``.

    row r (one offloaded chunk = blocks_per_chunk L1 blocks, all layers)
    +-----------------+-----------------+-----+-----------------+------+
    | layer 0 pages   | layer 1 pages   | ... | layer L-1 pages | pad  |
    +-----------------+-----------------+-----+-----------------+------+
    0                 P0*B              ...                  row_bytes

The mapping is MAP_SHARED | MAP_ANONYMOUS and pageable: pages become
resident when a row is first written, like the lazy KV cache. numpy and
torch see the same bytes; a silent copy between them would hide every
store from a reader of the other view, so the pointers are checked.

vLLM builds the offloading spec twice, once for the worker and once for the
scheduler. Both find the pool in their engine's context, in a
:class:`SharedPool`: the worker side opens it, the scheduler side borrows
the same one. An anonymous mapping of this process on purpose: a named
/dev/shm file (vLLM's way) would outlive a crash and be visible to other
users, and both sides are in this process.
"""

from __future__ import annotations

import mmap
import threading

import numpy as np
import torch


class ZeroCopyError(RuntimeError):
    """A view of the pool is not the pool's own bytes."""


class HostPool:
    def __init__(self, num_rows: int, row_bytes: int):
        if num_rows <= 0 or row_bytes <= 0:
            raise ValueError(
                f"host pool of {num_rows} rows x {row_bytes} bytes is empty: "
                f"--kv-offloading-size is too small for one chunk of KV."
            )
        self.num_rows = num_rows
        self.row_bytes = row_bytes
        # mmap(-1, n) is MAP_SHARED | MAP_ANONYMOUS on Linux.
        self._region = mmap.mmap(-1, num_rows * row_bytes)
        self.array = np.frombuffer(self._region, dtype=np.uint8).reshape(num_rows, row_bytes)
        self.tensor = torch.from_numpy(self.array)
        if self.array.ctypes.data != self.tensor.data_ptr():
            raise ZeroCopyError(
                "host pool views differ: numpy at "
                f"{self.array.ctypes.data:#x}, torch at {self.tensor.data_ptr():#x}"
            )

    def kv_memoryview(self) -> memoryview:
        """The rows as a (num_rows, row_bytes) memoryview, for the disk tier."""
        view = memoryview(self._region).cast("B", (self.num_rows, self.row_bytes))
        address = np.frombuffer(view, dtype=np.uint8).ctypes.data
        if address != self.array.ctypes.data:
            raise ZeroCopyError(
                f"host pool memoryview at {address:#x} is not the pool at "
                f"{self.array.ctypes.data:#x}"
            )
        return view

    def close(self) -> None:
        del self.tensor, self.array
        self._region.close()


class SharedPool:
    """The host pool of one engine, lent to its users and closed by the last.

    The worker side's mover opens it; the scheduler side's manager and the
    release thread borrow it (plugin/engine_context.py). Each release gives one
    reference back, in whatever order the sides shut down."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: HostPool | None = None
        self._users = 0

    def open(self, num_rows: int, row_bytes: int) -> HostPool:
        """The pool (made by the first call), with one reference more."""
        with self._lock:
            pool = self._pool
            if pool is None:
                pool = HostPool(num_rows, row_bytes)
            elif (pool.num_rows, pool.row_bytes) != (num_rows, row_bytes):
                raise ValueError(
                    f"the host pool has {pool.num_rows} rows of {pool.row_bytes} bytes, "
                    f"but {num_rows} rows of {row_bytes} were asked for; the worker "
                    f"and scheduler disagree on the pool."
                )
            self._pool, self._users = pool, self._users + 1
            return pool

    def existing(self) -> HostPool | None:
        with self._lock:
            return self._pool

    def release(self) -> None:
        with self._lock:
            pool = self._pool
            if pool is None:
                raise RuntimeError(
                    "the host pool was released more often than it was opened: "
                    "each user releases its own reference once."
                )
            self._users -= 1
            if self._users:
                return
            self._pool = None
        pool.close()
