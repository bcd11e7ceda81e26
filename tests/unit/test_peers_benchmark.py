"""The peer comparison's pure parts (tools/benchmark/peers*.py): its command
line, its prompts, the replies of either server, the decode rate, and the
table with its ratios to llama.cpp. No server is started."""

from __future__ import annotations

import json
import types

import pytest

from tools.benchmark import peers, peers_report
from tools.benchmark.peers_client import Reply, decode_rate, read_reply
from tools.benchmark.peers_servers import DEFAULT_KINDS, Setup, llama_args, vllm_flags
from tools.benchmark.peers_workload import ChatShape, Plan, prompt_ids, token_id_range


def test_the_defaults_are_the_four_servers_at_1k_and_4k_in_an_8k_context():
    args = peers.parse_args([])
    assert (
        args.servers
        == list(DEFAULT_KINDS)
        == [
            "llama.cpp",
            "vllm-uma",
            "vllm-uma-bs128",
            "stock-vllm",
        ]
    )
    assert (args.lengths, args.context, args.concurrency) == ([1000, 4000], 8192, [1, 4])
    assert (args.rounds, args.others, args.decode_tokens, args.gguf) == (3, 4, 128, None)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--servers", "llama.cpp,ollama"], "name each server once, from llama.cpp"),
        (["--servers", "vllm-uma,vllm-uma"], "name each server once"),
        (["--lengths", "1k"], "give whole numbers"),
        (["--concurrency", "0"], "numbers >= 1"),
        (["--lengths", "8192"], "does not fit --context 8192"),
        (["--rounds", "0"], "give rounds >= 1"),
        (["--gguf", "/no/such.gguf"], "--gguf /no/such.gguf: no such file"),
    ],
)
def test_a_bad_command_line_is_refused_with_the_rule(argv, says, capsys):
    with pytest.raises(SystemExit):
        peers.parse_args(argv)
    assert says in capsys.readouterr().err


def test_gguf_published_asks_for_a_recipe_s_source_file():
    args = peers.parse_args(
        ["--model", "Qwen2.5-Coder-1.5B-Instruct-int4-rtn", "--gguf", "published"]
    )
    assert args.gguf == peers.PUBLISHED


def test_every_vllm_server_serves_in_the_run_s_precision(tmp_path):
    setup = Setup(tmp_path, "m", [], tmp_path / "m.gguf", tmp_path, 8192, 2, "float32")
    flags = vllm_flags(setup)
    assert flags[flags.index("--dtype") + 1] == "float32"
    assert peers.parse_args([]).dtype == "bfloat16"
    assert peers.parse_args(["--dtype", "float32"]).dtype == "float32"


def test_llama_cpp_runs_one_slot_on_the_gguf_with_the_run_s_context_and_cores(tmp_path):
    setup = Setup(tmp_path, "m", [], tmp_path / "m.gguf", tmp_path / "llama-server", 8192, 2)
    args = llama_args(setup)
    assert args[:8] == ["-m", str(tmp_path / "m.gguf"), "-c", "8192", "-np", "1", "-t", "2"]
    assert "--cache-ram" not in args  # its default host prompt cache


