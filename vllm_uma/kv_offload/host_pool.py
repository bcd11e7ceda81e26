"""L2: the host pool, one anonymous shared mapping of fixed-size rows.

Runs in the worker (the engine-core process with the in-process worker).
The scheduler side never touches these bytes: it only hands out row
numbers (chunk ids) through vLLM's CPUOffloadingManager.

    row r (one offloaded chunk = blocks_per_chunk L1 blocks, all layers)
    +-----------------+-----------------+-----+-----------------+------+
    | layer 0 pages   | layer 1 pages   | ... | layer L-1 pages | pad  |
    +-----------------+-----------------+-----+-----------------+------+
    0                 P0*B              ...                  row_bytes

The mapping is MAP_SHARED | MAP_ANONYMOUS and pageable: pages become
resident when a row is first written, like the lazy KV cache. numpy and
torch see the same bytes; a silent copy between them would hide every
store from a reader of the other view, so the pointers are checked.
"""

from __future__ import annotations

import mmap

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

    def close(self) -> None:
        del self.tensor, self.array
        self._region.close()
