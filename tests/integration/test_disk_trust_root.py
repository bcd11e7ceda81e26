"""The store's trust rules (vllm_uma/kv_offload/disk/trust.py) against
directories another user owns, made so as root: through the fs tier's config
check, and the engine core's own look on its handles (Layout.untrusted).
The rules on this user's directories: tests/unit/test_disk_trust.py."""

from __future__ import annotations

import os

import pytest

from vllm_uma.kv_offload.disk.settings import DiskTierSettingsError, parse_disk_tier

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")


def parse(root) -> None:
    tier = {"type": "fs", "root_dir": str(root), "max_size_gib": 1}
    parse_disk_tier([tier], kv_events_enabled=False)


def refusal(root) -> str:
    with pytest.raises(DiskTierSettingsError) as caught:
        parse(root)
    message = str(caught.value)
    assert "\n" not in message
    return message


@as_root
def test_a_root_another_user_owns_is_refused(tmp_path):
    root = tmp_path / "kv"
    root.mkdir(mode=0o700)
    os.chown(root, NOBODY, NOBODY)
    message = refusal(root)
    assert f"'{root}' is owned by" in message and f"uid {NOBODY}" in message
    assert "Use a directory of your own" in message
    assert list(root.iterdir()) == []  # nothing written into it


@as_root
def test_a_noindex_another_user_owns_is_refused(tmp_path):
    root = tmp_path / "kv"
    (root / ".noindex").mkdir(parents=True, mode=0o700)
    os.chmod(root, 0o700)
    os.chown(root / ".noindex", NOBODY, NOBODY)
    assert f"uid {NOBODY}" in refusal(root)


def open_store_at(root):
    from types import SimpleNamespace

    from vllm_uma.kv_offload.disk.reports import DiskWarnings
    from vllm_uma.kv_offload.disk.tier_startup import open_store

    config = SimpleNamespace(root_dir=root)
    rows = memoryview(bytearray(4096))
    return open_store(config, b"\x01" * 16, {}, rows, 4096, DiskWarnings(root))


@as_root
def test_a_root_replaced_after_the_api_servers_check_is_refused_by_the_engine(tmp_path):
    from vllm_uma.kv_offload.disk.trust import StoreTrustError

    root = tmp_path / "kv"
    root.mkdir(mode=0o700)
    parse(root)  # the API server's check passes
    os.rename(root, tmp_path / "checked")
    root.mkdir(mode=0o700)  # swapped in meanwhile, by another user
    os.chown(root, NOBODY, NOBODY)
    with pytest.raises(StoreTrustError, match=f"'{root}' is owned by .*uid {NOBODY}"):
        open_store_at(root)
    assert list(root.iterdir()) == []  # nothing written into it


@as_root
def test_a_noindex_made_another_users_meanwhile_is_refused_by_the_engine(tmp_path):
    from vllm_uma.kv_offload.disk.layout import Layout

    root = tmp_path / "kv"
    root.mkdir(mode=0o700)
    (root / ".noindex").mkdir(mode=0o700)
    assert Layout(root).untrusted() is None
    os.chown(root / ".noindex", NOBODY, NOBODY)
    layout = Layout(root)
    assert "store directory" in layout.untrusted() and f"uid {NOBODY}" in layout.untrusted()
    layout.close()
