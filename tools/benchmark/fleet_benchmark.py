"""A fleet's routing policies on the same multi-turn traffic (vllm-uma fleet).

    .venv/bin/python -m tools.benchmark.fleet_benchmark --out bench-out/fleet.json
        [--policies round_robin,cache_aware,kv_aware] [--conversations 4]
        [--turns 3] [--disk both|on|off] [--no-restart]

For each policy, and for each disk setting (--disk both: with the shared
disk store, then without any disk tier), a fresh fleet of two servers
(vllm-uma fleet's own plan and supervisor: cores and memory split, a host
pool each, one shared disk store in a new directory) behind vllm-router
with that policy, then the same
traffic: --conversations conversations at once, each on its own ~1,000-token
system prompt, --turns turns each (a turn's prompt is the whole conversation
so far), and after each turn one or two unrelated ~1,000-token prompts
(other traffic that pushes KV out of the small L1; the count varies so
that round_robin's rotation does not keep a conversation on one server). Unless
--no-restart, server 2 is killed after the second turns and the fleet
restarts it (its L1 and pool are lost; its disk blocks are not).

Per policy, printed and written to --out (a PNG beside it): TTFT p50 and p99
(streamed, time to the first token), p50 of later turns only, prompt tokens
served from each tier (device = L1, host = pool, disk) and recomputed, from
the servers' own /metrics, requests per server (the load spread), the
later turns whose server found at least half of their prompt cached, and
the mean share found (from each reply's usage: cached_tokens), and the
router's own view: requests for which its KV index held part of the prompt
(``vllm_router_kv_placement_lookups_total``, kv_aware only). Without a disk
tier a turn that lands away from its conversation's server must be
recomputed: that is where routing by KV shows. One run, same traffic:
compare the policies' ratios, not absolute times. fleet_report.py computes
the figures and lays them out.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import requests

from tools.benchmark.fleet_report import chart, figures, print_table
from tools.benchmark.lib import client
from tools.benchmark.lib.prompts import MODEL, document
from tools.benchmark.lib.report import write_json
from tools.benchmark.lib.servers import kill_listener
from tools.harness.server import free_port, metric
from vllm_uma.commands.kv_events_endpoint import private_dir
from vllm_uma.fleet.plan import FleetPlan, FleetRequest, plan_fleet
from vllm_uma.fleet.supervisor import Fleet

REPO = Path(__file__).resolve().parents[2]
# A small L1 (about 2,600 bf16 tokens each) so that other traffic evicts a
# conversation between its turns: what then comes back from the pool or the
# disk is visible. Eager: a fleet starts in about 40 s instead of 2 minutes.
# --enable-prompt-tokens-details: each reply says how many of its prompt
# tokens its server found cached (any tier), which tells whether a later
# turn reached its conversation's KV.
SERVE_FLAGS = (
    "--enforce-eager", "--kv-cache-memory-bytes", "60000000", "--max-model-len", "2048",
    "--enable-prompt-tokens-details",
)  # fmt: skip


def stream_ttft(router: str, prompt: str, max_tokens: int = 8) -> tuple[float, str, dict]:
    """TTFT, the text, and the usage (prompt_tokens, cached_tokens)."""
    payload = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    payload["stream_options"] = {"include_usage": True}
    reply = client.stream(router, payload, timeout=300)
    usage = {}
    if reply.usage:
        details = reply.usage.get("prompt_tokens_details") or {}
        usage = {
            "prompt_tokens": reply.usage["prompt_tokens"],
            "cached_tokens": details.get("cached_tokens") or 0,
        }
    ttft = reply.ttft_s if reply.ttft_s is not None else reply.latency_s
    return ttft, reply.text, usage


# What server_totals reads of each server: prompt tokens by the tier that
# supplied them, all prompt tokens, requests served.
TOTALS = (*client.HIT_SOURCES, "prompt", "requests")


def server_totals(url: str) -> dict[str, float]:
    body = client.metrics(url, timeout=10)
    return {
        **client.cached_by_source(body),
        "prompt": metric(body, "vllm:prompt_tokens_total"),
        "requests": metric(body, "vllm:request_success_total"),
    }


def router_lookups(router_metrics: str) -> dict[str, float]:
    body = client.metrics(router_metrics, timeout=10)
    name = "vllm_router_kv_placement_lookups_total"
    return {r: metric(body, name, f'result="{r}"') for r in ("hit", "miss")}


@dataclass
class Turns:
    """What the turns of one run gathered, as they ran."""

    ttfts: dict[int, list[float]]  # by turn
    later: list[dict]  # usage of each later turn
    # Server 2's counters before its restart (they restart from 0).
    carried: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TOTALS, 0.0))


def run_policy(policy: str, args, work: Path, disk: bool) -> dict:
    ask, plan = _plan(policy, args, work, disk)
    logs = work / f"logs-{policy}-{'disk' if disk else 'nodisk'}"
    logs.mkdir()
    fleet = Fleet(plan, [str(Path(sys.executable).parent / "vllm-uma")], logs)
    fleet.start()
    watcher = threading.Thread(target=fleet.watch, daemon=True)  # restarts the killed one
    watcher.start()
    try:
        turns = converse(fleet, plan, args)
        time.sleep(2)  # the last steps' metrics
        lookups = router_lookups(f"http://127.0.0.1:{ask.metrics_port}")
        totals = [server_totals(m.url) for m in plan.members]
        totals[1] = {key: value + turns.carried[key] for key, value in totals[1].items()}
    finally:
        fleet.request_stop()
        fleet.stop()
    return figures(turns.ttfts, turns.later, totals, lookups, args.turns)


def _plan(policy: str, args, work: Path, disk: bool) -> tuple[FleetRequest, FleetPlan]:
    """A fleet of two servers behind ``policy``: vllm-uma fleet's own plan."""
    store = work / f"kv-{policy}" if disk else None
    ask = FleetRequest(
        servers=2, model=str(args.model), serve_flags=SERVE_FLAGS, host="127.0.0.1",
        port=free_port(), policy=policy, kv_store=store, metrics_port=free_port(),
        events_dir=private_dir(),
    )  # fmt: skip
    return ask, plan_fleet(ask, sorted(os.sched_getaffinity(0)), free_port)


