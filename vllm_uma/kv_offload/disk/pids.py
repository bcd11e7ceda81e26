"""L3: whether a writer is still alive, by the pid it left behind.

Any process and thread of the disk tier: the start-up scan asks it of a
temp file's writer (store_scan.py), the ledger of a row's writer when room
is short or at start-up (ledger/room.py, ledger/startup.py).
"""

from __future__ import annotations

import os


def pid_is_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (in this pid namespace)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    except (OverflowError, ValueError):
        return False  # not a pid at all
    return True
