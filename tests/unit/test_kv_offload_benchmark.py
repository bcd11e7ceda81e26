"""The KV offloading benchmark's arithmetic and checks, without a server:
spill sizing, traffic shape, the floor, the suspect rule, the flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.benchmark.kv_offload_client import PassResult, Reply
from tools.benchmark.kv_offload_report import compare, expectations, summarize, table
from tools.benchmark.kv_offload_runner import Runner, failure
from tools.benchmark.kv_offload_workloads import Settings, Sizing, build_traffic, spill_prompts
from tools.benchmark.lib.report import percentile

BW = {"memcpy_gbps": 10.0, "disk_read_gbps": 1.0}


def settings(**kw) -> Settings:
    base = dict(
        concurrency=4,
        prompt_tokens=4000,
        max_tokens=16,
        requests=8,
        suffix_tokens=256,
        l1_bytes=400_000_000,
        pool_gib=1.0,
        spill_factor=2.0,
        max_model_len=8192,
        equal_memory=False,
        disk_dir=Path("/tmp"),
        disk_cap_gib=2.0,
        keep_disk=False,
        model="SmolLM2-135M-Instruct",
        server_args=(),
    )
    return Settings(**{**base, **kw})


# The default model's geometry with the defaults: 135-block L1, 364-block pool.
SIZING = Sizing(block_size=128, per_block_bytes=2_949_120, l1_blocks=135, pool_blocks=364)


def test_spill_overflows_l1_and_fits_the_pool():
    n = spill_prompts(settings(), SIZING)
    assert n == 9  # ceil(2 x 17,280 / 4,000)
    per = SIZING.blocks(4000)
    assert (n - 1) * per >= SIZING.l1_blocks  # each prompt left L1 before it returns
    assert n * per <= SIZING.pool_blocks


def test_spill_capped_by_the_pool_and_refused_when_it_cannot_overflow():
    small_pool = Sizing(128, 2_949_120, 135, 250)
    assert spill_prompts(settings(spill_factor=10), small_pool) == 7  # 0.9 x 250 // 32
    with pytest.raises(RuntimeError, match="raise --pool-gib"):
        spill_prompts(settings(), Sizing(128, 2_949_120, 135, 100))


def test_a_model_with_several_kv_groups_counts_every_groups_blocks():
    # Gemma 3 270M: six groups share 393,216-byte blocks; a prompt holds six
    # blocks per 128 tokens in L1 (until evicted) and in the pool.
    # L1 holds what its server says (vLLM's group-aware capacity): sliding
    # groups free blocks past the window, so more than blocks / 6.
    gemma = Sizing(128, 393_216, 1017, 6826, kv_groups=6, l1_capacity_tokens=49_292)
    assert gemma.blocks(4000) == 6 * 32
    assert gemma.kv_per_token == 18_432  # 18 layers x K and V x 256 x 2 B
    n = spill_prompts(settings(), gemma)
    assert n == 25  # ceil(2 x 49,292 / 4,000)
    assert n * gemma.blocks(4000) <= gemma.pool_blocks
    # A 1 GiB pool cannot hold a set that leaves such an L1: refused.
    with pytest.raises(RuntimeError, match="raise --pool-gib"):
        spill_prompts(settings(), Sizing(128, 393_216, 1017, 2730, 6, 49_292))


def test_servers_serve_the_chosen_model():
    runner = Runner(settings(model="gemma-3-270m"), BW, Path("/tmp"))
    args = runner.server_args("pool", None)
    assert args[0] == "gemma-3-270m"  # vllm-uma serve's MODEL: a recipe's name


def test_traffic_shapes():
    s = settings()
    no_reuse = build_traffic("no_reuse", s, SIZING)
    assert not no_reuse.warmup and len(set(no_reuse.measured)) == 8
    reuse = build_traffic("reuse_fits", s, SIZING)
    assert len(reuse.warmup) == 2 and len(set(reuse.measured)) == 8
    prefix = reuse.warmup[0].split(" ")[: 4000 - 256 - 1]
    assert reuse.measured[0].split(" ")[: len(prefix)] == prefix
    spill = build_traffic("spill_revisit", s, SIZING)
    assert spill.warmup == spill.measured  # the same prompts, in the same order
    restart = build_traffic("restart", s, SIZING)
    assert not set(restart.measured) & set(spill.measured)


def passes(ttfts: list[float], prompt: int = 4000) -> PassResult:
    return PassResult([Reply(t, t + 1, prompt, 16) for t in ttfts], wall_s=sum(ttfts))


def counters(device=0, host=0, disk=0) -> dict[str, int]:
    return {
        "hit_device": device,
        "hit_host": host,
        "hit_disk": disk,
        "computed": 0,
        "bytes_CPU_to_GPU": 0,
        "bytes_GPU_to_CPU": 0,
        "bytes_all": 0,
    }


def test_floor_is_restored_bytes_over_measured_bandwidth():
    fig = summarize(passes([1.0, 1.0]), counters(host=1000, disk=1000), 23_040, BW)
    # per request: (1000 x 23,040 / 10 GB/s + 1000 x 23,040 / 1 GB/s) / 2
    assert fig["floor_restore_s_per_request"] == pytest.approx(0.012672, abs=1e-5)
    assert fig["restored_bytes"] == 2000 * 23_040
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0


def test_a_control_ahead_by_more_than_125x_is_suspect():
    off = summarize(passes([4.0] * 4), counters(), 23_040, BW)
    fast = summarize(passes([3.0] * 4), counters(), 23_040, BW)
    close = summarize(passes([3.5] * 4), counters(), 23_040, BW)
    runs = {"no_reuse": {"off": off, "pool": fast}, "reuse_fits": {"off": off, "pool": close}}
    reasons = compare(runs, equal_memory=False)
    assert len(reasons) == 1 and reasons[0].startswith("control no_reuse: pool is 1.33x")
    assert runs["reuse_fits"]["pool"]["vs_off"]["ttft_p50_x"] == pytest.approx(1.14, abs=0.01)


def test_spill_that_hits_l1_is_suspect_unless_memory_is_equal():
    off = summarize(passes([4.0] * 2), counters(device=4000), 23_040, BW)
    runs = {"spill_revisit": {"off": off}}
    assert "did not overflow L1" in compare(runs, equal_memory=False)[0]
    assert compare(runs, equal_memory=True) == []


def test_missing_lower_tier_hits_warn_and_failures_show_in_the_table():
    pool = summarize(passes([1.0]), counters(), 23_040, BW)
    runs = {"spill_revisit": {"pool": pool}, "restart": {"pool_disk": {"error": "refused"}}}
    assert expectations(runs) == ["spill_revisit/pool: no prompt token came from the host tier"]
    assert "pool_disk FAILED: refused" in table(runs)


def test_pool_disk_flags_with_more_memory_and_an_explicit_pool():
    # The older comparison, and pool_split's explicit sweep points.
    runner = Runner(settings(equal_memory=True), BW, Path("/tmp"))
    off = runner.server_args("off", None)
    assert off[off.index("--kv-cache-memory-bytes") + 1] == str(400_000_000 + (1 << 30))
    args = runner.server_args("pool_disk", Path("/data/kv"))
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(400_000_000)
    assert args[args.index("--kv-offloading-size") + 1] == "1"
    tier = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert tier == {
        "kv_connector_extra_config": {
            "secondary_tiers": [{"type": "fs", "root_dir": "/data/kv", "max_size_gib": 2.0}]
        }
    }
    more = Runner(settings(), BW, Path("/tmp"))
    for variant in ("off", "pool", "pool_disk"):
        a = more.server_args(variant, Path("/data/kv"))
        assert a[a.index("--kv-cache-memory-bytes") + 1] == str(400_000_000)


def test_at_equal_memory_pool_disk_stages_in_the_servers_own_pool():
    staging = 20480 * 23040  # (2 x 8192 + 2 x 2048) tokens of the default model
    runner = Runner(
        settings(equal_memory=True, staging_pool=True, staging_bytes=staging), BW, Path("/tmp")
    )
    budget = 400_000_000 + (1 << 30)
    l1 = {v: runner.server_args(v, Path("/d"))[4] for v in ("off", "pool", "pool_disk")}
    assert l1 == {"off": str(budget), "pool": "400000000", "pool_disk": str(budget - staging)}
    args = runner.server_args("pool_disk", Path("/d"))
    assert "--kv-offloading-size" not in args  # the server sizes it
    config = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] == "OffloadingConnector"
    assert config["kv_connector_extra_config"]["secondary_tiers"][0]["root_dir"] == "/d"


def test_the_benchmark_compares_at_equal_memory_by_default():
    from tools.benchmark.kv_offload_benchmark import batch_tokens, parse_args

    args = parse_args(["--variants", "off,pool_disk"])
    assert args.equal_memory and not args.more_memory
    # The staging pool of the default model at --max-model-len 8192.
    assert args.staging_bytes == (2 * 8192 + 2 * 2048) * 23040
    assert Settings.from_args(args).staging_pool
    assert not parse_args(["--more-memory"]).equal_memory
    assert batch_tokens("--enforce-eager --max-num-batched-tokens 4096") == 4096
    assert batch_tokens("--max-num-batched-tokens=512") == 512
    assert batch_tokens("") == 2048


def test_failure_leads_with_the_servers_error_line():
    exc = RuntimeError("server exited with 2:\nINFO start\nvllm-uma serve: error: no disk tier\n")
    assert failure(exc).splitlines()[0] == "vllm-uma serve: error: no disk tier"


@pytest.mark.parametrize(
    "block_tokens, smollm2_row, gemma_row",
    [(32, 737_280, 98_304), (128, 2_949_120, 393_216)],  # vllm-uma's default, vLLM CPU's
)
def test_a_pool_row_is_one_block_of_one_kv_cache_group(
    tmp_path, block_tokens, smollm2_row, gemma_row
):
    from tools.benchmark.lib.geometry import kv_row_bytes

    def model(**config):
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config))
        return d

    smollm2 = model(
        num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3
    )
    # Every layer in one group: 23,040 B of KV a token.
    assert kv_row_bytes(smollm2, block_tokens=block_tokens) == smollm2_row
    kinds = (["sliding_attention"] * 5 + ["full_attention"]) * 3
    gemma = model(
        num_hidden_layers=18,
        head_dim=256,
        hidden_size=640,
        num_attention_heads=4,
        num_key_value_heads=1,
        layer_types=kinds,
    )
    # Groups of 3 layers (the 3 full ones set it): 3,072 B of a group's KV a token.
    assert kv_row_bytes(gemma, block_tokens=block_tokens) == gemma_row
    assert kv_row_bytes(gemma, "float32", block_tokens=block_tokens) == 2 * gemma_row


def test_the_defaults_are_the_same_bytes_at_every_block_size():
    """L1 and the pool default to tokens of KV, not blocks: a run at 32 and
    one at 128 serve the same workload in the same memory."""
    from tools.benchmark.kv_offload_benchmark import parse_args

    at_32, at_128 = parse_args([]), parse_args(["--server-args=--block-size 128"])
    assert (at_32.block_tokens, at_128.block_tokens) == (32, 128)  # the servers' own
    assert (at_32.row_bytes, at_128.row_bytes) == (737_280, 2_949_120)
    # 135 and a half blocks of 128, 542 of 32: what 400 MB held before.
    assert at_32.l1_bytes == at_128.l1_bytes == 542 * 737_280 == 399_605_760
    assert at_32.pool_gib == at_128.pool_gib == 1.0
    assert at_32.staging_bytes == at_128.staging_bytes
    # The traffic sized from each server's breakdown is the same too.
    s = settings(l1_bytes=at_32.l1_bytes, pool_gib=1.0)
    small = Sizing(block_size=32, per_block_bytes=737_280, l1_blocks=542, pool_blocks=1456)
    large = Sizing(block_size=128, per_block_bytes=2_949_120, l1_blocks=135, pool_blocks=364)
    assert spill_prompts(s, small) == spill_prompts(s, large) == 9


def test_a_measured_pass_waits_for_the_disk_tiers_writes_too(monkeypatch):
    # The copies into the pool ended; the disk tier is still writing.
    from tools.benchmark import kv_offload_client as client

    readings = iter([(100, 10), (100, 20), (100, 30), (100, 30), (100, 30)])
    seen = []

    def scrape(url):
        bytes_all, written = next(readings)
        seen.append(written)
        return {"bytes_all": bytes_all, "disk_written": written}

    monkeypatch.setattr(client, "scrape", scrape)
    monkeypatch.setattr(client.time, "sleep", lambda s: None)
    client.wait_quiet("http://x")
    assert seen == [10, 20, 30, 30]  # quiet only once the writes stopped


def test_each_pass_is_new_traffic_of_the_same_shape():
    s = settings(passes=3)
    no_reuse = build_traffic("no_reuse", s, SIZING)
    prompts = [p for run in no_reuse.passes for p in run]
    assert len(no_reuse.passes) == 3 and len(set(prompts)) == 24  # nothing to restore
    assert no_reuse.measured == build_traffic("no_reuse", settings(), SIZING).measured
    reuse = build_traffic("reuse_fits", s, SIZING)
    assert [len(set(run)) for run in reuse.passes] == [8, 8, 8]
    assert len({p for run in reuse.passes for p in run}) == 24  # new suffixes each pass
    prefix = " ".join(reuse.warmup[1].split(" ")[: 4000 - 256 - 1])
    assert all(run[1].startswith(prefix) for run in reuse.passes)  # the same prefixes
    spill = build_traffic("spill_revisit", s, SIZING)
    assert spill.passes == (spill.warmup,) * 3  # the same revisits each pass
    assert len(build_traffic("restart", s, SIZING).passes) == 1  # a fresh server's first


def test_the_runner_serves_every_pass_and_waits_between_them(monkeypatch):
    from tools.benchmark import kv_offload_runner as runner_module

    served, quiet = [], []

    def run_pass(url, prompts, max_tokens, concurrency, label, model):
        served.append((label, tuple(prompts)))
        return passes([0.5] * len(prompts))

    monkeypatch.setattr(runner_module, "run_pass", run_pass)
    monkeypatch.setattr(runner_module, "wait_quiet", lambda url: quiet.append(len(served)))
    traffic = build_traffic("no_reuse", settings(passes=3), SIZING)
    result = Runner(settings(passes=3), BW, Path("/tmp"))._measure("http://x", traffic.passes)
    assert [p for _, p in served] == list(traffic.passes)
    assert [label for label, _ in served] == [f"measured {i}/3" for i in (1, 2, 3)]
    assert quiet == [1, 2]  # before the 2nd and the 3rd pass, not before the first
    assert len(result.replies) == 24 and result.wall_s == pytest.approx(12.0)


def test_passes_are_refused_past_the_workloads_seeds():
    from tools.benchmark.kv_offload_benchmark import parse_args

    assert parse_args([]).passes == 3
    with pytest.raises(SystemExit):
        parse_args(["--passes", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--passes", "101", "--requests", "8"])  # 808 > 800
