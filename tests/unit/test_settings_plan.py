"""The settings plan (vllm_uma/plugin/settings_plan.py): built once, carried in
$VLLM_UMA_PLAN with a constant marker in additional_config (so vLLM's
compile-cache key does not move with it), read back unchanged, and nothing
of vLLM's edited after start-up.

The configs are the small stand-ins of test_offload_config.py, with the
``additional_config`` vLLM gives every config.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import pickle
from types import SimpleNamespace

import pytest

from tests.unit.test_offload_config import PER_TOKEN, GiB, connector, vllm_config
from vllm_uma.kv_offload.pool_size import PoolSize, resize_auto_pool, spec_config
from vllm_uma.kv_offload.refusals import OffloadingConfigError
from vllm_uma.plugin import settings_plan as st
from vllm_uma.plugin.engine_context import EngineContext, engine_context
from vllm_uma.plugin.uma_settings import UmaSettings, UmaSettingsError


@pytest.fixture(autouse=True)
def no_plan_in_the_environment(monkeypatch):
    """The hook writes $VLLM_UMA_PLAN in this process: undone after each test."""
    monkeypatch.setenv(st.PLAN_ENV, "")
    monkeypatch.delenv(st.PLAN_ENV)


def engine_config(additional=None, **kwargs):
    cfg = vllm_config(**kwargs)
    cfg.additional_config = {} if additional is None else additional
    if cfg.kv_transfer_config is not None:
        cfg.kv_transfer_config.engine_id = "engine-0"
    return cfg


def with_disk(tmp_path, **kwargs):
    tiers = [{"type": "fs", "root_dir": str(tmp_path / "kv"), "max_size_gib": 2}]
    return engine_config(ktc=connector(None, secondary_tiers=tiers), size=1, **kwargs)


def test_the_plan_round_trips_through_its_serialised_form(tmp_path):
    cfg = with_disk(tmp_path, additional={"vllm_uma": {"wire_weights": False}})
    built = st.plan_for_hook(cfg, 24 * GiB)
    assert cfg.additional_config[st.PLAN_KEY] == st.MARKER
    assert st.loads(os.environ[st.PLAN_ENV]) == built
    assert built.uma == UmaSettings(wire_weights=False)
    assert built.offload.disk.root_dir == tmp_path / "kv"
    assert built.offload.namespace_inputs.values()["model"] == "/models/smol"
    # Across processes vLLM pickles the config, and copies it in places.
    for carried in (pickle.loads(pickle.dumps(cfg.additional_config)), copy.deepcopy(cfg)):
        additional = getattr(carried, "additional_config", carried)
        assert isinstance(additional[st.PLAN_KEY], st.PlanText)
        assert st.read_plan(SimpleNamespace(additional_config=additional)) == built


def vllm_hash_input(cfg) -> str:
    """What vLLM 0.32's VllmConfig.compute_hash hashes of additional_config."""
    return json.dumps(cfg.additional_config, sort_keys=True)


def test_the_compile_cache_key_does_not_move_with_the_plan(tmp_path):
    bare = engine_config(additional={"vllm_uma": {"wire_weights": False}})
    tiers = [{"type": "fs", "root_dir": str(tmp_path / "other"), "max_size_gib": 5}]
    other = engine_config(
        additional={"vllm_uma": {"wire_weights": False}},
        ktc=connector(None, secondary_tiers=tiers),
        size=3,
    )
    plans = []
    for cfg in (with_disk(tmp_path, additional={"vllm_uma": {"wire_weights": False}}), other):
        st.plan_for_hook(cfg, 24 * GiB)
        plans.append(os.environ[st.PLAN_ENV])
        assert vllm_hash_input(cfg) == vllm_hash_input(
            SimpleNamespace(additional_config={**bare.additional_config, st.PLAN_KEY: st.MARKER})
        )
    assert plans[0] != plans[1]  # two plans, one key
    assert json.dumps(json.loads(plans[0]), sort_keys=True, separators=(",", ":")) == plans[0]


def test_the_hook_run_again_reads_the_plan_without_parsing_or_io(tmp_path, monkeypatch):
    cfg = with_disk(tmp_path)
    built = st.plan_for_hook(cfg, 24 * GiB)
    (tmp_path / "kv").rename(tmp_path / "moved")  # the engine does no I/O of its own
    monkeypatch.setattr(st, "translate", lambda *a: pytest.fail("parsed again"))
    monkeypatch.setattr(UmaSettings, "from_additional_config", lambda *a: pytest.fail("again"))
    assert st.plan_for_hook(cfg, 24 * GiB) == built


def test_the_users_additional_config_is_not_edited():
    mine = {"vllm_uma": {"release_idle_seconds": 5}, "other_plugin": 1}
    cfg = engine_config(additional=mine)
    st.plan_for_hook(cfg, 24 * GiB)
    assert mine == {"vllm_uma": {"release_idle_seconds": 5}, "other_plugin": 1}
    assert st.read_plan(cfg).uma.release_idle_seconds == 5
    assert cfg.additional_config["other_plugin"] == 1


