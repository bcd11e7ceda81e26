"""tools/hosts' check before it makes anything: without root, the error
says so and names the fix. The simulated hosts themselves, on the real
kernel: tests/integration/test_hosts_netns.py."""

from __future__ import annotations

import pytest

from tools.hosts import ipcmd
from tools.hosts.ipcmd import HostsError


def test_without_root_the_error_says_so(monkeypatch):
    monkeypatch.setattr(ipcmd.shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    monkeypatch.setattr(ipcmd.os, "geteuid", lambda: 1000)
    with pytest.raises(HostsError, match="need root.*sudo"):
        ipcmd.preflight()
