"""The disk tier (L3) through real servers on one root_dir.

Every server here runs the model in float32, so that "the same tokens" can
be demanded exactly whatever computed a prefix: a cold prefill, an L1 hit,
a host-pool restore, a whole or partial disk restore (vllm_uma/models/oracles.py).
In bfloat16 a prefix split differently rounds differently, and a damaged
block makes the split depend on which file was damaged. Float32 is upcast
from the same weights and its rounding no longer reaches the argmax, on any
CPU's kernels: the comparisons hold on AVX2, AVX-512 and AMX alike.

- A serves four long prompts cold, each again at once (an L1 hit), then all
  four again after they left L1 (restored from the host pool): the three
  must give the same tokens. It stops at once. Three of its block files are
  then damaged: one truncated, one with flipped bytes, one replaced by a
  file another model wrote under the same name.
- B, a new process on the same root_dir, serves the four prompts again: most
  prefix tokens come from disk, each damaged file is a counted miss, and the
  greedy tokens equal A's.
- C has a cap a third of its traffic: the bytes on disk never exceed the cap
  by more than one block, and with KV events on, its disk stores and
  evictions are published. C is killed with SIGKILL while it stores.
- D starts on C's root_dir: no partial file is left, some prefix tokens of
  C's prompts come back from the blocks C wrote before it was killed, and
  D's tokens equal C's.
- F starts on a copy of the store A wrote (taken before the damage) in
  which one 2-hex subdirectory was moved out and replaced by a symlink to
  it: F serves A's prompts with A's tokens, the blocks behind the link are
  recomputed and their stores refused, and nothing behind the link is
  read, written or deleted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import pytest
import zmq
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

from tests.e2e.disk_store import (
    BLOCK_FILE_BYTES,
    BLOCK_TOKENS,
    block_files,
    disk_args,
    leftovers,
    namespace_of,
    start,
    store_bytes,
)
from tests.e2e.traffic import complete, metrics
from tools.harness.server import free_port, metric
from vllm_uma.commands.kv_events_endpoint import private_dir
from vllm_uma.kv_offload.disk import block_file
from vllm_uma.kv_offload.disk.block_write import write_block

pytestmark = pytest.mark.slow

PROMPTS = range(4)
DISK_HITS = "vllm:prompt_tokens_cached_by_source_total"
BAD_BLOCKS = "vllm:kv_offload_disk_bad_blocks_total"
EVICTIONS = "vllm:kv_offload_disk_evicted_blocks_total"
STORE_FAILED = "vllm:kv_offload_disk_store_failed_blocks_total"
OTHER_MODEL = b"\x01" * 16  # a namespace id no real model has
C_REVISITS = [3, 2, 1, 0]  # C's completed prompts, the last stored first


class EventListener:
    """Collects the KV events a server publishes on ZMQ.

    Named (``private=False``): vLLM's publisher binds wildcard endpoints and
    connects to the rest, so the listener binds a loopback port and the
    server connects to it. Private (no endpoint given, vllm-uma's default):
    the server binds an ipc:// socket of this user's, which the listener
    connects to once the server runs (:meth:`follow`)."""

    def __init__(self, private: bool = False):
        self.endpoint = None if private else f"tcp://127.0.0.1:{free_port()}"
        self.events: list = []
        self.batches: list[list] = []  # as published: one engine step's events each
        self._stop = threading.Event()
        self._sub = zmq.Context.instance().socket(zmq.SUB)
        if self.endpoint is not None:
            self._sub.bind(self.endpoint)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        self._thread = threading.Thread(target=self._listen, daemon=True)

    def server_args(self) -> list[str]:
        config = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv"}
        if self.endpoint is not None:
            config["endpoint"] = self.endpoint
        return ["--kv-events-config", json.dumps(config)]

    def follow(self, server) -> None:
        """Subscribe to a private server's socket, where its log says it is."""
        found = re.search(r"KV events: published on (ipc://\S+) \(this user only\)", server.log())
        assert found, "the server did not say where it publishes"
        socket_path = private_dir() / f"kv-events-{server.port}.sock"
        assert found.group(1) == f"ipc://{socket_path}"
        assert stat.S_IMODE(socket_path.parent.stat().st_mode) == 0o700
        self._sub.connect(found.group(1))

    def start(self) -> None:
        self._thread.start()

    def _listen(self) -> None:
        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        while not self._stop.is_set():
            if self._sub.poll(100):
                _, _, payload = self._sub.recv_multipart()
                batch = decoder.decode(payload).events
                self.batches.append(batch)
                self.events.extend(batch)
        self._sub.close(linger=0)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()  # it closes the socket
        else:
            self._sub.close(linger=0)

    def on_disk(self, kind, events=None) -> list:
        events = self.events if events is None else events
        return [e for e in events if isinstance(e, kind) and e.medium == "STORAGE"]

    def first_disk_batch(self, kind) -> list:
        """The disk events of the first batch that has any."""
        return next((found for b in self.batches if (found := self.on_disk(kind, b))), [])


def serve_prompts(
    exe, args, log_dir: Path, before=None, order=PROMPTS, topic: str = "Story"
) -> tuple[list[list[int]], str, object]:
    """A fresh server's greedy tokens for the prompts of ``order``, its
    /metrics after them, and what ``before()`` returned, called once the
    server is ready."""
    server = start(exe, args, log_dir)
    try:
        seen = before() if before else None
        outputs = [complete(server, i, topic) for i in order]
        return outputs, metrics(server), seen
    finally:
        server.stop()


def damage(root: Path) -> dict[str, Path]:
    """Truncate one block file, flip bytes in another, replace a third by a
    well-formed file written for another namespace (another model). A fourth
    is named for plant_fifo, once the next server has indexed it."""
    files = block_files(root)
    truncated, flipped, foreign = files[0], files[len(files) // 2], files[-1]
    fifo = files[len(files) // 4]
    with open(truncated, "r+b") as f:
        f.truncate(truncated.stat().st_size // 2)
    with open(flipped, "r+b") as f:
        f.seek(-100, os.SEEK_END)
        tail = f.read(64)
        f.seek(-100, os.SEEK_END)
        f.write(bytes(b ^ 0xFF for b in tail))
    key = block_file.key_from_name(foreign.name)
    payload = foreign.read_bytes()[block_file.HEADER_BYTES :]
    foreign.unlink()
    write_block(foreign, key, OTHER_MODEL, memoryview(payload), direct=False)
    return {"truncated": truncated, "flipped": flipped, "foreign": foreign, "fifo": fifo}


def plant_fifo(path: Path) -> None:
    """Replace a block file a running server has indexed by a FIFO: opening
    it without O_NONBLOCK would wait for a writer for ever. (One planted
    before start-up is not indexed at all: the scan takes regular files only.)"""
    path.unlink()
    os.mkfifo(path, 0o600)


def move_out_and_link_back(subdir: Path, outside: Path) -> list:
    """Move a 2-hex subdirectory out of the store and put a symlink in its
    place. Returns what is in it, to compare with afterwards."""
    os.rename(subdir, outside)
    os.symlink(outside, subdir)
    return listing(outside)


def listing(directory: Path) -> list[tuple[str, int, int]]:
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir())


@pytest.fixture(scope="module")
def restart(vllm_uma_exe, default_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("disk-tier") / "kv"
    args = disk_args(root, cap_gib=1)
    a = start(vllm_uma_exe, args, tmp_path_factory.mktemp("server-a"))
    try:
        a_outputs, a_hits = [], []
        for i in PROMPTS:
            a_outputs.append(complete(a, i))
            a_hits.append(complete(a, i))  # its prefix is in L1 now
        # L1 holds under two prompts: each comes back from the pool.
        a_restores = [complete(a, i) for i in PROMPTS]
        a_pool_tokens = metric(metrics(a), DISK_HITS, 'source="host"')
    finally:
        # Right after the last reply: the stop itself must write what is
        # still pending (the platform raises --shutdown-timeout for that).
        a.stop()
    files_after_a = block_files(root)
    # An undamaged copy of what A wrote, for the symlink test (linked).
    shutil.copytree(root, root.parent / "copy-of-a", symlinks=True)
    damaged = damage(root)
    b_outputs, b_metrics, _ = serve_prompts(
        vllm_uma_exe,
        args,
        tmp_path_factory.mktemp("server-b"),
        before=lambda: plant_fifo(damaged["fifo"]),
    )
    return dict(
        root=root,
        a_outputs=a_outputs,
        a_hits=a_hits,
        a_restores=a_restores,
        a_pool_tokens=a_pool_tokens,
        b_outputs=b_outputs,
        b_metrics=b_metrics,
        files_after_a=files_after_a,
        damaged=damaged,
    )


def test_cold_l1_hit_and_pool_restore_give_the_same_tokens(restart):
    assert restart["a_hits"] == restart["a_outputs"]
    assert restart["a_restores"] == restart["a_outputs"]
    # The restores were restores: all four prompts' full blocks from the pool.
    assert restart["a_pool_tokens"] >= len(PROMPTS) * 9 * BLOCK_TOKENS
    # And the prompts' tokens differ, so equality is not trivial.
    assert len({tuple(t) for t in restart["a_outputs"]}) == len(PROMPTS)


def test_a_restarted_server_serves_the_same_tokens(restart):
    assert restart["b_outputs"] == restart["a_outputs"]


def test_a_stop_right_after_the_last_reply_writes_every_block(restart):
    assert len(restart["files_after_a"]) == 9 * len(PROMPTS)


def test_most_prefix_tokens_come_back_from_disk(restart):
    disk_tokens = metric(restart["b_metrics"], DISK_HITS, 'source="disk"')
    full_blocks = 9 * len(PROMPTS)
    # Three damaged blocks (and what follows each in its prompt) are recomputed.
    found = f"{disk_tokens / BLOCK_TOKENS:.0f} of {full_blocks} blocks from disk"
    assert disk_tokens >= (full_blocks // 2) * BLOCK_TOKENS, found
    assert disk_tokens <= full_blocks * BLOCK_TOKENS, found


def test_each_damaged_file_is_a_counted_miss_and_removed(restart):
    text = restart["b_metrics"]
    assert metric(text, BAD_BLOCKS) == 4
    assert metric(text, BAD_BLOCKS, 'reason="not_a_file"') == 1  # the FIFO
    for path in restart["damaged"].values():
        # Removed, or stored again (from the recomputed KV) with B's namespace.
        assert not path.is_fifo()
        assert not path.exists() or namespace_of(path) != OTHER_MODEL


def test_files_are_private(restart):
    root = restart["root"]
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    for directory in [
        root / ".noindex",
        *(p for p in (root / ".noindex").rglob("*") if p.is_dir()),
    ]:
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    files = restart["files_after_a"]
    assert files
    for path in block_files(root):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


@pytest.fixture(scope="module")
def capped(vllm_uma_exe, default_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("disk-capped") / "kv"
    block = BLOCK_FILE_BYTES
    cap_bytes = 18 * block  # six prompts of 9 blocks: three times the cap
    args = disk_args(root, cap_gib=cap_bytes / (1 << 30))
    sizes = []
    stop_sampling = threading.Event()

    def sample():
        while not stop_sampling.is_set():
            sizes.append(store_bytes(root))
            time.sleep(0.05)

    # C publishes on vllm-uma's private default socket; D on a named endpoint.
    listener = EventListener(private=True)
    c = start(vllm_uma_exe, args + listener.server_args(), tmp_path_factory.mktemp("server-c"))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        listener.follow(c)
        listener.start()
        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = [pool.submit(complete, c, i, "Capped") for i in range(6)]
            c_outputs = [future.result() for future in futures[:4]]
            evictions = metric(metrics(c), EVICTIONS)
            # Killed while the last prompts compute and store.
            os.killpg(c.proc.pid, signal.SIGKILL)
            c.proc.wait(timeout=30)
    finally:
        stop_sampling.set()
        sampler.join()
        listener.stop()
        c.stop()
    # D restores what the killed C wrote. The most recent prompts first (C's
    # cap kept the blocks it stored last), and a cap of D's own large enough
    # that D's stores evict none of C's blocks before D asks for them.
    # D also publishes KV events: its first disk event announces what it
    # found on disk at start-up.
    on_disk_at_start = len(block_files(root))
    d_listener = EventListener()
    d_listener.start()
    try:
        d_outputs, d_metrics, d_leftovers = serve_prompts(
            vllm_uma_exe,
            disk_args(root, cap_gib=1) + d_listener.server_args(),
            tmp_path_factory.mktemp("server-d"),
            before=lambda: leftovers(root),
            order=C_REVISITS,
            topic="Capped",
        )
    finally:
        d_listener.stop()
    return dict(
        cap=cap_bytes,
        block=block,
        sizes=sizes,
        evictions=evictions,
        disk_stored=listener.on_disk(BlockStored),
        disk_removed=listener.on_disk(BlockRemoved),
        d_leftovers=d_leftovers,
        on_disk_at_start=on_disk_at_start,
        d_first_disk_batch=d_listener.first_disk_batch(BlockStored),
        c_outputs=[c_outputs[i] for i in C_REVISITS],
        d_outputs=d_outputs,
        d_metrics=d_metrics,
    )


def test_bytes_on_disk_never_exceed_the_cap_by_more_than_one_block(capped):
    assert capped["sizes"]
    assert max(capped["sizes"]) <= capped["cap"] + capped["block"]
    assert capped["evictions"] > 0


def test_disk_stores_and_evictions_are_published_as_kv_events(capped):
    assert capped["disk_stored"], "no BlockStored event with medium STORAGE"
    assert capped["disk_removed"], "no BlockRemoved event with medium STORAGE"


def test_after_sigkill_no_partial_file_is_left_and_serving_is_correct(capped):
    assert capped["d_leftovers"] == []
    assert metric(capped["d_metrics"], BAD_BLOCKS) == 0
    assert capped["d_outputs"] == capped["c_outputs"]


def test_after_sigkill_the_killed_servers_blocks_are_restored(capped):
    disk_tokens = metric(capped["d_metrics"], DISK_HITS, 'source="disk"')
    assert disk_tokens >= BLOCK_TOKENS, "D restored nothing the killed server wrote"


@pytest.fixture(scope="module")
def linked(vllm_uma_exe, restart, tmp_path_factory):
    """A copy of the store A wrote (restart); a subdirectory of its blocks is
    moved out of the store and linked back; F serves A's prompts on it (the
    victim may be a block of any of them)."""
    root = restart["root"].parent / "copy-of-a"
    victim = block_files(root)[len(block_files(root)) // 2]
    outside = root.parent / "outside-the-store"
    before = move_out_and_link_back(victim.parent, outside)
    f_outputs, f_metrics, _ = serve_prompts(
        vllm_uma_exe, disk_args(root, cap_gib=1), tmp_path_factory.mktemp("server-f")
    )
    return dict(
        a_outputs=restart["a_outputs"],
        f_outputs=f_outputs,
        f_metrics=f_metrics,
        outside=outside,
        before=before,
    )


def test_nothing_is_read_written_or_deleted_through_a_symlinked_subdirectory(linked):
    assert listing(linked["outside"]) == linked["before"]
    # The blocks behind the link were recomputed, and their store refused.
    assert linked["f_outputs"] == linked["a_outputs"]
    assert metric(linked["f_metrics"], STORE_FAILED, 'reason="io_error"') >= 1


def test_a_restarted_server_announces_the_blocks_it_found_on_disk(capped):
    # Published with D's first engine step, before any store of its own
    # completes: one BlockStored (medium STORAGE) per block file found.
    assert capped["on_disk_at_start"] > 0
    announced = capped["d_first_disk_batch"]
    assert len({h for e in announced for h in e.block_hashes}) == capped["on_disk_at_start"]
