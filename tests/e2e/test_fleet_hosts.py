"""`vllm-uma fleet` on two simulated hosts behind one real vllm-router, with
the network tier on a real Valkey server on a third (tools/hosts: network
namespaces on a bridge, links shaped to 10 Gbit/s).

Host 1 runs a fleet of one server with the router (`--advertise`, the
router on host 1's address); host 2 a fleet of one server that joins it
(`--join`); the client runs on host 3 beside the KV server. Each host has its
own disk store. float32, so that tokens compare exactly.

- Host 2's fleet adds its server to host 1's router: round_robin sends the
  same prompt once to each host, and the second host restores its prefix
  from the network tier (its /metrics), with the first host's tokens.

- Who can steer it: from the client's host, the router refuses to add or
  list workers (its gate, fleet/gate.py), and host 2's vLLM server refuses
  /v1/completions and /tokenize without the fleet's API key (vLLM's
  --api-key and fleet/server_guard.py) and answers with it. Every host
  names one key file (--api-key-file), as the KV secret.

A stop takes a joined fleet's servers out of the router's rotation
(vllm-router's /remove_worker): tests/integration/test_fleet_supervisor.py, against
a stand-in router, to keep this module's time to its one server start per
host.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.e2e.traffic import BLOCKS_OF_128, EAGER, MODEL, prompt
from tools.harness.server import metric
from tools.harness.valkey_server import KvServer
from tools.hosts import LinkShape, Network
from vllm_uma import lifeline

pytestmark = pytest.mark.slow

READY_S = 300
ROUTER_PORT = 8000  # a fresh namespace: every port is free
CACHED = "vllm:prompt_tokens_cached_by_source_total"
WRITTEN = "vllm:kv_offload_network_written_blocks_total"
NETWORK_SOURCE = "external_unspecified"
BLOCK_TOKENS = 128  # the servers run with BLOCKS_OF_128


def wait_for(check, what: str, timeout: float = READY_S, proc=None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while not check():
        if proc is not None and proc.poll() is not None:
            pytest.fail(
                f"{what}: the fleet exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        assert time.monotonic() < deadline, f"{what}: not after {timeout} s"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def hosts(vllm_uma_exe, default_model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("fleet-hosts")
    with Network(3, LinkShape(rate_mbit=10_000)) as net:
        address = {i: net.host(i).address for i in (1, 2, 3)}
        lru = ("--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru")
        kv_server = net.on(3).submit(KvServer, work, *lru, host=address[3]).result()
        shared = [*EAGER, *BLOCKS_OF_128, "--dtype", "float32", "--max-model-len", "2048"]
        shared += ["--gpu-memory-utilization", "0.3", "--kv-network", kv_server.url]
        # Every host signs with the same key: the file the first fleet creates.
        shared += ["--kv-secret-file", str(work / "kv-network.secret")]
        # And holds the fleet's API key: the file the first fleet creates.
        shared += ["--api-key-file", str(work / "fleet-api.key")]
        router = f"http://{address[1]}:{ROUTER_PORT}"
        out = {"net": net, "router": router, "kv_server": kv_server, "work": work, "fleets": []}

        def fleet(i: int, *flags: str) -> subprocess.Popen:
            log = work / f"fleet-{i}.out"
            argv = [vllm_uma_exe, "fleet", "--servers", "1", "--advertise", address[i]]
            argv += ["--kv-store", str(work / f"kv-{i}"), "--log-dir", str(work / f"logs-{i}")]
            proc = net.popen(i, [*argv, *flags, *shared], stdout=open(log, "w"),
                             stderr=subprocess.STDOUT,
                             env={**os.environ, **lifeline.supervised_env()})  # fmt: skip
            out["fleets"].append(proc)
            return proc

        try:
            first = fleet(1, "--host", address[1], "--port", str(ROUTER_PORT),
                          "--policy", "round_robin")  # fmt: skip
            on_client = net.on(3)

            def router_up() -> bool:
                try:
                    return requests.get(f"{router}/health", timeout=2).ok
                except requests.RequestException:
                    return False

            wait_for(lambda: on_client.submit(router_up).result(), "host 1's router",
                     proc=first, log=work / "fleet-1.out")  # fmt: skip
            out["second"] = fleet(2, "--join", router)
            wait_for(lambda: "joined vllm-router" in (work / "fleet-2.out").read_text(),
                     "host 2's join", proc=out["second"], log=work / "fleet-2.out")  # fmt: skip
            yield out
        finally:
            for proc in out["fleets"]:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
            for proc in out["fleets"]:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
            kv_server.stop()


def server_url(work: Path, i: int) -> str:
    text = (work / f"fleet-{i}.out").read_text()
    return re.search(r"server 1 of 1 starting on (http://\S+),", text)[1]


def ask(hosts, i: int) -> dict:
    payload = {"model": MODEL, "prompt": prompt(i), "max_tokens": 8, "temperature": 0}
    payload["return_token_ids"] = True
    reply = requests.post(f"{hosts['router']}/v1/completions", json=payload, timeout=120)
    reply.raise_for_status()
    return reply.json()


def counter(url: str, name: str, label: str = "") -> float:
    body = requests.get(f"{url}/metrics", timeout=10).text
    return metric(body, name, label)


def test_a_joined_host_restores_what_the_other_stored_with_its_tokens(hosts):
    on_client, work = hosts["net"].on(3), hosts["work"]
    urls = [server_url(work, 1), server_url(work, 2)]
    label = f'source="{NETWORK_SOURCE}"'

    def each(name: str, lab: str = "") -> list[float]:
        return [on_client.submit(counter, u, name, lab).result() for u in urls]

    before = each(CACHED, label)
    first = on_client.submit(ask, hosts, 0).result()
    full = (first["usage"]["prompt_tokens"] - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    # Its blocks reach the KV server behind the reply: wait until they are there.
    wait_for(lambda: sum(each(WRITTEN)) >= full // BLOCK_TOKENS, "the first host's stores", 60)
    second = on_client.submit(ask, hosts, 0).result()  # round_robin: the other host
    from_network = [a - b for a, b in zip(each(CACHED, label), before, strict=True)]
    assert sorted(from_network) == [0, full]  # one host computed, the other restored
    assert second["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]


def test_the_client_host_cannot_steer_the_router_nor_call_a_server_without_the_key(hosts):
    on_client, work = hosts["net"].on(3), hosts["work"]
    router, server = hosts["router"], server_url(work, 2)
    key = (work / "fleet-api.key").read_text().split()[0]

    def status(method: str, url: str, key: str | None = None, **kw) -> int:
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        return requests.request(method, url, headers=headers, timeout=60, **kw).status_code

    mine = f"http://{hosts['net'].host(3).address}:9999"
    assert on_client.submit(status, "POST", f"{router}/add_worker?url={mine}").result() == 403
    assert on_client.submit(status, "GET", f"{router}/list_workers").result() == 403
    assert on_client.submit(status, "POST", f"{router}/tokenize", json={}).result() == 404
    one = {"model": MODEL, "prompt": "Hello", "max_tokens": 1}
    tokens = {"model": MODEL, "prompt": "Hello"}
    for path, body in (("/v1/completions", one), ("/tokenize", tokens)):
        assert on_client.submit(status, "POST", server + path, json=body).result() == 401, path
        assert on_client.submit(status, "POST", server + path, key, json=body).result() == 200
    assert on_client.submit(status, "GET", f"{server}/health").result() == 200
