"""A conversation's next turns on another host, after its host died: with the
network tier (every host restores what any host stored) and without it (each
host its own disk tier, as docs/fleet.md's several hosts were before).

    .venv/bin/python -m tools.benchmark.hosts_benchmark --out bench-out/hosts.json
        [--model M] [--conversations 4] [--turns 4] [--kill-after 2]
        [--system-tokens 3000] [--turn-tokens 300] [--link-mbit 10000]
        [--variants network,local] [--death kill|cut] [--no-router]
        [--server-args "..."]

The hosts are Linux network namespaces on one switch (tools/hosts), every
link shaped to --link-mbit in both directions:

    host 1  vllm-uma server A (its own disk tier; + the network tier)
    host 2  vllm-uma server B (its own, empty disk tier; + the network tier)
    host 3  the Valkey server (allkeys-lru; 'network' only)
    host 4  the client, and vllm-router (round_robin over A and B, the
            health checks every fleet sets: fleet/plan.py)

Per variant, fresh servers, disk directories and KV server, then:

1. --conversations conversations, each on its own --system-tokens document,
   take turns 1..--kill-after on A, all conversations at once, one turn of
   each then the next. A turn's prompt is the whole conversation so far and
   --turn-tokens more (a completions prompt: the KV of every earlier turn is
   its prefix).
2. A dies right after the last reply: SIGKILL to its whole process group
   (--death kill: its RAM is gone, what its tiers had not written is lost
   too, and its host's kernel refuses new connections), or host A drops
   off the network (--death cut: its link cut at the switch, so a
   connection to it gets no answer at all, as when a host loses power).
3. The remaining turns go through the router, which lists A and B and
   must find out that A is gone (--no-router: straight to B, as a router
   that already knew would send them).

Printed and written to --out (a PNG beside it): TTFT p50 and p99 of the
turns on B and of B's first turn of each conversation (the one whose
prefix is elsewhere or nowhere), B's prompt tokens by source (device = L1,
host = pool, disk, network) and recomputed, from B's /metrics; the share
of the full blocks A computed for the conversations' last turns that B
restored in its first turns; the network restores' bandwidth (vLLM's
per-tier read bytes over read time, on B) against the link's, measured
between hosts 3 and 2 (tools/hosts/probe.py) before the run. One run, same
traffic: compare the variants' ratios. The 'local' variant's first turn on
B is a recompute (B has nothing of A's): with both variants, the network
variant's first turn against it is a death's cost against a recompute.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools.benchmark.lib import client, model_choice
from tools.benchmark.lib.environment import environment
from tools.benchmark.lib.log import progress
from tools.benchmark.lib.prompts import MODEL, document, text
from tools.benchmark.lib.report import percentile, write_json
from tools.benchmark.lib.servers import EXE, OFFLINE, block_tokens
from tools.harness.server import metric
from tools.harness.valkey_server import KvServer
from tools.hosts import LinkShape, Network
from vllm_uma.fleet.plan import ROUTER_HEALTH_FLAGS
from vllm_uma.fleet.router_front import router_command
from vllm_uma.server_process import Server

HOST_A, HOST_B, HOST_KV_SERVER, HOST_CLIENT = 1, 2, 3, 4
VARIANTS = ("network", "local")
DEATHS = ("kill", "cut")
ROUTER_PORT = 8800
ROUTER_READY_S = 60
NETWORK_SOURCE = "external_unspecified"  # vLLM's cache-hit source for our network tier
COMPUTED = "vllm:prompt_tokens_by_source_total"
READ_BYTES = "vllm:kv_offload_tiering_read_bytes_total"
READ_TIME = "vllm:kv_offload_tiering_read_time_total"
SOURCES = ("device", "host", "disk", NETWORK_SOURCE)
REQUEST_TIMEOUT_S = 900
PROBE_PORT = 9100
REPO = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, required=True, help="the JSON; the PNG beside it")
    ap.add_argument(
        "--model",
        default=MODEL,
        help="a recipe (the default model) or a model zoo build (zoo-qwen3-real, ...)",
    )
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--kill-after", type=int, default=2, help="turns on A before it dies")
    ap.add_argument("--system-tokens", type=int, default=3000)
    ap.add_argument("--turn-tokens", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--link-mbit", type=float, default=10_000, help="every link, both ways")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument(
        "--death",
        choices=DEATHS,
        default="kill",
        help="kill: SIGKILL to A's server; cut: host A's link cut (no answer at all)",
    )
    ap.add_argument(
        "--no-router",
        dest="router",
        action="store_false",
        help="send B's turns straight to B instead of through vllm-router",
    )
    ap.add_argument(
        "--engine-maxmemory",  # "engine": the KV server's old name here, kept for scripts
        default="4gb",
        help="the KV server's maxmemory ('network' only)",
    )
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument(
        "--server-args",
        # Two servers on one machine: each a share of the RAM ceiling.
        default="--enforce-eager --gpu-memory-utilization 0.4",
        help="more `vllm-uma serve` flags, both servers",
    )
    args = ap.parse_args(argv)
    chosen = [v for v in args.variants.split(",") if v]
    if not chosen or set(chosen) - set(VARIANTS):
        ap.error(f"--variants {args.variants!r}: choose from {', '.join(VARIANTS)}")
    args.variants = chosen
    if not 1 <= args.kill_after < args.turns:
        ap.error(
            f"--kill-after {args.kill_after}: at least 1 and less than --turns {args.turns}, "
            "so that A serves some turns and B the rest"
        )
    longest = args.system_tokens + args.turns * args.turn_tokens + args.max_tokens
    if longest > args.max_model_len:
        ap.error(
            f"the last turn has {longest} tokens, more than --max-model-len "
            f"{args.max_model_len}: lower --turns, --system-tokens or --turn-tokens"
        )
    args.model = model_choice.served_model(ap, args.model)
    args.block = block_tokens(args.server_args.split())
    return args


def turn_prompt(args: argparse.Namespace, conversation: int, turn: int) -> str:
    """The conversation so far: its document, then the user's text of every
    turn up to ``turn`` (1-based). Turn t's prompt is turn t-1's and more."""
    parts = [document(5000 + conversation, args.system_tokens)]
    parts += [text(7000 + 100 * conversation + t, args.turn_tokens) for t in range(1, turn + 1)]
    return "\n".join(parts)


def server_args(args: argparse.Namespace, disk: Path, network_tier: dict | None) -> list[str]:
    tiers = [{"type": "fs", "root_dir": str(disk), "max_size_gib": 4}]
    if network_tier is not None:  # the KV server's url and the run's fleet secret (KvServer.tier)
        tiers.append(network_tier)
    config = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"secondary_tiers": tiers},
    }
    return [
        args.model,
        "--max-model-len", str(args.max_model_len),
        "--kv-transfer-config", json.dumps(config),
        *args.server_args.split(),
    ]  # fmt: skip


def link_mbit(net: Network) -> float:
    """The KV server's link to host B as a transfer sees it (64 MB, KV server -> B)."""
    probe = [sys.executable, "-m", "tools.hosts.probe"]
    address = net.host(HOST_B).address
    serve = [*probe, "serve", "--bind", address, "--port", str(PROBE_PORT), "--lifetime", "30"]
    net.popen(HOST_B, serve, cwd=REPO)
    send = [*probe, "send", "--to", address, "--port", str(PROBE_PORT), "--mbytes", "64"]
    deadline = time.monotonic() + 10
    while True:
        done = subprocess.run(
            ["ip", "netns", "exec", net.host(HOST_KV_SERVER).netns, *send],
            capture_output=True, text=True, cwd=REPO, timeout=60,
        )  # fmt: skip
        if done.returncode == 0:
            return json.loads(done.stdout.strip().splitlines()[-1])["mbit_s"]
        if time.monotonic() > deadline:
            raise RuntimeError(f"the link probe failed: {done.stderr[-500:]}")
        time.sleep(0.2)  # the probe's server is still starting


