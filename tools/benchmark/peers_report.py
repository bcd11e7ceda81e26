"""What the peer comparison reports: each figure's median over the rounds,
its ratio to llama.cpp's, the console and Markdown tables, the PNG.

A session (peers_workload.session) gives nested figures; ``flatten`` makes
them one row each, keyed as the table lists them; ``summarize`` takes each
server's median over the rounds it finished (a round that failed for a
server, e.g. stock vLLM refusing to start, leaves it out for that server
only). A ratio is the server's figure over llama.cpp's, as measured: for a
time below 1 means faster than llama.cpp, for tokens a second above 1 does.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from tools.benchmark.lib.report import Column, GiB, Table
from tools.benchmark.peers_servers import LLAMA_CPP
from tools.benchmark.peers_workload import ChatShape

FORMATS = {"s": "{:.3f}", "tok/s": "{:.1f}", "GiB": "{:.2f}"}


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    unit: str  # a key of FORMATS


def figures(
    lengths: list[int], others: int, concurrency: list[int], chat: ChatShape | None = None
) -> list[Figure]:
    """The table's rows, in order."""
    rows = []
    for n in lengths:
        rows += [
            Figure(f"cold_{n}", f"{n:,} tokens: cold TTFT", "s"),
            Figure(f"again_{n}", f"{n:,} tokens: same prompt again at once", "s"),
            Figure(f"revisit_{n}", f"{n:,} tokens: again after {others} other prompts", "s"),
        ]
    for t in range(1, chat.turns + 1 if chat else 1):
        rows += [
            Figure(f"chat_p50_t{t}", f"chat turn {t}: median TTFT of {chat.chats}", "s"),
            Figure(f"chat_max_t{t}", f"chat turn {t}: slowest of {chat.chats}", "s"),
        ]
    longest = max(lengths)
    rows.append(Figure(f"restart_{longest}", f"{longest:,} tokens: after a restart", "s"))
    rows += [Figure(f"decode_c{c}", f"decode, {c} at once", "tok/s") for c in concurrency]
    rows += [
        Figure("start", "start to ready", "s"),
        Figure(f"rss_{longest}", f"RSS at {longest:,} tokens, all processes", "GiB"),
        Figure(f"pss_{longest}", f"PSS at {longest:,} tokens, all processes", "GiB"),
    ]
    return rows


def flatten(session: dict) -> dict[str, float | None]:
    """One session's figures, one key a table row (GiB for memory)."""
    out: dict[str, float | None] = {}
    for n, times in session["ttft_s"].items():
        out.update({f"{case}_{n}": t for case, t in times.items()})
    for t, times in session.get("chat_ttft_s", {}).items():
        out[f"chat_p50_t{t}"], out[f"chat_max_t{t}"] = statistics.median(times), max(times)
    out.update({f"restart_{n}": t for n, t in session["restart_ttft_s"].items()})
    out.update({f"decode_c{c}": rate for c, rate in session["decode_tok_s"].items()})
    out["start"] = statistics.median(session["start_s"]) if session["start_s"] else None
    for point, mem in session["memory"].items():
        if point.startswith("after_"):
            n = point.removeprefix("after_")
            out[f"rss_{n}"], out[f"pss_{n}"] = mem["rss"] / GiB, mem["pss"] / GiB
    return out


def summarize(rounds: list[dict[str, dict]], kinds: list[str]) -> dict[str, dict[str, float]]:
    """Each kind's median of each figure over the rounds it finished."""
    out = {}
    for kind in kinds:
        done = [flatten(r[kind]) for r in rounds if kind in r and "error" not in r[kind]]
        keys = {k for d in done for k in d}
        out[kind] = {
            k: statistics.median(v)
            for k in keys
            if (v := [d[k] for d in done if d.get(k) is not None])
        }
    return out


def ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return value / reference


def rows(summary: dict, kinds: list[str], table: list[Figure]) -> list[list[str | None]]:
    """Each figure's cells: its label, then per kind its value and (for every
    kind but llama.cpp, when llama.cpp ran) its ratio to llama.cpp's."""
    reference = summary.get(LLAMA_CPP) if LLAMA_CPP in kinds else None
    out = []
    for fig in table:
        cells: list[str | None] = [fig.label]
        for kind in kinds:
            value = summary.get(kind, {}).get(fig.key)
            cells.append(
                None if value is None else FORMATS[fig.unit].format(value) + f" {fig.unit}"
            )
            if kind != LLAMA_CPP and reference is not None:
                r = ratio(value, reference.get(fig.key))
                cells.append(None if r is None else f"{r:.2f}x")
        out.append(cells)
    return out


def headers(kinds: list[str]) -> list[str]:
    titles = ["figure"]
    for kind in kinds:
        titles.append(kind)
        if kind != LLAMA_CPP and LLAMA_CPP in kinds:
            titles.append("/llama.cpp")
    return titles


def console(summary: dict, kinds: list[str], table: list[Figure]) -> str:
    titles = headers(kinds)
    widths = [max(len(f.label) for f in table)] + [max(12, len(t)) for t in titles[1:]]
    pairs = enumerate(zip(titles, widths, strict=True))
    layout = Table([Column(t, w, left=(i == 0)) for i, (t, w) in pairs])
    lines = [layout.header()] + [layout.row(r) for r in rows(summary, kinds, table)]
    return "\n".join(lines)


def markdown(summary: dict, kinds: list[str], table: list[Figure]) -> str:
    titles = headers(kinds)
    lines = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
    for cells in rows(summary, kinds, table):
        lines.append("| " + " | ".join("-" if c is None else c for c in cells) + " |")
    return "\n".join(lines)


def warnings(rounds: list[dict[str, dict]], decode_tokens: int) -> list[str]:
    """Requests whose server counted other prompt tokens than were sent (a
    BOS added, a tokenizer in the way), or stopped a decode early (no
    ignore_eos): either makes the servers' figures unlike."""
    out = []
    for i, by_kind in enumerate(rounds):
        for kind, session in by_kind.items():
            for req in session.get("requests", []):
                where = f"round {i + 1}, {kind}, {req['name']}"
                if req["prompt_tokens"] not in (None, req["sent_tokens"]):
                    out.append(
                        f"{where}: {req['prompt_tokens']} prompt tokens counted, "
                        f"{req['sent_tokens']} sent"
                    )
                if (
                    req["name"].startswith("decode")
                    and (req["completion_tokens"] or 0) < decode_tokens
                ):
                    out.append(f"{where}: {req['completion_tokens']} tokens of {decode_tokens}")
    return out


def chart(summary: dict, kinds: list[str], table: list[Figure], png: Path, title: str) -> None:
    """TTFTs (log scale) and decode rates, one bar a server."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        [f for f in table if f.unit == "s" and f.key != "start"],
        [f for f in table if f.unit == "tok/s"],
    ]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), width_ratios=[3, 1])
    width = 0.8 / max(1, len(kinds))
    for ax, figs in zip(axes, panels, strict=True):
        for i, kind in enumerate(kinds):
            values = [summary.get(kind, {}).get(f.key) or 0 for f in figs]
            ax.bar([x + i * width for x in range(len(figs))], values, width, label=kind)
        ax.set_xticks(
            [x + width * (len(kinds) - 1) / 2 for x in range(len(figs))],
            [f.label for f in figs],
            rotation=30,
            ha="right",
            fontsize=8,
        )
        ax.set_ylabel({"s": "TTFT, s (log scale)", "tok/s": "decode, tokens/s"}[figs[0].unit])
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
