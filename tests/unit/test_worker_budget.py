"""The worker's inputs to the budget (vllm_uma/worker.py), on small fakes."""

from types import SimpleNamespace

import pytest

from vllm_uma.worker import (
    _rss,
    kv_block_geometry,
    peak_rss,
    reset_peak_rss,
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


def test_block_geometry_sums_the_layers_pages():
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(block_size=128, num_kv_heads=3, head_size=64, dtype=torch.bfloat16)
    per_block, block_size = kv_block_geometry({f"layer.{i}": spec for i in range(30)})
    # SmolLM2-135M: 23,040 bytes of KV per token, 128 tokens per block.
    assert (per_block, block_size) == (23_040 * 128, 128)


def test_the_peak_rss_window_sees_memory_freed_before_it_is_read():
    import numpy as np

    if not reset_peak_rss():
        pytest.skip("this kernel offers no peak-RSS reset (/proc/self/clear_refs)")
    start = _rss()
    scratch = np.ones(256 * MiB, dtype=np.uint8)  # touched: resident
    del scratch  # a large block goes back to the system at once
    assert _rss() < start + 128 * MiB
    assert peak_rss() >= start + 240 * MiB  # the window saw it
    reset_peak_rss()
    assert peak_rss() < start + 128 * MiB  # a new window starts from now


def test_no_proc_means_no_peak(tmp_path):
    assert peak_rss(str(tmp_path / "missing")) is None
    assert reset_peak_rss(str(tmp_path / "no-such-dir" / "clear_refs")) is False
    (tmp_path / "status").write_text("Name:\tx\nVmRSS:\t100 kB\n")
    assert peak_rss(str(tmp_path / "status")) is None
