"""KV memory follows the working set (memory_release/), through the real server.

One server with a host pool and the idle release after 6 s: four distinct
1,200-token prompts (nine full blocks each), each sent twice in a row (the
second is an L1 hit); then the server is left idle. The release must give
back at least the bytes of those 36 blocks, which the pool also holds, and
the log and /metrics must say so; the KV cache's resident pages (the
kernel's count, smaps Rss of its mapping) are then the warm reserve's.
(The process's whole RSS also moves with code paged in and Python's heap:
0.3-0.5% here, too much for an exact claim.) Revisited, the prompts come
back from the host pool, not from L1, with the L1 hit's tokens exactly: the
fair reference in either precision the test serves (same prefix/tail split;
tests/e2e/traffic.py, vllm_uma/models/oracles.py).

The warm reserve (memory_release/warm_reserve.py): before the first request
the KV cache's resident pages are the reserve's blocks.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.e2e.traffic import BLOCKS_OF_128, DTYPE, EAGER, complete, metrics
from tools.harness.server import Server, metric, model_process
from vllm_uma.memory_release.pages import PAGE
from vllm_uma.memory_release.resident import kv_resident
from vllm_uma.plugin.memory import BREAKDOWN_PREFIX, parse_breakdown

pytestmark = pytest.mark.slow

PROMPTS = range(4)
FULL_BLOCKS = 9  # of 128 tokens in a 1,200-token prompt
LAYERS = 30  # SmolLM2-135M's
GIVEN_BACK = re.compile(r"KV memory: idle for \d+ s: gave back ([\d.]+) GiB.*")
IDLE_SECONDS = 6
RESERVE = re.compile(r"KV warm reserve: the next (\d+) free KV blocks")


def l1_resident(server) -> int:
    """The kernel's count of the KV cache's resident pages (smaps Rss). A
    failure lists the large anonymous mappings there are (it once told that
    the KV cache's mapping was 3 MiB larger than resident.py's slack)."""
    line = next(x for x in server.log().splitlines() if BREAKDOWN_PREFIX in x)
    b = parse_breakdown(line)
    pid = model_process(server.proc.pid).pid
    found = kv_resident(pid, b["kv_cache"], b["kv_offload_pool"], 1)
    assert found.found_l1, (
        f"no KV cache mapping of the breakdown's size ({b['kv_cache']:,} B) in pid {pid}'s "
        f"smaps; its anonymous mappings over 64 MiB: {large_anonymous_mappings(pid)}"
    )
    return found.l1


def large_anonymous_mappings(pid: int) -> list[str]:
    out = []
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if fields[0].endswith(":") or len(fields) > 5:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if end - start > 64 << 20:
                out.append(f"{fields[0]} {fields[1]} {(end - start):,} B")
    return out


def wait_for_log(server, text: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in server.log():
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{server.log()[-3000:]}"
        time.sleep(0.2)


def wait_for_release(server, timeout_s: float = 60) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = GIVEN_BACK.search(server.log())
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"no idle release logged in {timeout_s} s:\n{server.log()[-3000:]}")


def wait_for_pool_stores(server, blocks: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while metric(metrics(server), "vllm:kv_offload_blocks_stored_total") < blocks:
        assert time.monotonic() < deadline, f"the pool did not store {blocks} blocks"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def run(vllm_uma_exe, default_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("release") / "server.log"
    uma = {"vllm_uma": {"release_idle_seconds": IDLE_SECONDS}}
    args = [*EAGER, *BLOCKS_OF_128, *DTYPE, "--kv-offloading-size", "1"]
    args += ["--additional-config", json.dumps(uma)]
    srv = Server(vllm_uma_exe, args, log).wait_ready()
    try:
        wait_for_log(srv, "KV warm reserve: made")
        warm_l1 = l1_resident(srv)
        hits = {}
        for i in PROMPTS:
            complete(srv, i, max_tokens=4)
            hits[i] = complete(srv, i, max_tokens=4)
        # The pool's stores of the last request end shortly after its reply:
        # read the RSS once the pool holds every full block, well before the
        # release.
        wait_for_pool_stores(srv, len(PROMPTS) * FULL_BLOCKS)
        busy_l1 = l1_resident(srv)
        block_bytes = int(re.search(r"per_block_bytes=(\d+)", srv.log()).group(1))
        released = wait_for_release(srv)
        idle_l1 = l1_resident(srv)
        before = metrics(srv)
        revisits = {i: complete(srv, i, max_tokens=4) for i in PROMPTS}
        after = metrics(srv)
        yield dict(
            hits=hits,
            revisits=revisits,
            busy_l1=busy_l1,
            idle_l1=idle_l1,
            warm_l1=warm_l1,
            block_bytes=block_bytes,
            released=released,
            before=before,
            after=after,
            log=srv.log(),
        )
    finally:
        srv.stop()


def freed_bytes(run) -> int:
    """The freed blocks' bytes, but for the page at each end of each layer's
    run of them: vLLM's KV buffer need not start on a page, and a page the
    run shares with a block the warm reserve keeps stays (pages.py)."""
    return len(PROMPTS) * FULL_BLOCKS * run["block_bytes"] - 2 * LAYERS * PAGE


def test_the_idle_release_leaves_only_the_warm_reserve_resident(run):
    # Busy: the prompts' blocks were resident. Idle: the pool holds every
    # full block, so all that stays in the KV cache is the warm reserve
    # (which refills as soon as the server is idle, before the release).
    freed = freed_bytes(run)
    assert run["busy_l1"] >= freed, (run["busy_l1"], freed)
    reserve = reserve_bytes(run)
    assert reserve <= run["idle_l1"] <= reserve + 2 * run["block_bytes"], (run["idle_l1"], reserve)
    assert float(run["released"].group(1)) * 2**30 >= freed * 0.99, run["released"].group(0)


def test_given_back_counted_in_metrics(run):
    counted = metric(run["after"], "vllm:kv_memory_given_back_idle_bytes_total")
    assert counted >= freed_bytes(run)


def test_revisits_restore_from_the_pool_with_the_hits_tokens(run):
    def cached(text, source):
        return metric(text, "vllm:prompt_tokens_cached_by_source_total", f'source="{source}"')

    host = cached(run["after"], "host") - cached(run["before"], "host")
    device = cached(run["after"], "device") - cached(run["before"], "device")
    assert host >= len(PROMPTS) * FULL_BLOCKS * 128 - 128, (host, device)
    assert device == 0
    assert run["revisits"] == run["hits"]


def reserve_bytes(run) -> int:
    return int(RESERVE.search(run["log"]).group(1)) * run["block_bytes"]


def test_the_warm_reserve_is_resident_before_the_first_request(run):
    # Filled as the scheduler is built, so before the server says it is up.
    log = run["log"]
    assert 0 <= log.find("KV warm reserve: made") < log.find("Application startup complete")
    reserve = reserve_bytes(run)
    assert reserve > 0
    # vLLM's start-up runs write no KV block; a block or two of slack.
    assert reserve <= run["warm_l1"] <= reserve + 2 * run["block_bytes"], (run["warm_l1"], reserve)
