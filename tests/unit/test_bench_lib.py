"""The benchmarks' shared client and report helpers (tools/benchmark/lib/), on literal inputs."""

from __future__ import annotations

import json
import time

import pytest

from tools.benchmark.lib.client import cached_by_source, chunks, read_stream
from tools.benchmark.lib.prompts import document, prompt_ids, text
from tools.benchmark.lib.report import Column, Table, at_rank, write_json

# vLLM's completions stream with include_usage: text chunks, then the usage
# chunk (no choices), then [DONE]; a keep-alive comment and a blank line between.
STREAM = [
    b'data: {"id":"c1","choices":[{"index":0,"text":" Paris"}],"usage":null}',
    b"",
    b": keep-alive",
    b'data: {"id":"c1","choices":[{"index":0,"text":"."}],"usage":null}',
    b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,'
    b'"prompt_tokens_details":{"cached_tokens":8}}}',
    b"data: [DONE]",
]


def test_a_stream_gives_its_chunks_text_and_last_usage():
    assert [c["choices"] for c in chunks(STREAM)][:2] == [
        [{"index": 0, "text": " Paris"}],
        [{"index": 0, "text": "."}],
    ]
    reply = read_stream(STREAM, time.perf_counter())
    assert reply.text == " Paris."
    assert reply.usage["prompt_tokens"] == 12
    assert reply.usage["prompt_tokens_details"] == {"cached_tokens": 8}
    assert 0 <= reply.ttft_s <= reply.latency_s


def test_a_stream_with_no_token_has_no_ttft_and_no_usage_unless_sent():
    reply = read_stream([b"data: [DONE]"], time.perf_counter())
    assert (reply.ttft_s, reply.text, reply.usage) == (None, "", None)
    only_usage = read_stream(STREAM[4:], time.perf_counter())
    assert only_usage.ttft_s is None and only_usage.usage["completion_tokens"] == 2


def test_cached_tokens_by_source_sum_engines_and_default_to_zero():
    body = "\n".join(
        [
            "# HELP vllm:prompt_tokens_cached_by_source_total Prompt tokens found cached",
            'vllm:prompt_tokens_cached_by_source_total{engine="0",source="device"} 128.0',
            'vllm:prompt_tokens_cached_by_source_total{engine="1",source="device"} 256.0',
            'vllm:prompt_tokens_cached_by_source_total{engine="0",source="host"} 3968.0',
            'vllm:prompt_tokens_by_source_total{engine="0",source="local_compute"} 99.0',
        ]
    )
    assert cached_by_source(body) == {"device": 384.0, "host": 3968.0, "disk": 0.0}


def test_a_table_aligns_titles_and_cells_and_writes_none_as_a_dash():
    table = Table(
        [
            Column("case", 6, left=True),
            Column("TTFT", 8, "{:.3f}s"),
            Column("range", 11, "{0[0]:.2f}-{0[1]:.2f}x"),
            Column("wall", 8, "{:.2f} ms", unit=1e3),
            Column("note", 0, left=True, gap=2),
        ]
    )
    assert table.header() == "case       TTFT       range     wall  note"
    assert table.row(["pool", 0.1234, [1.5, 3.25], 6740.0, "ok"]) == (
        "pool     0.123s  1.50-3.25x  6.74 ms  ok"
    )
    assert table.row(["off", None, None, None, ""]) == "off           -           -        -  "
    with pytest.raises(ValueError, match="a row of 2 values for 5 columns"):
        table.row(["pool", 0.1])


def test_a_rank_is_a_measured_value_its_index_rounded_down():
    values = [float(v) for v in range(1, 11)]  # 1..10: index 0.99 x 9 = 8.91 -> 8
    assert at_rank(values, 0.99) == 9.0
    assert at_rank(values, 0.5) == 5.0  # index 4.5 -> 4, not the median 5.5
    assert at_rank([7.0], 0.99) == 7.0


def test_json_out_is_indented_with_a_final_newline_and_paths_as_text(tmp_path):
    out = tmp_path / "sub" / "r.json"
    write_json(out, {"log": tmp_path, "n": 1})
    assert out.read_text().endswith("}\n")
    assert json.loads(out.read_text()) == {"log": str(tmp_path), "n": 1}


def test_prompts_are_fixed_by_their_seed():
    # The strings the benchmarks sent before the library: same seed, same bytes.
    assert text(7, 6) == "7 river stone cloud green"
    assert document(3, 6) == "Document 3: river0 green1 music2"
    assert prompt_ids(5, 4) == [1005, 41822, 17740, 24496]
