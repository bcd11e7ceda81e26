"""Running this process's own code on a simulated host: a thread inside the
host's network namespace.

A network namespace belongs to a thread, not to a process (setns(2) with
CLONE_NEWNET moves the calling thread only), and whatever that thread
starts inherits it: a socket it opens, a child it forks. So a test that
needs a server "on host 2" starts it from a thread that entered host 2's
namespace, and talks to it (HTTP to 127.0.0.1 inside that namespace, or to
another host's address) from the same thread. The rest of the process stays
in the root namespace.

Each host gets one long-lived thread (a one-worker executor), for two
reasons: a child started with PR_SET_PDEATHSIG (tools/harness/parent_death.py)
is killed when the *thread* that forked it ends, so the thread must outlive
its children; and every later call to such a server must come from the same
namespace. The executors are shut down by Network.down(), after its children
are gone.
"""

from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor

from tools.hosts.ipcmd import HostsError

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"  # where `ip netns add` pins a namespace

_libc = ctypes.CDLL(None, use_errno=True)


def enter(netns: str) -> None:
    """Move the calling thread into ``netns`` (made by ``ip netns add``)."""
    path = os.path.join(NETNS_DIR, netns)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise HostsError(
            f"network namespace {netns!r} cannot be opened ({path}: {exc.strerror}): "
            "make the network first (Network.up())."
        ) from None
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise HostsError(
                f"setns into {netns!r} failed: {os.strerror(err)} (needs CAP_SYS_ADMIN: "
                "run as root)."
            )
    finally:
        os.close(fd)


def executor(netns: str) -> ThreadPoolExecutor:
    """One thread inside ``netns``; ``submit(fn, ...)`` runs ``fn`` there."""
    return ThreadPoolExecutor(
        max_workers=1, thread_name_prefix=f"in-{netns}", initializer=enter, initargs=(netns,)
    )


def netns_inode(pid: int | str = "thread-self") -> int:
    """The network namespace of a process (or of the calling thread)."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino
