"""`vllm-uma fleet` with two real servers behind the real vllm-router.

- A chat through the router's one URL answers the README question.
- Two conversations, their turns interleaved through the router: each
  conversation stays on one server from its second turn on (that server's
  prefix cache serves the turns' shared prefix), and the two are spread
  over the two servers. A policy without affinity (round_robin) moves turns
  between servers and fails this.
- A server killed with SIGKILL is reported and restarted by the fleet, and
  the router answers every request meanwhile from the other one.
- SIGTERM stops the fleet with status 0, every server first draining its
  disk tier.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import psutil
import pytest
import requests

from tests.e2e.traffic import EAGER, MODEL
from vllm_uma import default_model
from vllm_uma.server_process import free_port, metric

pytestmark = pytest.mark.slow

READY_S = 300


def served_counts(servers: list[str]) -> list[float]:
    return [
        metric(requests.get(f"{url}/metrics", timeout=10).text, "vllm:request_success_total")
        for url in servers
    ]


def prefix_hits(url: str) -> float:
    return metric(requests.get(f"{url}/metrics", timeout=10).text, "vllm:prefix_cache_hits_total")


def complete(url: str, text: str) -> str:
    payload = {"model": MODEL, "prompt": text, "max_tokens": 8, "temperature": 0}
    reply = requests.post(f"{url}/v1/completions", json=payload, timeout=120)
    reply.raise_for_status()
    return reply.json()["choices"][0]["text"]


def conversation_start(name: str) -> str:
    words = ["apple", "river", "stone", "cloud", "green", "light", "table", "music"]
    return f"Conversation {name}. " + " ".join(words[k % 8] + str(k % 10) for k in range(500))


@pytest.fixture(scope="module")
def fleet(vllm_uma_exe, default_model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("fleet")
    port = free_port()
    out = open(logs / "fleet.log", "w")
    argv = [vllm_uma_exe, "fleet", "--servers", "2", "--port", str(port)]
    argv += ["--kv-store", str(logs / "kv"), "--log-dir", str(logs), *EAGER]
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    router = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_S
    try:
        while "behind vllm-router" not in (logs / "fleet.log").read_text():
            assert proc.poll() is None, (logs / "fleet.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the fleet did not start"
            time.sleep(1)
        servers = re.findall(
            r"starting on (http://127\.0\.0\.1:\d+)", (logs / "fleet.log").read_text()
        )
        yield dict(proc=proc, router=router, servers=servers[:2], logs=logs)
    finally:
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
        out.close()


def test_a_chat_through_the_router_answers(fleet):
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": default_model.CHECK_PROMPT}],
        "max_tokens": 32,
        "temperature": 0,
    }
    reply = requests.post(f"{fleet['router']}/v1/chat/completions", json=payload, timeout=120)
    assert reply.status_code == 200, reply.text
    assert "Paris" in reply.json()["choices"][0]["message"]["content"]


def test_each_conversation_stays_on_the_server_that_holds_it(fleet):
    servers, router = fleet["servers"], fleet["router"]
    texts = {name: conversation_start(name) for name in ("A", "B")}
    served: dict[str, list[int]] = {name: [] for name in texts}
    hits_before = {i: prefix_hits(url) for i, url in enumerate(servers)}
    for turn in range(3):
        for name in texts:  # A1, B1, A2, B2, A3, B3: one at a time, to attribute
            texts[name] += f"\nUser: question {turn} about item {turn * 7}?\nAssistant:"
            before = served_counts(servers)
            texts[name] += complete(router, texts[name])
            after = served_counts(servers)
            moved = [i for i in range(len(servers)) if after[i] > before[i]]
            assert len(moved) == 1, (before, after)
            served[name].append(moved[0])
    for name, path in served.items():
        assert len(set(path)) == 1, f"conversation {name} moved between servers: {path}"
    assert served["A"][0] != served["B"][0], f"both conversations on one server: {served}"
    for i, url in enumerate(servers):  # later turns reused their prefix's KV
        assert prefix_hits(url) - hits_before[i] >= 2 * 500, url


def test_a_killed_server_is_restarted_and_the_router_serves_meanwhile(fleet):
    victim = fleet["servers"][1]
    port = int(victim.rsplit(":", 1)[1])
    pids = [c.pid for c in psutil.net_connections("tcp") if c.laddr.port == port and c.pid]
    assert pids, f"nothing listens on {victim}"
    os.killpg(os.getpgid(pids[0]), signal.SIGKILL)
    for i in range(4):  # served by the other server while this one is down
        assert complete(fleet["router"], f"While one server is down, request {i}.")
    log = fleet["logs"] / "fleet.log"
    deadline = time.monotonic() + READY_S
    while True:
        text = log.read_text()
        if "server 2 exited" in text and text.count("server 2 of 2 starting") >= 2:
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
