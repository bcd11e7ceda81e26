"""tools/benchmark/int4_kernel.py's pure parts: a step's linear shapes and
weight bytes from a config.json. No kernel is run."""

from __future__ import annotations

import pytest

from tools.benchmark import int4_kernel as ik

# Qwen2.5-Coder-1.5B-Instruct's config.json, the fields that shape a step.
QWEN_CODER = {
    "hidden_size": 1536,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "vocab_size": 151936,
}


def test_the_layer_s_linears_are_fused_as_vllm_serves_them():
    assert ik.layer_shapes(QWEN_CODER) == {
        "qkv_proj": (1536, (12 + 2 * 2) * 128),
        "o_proj": (1536, 1536),
        "gate_up_proj": (1536, 2 * 8960),
        "down_proj": (8960, 1536),
    }


def test_a_step_reads_every_weight_once_at_its_width():
    per_layer_weights = 1536 * 2048 + 1536 * 1536 + 1536 * 17920 + 8960 * 1536
    lm_head = 1536 * 151936 * 2
    assert ik.step_bytes(QWEN_CODER, int4=False) == 28 * per_layer_weights * 2 + lm_head
    scales = (1536 * 2048 + 1536 * 1536 + 1536 * 17920 + 8960 * 1536) // ik.GROUP * 2
    assert ik.step_bytes(QWEN_CODER, int4=True) == 28 * (per_layer_weights // 2 + scales) + lm_head
    # What docs/models.md says an int4 step of this model reads: about 1.15 GB.
    assert 1.1e9 < ik.step_bytes(QWEN_CODER, int4=True) < 1.2e9


@pytest.mark.parametrize(
    "argv, says",
    [(["--rows", "1,x"], "give whole numbers"), (["--rows", "0"], "give numbers >= 1")],
)
def test_a_bad_command_line_is_refused_with_the_rule(argv, says, capsys):
    with pytest.raises(SystemExit):
        ik.parse_args(argv)
    assert says in capsys.readouterr().err