def counters(url: str) -> dict[str, float]:
    body = client.metrics(url)
    out = {s: metric(body, client.CACHED_BY_SOURCE, f'source="{s}"') for s in SOURCES}
    out["computed"] = metric(body, COMPUTED, 'source="local_compute"')
    out["network_read_bytes"] = metric(body, READ_BYTES, "valkey")
    out["network_read_s"] = metric(body, READ_TIME, "valkey")
    return out


def run_turns(args, url: str, turns: range) -> list[dict]:
    """Each turn of every conversation at once; the turns one after another."""
    replies = []
    with ThreadPoolExecutor(max_workers=args.conversations) as pool:
        for turn in turns:

            def one(c: int, turn: int = turn) -> dict:
                payload = {
                    "model": args.model,
                    "prompt": turn_prompt(args, c, turn),
                    "max_tokens": args.max_tokens,
                    "temperature": 0,
                    "stream_options": {"include_usage": True},
                }
                reply = client.stream(url, payload, REQUEST_TIMEOUT_S)
                if reply.ttft_s is None or reply.usage is None:
                    raise RuntimeError(f"conversation {c} turn {turn}: no token or no usage")
                return {
                    "conversation": c,
                    "turn": turn,
                    "ttft_s": reply.ttft_s,
                    "prompt_tokens": reply.usage["prompt_tokens"],
                }

            for r in pool.map(one, range(args.conversations)):
                replies.append(r)
                progress(f"  turn {r['turn']} conv {r['conversation']}: TTFT {r['ttft_s']:.2f} s")
    return replies