@pytest.mark.parametrize(
    "given", ['{"version": 1}', {"version": 1, "uma": {}, "offload": None}, "anything"]
)
def test_a_plan_the_user_gives_is_refused(given):
    cfg = engine_config(additional={st.PLAN_KEY: given})
    with pytest.raises(st.SettingsPlanError, match="is written by the vllm-uma platform"):
        st.plan_for_hook(cfg, 24 * GiB)


def test_the_network_tier_round_trips_without_its_password_or_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_VALKEY_PASSWORD", "s3cret-value")
    monkeypatch.setenv("TEST_KV_SECRET", "mac-key-" * 8)
    tiers = [
        {"type": "fs", "root_dir": str(tmp_path / "kv"), "max_size_gib": 2},
        {
            "type": "valkey",
            "url": "valkeys://kv@cache:6380/2",
            "password_env": "TEST_VALKEY_PASSWORD",
            "secret_env": "TEST_KV_SECRET",
        },
    ]
    cfg = engine_config(ktc=connector(None, secondary_tiers=tiers), size=1)
    built = st.plan_for_hook(cfg, 24 * GiB)
    assert st.loads(os.environ[st.PLAN_ENV]) == built
    network = built.offload.network
    assert (network.host, network.port, network.db, network.tls) == ("cache", 6380, 2, True)
    assert network.url == "valkeys://kv@cache:6380/2"
    assert built.offload.disk is not None and built.offload.namespace_inputs is not None
    # The plan names where the password is; the password is nowhere in it.
    assert "TEST_VALKEY_PASSWORD" in os.environ[st.PLAN_ENV]
    assert "s3cret-value" not in os.environ[st.PLAN_ENV]
    # The same for the MAC's secret: its variable's name, never its keys.
    assert network.secret_env == "TEST_KV_SECRET" and not network.unsigned
    assert "mac-key-" not in os.environ[st.PLAN_ENV]


def test_a_cluster_tiers_allowed_hosts_round_trip_in_the_plan():
    tiers = [
        {
            "type": "valkey",
            "url": "valkey://10.0.0.5:7000/0",
            "cluster": True,
            "cluster_allowed_hosts": ["10.0.0.0/24", "valkey-2.internal"],
            "unsigned": True,
        }
    ]
    cfg = engine_config(ktc=connector(None, secondary_tiers=tiers), size=1)
    built = st.plan_for_hook(cfg, 24 * GiB)
    assert st.loads(os.environ[st.PLAN_ENV]) == built
    assert built.offload.network.cluster_allowed_hosts == ("10.0.0.0/24", "valkey-2.internal")


def test_a_plan_of_another_version_or_shape_is_refused():
    plain = st.to_plain(st.SettingsPlan(uma=UmaSettings(), offload=None))
    other = st.PLAN_VERSION + 1
    with pytest.raises(st.SettingsPlanError, match=f"has version {other}, and this vllm-uma reads"):
        st.from_plain({**plain, "version": other})
    with pytest.raises(st.SettingsPlanError, match="uma in the vllm-uma plan has the keys"):
        st.from_plain({**plain, "uma": {"wire_weights": True}})
    with pytest.raises(st.SettingsPlanError, match="not JSON"):
        st.loads("{")


def test_readers_refuse_a_config_the_platform_never_saw():
    with pytest.raises(st.SettingsPlanError, match="did not run on this config"):
        st.read_plan(engine_config())


def test_a_process_without_the_plan_is_refused_with_the_fix():
    cfg = engine_config()
    st.plan_for_hook(cfg, 24 * GiB)
    del os.environ[st.PLAN_ENV]
    with pytest.raises(st.SettingsPlanError, match=r"VLLM_UMA_PLAN is not set in this process"):
        st.read_plan(cfg)


def test_a_plan_inherited_from_elsewhere_is_replaced_by_the_hook(monkeypatch):
    stale = st.dumps(st.SettingsPlan(uma=UmaSettings(release_idle_seconds=99), offload=None))
    monkeypatch.setenv(st.PLAN_ENV, stale)
    cfg = engine_config(additional={"vllm_uma": {"release_idle_seconds": 5}})
    assert st.plan_for_hook(cfg, 24 * GiB).uma.release_idle_seconds == 5
    assert st.read_plan(cfg).uma.release_idle_seconds == 5