def model_dir(tmp_path, vocab_size, tokenizer_vocab, added):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": vocab_size}))
    tokenizer = {
        "model": {"vocab": {f"t{i}": i for i in range(tokenizer_vocab)}},
        "added_tokens": [{"id": i, "content": f"<{i}>"} for i in added],
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    return tmp_path


def test_prompt_ids_stay_below_the_tokenizer_and_the_special_tokens(tmp_path):
    # A zoo build: Llama's embedding, SmolLM2's tokenizer (specials at 0..16).
    assert token_id_range(model_dir(tmp_path, 128_256, 49_152, range(17))) == (1000, 49_152)
    # Llama 3: the specials at the top of the vocabulary.
    assert token_id_range(model_dir(tmp_path, 128_256, 128_000, [128_000, 128_001])) == (
        1000,
        128_000,
    )


def test_a_round_s_prompts_are_distinct_from_their_first_id_and_the_same_for_every_server():
    plan = Plan.make(1, [1000, 4000], 4, [1, 4], (1000, 49_152))
    prompts = [plan.warmup, *plan.targets.values(), *sum(plan.others.values(), [])]
    prompts += sum(plan.decode.values(), [])
    assert len({p[0] for p in prompts}) == len(prompts) == 1 + 2 + 8 + 5
    assert [len(p) for p in plan.others[4000]] == [4000] * 4 and len(plan.decode[4]) == 4
    assert all(1000 <= i < 49_152 for p in prompts for i in p)
    assert Plan.make(1, [1000, 4000], 4, [1, 4], (1000, 49_152)) == plan
    assert (
        Plan.make(2, [1000, 4000], 4, [1, 4], (1000, 49_152)).targets[1000][0]
        != (plan.targets[1000][0])
    )
    assert prompt_ids(7, 3, (1000, 2000)) == prompt_ids(7, 3, (1000, 2000))


def sse(*chunks) -> list[bytes]:
    return [b"data: " + json.dumps(c).encode() for c in chunks] + [b"", b"data: [DONE]"]


def test_a_reply_reads_vllm_s_usage_and_llama_cpp_s_timings_alike():
    vllm = read_reply(
        sse(
            {"choices": [{"text": "a"}]},
            {"choices": [{"text": "b"}]},
            {
                "choices": [],
                "usage": {
                    "prompt_tokens": 1000,
                    "completion_tokens": 2,
                    "prompt_tokens_details": {"cached_tokens": 896},
                },
            },
        ),
        0.0,
    )
    assert (vllm.prompt_tokens, vllm.cached_tokens, vllm.completion_tokens) == (1000, 896, 2)
    llama = read_reply(
        sse(
            {"choices": [{"text": "a"}]},
            {
                "choices": [{"text": ""}],
                "usage": {"prompt_tokens": 1000, "completion_tokens": 1},
                "timings": {"cache_n": 999, "predicted_n": 1},
            },
        ),
        0.0,
    )
    assert (llama.prompt_tokens, llama.cached_tokens, llama.completion_tokens) == (1000, 999, 1)
    assert 0 < vllm.first <= vllm.end


def reply(first, end, tokens):
    return Reply(
        sent=0.0, first=first, end=end, prompt_tokens=32, cached_tokens=0, completion_tokens=tokens
    )


def test_the_decode_rate_leaves_prefill_out_and_charges_a_queue():
    assert decode_rate([reply(1.0, 2.27, 128)]) == pytest.approx(100.0)
    # Four at once on four slots, or one after another on one slot.
    assert decode_rate([reply(1.0, 3.0, 101)] * 4) == pytest.approx(200.0)
    queued = [reply(1.0 + 2 * k, 3.0 + 2 * k, 101) for k in range(4)]
    assert decode_rate(queued) == pytest.approx(50.0)
    assert decode_rate([reply(None, 2.0, 0)]) is None


def session(cold, again, decode, start=(2.0, 2.2), pss=1.0):
    gib = 1 << 30
    return {
        "start_s": list(start),
        "ttft_s": {4000: {"cold": cold, "again": again, "revisit": again}},
        "restart_ttft_s": {4000: cold},
        "decode_tok_s": {1: decode},
        "memory": {"ready": {"rss": 0, "pss": 0}, "after_4000": {"rss": 2 * gib, "pss": pss * gib}},
        "requests": [],
    }


def test_the_table_gives_each_median_and_its_ratio_to_llama_cpp():
    rounds = [
        {"llama.cpp": session(8.0, 0.02, 100.0), "vllm-uma": session(2.0, 0.06, 80.0)},
        {"llama.cpp": session(7.0, 0.03, 110.0), "vllm-uma": {"error": "refused"}},
        {"llama.cpp": session(9.0, 0.04, 120.0), "vllm-uma": session(3.0, 0.07, 90.0)},
    ]
    kinds = ["llama.cpp", "vllm-uma", "stock-vllm"]
    summary = peers_report.summarize(rounds, kinds)
    assert summary["llama.cpp"]["cold_4000"] == 8.0
    assert summary["vllm-uma"]["cold_4000"] == 2.5  # the failed round left out
    assert summary["vllm-uma"]["start"] == 2.1 and summary["stock-vllm"] == {}
    table = peers_report.figures([4000], 4, [1])
    cells = {r[0]: r[1:] for r in peers_report.rows(summary, kinds, table)}
    assert cells["4,000 tokens: cold TTFT"] == ["8.000 s", "2.500 s", "0.31x", None, None]
    assert cells["decode, 1 at once"] == ["110.0 tok/s", "85.0 tok/s", "0.77x", None, None]
    assert cells["PSS at 4,000 tokens, all processes"][:3] == ["1.00 GiB", "1.00 GiB", "1.00x"]
    text = peers_report.console(summary, kinds, table)
    assert text.splitlines()[0].split() == [
        "figure",
        "llama.cpp",
        "vllm-uma",
        "/llama.cpp",
        "stock-vllm",
        "/llama.cpp",
    ]
    assert "| 4,000 tokens: cold TTFT | 8.000 s | 2.500 s | 0.31x | - | - |" in (
        peers_report.markdown(summary, kinds, table)
    )


def test_without_llama_cpp_there_is_no_ratio_column():
    summary = peers_report.summarize([{"vllm-uma": session(2.0, 0.06, 80.0)}], ["vllm-uma"])
    assert peers_report.headers(["vllm-uma"]) == ["figure", "vllm-uma"]
    assert peers_report.rows(summary, ["vllm-uma"], peers_report.figures([4000], 4, [1]))[0] == [
        "4,000 tokens: cold TTFT",
        "2.000 s",
    ]


def test_a_server_that_counted_other_tokens_or_stopped_a_decode_early_is_warned_of():
    def request(name, sent, counted, completion):
        return {
            "name": name,
            "sent_tokens": sent,
            "prompt_tokens": counted,
            "completion_tokens": completion,
        }

    rounds = [
        {
            "llama.cpp": {
                "requests": [
                    request("cold-4000", 4000, 4001, 1),
                    request("decode-c1", 32, 32, 128),
                    request("decode-c4", 32, 32, 17),
                    request("again-4000", 4000, None, 1),
                ]
            }
        }
    ]
    assert peers_report.warnings(rounds, 128) == [
        "round 1, llama.cpp, cold-4000: 4001 prompt tokens counted, 4000 sent",
        "round 1, llama.cpp, decode-c4: 17 tokens of 128",
    ]


def test_the_run_goes_on_past_a_server_that_does_not_start(tmp_path, monkeypatch):
    def fake_session(make, name, plan, decode_tokens):
        if make() == "stock-vllm":
            raise RuntimeError("server exited with 1:\nAvailable memory on node 0 ...")
        return session(2.0, 0.06, 80.0)

    monkeypatch.setattr(peers, "factory", lambda kind, setup, log, work: lambda: kind)
    monkeypatch.setattr(peers, "session", fake_session)
    monkeypatch.setattr(peers, "token_id_range", lambda d: (1000, 49_152))
    args = types.SimpleNamespace(
        rounds=2,
        servers=["llama.cpp", "stock-vllm"],
        lengths=[4000],
        others=1,
        concurrency=[1],
        chats=None,
        decode_tokens=8,
    )
    setup = Setup(tmp_path, "m", [], tmp_path, tmp_path, 8192, 2)
    rounds = peers.run(args, setup, tmp_path, tmp_path / "work")
    assert [list(r) for r in rounds] == [["llama.cpp", "stock-vllm"], ["stock-vllm", "llama.cpp"]]
    assert rounds[0]["stock-vllm"] == {
        "error": "server exited with 1: ... Available memory on node 0 ..."
    }


class FakeServer:
    def __init__(self, n):
        self.url, self.stopped = f"http://server-{n}", False

    def stop(self):
        self.stopped = True


@pytest.fixture
def fake_servers(monkeypatch):
    """peers_workload.session with servers and requests faked: what was
    asked of which server, in order."""
    from tools.benchmark import peers_client, peers_workload

    started, asked = [], []

    def start_timed(make):
        started.append(FakeServer(len(started)))
        return started[-1], 1.0 + len(started)

    def complete(url, model, ids, max_tokens, ignore_eos=False):
        asked.append((url[-1], len(ids), max_tokens, ignore_eos, ids[0]))
        return Reply(0.0, 0.5, 1.0, len(ids), 0, max_tokens)

    monkeypatch.setattr(peers_workload, "start_timed", start_timed)
    monkeypatch.setattr(peers_workload, "complete", complete)
    monkeypatch.setattr(peers_client, "complete", complete)  # at_once's
    monkeypatch.setattr(peers_workload, "memory", lambda s: {"rss": 1, "pss": 1, "processes": 1})
    return peers_workload, started, asked


def test_a_session_asks_in_the_documented_order_and_restarts_for_the_last_figure(fake_servers):
    peers_workload, started, asked = fake_servers
    plan = Plan.make(0, [1000, 4000], 2, [1, 4], (1000, 49_152))
    out = peers_workload.session(lambda: None, "m", plan, 128)
    first = [(n, m, e) for s, n, m, e, _ in asked if s == "0"]
    assert first == [
        (16, 4, False),  # warm-up
        (1000, 1, False), (1000, 1, False), (1000, 1, False), (1000, 1, False), (1000, 1, False),
        (4000, 1, False), (4000, 1, False), (4000, 1, False), (4000, 1, False), (4000, 1, False),
        *[(32, 128, True)] * 5,  # decode: 1, then 4 at once
    ]  # fmt: skip
    # The restart: a new server, warmed up, asked the longest target again.
    assert [(n, m, i) for s, n, m, e, i in asked if s == "1"] == [
        (16, 4, plan.warmup[0]), (4000, 1, plan.targets[4000][0]),
    ]  # fmt: skip
    # The revisit is the target; the prompts between are others.
    firsts = [i for s, n, m, e, i in asked if s == "0" and n == 4000]
    assert firsts == [plan.targets[4000][0]] * 2 + [p[0] for p in plan.others[4000]] + [
        plan.targets[4000][0]
    ]
    assert out["start_s"] == [2.0, 3.0] and all(s.stopped for s in started)
    assert set(out["ttft_s"]) == {1000, 4000} and set(out["ttft_s"][1000]) == {
        "cold", "again", "revisit",
    }  # fmt: skip
    assert set(out["memory"]) == {"ready", "after_4000", "end"}
    assert out["decode_tok_s"] == {1: pytest.approx(254.0), 4: pytest.approx(4 * 127 / 0.5)}


def test_chats_are_asked_turn_by_turn_across_conversations(fake_servers):
    peers_workload, _, asked = fake_servers
    shape = ChatShape(chats=3, turns=3, first=100, per_turn=20)
    plan = Plan.make(0, [64], 1, [1], (1000, 49_152), shape)
    # Each turn is the one before it and more; no two conversations share a prefix.
    for turns in plan.chats:
        assert [len(t) for t in turns] == [100, 120, 140]
        assert all(b[: len(a)] == a for a, b in zip(turns, turns[1:], strict=False))
    assert len({turns[0][0] for turns in plan.chats}) == 3
    out = peers_workload.session(lambda: None, "m", plan, 8)
    chat = [(n, i) for s, n, m, e, i in asked if s == "0" and n >= 100]
    assert chat == [(100 + 20 * t, plan.chats[c][0][0]) for t in range(3) for c in range(3)]
    assert sorted(out["chat_ttft_s"]) == [1, 2, 3] and len(out["chat_ttft_s"][2]) == 3
    flat = peers_report.flatten(out)
    assert flat["chat_p50_t2"] == sorted(out["chat_ttft_s"][2])[1]
    assert flat["chat_max_t3"] == max(out["chat_ttft_s"][3])
    keys = [f.key for f in peers_report.figures([64], 1, [1], shape)]
    assert "chat_p50_t1" in keys and "chat_max_t3" in keys


@pytest.mark.parametrize(
    "value, says",
    [("4,1,1000,200", "turns >= 2"), ("4,4,1000", "four whole numbers"), ("4,4,9000,200", "fit")],
)
def test_a_bad_chat_shape_is_refused_with_the_rule(value, says, capsys):
    with pytest.raises(SystemExit):
        peers.parse_args(["--chats", value])
    assert says in capsys.readouterr().err


def test_chats_none_leaves_the_workload_out():
    assert peers.parse_args(["--chats", "none"]).chats is None
    assert peers.parse_args([]).chats == ChatShape(4, 4, 1000, 200)


def test_a_session_that_fails_stops_its_server(fake_servers, monkeypatch):
    peers_workload, started, _ = fake_servers

    def refused(*args, **kw):
        raise RuntimeError("HTTP 400")

    monkeypatch.setattr(peers_workload, "complete", refused)
    with pytest.raises(RuntimeError):
        peers_workload.session(lambda: None, "m", Plan.make(0, [64], 1, [1], (1000, 2000)), 8)
    assert len(started) == 1 and started[0].stopped
