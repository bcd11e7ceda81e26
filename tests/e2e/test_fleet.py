"""`vllm-uma fleet` with two real servers behind the real vllm-router.

- A chat through the router's one URL answers the README question.
- Two conversations: their first turns, sent at once, are spread over the
  two servers; every later turn goes to the server holding its
  conversation (whose prefix cache then serves the shared prefix), and the
  router says it found that prefix in the server's reported KV (kv_aware,
  the default, fed by the servers' KV events through the fleet's relays).
  A policy without affinity (round_robin) moves turns, one without
  spreading puts both on one server, a router blind to the events counts no
  hit: each fails this.
- A server whose API server is killed with SIGKILL is reported and
  restarted by the fleet, and the router answers every request meanwhile
  from the other one; its engine core, orphaned, stops by itself
  (vllm_uma/lifeline.py).
- SIGTERM stops the fleet with status 0, every server first draining its
  disk tier.
- SIGKILL of the fleet process leaves no process behind: its servers stop as
  SIGTERM would stop them (draining their disk tiers) and the router's
  lifeline stops the router.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests

from tests.e2e.traffic import EAGER, MODEL
from tools.harness.server import free_port, metric
from vllm_uma import lifeline
from vllm_uma.kv_offload.pool_size import staging_tokens
from vllm_uma.models import smollm2
from vllm_uma.plugin.memory import parse_breakdown

pytestmark = pytest.mark.slow

READY_S = 300


def served_counts(servers: list[str]) -> list[float]:
    return [
        metric(requests.get(f"{url}/metrics", timeout=10).text, "vllm:request_success_total")
        for url in servers
    ]


def prefix_hits(url: str) -> float:
    return metric(requests.get(f"{url}/metrics", timeout=10).text, "vllm:prefix_cache_hits_total")


def generated(servers: list[str]) -> list[float]:
    return [
        metric(requests.get(f"{url}/metrics", timeout=10).text, "vllm:generation_tokens_total")
        for url in servers
    ]


def router_found(metrics_url: str) -> float:
    """Requests for which the router's KV index held part of the prompt."""
    text = requests.get(metrics_url, timeout=10).text
    return metric(text, "vllm_router_kv_placement_lookups_total", label='result="hit"')


def complete(url: str, text: str, tokens: int = 8) -> str:
    """Exactly ``tokens`` new tokens (min_tokens): a server's generation
    counter then says which request it served."""
    payload = {"model": MODEL, "prompt": text, "max_tokens": tokens, "min_tokens": tokens}
    payload["temperature"] = 0
    reply = requests.post(f"{url}/v1/completions", json=payload, timeout=120)
    reply.raise_for_status()
    return reply.json()["choices"][0]["text"]


Q = "\nUser: question {0} about the list above?\nAssistant:"


def start_fleet(exe: str, logs) -> dict:
    """A two-server fleet, once its log says it serves behind the router."""
    port = free_port()
    out = open(logs / "fleet.log", "w")
    argv = [exe, "fleet", "--servers", "2", "--port", str(port)]
    argv += ["--kv-store", str(logs / "kv"), "--log-dir", str(logs), *EAGER]
    proc = subprocess.Popen(
        argv,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **lifeline.supervised_env()},  # it stops if this test dies
    )
    fleet = dict(proc=proc, out=out, router=f"http://127.0.0.1:{port}", logs=logs)
    deadline = time.monotonic() + READY_S
    try:
        while "behind vllm-router" not in (logs / "fleet.log").read_text():
            assert proc.poll() is None, (logs / "fleet.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the fleet did not start"
            time.sleep(1)
    except BaseException:
        stop_fleet(fleet)
        raise
    text = (logs / "fleet.log").read_text()
    started = re.findall(r"server (\d) of 2 starting on (http://127\.0\.0\.1:\d+)", text)
    fleet["servers"] = [url for _, url in sorted(started)]  # server 1, server 2
    fleet["metrics"] = re.search(r"its metrics at (http://\S+/metrics)", text).group(1)
    return fleet


def stop_fleet(fleet: dict) -> None:
    proc = fleet["proc"]
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left
    except ProcessLookupError:
        pass
    fleet["out"].close()


@pytest.fixture(scope="module")
def fleets(vllm_uma_exe, default_model_dir, tmp_path_factory):
    """The module's fleets: one, unless a test stopped it (the SIGTERM test
    does); every fleet still running at the end is stopped."""
    started: list[dict] = []
    yield started
    for fleet in started:
        stop_fleet(fleet)


@pytest.fixture
def fleet(fleets, vllm_uma_exe, tmp_path_factory):
    """A running fleet, whatever ran before: the last one if it still runs,
    else a new one, so that no test depends on another's order or effects."""
    if not fleets or fleets[-1]["proc"].poll() is not None:
        fleets.append(start_fleet(vllm_uma_exe, tmp_path_factory.mktemp("fleet")))
    return fleets[-1]


def test_a_chat_through_the_router_answers(fleet):
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": smollm2.CHECK_PROMPT}],
        "max_tokens": 32,
        "temperature": 0,
    }
    reply = requests.post(f"{fleet['router']}/v1/chat/completions", json=payload, timeout=120)
    assert reply.status_code == 200, reply.text
    assert "Paris" in reply.json()["choices"][0]["message"]["content"]