def start_router(
    net: Network, work: Path, name: str, workers: list[str]
) -> tuple[str, subprocess.Popen]:
    """vllm-router on the client's host, over A and B, with the health checks
    every fleet sets; its URL once it answers, and its process."""
    address = net.host(HOST_CLIENT).address
    argv = [
        *router_command(), "--host", address, "--port", str(ROUTER_PORT),
        "--policy", "round_robin", "--worker-urls", *workers, *ROUTER_HEALTH_FLAGS,
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(ROUTER_PORT + 1),
    ]  # fmt: skip
    log = (work.parent / f"{name}-router.log").open("wb")
    proc = net.popen(HOST_CLIENT, argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://{address}:{ROUTER_PORT}"

    net.on(HOST_CLIENT).submit(client.wait_healthy, url, ROUTER_READY_S, 0.5).result()
    progress(f"vllm-router on the client's host at {url}, over {', '.join(workers)}")
    return url, proc


def restored_share(seen: dict, computed_prompts: list[int], block: int) -> float | None:
    """B's restored prompt tokens (every tier) in its first turns, over the
    full-block tokens of A's last prompts (what A computed and stored)."""
    full = sum(t // block * block for t in computed_prompts)
    restored = sum(seen[s] for s in SOURCES)
    return round(min(restored, full) / full, 3) if full else None


def run_variant(args, net: Network, variant: str, work: Path) -> dict:
    kv_server = router = None
    servers: list[Server] = []
    try:
        network_tier = None
        if variant == "network":
            lru = ("--maxmemory", args.engine_maxmemory, "--maxmemory-policy", "allkeys-lru")
            address = net.host(HOST_KV_SERVER).address
            kv_server = net.on(HOST_KV_SERVER).submit(KvServer, work, *lru, host=address).result()
            network_tier = kv_server.tier()
        for index, name in ((HOST_A, "A"), (HOST_B, "B")):
            address = net.host(index).address
            argv = server_args(args, work / f"disk-{name}", network_tier)
            log = work.parent / f"{variant}-{name}.log"

            # Started from the host's thread (tools/hosts/inside.py), on its address.
            def start(address=address, argv=argv, log=log) -> Server:
                return Server(EXE, argv, log, env=OFFLINE, host=address).wait_ready()

            progress(f"{variant}: starting server {name} on host {index} ({address})")
            servers.append(net.on(index).submit(start).result())
        a, b = servers
        on_client = net.on(HOST_CLIENT)
        b_url = b.url
        if args.router:
            b_url, router = start_router(net, work, variant, [a.url, b.url])
        before_a = on_client.submit(run_turns, args, a.url, range(1, 2)).result()
        rest = range(2, args.kill_after + 1)
        on_a = before_a + on_client.submit(run_turns, args, a.url, rest).result()
        if args.death == "kill":
            os.killpg(a.proc.pid, signal.SIGKILL)  # A dies, right after its last reply
        else:
            net.cut(HOST_A)  # host A drops off the network, right after its last reply
        progress(f"{variant}: server A {'killed' if args.death == 'kill' else 'cut off'}")
        start = on_client.submit(counters, b.url).result()
        first = args.kill_after + 1
        on_b = on_client.submit(run_turns, args, b_url, range(first, first + 1)).result()
        after_first = on_client.submit(counters, b.url).result()
        later = range(first + 1, args.turns + 1)
        on_b += on_client.submit(run_turns, args, b_url, later).result()
        end = on_client.submit(counters, b.url).result()
        seen = {k: end[k] - start[k] for k in end}
        seen_first = {k: after_first[k] - start[k] for k in end}
        computed = [r["prompt_tokens"] for r in on_a if r["turn"] == args.kill_after]
        fig = summarize(args, on_a, on_b, seen)
        fig["b_first_turn_restored_share"] = restored_share(seen_first, computed, args.block)
        return fig
    finally:
        if router is not None:
            router.terminate()
            router.wait(30)
        for server in servers:
            server.stop()
        if kv_server is not None:
            kv_server.stop()
        net.restore(HOST_A)  # for the next variant (a no-op unless cut)


def summarize(args, on_a: list[dict], on_b: list[dict], seen: dict) -> dict:
    first = [r["ttft_s"] for r in on_b if r["turn"] == args.kill_after + 1]
    ttft_b = [r["ttft_s"] for r in on_b]
    read_s = seen["network_read_s"]
    return {
        "turns_on_a": on_a,
        "turns_on_b": on_b,
        "b_first_turn_ttft_p50_s": round(statistics.median(first), 4),
        "b_first_turn_ttft_p99_s": round(percentile(first, 99), 4),
        "b_ttft_p50_s": round(statistics.median(ttft_b), 4),
        "b_ttft_p99_s": round(percentile(ttft_b, 99), 4),
        "b_hit_tokens": {s: int(seen[s]) for s in SOURCES},
        "b_computed_tokens": int(seen["computed"]),
        "b_network_read_bytes": int(seen["network_read_bytes"]),
        "b_network_read_gbit_s": round(seen["network_read_bytes"] * 8 / read_s / 1e9, 2)
        if read_s
        else None,
    }


def chart(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(result["variants"])
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.35
    for k, (key, label) in enumerate(
        (("b_first_turn_ttft_p50_s", "first turn on B, p50"), ("b_ttft_p50_s", "all on B, p50"))
    ):
        values = [result["variants"][v].get(key, 0) for v in variants]
        ax.bar([i + k * width for i in range(len(variants))], values, width, label=label)
    ax.set_xticks([i + width / 2 for i in range(len(variants))], variants)
    ax.set_ylabel("TTFT (s)")
    ax.set_title(result["title"], fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    env = environment(args)
    result: dict = {"environment": env, "settings": {k: str(v) for k, v in vars(args).items()}}
    with Network(4, LinkShape(rate_mbit=args.link_mbit)) as net:
        result["link_mbit_measured"] = round(link_mbit(net), 1)
        progress(f"link: {args.link_mbit:g} Mbit/s shaped, {result['link_mbit_measured']} measured")
        result["variants"] = {}
        for variant in args.variants:
            with tempfile.TemporaryDirectory(dir=args.out.parent) as tmp:
                work = Path(tmp) / "work"
                work.mkdir()
                try:
                    result["variants"][variant] = run_variant(args, net, variant, work)
                finally:
                    for log in Path(tmp).glob("*.log"):
                        log.replace(args.out.with_name(f"{args.out.stem}-{log.name}"))
    result["title"] = (
        f"{args.model}: {args.conversations} conversations, turns 1-{args.kill_after} on A, "
        f"A {'killed' if args.death == 'kill' else 'cut off'}, {args.kill_after + 1}-"
        f"{args.turns} on B{' through vllm-router' if args.router else ''}; link "
        f"{args.link_mbit:g} Mbit/s"
    )
    write_json(args.out, result)
    chart(result, args.out.with_suffix(".png"))
    print(table(result))
    print(f"wrote {args.out}, {args.out.with_suffix('.png')}")
    return 0


def table(result: dict) -> str:
    rows = [
        "| variant | B first turn p50 / p99 (s) | B all turns p50 / p99 (s) | B hits: L1 / pool / "
        "disk / network | recomputed | A's full blocks restored in B's first turns | network "
        "read (Gbit/s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, v in result["variants"].items():
        h = v["b_hit_tokens"]
        rows.append(
            f"| {name} | {v['b_first_turn_ttft_p50_s']:.3f} / {v['b_first_turn_ttft_p99_s']:.3f} "
            f"| {v['b_ttft_p50_s']:.3f} / {v['b_ttft_p99_s']:.3f} | {h['device']} / {h['host']} "
            f"/ {h['disk']} / {h[NETWORK_SOURCE]} | {v['b_computed_tokens']} | "
            f"{v.get('b_first_turn_restored_share')} | {v['b_network_read_gbit_s']} |"
        )
    variants = result["variants"]
    if {"network", "local"} <= set(variants):  # a death's cost against a recompute
        ratio = variants["network"]["b_first_turn_ttft_p50_s"] / max(
            variants["local"]["b_first_turn_ttft_p50_s"], 1e-9
        )
        rows.append(
            f"B's first turn with the network tier: {ratio:.2f}x its recompute ('local'); "
            "bounds: at most 1.0x, at least 0.9 of A's full blocks restored"
        )
    rows.append(f"link: {result['link_mbit_measured']} Mbit/s measured (KV server -> B)")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
