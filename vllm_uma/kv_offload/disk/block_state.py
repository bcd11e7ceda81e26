"""L3: the states of a block, one enum for this server's index and the shared ledger.

Pure data, no I/O. The disk index (index.py, scheduler thread) holds WRITING
and PRESENT blocks; the ledger (ledger/, every server on the store) holds
those and DELETING ones. SQLite stores the enum's int value in
``blocks.state``: the numbers are part of the ledger's on-disk format, read
by every server on the store, and must never be renumbered.
"""

from __future__ import annotations

from enum import IntEnum


class BlockState(IntEnum):
    WRITING = 0  # reserved, bytes on their way to a temp file
    PRESENT = 1  # the final file exists and may be loaded
    # Ledger only: a victim whose file is being unlinked; still counted, and
    # its name taken, so that no store lands under it before the unlink.
    DELETING = 2

    @property
    def label(self) -> str:
        """The metric label of a store skipped for this state ("writing", ...)."""
        return self.name.lower()
