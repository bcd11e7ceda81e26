"""The benchmarks' block geometry follows the block size their servers run
(servers.block_tokens of their flags, else vllm-uma's default), never a
constant: the expected block files of stop_survival, the copy layout of
kv_pool_bandwidth, the ledger benchmark's rows and jobs, restore_breakdown's
flags, the default block sizes of the checksum and MAC benchmarks."""

from __future__ import annotations

import json

import pytest

from tools.benchmark.lib import servers
from vllm_uma.plugin.block_size import DEFAULT_BLOCK_TOKENS

SMOLLM2 = dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3)
GEMMA3 = dict(
    num_hidden_layers=18, head_dim=256, hidden_size=640, num_attention_heads=4,
    num_key_value_heads=1, layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
)  # fmt: skip


def model_dir(tmp_path, config: dict):
    directory = tmp_path / str(len(list(tmp_path.iterdir())))
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_the_default_is_vllm_umas_32_token_block():
    assert DEFAULT_BLOCK_TOKENS == 32
    assert servers.block_tokens([]) == DEFAULT_BLOCK_TOKENS


@pytest.mark.parametrize("flags, expected", [([], 8 * 48), (["--block-size", "128"], 8 * 12)])
def test_stop_survival_expects_the_full_blocks_of_the_servers_block_size(flags, expected):
    from tools.benchmark.stop_survival import expected_blocks

    # Eight prompts of 1,536 tokens: 48 blocks each at 32 tokens, 12 at 128.
    assert expected_blocks(8, 1536, ["--kv-offloading-size", "0.5", *flags]) == expected


@pytest.mark.parametrize(
    "config, block, layout",
    [
        (SMOLLM2, 32, (30, 24_576)),  # every layer; 768 B a token a layer
        (SMOLLM2, 128, (30, 98_304)),
        (GEMMA3, 32, (3, 32_768)),  # one KV cache group's 3 layers; 1,024 B a token a layer
        (GEMMA3, 128, (3, 131_072)),
    ],
)
def test_the_copy_bandwidth_tool_lays_out_blocks_of_the_size_asked(tmp_path, config, block, layout):
    from tools.benchmark.kv_pool_bandwidth import block_layout

    assert block_layout(model_dir(tmp_path, config), block) == layout


def test_the_ledger_benchmark_stores_the_same_bytes_at_every_block_size():
    from tools.benchmark.disk_ledger_cost import Geometry

    small, large = Geometry.of(32, 23_040), Geometry.of(128, 23_040)
    assert (small.row, small.job_blocks, small.rows) == (737_280, 36, 144)
    assert (large.row, large.job_blocks, large.rows) == (2_949_120, 9, 36)
    assert small.row * small.job_blocks == large.row * large.job_blocks  # a job's bytes
    assert small.row * small.rows == large.row * large.rows  # the pool's


def test_restore_breakdown_serves_the_default_block_unless_asked():
    from tools.benchmark.restore_breakdown import COMMON, block_args

    assert "--block-size" not in COMMON
    assert servers.block_tokens(COMMON + block_args(None)) == DEFAULT_BLOCK_TOKENS
    assert servers.block_tokens(COMMON + block_args(128)) == 128


def test_the_checksum_and_mac_benchmarks_time_blocks_of_the_default_size():
    from tools.benchmark import checksum_speed, mac_cost

    # The default model's and Qwen3-0.6B's 32-token blocks.
    assert checksum_speed.DEFAULT_SIZES == (737_280, 3_670_016)
    assert mac_cost.DEFAULT_BLOCKS == (737_280, 3_670_016)
