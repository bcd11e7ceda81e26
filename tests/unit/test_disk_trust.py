"""The store's trust rules at start-up (vllm_uma/kv_offload/disk/trust.py),
through the fs tier's config check, on real directories of this user's.
Directories another user owns, made so as root:
tests/integration/test_disk_trust_root.py."""

from __future__ import annotations

import os
import stat

import pytest

from vllm_uma.kv_offload.disk.settings import (
    DiskTierSettings,
    DiskTierSettingsError,
    parse_disk_tier,
)


def parse(root) -> DiskTierSettings:
    tier = {"type": "fs", "root_dir": str(root), "max_size_gib": 1}
    config, _ = parse_disk_tier([tier], kv_events_enabled=False)
    return config


def refusal(root) -> str:
    with pytest.raises(DiskTierSettingsError) as caught:
        parse(root)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_new_root_is_created_private(tmp_path):
    root = tmp_path / "a" / "kv"
    parse(root)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_a_root_of_ours_readable_by_others_is_accepted(tmp_path):
    root = tmp_path / "kv"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    assert parse(root).root_dir == root
    assert stat.S_IMODE(root.stat().st_mode) == 0o755  # taken as it is, not tightened


def test_a_root_reached_through_the_users_own_symlink_is_accepted(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert parse(tmp_path / "link").root_dir == tmp_path / "link"  # the path as given
    assert (tmp_path / "link").readlink() == tmp_path / "real"  # the link left as it was


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_root_others_may_write_is_refused_with_the_fix(tmp_path, mode):
    root = tmp_path / "kv"
    root.mkdir()
    os.chmod(root, mode)
    message = refusal(root)
    assert f"'{root}' is writable by group or others (mode {stat.S_IMODE(mode):04o})" in message
    assert f"chmod go-w {root}" in message
    assert stat.S_IMODE(root.stat().st_mode) == mode  # left as it was
    assert list(root.iterdir()) == []  # nothing written into it


def test_a_noindex_symlink_is_refused_and_its_target_untouched(tmp_path):
    root, target = tmp_path / "kv", tmp_path / "elsewhere"
    root.mkdir(mode=0o700)
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    (root / ".noindex").symlink_to(target)
    message = refusal(root)
    assert ".noindex' is a symlink" in message and "rm " in message
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert list(target.iterdir()) == []


def test_a_noindex_file_is_refused(tmp_path):
    root = tmp_path / "kv"
    root.mkdir(mode=0o700)
    (root / ".noindex").write_text("")
    assert ".noindex' is not a directory" in refusal(root)


def test_a_noindex_others_may_write_is_refused(tmp_path):
    root = tmp_path / "kv"
    (root / ".noindex").mkdir(parents=True)
    os.chmod(root, 0o700)
    os.chmod(root / ".noindex", 0o777)
    assert "is writable by group or others (mode 0777)" in refusal(root)
