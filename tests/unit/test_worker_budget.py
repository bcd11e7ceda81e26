"""The worker's inputs to the budget (vllm_uma/plugin/worker_memory.py), on small fakes."""

from types import SimpleNamespace

import pytest

from vllm_uma.plugin.worker_memory import (
    min_request_kv_bytes,
    peak_rss,
    reset_peak_rss,
    rss,
    workers_sharing_ram,
)

MiB = 1 << 20


@pytest.mark.parametrize(
    "local_world_size, dp_local, expected",
    [(1, 1, 1), (2, 1, 2), (1, 0, 1), (2, 2, 4), (1, None, 1)],
)
def test_workers_sharing_ram(local_world_size, dp_local, expected):
    config = SimpleNamespace(local_world_size=local_world_size, data_parallel_size_local=dp_local)
    assert workers_sharing_ram(config) == expected


def _vllm_config(max_model_len: int, in_flight: int = 2048):
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=max_model_len),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        max_in_flight_tokens=in_flight,
    )


def test_a_request_needs_every_full_attention_layers_blocks():
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(block_size=128, num_kv_heads=3, head_size=64, dtype=torch.bfloat16)
    specs = {f"layer.{i}": spec for i in range(30)}
    # SmolLM2-135M: 23,040 bytes of KV per token, 128 tokens per block:
    # 8,192 tokens are 64 blocks of every layer.
    assert min_request_kv_bytes(specs, _vllm_config(8192)) == 64 * 23_040 * 128


def test_a_sliding_window_layer_needs_only_its_window():
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    # Gemma 3 270M: 1 KV head of 256, 5 sliding (window 512) : 1 full.
    kw = dict(block_size=128, num_kv_heads=1, head_size=256, dtype=torch.bfloat16)
    specs = {f"layer.{i}": SlidingWindowSpec(sliding_window=512, **kw) for i in range(15)}
    specs.update({f"full.{i}": FullAttentionSpec(**kw) for i in range(3)})
    page = 128 * 1024  # one layer's block: 128 tokens x K and V x 256 x 2 bytes
    need = min_request_kv_bytes(specs, _vllm_config(32768))
    # The full layers keep all 256 blocks; a sliding layer holds only the
    # blocks its window and one step's tokens span, far fewer.
    assert need >= 3 * 256 * page
    assert need < 3 * 256 * page + 15 * 40 * page
    assert need < 18 * 256 * page / 4


def test_the_peak_rss_window_sees_memory_freed_before_it_is_read():
    import numpy as np

    if not reset_peak_rss():
        pytest.skip("this kernel offers no peak-RSS reset (/proc/self/clear_refs)")
    start = rss()
    scratch = np.ones(256 * MiB, dtype=np.uint8)  # touched: resident
    del scratch  # a large block goes back to the system at once
    assert rss() < start + 128 * MiB
    assert peak_rss() >= start + 240 * MiB  # the window saw it
    reset_peak_rss()
    assert peak_rss() < start + 128 * MiB  # a new window starts from now


def test_no_proc_means_no_peak(tmp_path):
    assert peak_rss(str(tmp_path / "missing")) is None
    assert reset_peak_rss(str(tmp_path / "no-such-dir" / "clear_refs")) is False
    (tmp_path / "status").write_text("Name:\tx\nVmRSS:\t100 kB\n")
    assert peak_rss(str(tmp_path / "status")) is None
