"""What a server's death costs a conversation, in a fleet on one host.

    .venv/bin/python -m tools.benchmark.fleet_death --out bench-out/fleet_death.json
        [--rounds 3] [--kill-delays 0,0.5,2] [--document-tokens 3000]
        [--turn-tokens 200] [--turns-before 2] [--max-tokens 32]
        [--next-turn-delay 0] [--kill-during [--decode-tokens 400]]
        [--model DIR] [--serve-args "..."]

A fleet of two servers (vllm-uma fleet's own plan and supervisor: cores and
memory split, one shared disk store in a new directory, vllm-router with
``kv_aware`` on loopback). Each round is one conversation, sent through the
router as a client would send it: its document, then ``--turns-before``
turns (a turn's prompt is the whole conversation so far, the replies
included, and ``--turn-tokens`` more). Then:

1. the server that answered the last turn (the one whose prompt-token
   counter grew) is killed with SIGKILL to its process group,
   ``--kill-delays`` seconds after the last reply (one value a round, in
   turn): what its tiers had not written by then is lost. With
   ``--kill-during`` it dies instead ``--kill-delays`` seconds after the
   last turn's first token, while it decodes (``--decode-tokens``), and the
   client sends that turn again: how soon after its first token a prompt's
   blocks are safe in the shared store;
2. ``--next-turn-delay`` seconds later the next turn goes to the router,
   which must send it to the survivor: its TTFT, and the prompt tokens the
   survivor found in each tier (its /metrics, before and after);
3. the reference, on the same survivor under the same conditions: a turn of
   another conversation of the same shape that no server has seen, the
   recompute a plain server would do.

Printed and written to --out: per round the kill delay, the next turn's
TTFT against the reference's (their ratio: the issue's bound is 1.0), the
conversation's full blocks the killed server computed and how many of them
the survivor restored (the bound: at least 90%), by tier. The fleet's
supervisor restarts the killed server between rounds, as in production.
One run, ratios within a round: these machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from tools.benchmark.lib import client
from tools.benchmark.lib.log import progress
from tools.benchmark.lib.prompts import MODEL, document
from tools.benchmark.lib.report import write_json
from tools.benchmark.lib.servers import block_tokens, kill_listener
from tools.harness.server import free_port, metric
from vllm_uma.commands.kv_events_endpoint import private_dir
from vllm_uma.fleet.plan import FleetPlan, FleetRequest, plan_fleet
from vllm_uma.fleet.supervisor import Fleet

# Eager: a killed server is back in about a minute instead of several, so
# that rounds follow one another; both servers run the same way, and the
# reference is taken on the survivor, so the ratio is not affected.
# --enable-prompt-tokens-details: each reply says how many of its prompt
# tokens were found cached.
SERVE_FLAGS = "--enforce-eager --max-model-len 8192 --enable-prompt-tokens-details"
REQUEST_TIMEOUT_S = 600
BACK_TIMEOUT_S = 600
RESTORED_BOUND = 0.9  # the share of the conversation's full blocks a survivor must restore
TTFT_BOUND = 1.0  # the next turn's TTFT against a recompute of it


@dataclass
class Turn:
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    text: str


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, required=True, help="the JSON")
    ap.add_argument("--model", default=None, help="model directory (default: the default model)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--kill-delays",
        default="0,0.5,2",
        help="seconds between the last reply and the SIGKILL, one a round, in turn",
    )
    ap.add_argument(
        "--kill-during",
        action="store_true",
        help="kill during the last turn, --kill-delays after its first token, instead of "
        "after its reply; the client then sends that turn again",
    )
    ap.add_argument(
        "--decode-tokens",
        type=int,
        default=400,
        help="with --kill-during: the last turn's max_tokens, long enough to outlast the kill",
    )
    ap.add_argument("--next-turn-delay", type=float, default=0.0)
    ap.add_argument("--document-tokens", type=int, default=3000)
    ap.add_argument("--turn-tokens", type=int, default=200)
    ap.add_argument("--turns-before", type=int, default=2, help="turns before the death")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--serve-args", default=SERVE_FLAGS, help="`vllm-uma serve` flags, both")
    args = ap.parse_args(argv)
    try:
        args.kill_delays = [float(d) for d in args.kill_delays.split(",") if d]
    except ValueError:
        ap.error(f"--kill-delays {args.kill_delays!r}: seconds, comma-separated, e.g. 0,0.5,2")
    if not args.kill_delays or min(args.kill_delays) < 0:
        ap.error(f"--kill-delays {args.kill_delays!r}: at least one value, none negative")
    if args.rounds < 1 or args.turns_before < 1:
        ap.error("--rounds and --turns-before: at least 1")
    return args


def conversation_turn(seed: int, turn: int, replies: list[str], args) -> str:
    """Conversation ``seed`` up to ``turn`` (1-based): its document, and per
    turn the user's question and (for every earlier turn) the reply."""
    parts = [document(seed, args.document_tokens)]
    for t in range(1, turn + 1):
        parts.append(f"\nUser: question {t}: {document(seed * 100 + t, args.turn_tokens)}")
        parts.append("\nAssistant:")
        if t < turn:
            parts.append(replies[t - 1])
    return "".join(parts)