def converse(fleet: Fleet, plan: FleetPlan, args) -> Turns:
    """--turns turns of every conversation at once, server 2 restarted
    before the third unless --no-restart."""
    servers = [m.url for m in plan.members]
    turns = Turns({t: [] for t in range(args.turns)}, [])
    conversations = {c: document(1000 + c, 1000) for c in range(args.conversations)}
    for turn in range(args.turns):
        if turn == 2 and not args.no_restart:
            turns.carried = server_totals(servers[1])  # its counters restart from 0
            kill_listener(servers[1])
            _wait_back(fleet, servers[1])
        one = partial(_one_turn, plan.router_url, conversations, turns, turn=turn)
        with ThreadPoolExecutor(max_workers=args.conversations) as pool:
            list(pool.map(one, range(args.conversations)))
    return turns


def _one_turn(router: str, conversations: dict, turns: Turns, c: int, turn: int) -> None:
    """Conversation ``c``'s turn: its question, the reply appended, then
    other traffic."""
    conversations[c] += f"\nUser: question {turn} about document {1000 + c}?\nAssistant:"
    ttft, reply, usage = stream_ttft(router, conversations[c])
    turns.ttfts[turn].append(ttft)
    if turn > 0:
        turns.later.append(usage)
    conversations[c] += reply
    # Other traffic: one or two unrelated prompts, varying so that
    # round_robin's rotation does not line turns up with servers.
    for k in range(1 + (c + turn) % 2):
        stream_ttft(router, document(5000 + 100 * turn + 10 * c + k, 1000), 2)


def _wait_back(fleet: Fleet, url: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    time.sleep(3)  # the supervisor polls every second
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/health", timeout=2).ok:
                time.sleep(2)  # back in the router's rotation
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} did not come back")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench-out" / "fleet_benchmark.json")
    parser.add_argument("--policies", default="round_robin,cache_aware,kv_aware")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--disk", choices=("both", "on", "off"), default="both")
    parser.add_argument("--no-restart", action="store_true")
    parser.add_argument(
        "--model", default=None, help="model directory (default: the default model)"
    )
    args = parser.parse_args()
    if args.model is None:
        from vllm_uma import models

        args.model = models.prepare()
    work = Path(tempfile.mkdtemp(prefix="uma-fleet-bench-", dir=REPO))
    traffic = (
        f"{args.conversations} conversations x {args.turns} turns, 2 servers, "
        f"{'no restart' if args.no_restart else 'server 2 restarted before turn 3'}"
    )
    settings = {"both": (True, False), "on": (True,), "off": (False,)}[args.disk]
    result: dict = {"traffic": traffic}
    try:
        for disk in settings:  # "policies": with the disk store (or the only setting)
            key = "policies" if disk or len(settings) == 1 else "policies_without_disk"
            result[key] = {}
            for policy in args.policies.split(","):
                result[key][policy] = run_policy(policy, args, work, disk)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(traffic)
    for key in ("policies", "policies_without_disk"):
        if key in result:
            print_table(key, result[key], settings)
    write_json(args.out, result)
    chart(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
