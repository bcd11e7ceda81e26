"""A pin carried over HTTP (pins/http_bundles.py, bundle_tar.py, http_stream.py):
the real pins middleware on a small Starlette app, real stores whose blocks
the real disk tier wrote (disk_tier_kit: threads, no process), the real
ledger; the engine is a stand-in route answering the namespace probe. The
CLI's export|import of the same bundles: tests/integration/test_pin_bundles.py."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import time
import types
from pathlib import Path

import pytest

from tests.unit.disk_tier_kit import FILE, NS, OTHER_NS, Primary, key
from tests.unit.pins_bundle_kit import (
    BUNDLE_URL,
    IMPORT_URL,
    KEYS,
    TAR,
    Server,
    a_store,
    block_path,
    pin,
    scratch,
    state,
)
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger
from vllm_uma.kv_offload.pins import book, bundle_tar


@pytest.fixture
def source(tmp_path):
    root = tmp_path / "a"
    a_store(root, Primary(), keys=KEYS)
    pin(root)
    return root


@pytest.fixture
def target(tmp_path):
    root = tmp_path / "b"
    a_store(root, Primary())
    return root


def exported(source: Path, monkeypatch) -> bytes:
    got = Server(source, monkeypatch).request("GET", BUNDLE_URL)
    assert got.status_code == 200, got.text
    return got.content


def test_round_trip_over_http_gives_the_same_blocks_and_the_pin(source, target, monkeypatch):
    a, b = Server(source, monkeypatch), Server(target, monkeypatch)
    got = a.request("GET", BUNDLE_URL)
    assert got.status_code == 200, got.text
    assert got.headers["content-type"] == "application/x-tar"
    assert int(got.headers["content-length"]) == len(got.content)
    assert len(got.content) % bundle_tar.RECORD == 0
    with tarfile.open(fileobj=io.BytesIO(got.content)) as tar:
        assert tar.getnames() == ["manifest.json"] + [f"blocks/{k.hex()}.kvb" for k in KEYS]
        for k in KEYS:
            sent = tar.extractfile(f"blocks/{k.hex()}.kvb").read()
            assert sent == block_path(source, k).read_bytes()
    assert scratch(source) == []

    put = b.request("POST", IMPORT_URL + "?ttl_s=60", content=got.content, headers=TAR)
    assert put.status_code == 200, put.text
    reply = put.json()
    assert (reply["name"], reply["blocks"], reply["blocks_on_disk"]) == ("system", 4, 4)
    assert (reply["blocks_written"], reply["blocks_already"], reply["model"]) == (
        4, 0, "test-model",
    )  # fmt: skip
    for k in KEYS:
        assert block_path(target, k).read_bytes() == block_path(source, k).read_bytes()
    ledger = Ledger(target / ".noindex")
    (made,) = book.pins(ledger)
    ledger.close()
    assert (made.name, made.namespace, made.blocks, made.blocks_on_disk) == ("system", NS, 4, 4)
    assert 50 < made.expires - time.time() <= 60
    assert scratch(target) == []
    assert [p["prompt"] for p in b.probes] == ["."]  # the engine asked once for its namespace
    again = b.request("POST", IMPORT_URL, content=got.content, headers=TAR)
    assert again.status_code == 200 and again.json()["blocks_already"] == 4
    assert len(b.probes) == 1


def _retar(original: bytes, edit, form=tarfile.GNU_FORMAT) -> bytes:
    """The tar's members as (TarInfo, bytes), changed by ``edit``, written again."""
    with tarfile.open(fileobj=io.BytesIO(original)) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=form) as tar:
        for info, data in edit(members):
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


def _member(name, data=b"", kind=tarfile.REGTYPE, link=""):
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, len(data) if kind == tarfile.REGTYPE else 0, link
    return info, data


def _grown(members):
    info, data = members[2]
    info.size += 1
    return [*members[:2], (info, data + b"x"), *members[3:]]


def _block_name(i: int) -> str:
    return f"blocks/{KEYS[i].hex()}.kvb"


def _instead_of_block_0(info):
    return lambda m: [m[0], info, *m[2:]]


