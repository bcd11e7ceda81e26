"""The restore breakdown tool's reading of vLLM's transfer counters and its table."""

from __future__ import annotations

from tools.benchmark.restore_breakdown import _medians, _table, transfers

BODY = """# HELP vllm:kv_offload_load_time_total Total load time
vllm:kv_offload_load_time_total{engine="0",transfer_type="CPU_to_GPU"} 0.25
vllm:kv_offload_load_time_total{engine="0",transfer_type="STORAGE_to_CPU"} 1.5
vllm:kv_offload_load_bytes_total{engine="0",transfer_type="CPU_to_GPU"} 9.2e+07
vllm:kv_offload_store_time_total{engine="0",transfer_type="GPU_to_CPU"} 3.0
"""


def test_load_counters_are_read_by_label_and_stores_are_not():
    got = transfers(BODY)
    assert got == {
        'load_time{transfer_type="CPU_to_GPU"}': 0.25,
        'load_time{transfer_type="STORAGE_to_CPU"}': 1.5,
        'load_bytes{transfer_type="CPU_to_GPU"}': 9.2e7,
    }
    plain = 'vllm:kv_offload_load_time_total{engine="0",model_name="m"} 0.5\n'
    assert transfers(plain) == {"load_time": 0.5}


def test_medians_and_the_table_show_every_case_and_part():
    runs = [{"client": 0.1, "queue": 0.02}, {"client": 0.3}, {"client": 0.2, "queue": 0.04}]
    assert _medians(runs) == {"client": 0.2, "queue": 0.02}
    result = {c: {"client": 0.2, "hit_host": 3968.0} for c in ("recompute", "l1_hit", "pool")}
    result["disk"] = {"client": 0.25, 'load_time{transfer_type="STORAGE_to_CPU"}': 0.05}
    table = _table(result)
    assert "client" in table and "200.0ms" in table and "250.0ms" in table
    assert "STORAGE_to_CPU" in table and "3968" in table