def test_with_the_shared_store_each_pool_is_the_disk_tiers_staging_area(fleet):
    # The fleet names the connector without a size: each server sizes its
    # pool from what passes through it to the disk tier, L1 gets the rest.
    for i in (1, 2):
        text = (fleet["logs"] / f"server-{i}.log").read_text()
        assert "host pool of" in text and "a staging area for the disk tier" in text
        line = next(x for x in text.splitlines() if "memory breakdown:" in x)
        assert "; the pool stages KV for the disk tier" in line
        figures = parse_breakdown(line)
        shape = re.search(r"max_model_len=(\d+) .* max_num_batched_tokens=(\d+)", text)
        tokens = staging_tokens(int(shape[1]), int(shape[2]))
        per_token = figures["per_block_bytes"] // figures["block_size"]
        assert figures["kv_offload_pool"] == tokens * per_token


def test_each_conversation_stays_on_the_server_that_holds_it(fleet):
    servers, router = fleet["servers"], fleet["router"]
    words = {"A": ["apple", "river", "stone", "cloud"], "B": ["green", "light", "table", "music"]}
    texts = {
        name: f"Conversation {name}. " + " ".join(w[k % 4] + str(k % 10) for k in range(500))
        for name, w in words.items()
    }
    tokens = {"A": 8, "B": 9}  # told apart by the servers' generation counters
    hits_before = [prefix_hits(url) for url in servers]
    found_before = router_found(fleet["metrics"])
    # Turn 1 of both at once: a fleet spreads them over its two servers.
    before = generated(servers)
    with ThreadPoolExecutor(max_workers=2) as pool:
        replies = {
            n: pool.submit(complete, router, texts[n] + Q.format(0), tokens[n]) for n in texts
        }
        for name in texts:
            texts[name] += Q.format(0) + replies[name].result()
    delta = [round(a - b) for a, b in zip(generated(servers), before, strict=True)]
    assert sorted(delta) == [8, 9], f"turn 1 of A and B not spread over the servers: {delta}"
    holder = {"A": delta.index(8), "B": delta.index(9)}
    # Later turns, one at a time: each goes where its conversation's KV is.
    for turn in (1, 2):
        for name in texts:
            texts[name] += Q.format(turn)
            before = served_counts(servers)
            texts[name] += complete(router, texts[name])
            after = served_counts(servers)
            moved = [i for i in range(len(servers)) if after[i] > before[i]]
            assert moved == [holder[name]], f"turn {turn + 1} of {name}: {moved}, holder {holder}"
    for i, url in enumerate(servers):  # the later turns reused their prefix's KV
        assert prefix_hits(url) - hits_before[i] >= 2 * 500, url
    # ... and the router chose the holder because it knew where that KV was.
    assert router_found(fleet["metrics"]) - found_before >= 4


def test_a_killed_server_is_restarted_and_the_router_serves_meanwhile(fleet):
    victim = fleet["servers"][1]
    port = int(victim.rsplit(":", 1)[1])
    pids = [c.pid for c in psutil.net_connections("tcp") if c.laddr.port == port and c.pid]
    assert pids, f"nothing listens on {victim}"
    api_server = psutil.Process(pids[0])
    engine_cores = api_server.children(recursive=True)
    assert engine_cores, "the API server has no engine core"
    api_server.kill()  # SIGKILL to the API server alone: its engine core is orphaned
    gone, alive = psutil.wait_procs(engine_cores, timeout=lifeline.GRACE_S + 10)
    assert not alive, [p.pid for p in alive]
    server_log = (fleet["logs"] / "server-2.log").read_text()
    assert "has exited; stopping this engine core as SIGTERM would" in server_log
    log = fleet["logs"] / "fleet.log"
    deadline = time.monotonic() + 30
    while "server 2 exited" not in log.read_text():  # the fleet polls every second
        assert time.monotonic() < deadline, "the fleet did not notice the dead server"
        time.sleep(0.2)
    for i in range(4):  # served by the other server while this one restarts
        assert complete(fleet["router"], f"While one server is down, request {i}.")
    deadline = time.monotonic() + READY_S
    while True:
        text = log.read_text()
        if "server 2 is back in the router's rotation" in text:
            break
        assert fleet["proc"].poll() is None, text[-3000:]
        assert time.monotonic() < deadline, "server 2 was not restarted"
        time.sleep(1)
    deadline = time.monotonic() + READY_S
    while True:
        try:
            if requests.get(f"{victim}/health", timeout=2).ok:
                break
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, "the restarted server never became healthy"
        time.sleep(1)


def test_sigterm_stops_every_process_after_the_disk_tiers_drain(fleet):
    proc = fleet["proc"]
    children = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, [p.pid for p in alive]
    for i in (1, 2):
        assert "Disk KV tier stopped" in (fleet["logs"] / f"server-{i}.log").read_text()
    assert "fleet: stopped." in (fleet["logs"] / "fleet.log").read_text()


def test_sigkill_of_the_fleet_leaves_no_process_behind(fleet):
    proc = fleet["proc"]
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= 5, children  # 2 API servers, 2 engine cores, the router
    proc.kill()
    proc.wait(timeout=10)
    gone, alive = psutil.wait_procs(children, timeout=lifeline.GRACE_S + 30)
    assert not alive, [(p.pid, p.name()) for p in alive]
    for i in (1, 2):  # stopped as SIGTERM would stop them: their disk tiers drained
        text = (fleet["logs"] / f"server-{i}.log").read_text()
        assert "the process that started this server" in text
        assert "Disk KV tier stopped" in text