EDITS = {
    "symlink": (
        _instead_of_block_0(_member(_block_name(0), kind=tarfile.SYMTYPE, link="/etc")),
        400,
        "is a link",
    ),
    "hardlink": (_instead_of_block_0(_member(_block_name(0), kind=tarfile.LNKTYPE)), 400, "a link"),
    "fifo": (_instead_of_block_0(_member(_block_name(0), kind=tarfile.FIFOTYPE)), 400, "tar type"),
    "directory": (lambda m: [*m, _member("blocks/x", kind=tarfile.DIRTYPE)], 400, "a directory"),
    "dotdot": (lambda m: [*m, _member("blocks/../../x.kvb", b"x")], 400, "not a block file"),
    "absolute": (lambda m: [*m, _member("/tmp/escape.kvb", b"x")], 400, "absolute"),
    "extra member": (lambda m: [*m, _member("notes.txt", b"hello")], 400, "not a block file"),
    "block twice": (lambda m: [*m, m[1]], 400, "came twice"),
    "manifest not first": (lambda m: [*m[1:], m[0]], 400, "first file is 'blocks/"),
    "block missing": (lambda m: m[:-1], 400, "lacks 1 of the manifest's block files"),
    "oversized block": (_grown, 413, f"is {FILE + 1} bytes; the manifest says {FILE}"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_bad_tar_is_refused_and_nothing_is_written(source, target, monkeypatch, edit):
    change, status, words = EDITS[edit]
    body = _retar(exported(source, monkeypatch), change)
    before = state(target)
    put = Server(target, monkeypatch).request("POST", IMPORT_URL, content=body, headers=TAR)
    assert put.status_code == status, put.text
    error = put.json()["error"]
    assert error["code"] == status and words in error["message"], error
    assert state(target) == before
    assert scratch(target) == []


def test_a_tar_made_by_tar_of_a_bundle_directory_is_accepted(source, target, monkeypatch):
    """``tar cf B.tar manifest.json blocks`` of the CLI's bundle: a
    ``blocks/`` entry, ``./`` names, pax headers (here one naming a file)."""

    def as_tar_writes(members):
        (manifest, data), *blocks = members
        out = [(manifest, data), _member("./blocks/", kind=tarfile.DIRTYPE)]
        for info, block in blocks:
            info.name = "./" + info.name
            out.append((info, block))
        last = out[-1][0]
        last.pax_headers = {"path": last.name, "comment": "hi"}
        last.name = "short"
        return out

    body = _retar(exported(source, monkeypatch), as_tar_writes, tarfile.PAX_FORMAT)
    assert b"path=./blocks/" in body  # the pax header is there
    put = Server(target, monkeypatch).request("POST", IMPORT_URL, content=body, headers=TAR)
    assert put.status_code == 200, put.text
    for k in KEYS:
        assert block_path(target, k).read_bytes() == block_path(source, k).read_bytes()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"", "holds no manifest.json"),
        (b"not a tar" * 100, "not a tar"),
        (b"\x01" * 300, "ends inside a tar block"),
    ],
)
def test_a_body_that_is_no_tar_is_refused(target, monkeypatch, body, words):
    before = state(target)
    put = Server(target, monkeypatch).request("POST", IMPORT_URL, content=body, headers=TAR)
    assert put.status_code == 400 and words in put.json()["error"]["message"], put.text
    assert state(target) == before and scratch(target) == []


def test_garbage_after_the_end_and_a_large_manifest_are_refused(source, target, monkeypatch):
    good = exported(source, monkeypatch)
    b = Server(target, monkeypatch)
    before = state(target)
    put = b.request("POST", IMPORT_URL, content=good + b"\x01" * 10, headers=TAR)
    assert put.status_code == 400 and "after the tar's end" in put.text
    monkeypatch.setattr(bundle_tar, "MAX_MANIFEST_BYTES", 100)
    put = b.request("POST", IMPORT_URL, content=good, headers=TAR)
    assert put.status_code == 413 and "manifest.json of" in put.text
    assert state(target) == before and scratch(target) == []


def test_a_bundle_of_another_namespace_is_refused(source, target, tmp_path, monkeypatch):
    body = exported(source, monkeypatch)
    # The store knows the bundle's namespace, but this server's engine writes another.
    before = state(target)
    put = Server(target, monkeypatch, engine_ns=OTHER_NS).request(
        "POST", IMPORT_URL, content=body, headers=TAR
    )
    assert put.status_code == 400
    assert f"this server (m) writes namespace {OTHER_NS.hex()}" in put.json()["error"]["message"]
    assert state(target) == before and scratch(target) == []
    # An engine that cannot say: the store's own check refuses a namespace it lacks.
    other = tmp_path / "other"
    a_store(other, Primary(), ns=OTHER_NS)
    before = state(other)
    put = Server(other, monkeypatch, engine_ns=None).request(
        "POST", IMPORT_URL, content=body, headers=TAR
    )
    assert put.status_code == 400 and "does not know that namespace" in put.text
    assert state(other) == before and scratch(other) == []


def test_a_pin_over_budget_is_409_with_nothing_written(source, target, monkeypatch):
    body = exported(source, monkeypatch)
    before = state(target)
    # A budget of 2 blocks (0.5 of 4): refused from the manifest, before any block is read.
    put = Server(target, monkeypatch, cap_blocks=4).request(
        "POST", IMPORT_URL, content=body, headers=TAR
    )
    assert put.status_code == 409 and "even with no other pin" in put.text
    assert state(target) == before
    # A budget of 5 blocks, 3 held by another pin: refused by the ledger's own check.
    pin(target, "other", [key(k) for k in range(10, 13)])
    before = state(target)
    put = Server(target, monkeypatch, cap_blocks=10).request(
        "POST", IMPORT_URL, content=body, headers=TAR
    )
    assert put.status_code == 409 and "over the pin budget" in put.text, put.text
    assert "Nothing was written" in put.text
    assert state(target) == before and scratch(target) == []


