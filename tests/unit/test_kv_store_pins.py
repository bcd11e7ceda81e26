"""`vllm-uma kv-store ROOT pins|unpin` (commands/kv_store_pins.py) on a
store's real ledger: listed with the model, unpinned, refused in the HTTP
API's words."""

from __future__ import annotations

import pytest

from tests.unit.ledger_kit import NS, Unlinks, never, ref
from vllm_uma.commands import main as cli
from vllm_uma.kv_offload.disk.layout import Layout
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger
from vllm_uma.kv_offload.pins import book

OTHER = b"\x22" * 16


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "kv"
    layout = Layout(root)
    for ns, model in ((NS, "org/model-a"), (OTHER, "org/model-b")):
        assert layout.prepare(ns, {"model": model}) is None
    layout.close()
    ledger = Ledger(root / ".noindex")
    ledger.create()
    assert isinstance(ledger.reserve(ref(0), 10, 1, None, "w", never, Unlinks()), list)
    ledger.commit(ref(0), 10, 1, "w")
    budget = book.PinBudget(1.0, None)
    for ns, name, ttl in ((NS, "system", 7200.0), (OTHER, "system", None), (NS, "doc", None)):
        keys = [ref(0, ns).key, ref(1, ns).key]
        book.pin(ledger, ns, name, keys, block_bytes=10, tokens=64, ttl_s=ttl, budget=budget)
    ledger.close()
    return root


def run(capsys, *argv) -> tuple[int, str, str]:
    status = cli.main(["kv-store", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_pins_lists_each_live_pin_with_its_model_blocks_and_expiry(root, capsys):
    status, out, _ = run(capsys, str(root), "pins")
    assert status == 0
    lines = out.splitlines()[1:]
    assert len(lines) == 3
    first = lines[0].split()
    assert first[:6] == ["system", "org/model-a", NS.hex(), "64", "2", "20"]
    assert first[7] == "1" and "(in 2.0 h)" in lines[0]  # one of two blocks on disk
    assert "org/model-b" in lines[1] and lines[1].endswith("until unpinned")


def test_unpin_needs_the_namespace_when_two_models_have_the_name(root, capsys):
    status, _, err = run(capsys, str(root), "unpin", "system")
    assert status == 2
    assert "pins named 'system' exist in 2 namespaces" in err
    status, out, _ = run(capsys, str(root), "unpin", "system", "--namespace", OTHER.hex())
    assert status == 0 and f"unpinned 'system' (namespace {OTHER.hex()}, 2 blocks)" in out
    status, out, _ = run(capsys, str(root), "unpin", "system")
    assert status == 0 and NS.hex() in out
    _, out, _ = run(capsys, str(root), "pins")
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["doc"]


def test_unpin_of_an_unknown_name_or_bad_namespace_is_refused(root, capsys):
    status, _, err = run(capsys, str(root), "unpin", "nope")
    assert status == 2 and "no pin named 'nope'" in err
    status, _, err = run(capsys, str(root), "unpin", "doc", "--namespace", "xyz")
    assert status == 2 and "namespace='xyz' is not hex" in err


def test_a_store_without_a_ledger_has_no_pins(tmp_path, capsys):
    (tmp_path / ".noindex").mkdir()
    status, out, _ = run(capsys, str(tmp_path), "pins")
    assert status == 0 and "(no pins)" in out
    status, _, err = run(capsys, str(tmp_path), "unpin", "doc")
    assert status == 2 and "has no ledger" in err
