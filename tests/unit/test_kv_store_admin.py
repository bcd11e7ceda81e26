"""`vllm-uma kv-store ROOT ...` on a store the real disk tier wrote."""

from __future__ import annotations

import json
import os
import time

import pytest
from disk_tier_kit import FILE, NS, OTHER_NS, Jobs, Primary, block_files, key, make_tier

from vllm_uma.commands import main as cli
from vllm_uma.kv_offload.disk import admin
from vllm_uma.kv_offload.disk.layout import NOINDEX


@pytest.fixture
def store(tmp_path):
    """Two namespaces: ours with 3 blocks, another model's with 2."""
    primary = Primary()
    root = tmp_path / "kv"
    for ns, keys in ((NS, [0, 1, 2]), (OTHER_NS, [5, 6])):
        tier = make_tier(root, primary, ns=ns)
        for row, k in enumerate(keys):
            primary.fill(row, seed=k + 1)
        assert Jobs(tier).stored([key(k) for k in keys], list(range(len(keys)))).success
        tier.shutdown()
    return root


def run(capsys, *argv) -> tuple[int, str, str]:
    status = cli.main(["kv-store", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_ls_lists_each_namespace_with_its_model_blocks_and_size(store, capsys):
    status, out, _ = run(capsys, str(store), "ls")
    assert status == 0
    lines = out.splitlines()
    ours = next(line for line in lines if line.startswith(NS.hex()))
    assert "test-model" in ours and "bfloat16" in ours and " 3 " in ours
    assert any(line.startswith(OTHER_NS.hex()) and " 2 " in line for line in lines)


def test_du_totals_every_block(store, capsys):
    status, out, _ = run(capsys, str(store), "du")
    assert status == 0
    assert "total, 5 blocks" in out.splitlines()[-1]
    assert sum(s.bytes for s in admin.survey(store)) == 5 * FILE


def test_verify_passes_a_sound_store_and_finds_each_kind_of_damage(store, capsys):
    assert run(capsys, str(store), "verify")[0] == 0
    files = block_files(store)
    with open(files[0], "r+b") as f:  # flip a payload byte
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    os.truncate(files[1], 100)
    status, out, _ = run(capsys, str(store), "verify")
    assert status == 1
    assert "5 block files checked, 2 bad (--remove deletes them)" in out
    assert "checksum mismatch" in out and "truncated" in out
    assert all(p.exists() for p in files[:2])  # reported only
    status, out, _ = run(capsys, str(store), "verify", "--remove")
    assert status == 1 and "2 bad, 2 removed" in out
    assert not files[0].exists() and not files[1].exists()
    assert run(capsys, str(store), "verify")[0] == 0


def test_nothing_planted_is_followed_or_waited_on(store, tmp_path, capsys):
    outside = tmp_path / "secret"
    outside.write_bytes(b"not a block")
    sub = block_files(store)[0].parent
    os.symlink(outside, sub / (key(9).hex() + ".kvb"))
    os.mkfifo(sub / (key(8).hex() + ".kvb"))
    status, out, _ = run(capsys, str(store), "verify", "--remove")
    assert status == 0 and "5 block files checked" in out
    assert run(capsys, str(store), "clear", "--yes")[0] == 0
    assert outside.read_bytes() == b"not a block"


def test_prune_by_age_and_namespace_and_gone_models(store, tmp_path, capsys):
    old = block_files(store)[0]
    week_ago = time.time() - 7 * 86400
    os.utime(old, (week_ago, week_ago))
    status, out, _ = run(capsys, str(store), "prune", "--older-than", "3", "--dry-run")
    assert status == 0 and "would delete 1 block files" in out and old.exists()
    assert run(capsys, str(store), "prune", "--older-than", "3")[0] == 0
    assert not old.exists() and len(block_files(store)) == 4
    status, out, _ = run(capsys, str(store), "prune", "--namespace", OTHER_NS.hex())
    assert "deleted 2 block files" in out
    # Our namespace's model was a directory that has since been removed.
    info_path = store / NOINDEX / NS.hex() / "namespace.json"
    info = json.loads(info_path.read_text())
    info["model"] = str(tmp_path / "deleted-model")
    info_path.write_text(json.dumps(info))
    assert run(capsys, str(store), "prune", "--missing-models")[0] == 0
    assert block_files(store) == []


def test_prune_without_a_criterion_and_clear_without_yes_are_refused(store, capsys):
    status, _, err = run(capsys, str(store), "prune")
    assert status == 2 and "prune needs a criterion" in err
    status, _, err = run(capsys, str(store), "clear")
    assert status == 2 and "add --yes" in err
    assert len(block_files(store)) == 5


def test_temp_files_in_flight_are_never_deleted(store, capsys):
    sub = block_files(store)[0].parent
    temp = sub / (key(7).hex() + ".kvb.abcdef.tmp")
    temp.write_bytes(b"a write in flight")
    status, out, _ = run(capsys, str(store), "du")
    assert "1 temp files in flight or left over" in out
    assert run(capsys, str(store), "clear", "--yes")[0] == 0
    assert temp.exists() and block_files(store) == []


def test_a_directory_that_is_not_a_store_is_refused(tmp_path, capsys):
    status, _, err = run(capsys, str(tmp_path), "ls")
    assert status == 2 and "is not a vllm-uma KV store: it has no .noindex" in err


def test_a_header_claiming_a_huge_payload_is_bad_not_a_huge_buffer(store, capsys):
    victim = block_files(store)[0]
    with open(victim, "r+b") as f:
        f.seek(16)  # the payload length field (block_file.py's layout)
        f.write((40 << 30).to_bytes(8, "little"))
    status, out, _ = run(capsys, str(store), "verify")
    assert status == 1 and "the header claims" in out


def test_a_sparse_file_as_large_as_its_headers_claim_is_bad_not_read(store, capsys):
    # The size check alone passes: the file is as long as the header says.
    victim = block_files(store)[0]
    claim = 40 << 30
    with open(victim, "r+b") as f:
        f.seek(16)  # the payload length field (block_file.py's layout)
        f.write(claim.to_bytes(8, "little"))
    os.truncate(victim, 4096 + claim)  # sparse: no block of it on disk
    status, out, _ = run(capsys, str(store), "verify")
    assert status == 1
    assert f"the header claims {claim} bytes of payload, over the {1 << 30}" in out


def test_deletions_reach_a_running_server_and_the_shared_count(store, capsys):
    from disk_tier_kit import CTX
    from vllm.v1.kv_offload.base import LookupResult

    tier = make_tier(store, Primary(), ns=NS)
    assert tier.lookup(key(0), CTX) is LookupResult.HIT
    assert tier.used_bytes == 5 * FILE
    status, _, _ = run(capsys, str(store), "prune", "--namespace", NS.hex())
    assert status == 0
    tier.drain_jobs()  # the ledger feed brings the removals
    tier.get_finished_jobs()
    assert [tier.lookup(key(k), CTX) for k in (0, 1, 2)] == [LookupResult.MISS] * 3
    assert tier.used_bytes == 2 * FILE  # the other namespace's two blocks
    assert sorted(e.keys[0] for e in tier.take_events() if e.removed) == [key(k) for k in (0, 1, 2)]
    tier.shutdown()