def test_unknown_pin_is_404_and_a_bad_query_400(source, monkeypatch):
    a = Server(source, monkeypatch)
    missing = a.request("GET", "/v1/uma/pins/nope/bundle")
    assert missing.status_code == 404 and "no pin named 'nope'" in missing.text
    assert a.request("GET", BUNDLE_URL + "?namespace=zz").status_code == 400
    assert a.request("GET", f"{BUNDLE_URL}?namespace={OTHER_NS.hex()}").status_code == 404
    assert a.request("POST", IMPORT_URL + "?ttl_s=-1", content=b"").status_code == 400
    assert scratch(source) == []


def test_with_an_api_key_the_bundle_routes_need_it(source, target, monkeypatch):
    a = Server(source, monkeypatch, api_key="s3cret")
    assert a.request("GET", BUNDLE_URL).status_code == 401
    ok = a.request("GET", BUNDLE_URL, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    b = Server(target, monkeypatch, api_key="s3cret")
    before = state(target)
    assert b.request("POST", IMPORT_URL, content=ok.content, headers=TAR).status_code == 401
    assert state(target) == before
    put = b.request(
        "POST", IMPORT_URL, content=ok.content, headers={**TAR, "Authorization": "Bearer s3cret"}
    )
    assert put.status_code == 200, put.text


async def _call(app, method, path, chunks, *, gone_after=None):
    """One request straight through ASGI: the body in ``chunks``; with
    ``gone_after``, the client disconnects once that many body parts came."""
    parts, started, gone = list(chunks), [], asyncio.Event()
    sent: list[bytes] = []

    async def receive():
        if parts:
            return {"type": "http.request", "body": parts.pop(0), "more_body": bool(parts)}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            started.append(message)
        else:
            sent.append(message.get("body", b""))
            if gone_after is not None and len(sent) >= gone_after:
                gone.set()

    scope = {
        "type": "http", "method": method, "path": path, "raw_path": path.encode(),
        "query_string": b"", "headers": [], "http_version": "1.1", "scheme": "http",
        "server": ("t", 80), "client": ("t", 1), "root_path": "",
    }  # fmt: skip
    await app(scope, receive, send)
    gone.set()
    return started[0], sent


def test_a_client_gone_mid_stream_leaves_no_scratch(source, monkeypatch):
    a = Server(source, monkeypatch)
    start, sent = asyncio.run(_call(a.app, "GET", BUNDLE_URL, [b""], gone_after=1))
    length = int(dict(start["headers"])[b"content-length"])
    assert start["status"] == 200 and 0 < sum(map(len, sent)) < length
    assert scratch(source) == []


def test_an_import_in_small_parts_lands(source, target, monkeypatch):
    body = exported(source, monkeypatch)
    parts = [body[i : i + 700] for i in range(0, len(body), 700)]  # splits headers too
    b = Server(target, monkeypatch)
    b.use()
    start, sent = asyncio.run(_call(b.app, "POST", IMPORT_URL, parts))
    assert start["status"] == 200, sent
    for k in KEYS:
        assert block_path(target, k).read_bytes() == block_path(source, k).read_bytes()


def test_leftovers_of_gone_processes_are_removed(source, monkeypatch):
    base = source / ".noindex" / "http-bundles"
    base.mkdir()
    gone = f"{2**22 + 5}-abcd-x"  # above Linux's largest pid: no such process
    earlier = f"{os.getpid()}-0000-x"  # an earlier life of this pid
    alive = f"{os.getppid()}-abcd-x"  # another server's, running
    for name in (gone, earlier, alive):
        (base / name / "bundle").mkdir(parents=True)
    assert exported(source, monkeypatch)
    assert scratch(source) == [alive]


def test_a_bundle_larger_than_the_free_space_is_413_before_its_blocks(source, target, monkeypatch):
    body = exported(source, monkeypatch)
    before = state(target)
    real = os.statvfs
    monkeypatch.setattr(
        os, "statvfs", lambda p: types.SimpleNamespace(f_bavail=1, f_frsize=4096, f_blocks=9)
    )
    put = Server(target, monkeypatch).request("POST", IMPORT_URL, content=body, headers=TAR)
    monkeypatch.setattr(os, "statvfs", real)
    assert put.status_code == 413, put.text
    assert "4.0 KiB free on the store's volume" in put.json()["error"]["message"]
    assert state(target) == before and scratch(target) == []
