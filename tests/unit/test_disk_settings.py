"""The fs tier's settings (vllm_uma/kv_offload/disk/settings.py): parsing and every refusal."""

from __future__ import annotations

import os
import shutil
import stat
from collections import namedtuple
from pathlib import Path

import pytest

from vllm_uma.kv_offload.disk import settings as dc

GiB = 1 << 30


def tier(tmp_path, **keys):
    return [{"type": "fs", "root_dir": str(tmp_path / "kv"), **keys}]


def parse(tiers, events=False):
    return dc.parse_disk_tier(tiers, kv_events_enabled=events)


def other_warnings(warnings: list[str]) -> list[str]:
    """The warnings besides the one for a root_dir in RAM, which a machine
    whose /tmp (pytest's tmp_path) is tmpfs gets on every parse."""
    return [w for w in warnings if "which keeps its files in RAM" not in w]


def test_no_tiers_means_no_disk_tier():
    assert parse(None) == (None, [])
    assert parse([]) == (None, [])


def test_root_dir_is_created_private(tmp_path):
    config, warnings = parse(tier(tmp_path, max_size_gib=1.5))
    assert config.root_dir == tmp_path / "kv" and other_warnings(warnings) == []
    assert stat.S_IMODE(os.stat(config.root_dir).st_mode) == 0o700
    assert config.cap_bytes == int(1.5 * GiB) and config.cap_reason == "max_size_gib=1.5"


def test_zero_means_no_cap(tmp_path):
    config, _ = parse(tier(tmp_path, max_size_gib=0))
    assert config.cap_bytes is None and "no cap" in config.cap_reason


def test_default_cap_is_a_tenth_of_the_volume(tmp_path):
    config, _ = parse(tier(tmp_path))
    vfs = os.statvfs(tmp_path)
    assert config.cap_bytes == int(vfs.f_blocks * vfs.f_frsize * 0.10)
    assert "10% of the volume" in config.cap_reason


def test_default_cap_larger_than_the_free_space_fails(tmp_path, monkeypatch):
    full = namedtuple("vfs", "f_blocks f_frsize f_bavail")(1000 * GiB // 4096, 4096, GiB // 4096)
    monkeypatch.setattr(dc.os, "statvfs", lambda path: full)
    with pytest.raises(dc.DiskTierSettingsError) as err:
        parse(tier(tmp_path))
    message = str(err.value)
    assert "10% of the volume" in message and "(100.0 GiB)" in message
    assert "only 1.0 GiB is free" in message and "set max_size_gib" in message


def test_the_tiers_own_files_count_as_free_space(tmp_path, monkeypatch):
    # A restart after the tier filled its default cap: 1 GiB free beside the
    # tier's own 99 GiB of blocks, which it may evict, is room enough.
    full = namedtuple("vfs", "f_blocks f_frsize f_bavail")(1000 * GiB // 4096, 4096, GiB // 4096)
    monkeypatch.setattr(dc.os, "statvfs", lambda path: full)
    blocks = tmp_path / "kv" / ".noindex" / ("ab" * 16) / "cd"
    blocks.mkdir(parents=True)
    with open(blocks / "cdef.kvb", "wb") as f:
        f.truncate(99 * GiB)  # sparse: st_size is what the tier counts
    config, _ = parse(tier(tmp_path))
    assert config.cap_bytes == 100 * GiB


@pytest.mark.parametrize(
    "tiers, fragment",
    [
        ({"type": "fs"}, "must be a list of tier objects"),
        ([{"type": "obj", "root_dir": "/x"}], "tier type 'obj' is not supported"),
        ([{"root_dir": "/x"}], "tier type None is not supported"),
        ([{"type": "fs", "root_dir": "/x"}] * 2, "names 2 tiers"),
        ([{"type": "fs", "root_dir": "/x", "max_gib": 1}], "unknown key(s) ['max_gib']"),
        ([{"type": "fs"}], "root_dir=None is invalid"),
        ([{"type": "fs", "root_dir": ""}], "root_dir='' is invalid"),
    ],
)
def test_bad_tier_lists_are_refused(tiers, fragment):
    with pytest.raises(dc.DiskTierSettingsError) as err:
        parse(tiers)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    "size, fragment",
    [
        (-1, "max_size_gib=-1 is invalid: it must be >= 0 (0 means no cap)"),
        ("50", "max_size_gib='50' is invalid"),
        (True, "max_size_gib=True is invalid"),
        (float("nan"), "max_size_gib=nan is invalid"),
    ],
)
def test_bad_sizes_are_refused_with_the_fix(tmp_path, size, fragment):
    with pytest.raises(dc.DiskTierSettingsError) as err:
        parse(tier(tmp_path, max_size_gib=size))
    assert fragment in str(err.value)
    assert "Set a size in GiB or remove the key" in str(err.value)


def test_a_root_dir_that_cannot_be_written_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(dc.DiskTierSettingsError) as err:
        parse([{"type": "fs", "root_dir": str(blocker / "kv")}])
    assert "cannot be created or written" in str(err.value)
    assert "choose a directory this user can write" in str(err.value)


def test_events_follow_the_global_switch(tmp_path):
    on, warnings = parse(tier(tmp_path, max_size_gib=1), events=True)
    assert on.enable_kv_events and other_warnings(warnings) == []
    off, warnings = parse(tier(tmp_path, max_size_gib=1, enable_kv_events=False), events=True)
    assert not off.enable_kv_events


def test_tier_events_without_the_global_switch_warn(tmp_path):
    config, warnings = parse(tier(tmp_path, max_size_gib=1, enable_kv_events=True))
    assert not config.enable_kv_events
    warnings = other_warnings(warnings)
    assert len(warnings) == 1 and "--kv-events-config" in warnings[0]


def test_a_non_boolean_event_switch_is_refused(tmp_path):
    with pytest.raises(dc.DiskTierSettingsError, match="enable_kv_events='yes' is invalid"):
        parse(tier(tmp_path, max_size_gib=1, enable_kv_events="yes"))


def test_a_root_dir_in_ram_is_warned_about(tmp_path):
    shm = Path("/dev/shm")
    if dc.filesystem_of(shm) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm on this machine")
    root = shm / f"vllm-uma-test-{os.getpid()}"
    try:
        config, warnings = parse([{"type": "fs", "root_dir": str(root), "max_size_gib": 0.01}])
        assert config.root_dir == root
        assert len(warnings) == 1 and "is on tmpfs, which keeps its files in RAM" in warnings[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _, warnings = parse(tier(tmp_path, max_size_gib=0.01))
    on_disk = dc.filesystem_of(tmp_path) not in dc.MEMORY_FILESYSTEMS
    assert (warnings == []) is on_disk


def test_the_filesystem_of_a_path_is_its_longest_mount(tmp_path):

    from vllm_uma.kv_offload.disk.settings import filesystem_of

    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/vda1 / ext4 rw 0 0\n"
        "server:/export /srv/kv nfs4 rw 0 0\n"
        "tmpfs /srv/kv\\040cache tmpfs rw 0 0\n"
    )
    assert filesystem_of(Path("/srv/kv/a"), str(mounts)) == "nfs4"
    assert filesystem_of(Path("/srv/kvx"), str(mounts)) == "ext4"  # not under /srv/kv
    assert filesystem_of(Path("/srv/kv cache/x"), str(mounts)) == "tmpfs"
    assert filesystem_of(Path("/x"), str(tmp_path / "none")) == "?"
