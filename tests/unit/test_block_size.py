"""vllm-uma's default KV block (vllm_uma/plugin/block_size.py): 32 tokens
where vLLM CPU put its general default of 128, and nowhere else."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_uma.plugin import block_size


def cache(size: int, user: bool) -> SimpleNamespace:
    return SimpleNamespace(block_size=size, user_specified_block_size=user)


def test_vllm_cpus_default_becomes_ours():
    config = cache(128, user=False)
    assert block_size.apply_default(config)
    assert config.block_size == 32


@pytest.mark.parametrize(
    "size, user",
    [
        (128, True),  # --block-size 128: the user's
        (64, True),
        (16, False),  # vLLM CPU's MLA kernel requires 16
        (256, False),  # and DeepSeek-V4's 256
    ],
)
def test_a_size_chosen_by_the_user_or_required_by_a_kernel_stays(size, user):
    config = cache(size, user)
    assert not block_size.apply_default(config)
    assert config.block_size == size