def test_a_marker_of_another_version_is_refused():
    cfg = engine_config(additional={st.PLAN_KEY: st.PlanText("the vllm-uma plan, version 0")})
    with pytest.raises(st.SettingsPlanError, match="different vllm-uma installations"):
        st.read_plan(cfg)


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        (dict(additional={"vllm_uma": {"wire_weight": False}}), UmaSettingsError, "unknown key"),
        (dict(additional={"vllm_uma": True}), UmaSettingsError, "must be a JSON object"),
        (dict(size=0), OffloadingConfigError, "--kv-offloading-size=0 is invalid"),
        (
            dict(ktc=connector("OffloadingConnector", uma_disk_tier={})),
            OffloadingConfigError,
            "unknown key(s) ['uma_disk_tier']",  # our old private keys are no user keys
        ),
    ],
)
def test_refusals_are_raised_where_the_plan_is_built(kwargs, error, fragment):
    cfg = engine_config(**kwargs)
    with pytest.raises(error) as err:
        st.plan_for_hook(cfg, 24 * GiB)
    assert fragment in str(err.value)
    assert st.PLAN_KEY not in cfg.additional_config


def test_a_non_dict_additional_config_is_refused_with_the_fix():
    cfg = engine_config()
    cfg.additional_config = SimpleNamespace(compute_hash=lambda: "x")
    with pytest.raises(
        UmaSettingsError, match="additional_config is a SimpleNamespace, not a dict"
    ):
        st.plan_for_hook(cfg, 24 * GiB)


# -- the worker's pool resize: a result, not an edit --------------------------


def offloading_config(extra):
    """The two fields of vLLM's OffloadingConfig that spec_config reads."""

    @dataclasses.dataclass(frozen=True)
    class Offloading:
        extra_config: dict
        engine_id: str = "engine-0"

    return Offloading(extra_config=extra)


def test_the_workers_resize_edits_none_of_vllms_config_dicts():
    cfg = engine_config(ktc=connector("OffloadingConnector"))
    offload = st.plan_for_hook(cfg, 24 * GiB).offload
    extra = cfg.kv_transfer_config.kv_connector_extra_config
    before = copy.deepcopy((extra, cfg.additional_config))
    pool = resize_auto_pool(cfg, offload, left=1_000_000_000)
    built = spec_config(offloading_config(extra), offload, pool)
    assert (extra, cfg.additional_config) == before
    assert extra["cpu_bytes_to_use"] == 2 * 8192 * PER_TOKEN  # the provisional size
    assert built.extra_config["cpu_bytes_to_use"] == 250_000_000  # the worker's
    assert built.extra_config is not extra


def test_without_the_worker_in_this_process_the_spec_gets_the_planned_size():
    cfg = engine_config(ktc=connector("OffloadingConnector"))
    offload = st.plan_for_hook(cfg, 24 * GiB).offload
    extra = cfg.kv_transfer_config.kv_connector_extra_config
    built = spec_config(offloading_config(extra), offload, EngineContext().pool_size)
    assert built.extra_config["cpu_bytes_to_use"] == offload.pool.bytes


def test_a_size_the_user_gave_reaches_the_spec_as_vllm_wrote_it():
    cfg = engine_config(size=1.5, ktc=connector(None))
    offload = st.plan_for_hook(cfg, 24 * GiB).offload
    given = offloading_config({"cpu_bytes_to_use": 1.5 * GiB})
    final = PoolSize(2 * GiB, "a worker's", True)
    assert spec_config(given, offload, final) is given


def test_a_pools_final_size_is_recorded_once():
    context = EngineContext()
    context.record_pool_size(PoolSize(10, "x", True))
    context.record_pool_size(PoolSize(10, "x", True))  # the same result again is no conflict
    with pytest.raises(ValueError, match="recorded as 10 bytes and again as 11"):
        context.record_pool_size(PoolSize(11, "x", True))
    assert context.pool_size.bytes == 10


@pytest.mark.parametrize("left, expected", [(1_000_000_000, 250_000_000), (20 * GiB, None)])
def test_the_worker_records_its_final_pool_and_edits_no_dict(left, expected):
    from vllm_uma.plugin import worker

    cfg = engine_config(ktc=connector("OffloadingConnector"))
    settings = st.plan_for_hook(cfg, 24 * GiB)
    extra = cfg.kv_transfer_config.kv_connector_extra_config
    before = copy.deepcopy((extra, cfg.additional_config))
    fake = SimpleNamespace(settings=settings, vllm_config=cfg)
    expected = 2 * 8192 * PER_TOKEN if expected is None else expected
    assert worker.UmaWorker._final_pool(fake, left) == expected
    # In the engine's context, where the connectors read it.
    assert engine_context(cfg).pool_size.bytes == expected
    assert (extra, cfg.additional_config) == before


def test_a_worker_with_a_given_pool_size_records_nothing():
    from vllm_uma.plugin import worker

    cfg = engine_config(size=1, ktc=connector(None))
    fake = SimpleNamespace(settings=st.plan_for_hook(cfg, 24 * GiB), vllm_config=cfg)
    assert worker.UmaWorker._final_pool(fake, 1_000_000) == 1 * GiB
    assert engine_context(cfg).pool_size is None
