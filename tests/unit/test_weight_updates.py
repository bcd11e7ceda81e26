"""Weights that can change at run time refuse the disk and network tiers
(vllm_uma/kv_offload/weight_updates.py): the setting is read as vLLM reads
it, each refusal names the setting and the fix, and our worker refuses an
in-place change under a lower tier while vLLM's own runs without one.

The start-up refusals as the preflight and the platform make them are in
test_preflight_config.py and test_offload_config.py; the fleet's in
test_fleet_plan.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_uma.kv_offload.refusals import OffloadingConfigError
from vllm_uma.kv_offload.weight_updates import (
    DEV_MODE_ENV,
    TURN_OFF_TIERS,
    WeightChangeRefused,
    dev_mode_on,
    refuse_weight_change,
    refuse_weight_updates,
    tiers_named,
)


@pytest.mark.parametrize(
    "value, on", [(None, False), ("0", False), ("1", True), ("2", True), (" 1", True)]
)
def test_the_dev_mode_is_read_as_vllm_reads_it(value, on):
    environ = {} if value is None else {DEV_MODE_ENV: value}
    assert dev_mode_on(environ) is on
    # vllm/envs.py: bool(int(os.getenv("VLLM_SERVER_DEV_MODE", "0")))
    assert bool(int(environ.get(DEV_MODE_ENV, "0"))) is on


def test_a_dev_mode_that_is_no_number_is_left_to_vllm():
    assert not dev_mode_on({DEV_MODE_ENV: "true"})  # vLLM's import refuses it


def test_the_tiers_are_named_as_configured():
    assert tiers_named(False, False) is None
    assert tiers_named(True, False) == "the disk tier"
    assert tiers_named(False, True) == "the network tier"
    assert tiers_named(True, True) == "the disk and network tiers"


def test_the_dev_mode_refuses_a_lower_tier_with_the_setting_and_the_fix():
    with pytest.raises(OffloadingConfigError) as err:
        refuse_weight_updates("the disk tier", {DEV_MODE_ENV: "1"}, False, TURN_OFF_TIERS)
    message = str(err.value)
    assert message.startswith("VLLM_SERVER_DEV_MODE=1 opens vLLM's development endpoints")
    assert "the disk tier would keep serving" in message
    assert message.endswith(
        "Unset VLLM_SERVER_DEV_MODE (or set it to 0), or remove 'secondary_tiers' "
        "(the disk and network tiers)."
    )


def test_a_weight_transfer_config_refuses_a_lower_tier():
    with pytest.raises(OffloadingConfigError) as err:
        refuse_weight_updates("the network tier", {}, True, "turn them off")
    message = str(err.value)
    assert message.startswith("--weight-transfer-config lets a trainer replace the weights")
    assert "Remove --weight-transfer-config" in message and message.endswith("turn them off.")


@pytest.mark.parametrize(
    "tiers, environ, transfer, refused_with",
    [
        # no lower tier: the pool dies with the process
        (None, {DEV_MODE_ENV: "1"}, True, {"tiers": "the disk tier"}),
        ("the disk tier", {DEV_MODE_ENV: "0"}, False, {"environ": {DEV_MODE_ENV: "1"}}),
        ("the disk tier", {}, False, {"weight_transfer": True}),
    ],
)
def test_nothing_is_refused_otherwise(tiers, environ, transfer, refused_with):
    refuse_weight_updates(tiers, environ, transfer, TURN_OFF_TIERS)
    # The one setting that would make it a refusal: passed for the right reason.
    changed = {"tiers": tiers, "environ": environ, "weight_transfer": transfer, **refused_with}
    with pytest.raises(OffloadingConfigError):
        refuse_weight_updates(**changed, turn_off=TURN_OFF_TIERS)


def worker(disk: bool, network: bool = False):
    """Our worker, with only what its weight methods read: the settings plan
    and a model runner around a real module."""
    from vllm_uma.plugin.worker import UmaWorker

    offload = SimpleNamespace(
        disk=object() if disk else None, network=object() if network else None
    )
    instance = UmaWorker.__new__(UmaWorker)  # no process group, no model load
    instance.settings = SimpleNamespace(offload=offload)
    model = torch.nn.Linear(2, 2)
    torch.nn.init.ones_(model.weight)
    instance.model_runner = SimpleNamespace(get_model=lambda: model)
    return instance, model


@pytest.mark.parametrize("disk, network", [(True, False), (False, True), (True, True)])
def test_the_worker_refuses_an_in_place_change_under_a_lower_tier(disk, network):
    instance, model = worker(disk, network)
    named = tiers_named(disk, network)
    with pytest.raises(WeightChangeRefused, match=f"reload_weights would change .* {named}"):
        instance.reload_weights(weights_path="/other/checkpoint")
    with pytest.raises(WeightChangeRefused, match="reset_weights"):
        instance.reset_weights()
    with pytest.raises(WeightChangeRefused, match="update_config"):
        instance.update_config({"model_config": {"model": "/other/checkpoint"}})
    assert torch.equal(model.weight, torch.ones(2, 2))  # unchanged


def test_without_a_lower_tier_the_worker_changes_weights_as_vllm_does():
    instance, model = worker(disk=False)
    instance.reset_weights()  # vLLM's own: zeroes every parameter
    assert not model.weight.any()
    instance.settings = SimpleNamespace(offload=None)  # offloading off altogether
    refuse_weight_change("reload_weights", instance._lower_tiers())