def send(router: str, model: str, prompt: str, max_tokens: int) -> Turn:
    payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    payload["stream_options"] = {"include_usage": True}
    reply = client.stream(router, payload, REQUEST_TIMEOUT_S)
    if reply.ttft_s is None or not reply.usage:
        raise RuntimeError("a turn got no token or no usage")
    details = reply.usage.get("prompt_tokens_details") or {}
    return Turn(
        reply.ttft_s,
        reply.usage["prompt_tokens"],
        details.get("cached_tokens") or 0,
        reply.usage["completion_tokens"],
        reply.text,
    )


def counters(url: str) -> dict[str, float]:
    body = client.metrics(url, timeout=10)
    return {
        **client.cached_by_source(body),
        "prompt": metric(body, "vllm:prompt_tokens_total"),
    }


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {k: int(after[k] - before[k]) for k in after}


def full_block_tokens(tokens: int, block: int) -> int:
    return tokens // block * block


def round_figures(
    kill_delay: float, computed: int, nxt: Turn, reference: Turn, seen: dict[str, int], block: int
) -> dict:
    """One round's figures. The conversation's full blocks are those of
    the ``computed`` tokens whose KV the killed server had computed (its
    last prompt and its reply, or the prompt of the turn it died in)."""
    computed = full_block_tokens(computed, block)
    restored = sum(seen[s] for s in client.HIT_SOURCES)
    return {
        "kill_delay_s": kill_delay,
        "next_turn_ttft_s": round(nxt.ttft_s, 4),
        "reference_ttft_s": round(reference.ttft_s, 4),
        "ttft_ratio": round(nxt.ttft_s / reference.ttft_s, 3),
        "next_turn_prompt_tokens": nxt.prompt_tokens,
        "reference_prompt_tokens": reference.prompt_tokens,
        "conversation_full_block_tokens": computed,
        "restored_tokens": restored,
        "restored_by_tier": {s: seen[s] for s in client.HIT_SOURCES},
        "restored_share": round(min(restored, computed) / computed, 3) if computed else None,
    }


def server_of_last_turn(urls: list[str], before: list[dict], tokens: int) -> str:
    """The server whose prompt-token counter grew by the last turn's."""
    grew = [
        url for url, b in zip(urls, before, strict=True) if counters(url)["prompt"] > b["prompt"]
    ]
    if len(grew) != 1:
        raise RuntimeError(f"the last turn ({tokens} tokens) was counted by {grew or 'no server'}")
    return grew[0]


def wait_healthy(urls: list[str], timeout: float = BACK_TIMEOUT_S) -> None:
    for url in urls:
        client.wait_healthy(url, timeout)
    time.sleep(2)  # the supervisor adds it back to the router after /health


@dataclass
class Round:
    """One conversation's round: where it runs and what it has said so far."""

    index: int
    urls: list[str]  # the fleet's servers
    router: str
    block: int  # the servers' block size, in tokens
    delay: float  # seconds to the kill
    replies: list[str]

    @property
    def seed(self) -> int:
        return 6000 + self.index

    @property
    def reference_seed(self) -> int:
        return 9000 + self.index


def one_round(index: int, args, plan: FleetPlan, block: int) -> dict:
    delay = args.kill_delays[index % len(args.kill_delays)]
    r = Round(index, [m.url for m in plan.members], plan.router_url, block, delay, [])
    for turn in range(1, args.turns_before + 1):
        before = [counters(u) for u in r.urls]
        prompt = conversation_turn(r.seed, turn, r.replies, args)
        if turn == args.turns_before and args.kill_during:
            victim, survivor = kill_while_decoding(r, args, prompt, before)
            progress(f"round {index}: {victim} killed {delay:g} s after its first token")
            # The client sends the turn again: its prompt is what the
            # killed server had computed before its first token.
            return next_turn(r, args, survivor, turn, computed=None)
        last = send(r.router, args.served_name, prompt, args.max_tokens)
        r.replies.append(last.text)
        progress(f"round {index}: turn {turn}, {last.prompt_tokens} tokens, {last.ttft_s:.2f} s")
    victim = server_of_last_turn(r.urls, before, last.prompt_tokens)
    time.sleep(delay)
    kill_listener(victim)
    progress(f"round {index}: {victim} killed {delay:g} s after its last reply")
    survivor = next(u for u in r.urls if u != victim)
    computed = last.prompt_tokens + last.completion_tokens
    return next_turn(r, args, survivor, args.turns_before + 1, computed)


