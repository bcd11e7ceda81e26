"""Translation and refusal of the offloading flags (vllm_uma/kv_offload/config.py,
refusals.py), and the host pool's automatic size (pool_size.py).

The configs are small stand-ins with only the attributes the module reads;
the end-to-end tests run the real flags through the real server.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_uma.kv_offload import config as oc
from vllm_uma.kv_offload import pool_size, refusals

GiB = 1 << 30
PER_TOKEN = 23_040  # SmolLM2-135M in bf16


class Model(SimpleNamespace):
    def get_num_layers(self, parallel):
        return 30

    def get_num_kv_heads(self, parallel):
        return 3

    def get_head_size(self):
        return 64

    def get_sliding_window(self):
        return self.sliding_window


class Spec(SimpleNamespace):
    def uses_draft_model(self):
        return self.method == "draft_model"


def vllm_config(
    size=None,
    backend="native",
    ktc=None,
    use_mla=False,
    sliding_window=None,
    runner_type="generate",
    transcription=False,
    is_hybrid=False,
    pp=1,
    dp=1,
    tp=1,
    executor="uni",
    spec=None,
    hash_algo="sha256",
    kv_events=False,
    shutdown_timeout=0,
    cache_dtype="auto",
    weight_transfer=False,
):
    return SimpleNamespace(
        shutdown_timeout=shutdown_timeout,
        weight_transfer_config=SimpleNamespace(backend="ipc") if weight_transfer else None,
        kv_events_config=SimpleNamespace(enable_kv_cache_events=kv_events),
        cache_config=SimpleNamespace(
            kv_offloading_size=size,
            kv_offloading_backend=backend,
            gpu_memory_utilization=0.5,
            prefix_caching_hash_algo=hash_algo,
            cache_dtype=cache_dtype,
        ),
        load_config=SimpleNamespace(load_format="auto", download_dir=None),
        lora_config=None,
        kv_transfer_config=ktc,
        model_config=Model(
            use_mla=use_mla,
            sliding_window=sliding_window,
            dtype=torch.bfloat16,
            max_model_len=8192,
            runner_type=runner_type,
            _model_info=SimpleNamespace(supports_transcription=transcription),
            is_hybrid=is_hybrid,
            model="/models/smol",
            revision=None,
            quantization=None,
            hf_overrides={},
            trust_remote_code=False,
            is_multimodal_model=False,
        ),
        parallel_config=SimpleNamespace(
            pipeline_parallel_size=pp,
            data_parallel_size=dp,
            tensor_parallel_size=tp,
            distributed_executor_backend=executor,
        ),
        speculative_config=None if spec is None else Spec(method=spec),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=2048),
    )


def connector(name, **extra):
    return SimpleNamespace(kv_connector=name, kv_connector_extra_config=dict(extra))


def test_off_when_neither_flag_is_given():
    cfg = vllm_config()
    assert oc.translate(cfg, 24 * GiB) is None
    assert cfg.kv_transfer_config is None


def test_size_flag_points_the_connector_at_our_spec():
    cfg = vllm_config(size=1.5, ktc=connector(None))
    pool = oc.translate(cfg, 24 * GiB).pool
    assert pool.bytes == int(1.5 * GiB) and pool.reason == "--kv-offloading-size"
    extra = cfg.kv_transfer_config.kv_connector_extra_config
    assert extra["spec_name"] == "UmaOffloadingSpec"
    assert extra["spec_module_path"] == "vllm_uma.kv_offload.spec"


def test_vllms_connector_name_finds_our_connector():
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    from vllm_uma.kv_offload.connector import UmaOffloadingConnector

    cfg = vllm_config(size=1, ktc=connector(None))
    oc.translate(cfg, 24 * GiB)
    ktc = cfg.kv_transfer_config
    assert ktc.kv_connector_module_path == "vllm_uma.kv_offload.connector"
    # vLLM sets the name from --kv-offloading-size after the platform hook.
    ktc.kv_connector = "OffloadingConnector"
    assert KVConnectorFactory.get_connector_class(ktc) is UmaOffloadingConnector


def test_connector_without_size_gets_two_requests_of_kv():
    cfg = vllm_config(ktc=connector("OffloadingConnector"))
    pool = oc.translate(cfg, 24 * GiB).pool
    assert pool.bytes == 2 * 8192 * PER_TOKEN
    assert "2 x max_model_len=8192" in pool.reason
    assert "at most, final once the weights load" in pool.reason  # the worker resizes it
    assert pool.auto
    # vLLM's spec needs a size to start: the provisional one.
    assert cfg.kv_transfer_config.kv_connector_extra_config["cpu_bytes_to_use"] == pool.bytes


@pytest.mark.parametrize("cache_dtype, per_token", [("auto", PER_TOKEN), ("fp8", PER_TOKEN // 2)])
def test_the_auto_size_counts_the_kv_cache_dtype(cache_dtype, per_token):
    cfg = vllm_config(ktc=connector("OffloadingConnector"), cache_dtype=cache_dtype)
    assert oc.translate(cfg, 24 * GiB).pool.bytes == 2 * 8192 * per_token


def test_with_a_disk_tier_the_automatic_pool_is_a_staging_area(tmp_path):
    # Two full-length restores promoted at once, two steps of stores on
    # their way down: what vLLM's tiering moves through the pool.
    tiers = [{"type": "fs", "root_dir": str(tmp_path), "max_size_gib": 1}]
    cfg = vllm_config(ktc=connector("OffloadingConnector", secondary_tiers=tiers))
    plan = oc.translate(cfg, 24 * GiB)
    assert plan.lower_tier == "disk" and plan.pool.auto
    assert plan.pool.bytes == (2 * 8192 + 2 * 2048) * PER_TOKEN
    assert "staging area for the disk tier" in plan.pool.reason
    assert "max_num_batched_tokens=2048" in plan.pool.reason
    assert "L1 gets the rest of the budget" in plan.pool.reason
    # The worker makes it final the same way, from what is left.
    final = pool_size.resize_auto_pool(cfg, plan, left=20 * GiB)
    assert final.bytes == plan.pool.bytes and "staging area" in final.reason
    assert pool_size.resize_auto_pool(cfg, plan, left=400_000_000).bytes == 100_000_000
    # Without the disk tier: no staging, two requests of KV.
    pool_only = oc.translate(vllm_config(ktc=connector("OffloadingConnector")), 24 * GiB)
    assert pool_only.lower_tier is None and pool_only.pool.bytes == 2 * 8192 * PER_TOKEN


def test_an_explicit_size_is_honoured_with_a_disk_tier(tmp_path):
    tiers = [{"type": "fs", "root_dir": str(tmp_path), "max_size_gib": 1}]
    cfg = vllm_config(size=0.5, ktc=connector(None, secondary_tiers=tiers))
    plan = oc.translate(cfg, 24 * GiB)
    assert plan.pool.bytes == GiB // 2 and not plan.pool.auto
    assert pool_size.resize_auto_pool(cfg, plan, left=20 * GiB) is None


def test_auto_size_is_clamped_to_a_quarter_of_the_kv_budget():
    pool = pool_size.auto_pool_size(PER_TOKEN, 8192, kv_budget=400_000_000)
    assert pool.bytes == 100_000_000
    assert "clamped to 1/4 of the KV budget" in pool.reason


def test_the_worker_resizes_an_automatic_pool_from_what_is_left():
    # A 24 GiB budget would allow 2 x 8192 tokens (377 MB); with 1 GB left
    # after weights and activations a quarter of that is the pool.
    cfg = vllm_config(ktc=connector("OffloadingConnector"))
    plan = oc.translate(cfg, 24 * GiB)
    assert plan.pool.bytes == 2 * 8192 * PER_TOKEN
    pool = pool_size.resize_auto_pool(cfg, plan, left=1_000_000_000)
    assert pool.bytes == 250_000_000 and pool.auto
    assert "1/4 of the budget left after weights and activations" in pool.reason
    # Room enough: two full-length requests, as before.
    assert pool_size.resize_auto_pool(cfg, plan, left=20 * GiB).bytes == 2 * 8192 * PER_TOKEN
    # Nothing left: an empty pool, which the spec then refuses with its fix.
    assert pool_size.resize_auto_pool(cfg, plan, left=-5).bytes == 0
    assert pool_size.resize_auto_pool(cfg, None, left=20 * GiB) is None  # offloading off


@pytest.mark.parametrize(
    "kwargs",
    [dict(size=1), dict(ktc=connector("OffloadingConnector", cpu_bytes_to_use=123456789))],
)
def test_a_pool_size_the_user_gave_is_not_resized(kwargs):
    cfg = vllm_config(**kwargs)
    plan = oc.translate(cfg, 24 * GiB)
    assert not plan.pool.auto
    assert pool_size.resize_auto_pool(cfg, plan, left=1_000_000) is None


def test_explicit_cpu_bytes_in_the_json_is_kept():
    cfg = vllm_config(ktc=connector("OffloadingConnector", cpu_bytes_to_use=123456789))
    assert oc.translate(cfg, 24 * GiB).pool.bytes == 123456789


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(size=1, backend="lmcache"), "--kv-offloading-backend lmcache is not supported"),
        (dict(size=0), "--kv-offloading-size=0 is invalid: it must be a positive"),
        (dict(size=-2), "--kv-offloading-size=-2 is invalid"),
        (
            dict(size=1, ktc=connector("NixlConnector")),
            "cannot be combined with the KV connector 'NixlConnector'",
        ),
        (dict(size=1, use_mla=True), "not supported for MLA models"),
        (dict(size=1, runner_type="pooling"), "not supported for pooling"),
        (dict(size=1, transcription=True), "not supported for speech-to-text"),
        (dict(size=1, is_hybrid=True), "hybrid models with Mamba or linear-attention"),
        (dict(size=1, pp=2), "--pipeline-parallel-size=2"),
        (dict(size=1, dp=2), "--data-parallel-size=2"),
        (dict(size=1, tp=2, executor="mp"), "the executor is 'mp' (tensor_parallel_size=2)"),
        (dict(size=1, executor="ray"), "the executor is 'ray'"),
        (dict(size=1, spec="draft_model"), "draft-model speculative decoding"),
        (
            dict(ktc=connector("OffloadingConnector", cpu_byte_to_use=1)),
            "unknown key(s) ['cpu_byte_to_use']",
        ),
        (
            dict(size=1, ktc=connector(None, self_describing_kv_events="false")),
            "self_describing_kv_events='false' is invalid",
        ),
        (
            dict(ktc=connector(None, secondary_tiers=[{"type": "fs", "root_dir": "/x"}])),
            "'secondary_tiers' (the disk and network tiers) needs the host pool",
        ),
        (
            dict(
                size=1,
                ktc=connector(
                    None, store_threshold=2, secondary_tiers=[{"type": "fs", "root_dir": "/x"}]
                ),
            ),
            "store_threshold=2 cannot be combined with the disk tier",
        ),
    ],
)
def test_refusals_name_the_setting_and_the_fix(kwargs, fragment):
    with pytest.raises(refusals.OffloadingConfigError) as err:
        oc.translate(vllm_config(**kwargs), 24 * GiB)
    assert fragment in str(err.value)
    assert "remove" in str(err.value).lower() or "use " in str(err.value)


def test_sliding_window_models_are_offloaded():
    # Gemma 2/3, Mistral: vLLM's connector keys each KV cache group's blocks
    # and restores the window a sliding group needs (spec.py, the e2e test
    # test_offload_sliding_window.py).
    assert oc.translate(vllm_config(size=1, sliding_window=512), 24 * GiB) is not None


def test_other_speculative_methods_are_allowed():
    cfg = vllm_config(size=1, ktc=connector(None), spec="ngram")
    assert oc.translate(cfg, 24 * GiB) is not None


@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
@pytest.mark.parametrize("seed", [None, "0"])
def test_a_disk_tier_refuses_a_hash_that_is_not_collision_resistant(
    tmp_path, monkeypatch, algo, seed
):
    if seed is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", seed)  # a known seed is no fix
    tiers = [{"type": "fs", "root_dir": str(tmp_path / "kv"), "max_size_gib": 1}]
    cfg = vllm_config(size=1, ktc=connector(None, secondary_tiers=tiers), hash_algo=algo)
    with pytest.raises(refusals.OffloadingConfigError) as err:
        oc.translate(cfg, 24 * GiB)
    assert f"--prefix-caching-hash-algo {algo} cannot name the disk tier" in str(err.value)
    assert "Use --prefix-caching-hash-algo sha256" in str(err.value)
    assert not (tmp_path / "kv").exists()  # refused before anything was created


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_a_disk_tier_takes_sha256(tmp_path, algo):
    tiers = [{"type": "fs", "root_dir": str(tmp_path / "kv"), "max_size_gib": 1}]
    cfg = vllm_config(size=1, ktc=connector(None, secondary_tiers=tiers), hash_algo=algo)
    assert oc.translate(cfg, 24 * GiB).disk is not None


def test_the_host_pool_alone_takes_any_hash(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)  # the pool lives in-process
    plan = oc.translate(vllm_config(size=1, ktc=connector(None), hash_algo="xxhash"), 24 * GiB)
    assert plan.disk is None and plan.warnings == ()


def test_a_disk_tier_selects_the_tiered_spec(tmp_path):
    tiers = [{"type": "fs", "root_dir": str(tmp_path / "kv"), "max_size_gib": 2}]
    cfg = vllm_config(size=1, ktc=connector(None, secondary_tiers=tiers), kv_events=True)
    plan = oc.translate(cfg, 24 * GiB)
    assert plan.disk.root_dir == tmp_path / "kv" and plan.disk.cap_bytes == 2 * GiB
    assert plan.disk.enable_kv_events  # the tier follows --kv-events-config
    extra = cfg.kv_transfer_config.kv_connector_extra_config
    assert extra["spec_name"] == "UmaTieredOffloadingSpec"


def test_without_a_disk_tier_the_pool_spec_is_used_and_no_warnings(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    plan = oc.translate(vllm_config(size=1, ktc=connector(None)), 24 * GiB)
    assert plan.disk is None and plan.warnings == ()


def test_a_disk_tier_gives_a_stopping_server_time_to_write(tmp_path):
    tiers = [{"type": "fs", "root_dir": str(tmp_path / "kv"), "max_size_gib": 1}]
    cfg = vllm_config(size=1, ktc=connector(None, secondary_tiers=tiers))
    note = oc.flush_on_stop(cfg, oc.translate(cfg, 24 * GiB))
    assert cfg.shutdown_timeout == oc.DISK_FLUSH_TIMEOUT_S
    assert f"--shutdown-timeout set to {oc.DISK_FLUSH_TIMEOUT_S} s" in note


@pytest.mark.parametrize("timeout, tiers", [(5, True), (0, False)])
def test_the_stop_timeout_is_left_alone_otherwise(tmp_path, timeout, tiers):
    extra = {"secondary_tiers": [{"type": "fs", "root_dir": str(tmp_path), "max_size_gib": 1}]}
    cfg = vllm_config(
        size=1, ktc=connector(None, **(extra if tiers else {})), shutdown_timeout=timeout
    )
    assert oc.flush_on_stop(cfg, oc.translate(cfg, 24 * GiB)) is None
    assert cfg.shutdown_timeout == timeout


def test_a_lower_tier_is_refused_where_weights_can_change(tmp_path, monkeypatch):
    # vllm serve without our preflight, and LLM(...) in-process, reach this.
    tiers = [{"type": "fs", "root_dir": str(tmp_path / "kv"), "max_size_gib": 1}]
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    cfg = vllm_config(size=1, ktc=connector(None, secondary_tiers=tiers), weight_transfer=True)
    with pytest.raises(refusals.OffloadingConfigError, match="^--weight-transfer-config lets"):
        oc.translate(cfg, 24 * GiB)
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    cfg = vllm_config(size=1, ktc=connector(None, secondary_tiers=tiers))
    with pytest.raises(refusals.OffloadingConfigError, match="^VLLM_SERVER_DEV_MODE=1 opens"):
        oc.translate(cfg, 24 * GiB)
    assert not (tmp_path / "kv").exists()  # refused before anything was created
    # The host pool alone: its blocks die with the process, nothing to refuse.
    assert oc.translate(vllm_config(size=1, ktc=connector(None), weight_transfer=True), 24 * GiB)
