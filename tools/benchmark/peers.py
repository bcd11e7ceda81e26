"""llama.cpp's llama-server, vllm-uma and stock vLLM CPU side by side, on the same prompt token ids.

    make bench-peers [BENCH_ARGS="--model zoo-llama-real --rounds 2"]
    .venv/bin/python -m tools.benchmark.peers [--model M] [--servers llama.cpp,vllm-uma,...]
        [--rounds 3] [--lengths 1000,4000] [--dtype bfloat16|float32] [--gguf FILE]
        [--out bench-out/peers.json]

What a person serving from a CPU's RAM runs today is llama-server (Ollama
and LM Studio wrap it); this measures vllm-uma against it on its own
ground. llama.cpp is built from the pinned PyPI source package
(tools/peers/llama_cpp.py, cached under the cache root; about 6 minutes the
first time on 2 cores) and serves the model directory converted to a GGUF
by that package's converter (tools/peers/gguf_convert.py, cached beside
the model); the vLLM servers serve the directory itself. Same weights,
same precision (--dtype: bfloat16, or float32 where the CPU has no native
bf16 arithmetic, AVX2 without AVX-512), same context (--context), the
same token ids.

Each round runs every server kind once, one server at a time (the order
rotated from round to round, so that drift on a shared machine does not
always favour the same one), each on the round's prompts: the session of
peers_workload.py (cold, again, revisit, decode at 1 and 4, memory, a
restart). The table gives each figure's median over the rounds and its
ratio to llama.cpp's; the JSON keeps every request; a PNG and a Markdown
copy of the table are written beside it. The machine is shared: compare
ratios within one run, and see its load in the JSON.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import requests

from tools.benchmark import peers_report as report
from tools.benchmark.lib import model_choice
from tools.benchmark.lib.environment import environment
from tools.benchmark.lib.log import progress
from tools.benchmark.lib.report import missing_chart_library, write_json
from tools.benchmark.peers_servers import DEFAULT_KINDS, KINDS, LLAMA_CPP, Setup, cores, factory
from tools.benchmark.peers_workload import ChatShape, Plan, session, token_id_range
from tools.peers import llama_cpp, published_gguf
from tools.peers.errors import PeerError
from tools.peers.gguf_convert import OUTTYPES, ensure_gguf
from vllm_uma import models

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = "published"  # --gguf: the quantized file a recipe was built from


def _chat_shape(text: str) -> ChatShape | None:
    if text.strip().lower() == "none":
        return None
    try:
        chats, turns, first, per_turn = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give four whole numbers, conversations,turns,first,per-turn "
            f"(e.g. 4,4,1000,200), or none"
        ) from None
    if chats < 1 or turns < 2 or first < 1 or per_turn < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give conversations >= 1, turns >= 2 (a later turn is what it "
            f"measures), tokens >= 1; or none"
        )
    return ChatShape(chats, turns, first, per_turn)


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers, comma-separated") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more numbers >= 1")
    return values


def _kinds(text: str) -> list[str]:
    kinds = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds or len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(
            f"{text!r}: name each server once, from {', '.join(KINDS)}"
        )
    return kinds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_choice.add_argument(ap)
    ap.add_argument(
        "--servers",
        type=_kinds,
        default=list(DEFAULT_KINDS),
        help=f"comma-separated, from {', '.join(KINDS)} (default: {','.join(DEFAULT_KINDS)})",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lengths", type=_ints, default=[1000, 4000], help="prompt tokens")
    ap.add_argument("--others", type=int, default=4, help="prompts between a visit and its revisit")
    ap.add_argument(
        "--chats",
        type=_chat_shape,
        default=ChatShape(),
        help="the multi-turn workload: conversations,turns,first turn's tokens,tokens "
        "added a turn (default 4,4,1000,200; 'none' leaves it out)",
    )
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=_ints, default=[1, 4])
    ap.add_argument("--context", type=int, default=8192, help="every server's context length")
    ap.add_argument(
        "--gguf",
        default=None,
        help="llama.cpp's model file; 'published': the quantized GGUF a recipe was built "
        "from (Qwen2.5-Coder's Q4_K_M, ...), as llama.cpp's users run it (default: the "
        "model directory converted to --dtype)",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="compile jobs for llama.cpp's first build",
    )
    ap.add_argument(
        "--dtype",
        choices=sorted(OUTTYPES),
        default="bfloat16",
        help="every server's precision: vLLM's --dtype, llama.cpp's GGUF type (default: bfloat16)",
    )
    ap.add_argument("--out", type=Path, default=REPO / "bench-out" / "peers.json")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.others < 0 or args.decode_tokens < 2 or args.jobs < 1:
        ap.error(
            f"--rounds {args.rounds}, --others {args.others}, --decode-tokens "
            f"{args.decode_tokens}, --jobs {args.jobs}: give rounds >= 1, others >= 0, "
            f"decode tokens >= 2 (a rate needs two), jobs >= 1"
        )
    if max(args.lengths) >= args.context:
        ap.error(
            f"--lengths {max(args.lengths)} does not fit --context {args.context}: every "
            f"prompt and its first token must fit; shorten it or raise --context"
        )
    if args.chats is not None and args.chats.longest() >= args.context:
        ap.error(
            f"--chats: the last turn's {args.chats.longest()} tokens do not fit --context "
            f"{args.context}; fewer turns or tokens, or raise --context"
        )
    if args.gguf not in (None, PUBLISHED) and not Path(args.gguf).is_file():
        ap.error(
            f"--gguf {args.gguf}: no such file; give a GGUF, '{PUBLISHED}' (a recipe's "
            f"source), or leave --gguf out to convert"
        )
    return args


def prepare(args: argparse.Namespace, choice, log_dir: Path) -> Setup:
    """The llama.cpp binary and GGUF (built or converted if missing) and
    what every server shares."""
    binary = gguf = Path()
    if LLAMA_CPP in args.servers:
        binary = llama_cpp.ensure_server(jobs=args.jobs, say=progress)
        if args.gguf == PUBLISHED:
            recipe = args.model or models.DEFAULT_MODEL_NAME
            gguf = published_gguf.ensure(recipe, llama_cpp.peer_root(), say=progress)
        elif args.gguf is not None:
            gguf = Path(args.gguf)
        else:
            gguf = ensure_gguf(
                choice.directory,
                llama_cpp.source_dir(llama_cpp.peer_root()),
                llama_cpp.BUILD,
                log_dir,
                say=progress,
                outtype=OUTTYPES[args.dtype],
            )
    return Setup(
        choice.directory,
        choice.served_name,
        choice.serve_args,
        gguf,
        binary,
        args.context,
        cores(),
        args.dtype,
    )


def one_line(exc: BaseException) -> str:
    """An error in one line: its first line and, when it goes on (a server's
    exit carries its log's tail), the last, which says why."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"


def run(args: argparse.Namespace, setup: Setup, log_dir: Path, work: Path) -> list[dict]:
    id_range = token_id_range(setup.model_dir)
    rounds = []
    for r in range(args.rounds):
        plan = Plan.make(r, args.lengths, args.others, args.concurrency, id_range, args.chats)
        shift = r % len(args.servers)
        by_kind: dict[str, dict] = {}
        for kind in args.servers[shift:] + args.servers[:shift]:
            progress(f"round {r + 1}/{args.rounds}: {kind} ...")
            (work / f"{r}-{kind}").mkdir(parents=True)
            make = factory(kind, setup, log_dir / f"round{r + 1}-{kind}.log", work / f"{r}-{kind}")
            try:
                by_kind[kind] = session(make, setup.served_name, plan, args.decode_tokens)
            except (RuntimeError, TimeoutError, OSError, requests.RequestException) as exc:
                by_kind[kind] = {"error": one_line(exc)}
                progress(f"  {kind} failed: {one_line(exc)} (log: {log_dir})")
                continue
            progress(
                f"  {kind}: "
                + ", ".join(
                    f"{k} {v:.3f}"
                    for k, v in report.flatten(by_kind[kind]).items()
                    if k.startswith(("cold", "again", "revisit")) and v is not None
                )
            )
        rounds.append(by_kind)
    return rounds


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if problem := missing_chart_library("bench-peers", "make install"):
        print(problem, file=sys.stderr)
        return 2
    env = environment(args)
    log_dir = args.out.with_name(args.out.stem + "-logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    for old in log_dir.glob("round*.log"):  # a server's log is appended to: start clean
        old.unlink()
    choice = model_choice.choose(args.model)
    try:
        setup = prepare(args, choice, log_dir)
    except PeerError as exc:
        print(f"bench-peers: {exc}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="peers-work-", dir=args.out.parent))
    try:
        rounds = run(args, setup, log_dir, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = report.figures(args.lengths, args.others, args.concurrency, args.chats)
    summary = report.summarize(rounds, args.servers)
    warnings = report.warnings(rounds, args.decode_tokens)
    title = (
        f"{choice.describe(args.dtype)}; {args.rounds} round{'s' * (args.rounds != 1)}; "
        f"commit {env['git_commit']}, {env['cpu_model']}, "
        f"load before {env['loadavg_before'][0]:.1f}"
    )
    print(title)
    print(report.console(summary, args.servers, table))
    print("ratio: the server's figure over llama.cpp's (times: below 1 is faster; tok/s: above 1)")
    for w in warnings:
        print(f"warning: {w}")
    errors = {
        f"round {i + 1}, {k}": s["error"]
        for i, r in enumerate(rounds)
        for k, s in r.items()
        if "error" in s
    }
    for where, error in errors.items():
        print(f"failed: {where}: {error}")
    write_json(
        args.out,
        {
            "environment": {**env, "loadavg_after": list(os.getloadavg())},
            "setup": {k: str(v) if isinstance(v, Path) else v for k, v in vars(setup).items()},
            "llama_cpp_stamp": llama_cpp.stamp(),
            "summary": summary,
            "warnings": warnings,
            "errors": errors,
            "rounds": rounds,
        },
    )
    args.out.with_suffix(".md").write_text(report.markdown(summary, args.servers, table) + "\n")
    report.chart(summary, args.servers, table, args.out.with_suffix(".png"), title)
    print(
        f"wrote {args.out}, {args.out.with_suffix('.md')}, {args.out.with_suffix('.png')}, "
        f"logs in {log_dir}"
    )
    # Stock vLLM may refuse to start here (it checks the NUMA node's free memory,
    # docs/memory.md): the others must have run.
    missing = [k for k in args.servers if k != "stock-vllm" and not summary[k]]
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
