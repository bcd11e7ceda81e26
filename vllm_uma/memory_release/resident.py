"""How much of a server's KV memory is resident, read from outside the server.

For tools and tests (memory_benchmark.py --pressure, tests/e2e): the kernel's
exact count of a process's resident pages per mapping is /proc/PID/smaps
(``Rss:``, from a walk of the page tables; VmRSS is the same count kept in
per-thread batches and also includes code paged in, Python's heap...).

The two mappings are found by what the ``memory breakdown:`` line says:

- the KV cache (L1): the private anonymous mapping vLLM's one backing
  allocation lives in, ``kv_cache`` bytes and up to SLACK more: the size
  rounded up to 2 MiB and 2 MiB of alignment for huge pages, plus the
  allocator's header (a 21,012,480,000-byte KV cache lived in a mapping
  3,149,824 B larger: 2 MiB-rounding 983,040, alignment 2 MiB, 68 KiB);
- the host pool (L2): the shared anonymous mapping (``/dev/zero (deleted)``)
  of whole pool rows, so at most ``kv_offload_pool`` bytes and more than
  ``kv_offload_pool`` minus one row.

In a server these are GiB-sized and alone in their size range; where more
than one mapping fits (a test's small buffers), the closest in size counts.
"""

from __future__ import annotations

from dataclasses import dataclass

# The size rounded up to 2 MiB, a 2 MiB alignment for huge pages, and the
# allocator's header (tens of KiB) rounded up to pages.
SLACK = (4 << 20) + (128 << 10)


@dataclass(frozen=True)
class KVResident:
    l1: int  # bytes of the KV cache's pages resident
    pool: int  # bytes of the host pool's pages resident
    found_l1: bool
    found_pool: bool

    @property
    def total(self) -> int:
        return self.l1 + self.pool


def kv_resident(pid: int, kv_cache: int, pool: int, row_bytes: int) -> KVResident:
    """Where several mappings could be the one, the closest in size is."""
    l1: list[tuple[int, int]] = []  # (bytes above the expected size, Rss)
    pools: list[tuple[int, int]] = []
    current = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            head = fields[0]
            if not head.endswith(":"):  # a mapping's first line: range perms ... path
                start, end = (int(x, 16) for x in head.split("-"))
                size, perms, path = end - start, fields[1], " ".join(fields[5:])
                current = None
                if perms.startswith("rw-p") and not path and kv_cache <= size <= kv_cache + SLACK:
                    current = (l1, size - kv_cache)
                elif perms.startswith("rw-s") and path.startswith("/dev/zero"):
                    if pool - row_bytes < size <= pool:
                        current = (pools, pool - size)
            elif head == "Rss:" and current is not None:
                found, distance = current
                found.append((distance, int(fields[1]) * 1024))
    return KVResident(
        l1=min(l1)[1] if l1 else 0,
        pool=min(pools)[1] if pools else 0,
        found_l1=bool(l1),
        found_pool=bool(pools),
    )