def kill_while_decoding(r: Round, args, prompt: str, before: list[dict]) -> tuple[str, str]:
    """Stream ``prompt`` (--decode-tokens long), kill its server ``r.delay``
    seconds after the first token; (victim, survivor)."""
    first_token = threading.Event()
    payload = {"model": args.served_name, "prompt": prompt, "temperature": 0, "stream": True}
    payload["max_tokens"] = args.decode_tokens

    def stream() -> None:
        try:
            with requests.post(
                f"{r.router}/v1/completions", json=payload, stream=True, timeout=REQUEST_TIMEOUT_S
            ) as reply:
                for line in reply.iter_lines():
                    if line.startswith(b"data: {") and b'"choices"' in line:
                        first_token.set()
        except requests.RequestException:
            pass  # the server died under it: what this benchmark does
        finally:
            first_token.set()

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    if not first_token.wait(REQUEST_TIMEOUT_S):
        raise RuntimeError("no first token")
    time.sleep(r.delay)
    victim = server_of_last_turn(r.urls, before, 0)
    if not reader.is_alive():
        raise RuntimeError(
            f"the turn ended before the kill {r.delay:g} s after its first token: raise "
            f"--decode-tokens ({args.decode_tokens})"
        )
    kill_listener(victim)
    reader.join(60)
    return victim, next(u for u in r.urls if u != victim)


def next_turn(r: Round, args, survivor: str, turn: int, computed: int | None) -> dict:
    """Turn ``turn`` on the survivor and its reference; the round's figures.
    ``computed``: the tokens whose KV the killed server had computed (None:
    the turn's own prompt, for a kill during it)."""
    time.sleep(args.next_turn_delay)
    start = counters(survivor)
    prompt = conversation_turn(r.seed, turn, r.replies, args)
    nxt = send(r.router, args.served_name, prompt, args.max_tokens)
    seen = delta(counters(survivor), start)
    if seen["prompt"] != nxt.prompt_tokens:
        raise RuntimeError(f"the next turn was not served by the survivor {survivor} alone")
    # The reference: the same shape, never seen (its own document, and
    # replies of the same length taken from this conversation).
    ref_prompt = conversation_turn(r.reference_seed, turn, r.replies, args)
    reference = send(r.router, args.served_name, ref_prompt, args.max_tokens)
    computed = nxt.prompt_tokens if computed is None else computed
    figures = round_figures(r.delay, computed, nxt, reference, seen, r.block)
    figures["killed"] = "during the turn" if args.kill_during else "after the reply"
    progress(
        f"round {r.index}: next turn {nxt.ttft_s:.2f} s, recompute {reference.ttft_s:.2f} s "
        f"({figures['ttft_ratio']:.2f}x), restored {figures['restored_tokens']} of "
        f"{figures['conversation_full_block_tokens']} tokens"
    )
    wait_healthy(r.urls)  # the killed one back (the fleet restarts it) before the next round
    return figures


def table(rounds: list[dict]) -> str:
    rows = [
        "| killed | delay (s) | next turn TTFT (s) | recompute TTFT (s) | ratio (bound 1.0) | "
        "full-block tokens / restored (L1, pool, disk) | share (bound 0.9) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        t = r["restored_by_tier"]
        rows.append(
            f"| {r['killed']} | {r['kill_delay_s']:g} | {r['next_turn_ttft_s']:.3f} "
            f"| {r['reference_ttft_s']:.3f} "
            f"| {r['ttft_ratio']:.2f} | {r['conversation_full_block_tokens']} / "
            f"{r['restored_tokens']} ({t['device']}, {t['host']}, {t['disk']}) "
            f"| {r['restored_share']} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    flags = args.serve_args.split()
    if args.model is None:  # the servers' default model, served under its name
        from vllm_uma import models

        model_dir, args.served_name = str(models.prepare()), MODEL
    else:  # served under the name the user gave it, as vLLM does
        model_dir, args.served_name = args.model, args.model
        flags.insert(0, args.model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fleet-death-", dir=args.out.parent))
    ask = FleetRequest(
        servers=2, model=model_dir, serve_flags=tuple(flags),
        host="127.0.0.1", port=free_port(), policy="kv_aware", kv_store=work / "kv",
        metrics_port=free_port(), events_dir=private_dir(),
    )  # fmt: skip
    plan = plan_fleet(ask, sorted(os.sched_getaffinity(0)), free_port)
    logs = work / "logs"
    logs.mkdir()
    fleet = Fleet(plan, [str(Path(sys.executable).parent / "vllm-uma")], logs)
    fleet.start()
    watcher = threading.Thread(target=fleet.watch, daemon=True)  # restarts the killed one
    watcher.start()
    try:
        block = block_tokens(args.serve_args.split())
        rounds = [one_round(i, args, plan, block) for i in range(args.rounds)]
    finally:
        fleet.request_stop()
        fleet.stop()
    result = {
        "settings": {k: str(v) for k, v in vars(args).items()},
        "bounds": {"ttft_ratio": TTFT_BOUND, "restored_share": RESTORED_BOUND},
        "rounds": rounds,
        "logs": str(logs),
    }
    write_json(args.out, result)
    print(table(rounds))
    print(
        f"bounds: next turn at most {TTFT_BOUND}x the recompute; at least "
        f"{RESTORED_BOUND:.0%} of the full blocks restored"
    )
    print(f"wrote {args.out} (server and router logs in {logs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
