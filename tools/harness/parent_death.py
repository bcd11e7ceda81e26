"""A child that dies with its parent: for processes the tests and tools start
that do not run our code (so cannot watch their parent the way
vllm_uma/lifeline.py does), e.g. the crash campaign's workers and the
Valkey server. ``PR_SET_PDEATHSIG`` fires when the thread that started the
child exits; the callers start their children from their main thread.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def kill_me_with_my_parent(parent_pid: int) -> None:
    """In the child (or as ``preexec_fn``): SIGKILL this process when
    ``parent_pid``'s starting thread exits; exit now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent_pid:  # it died before the signal was set
        os._exit(1)
