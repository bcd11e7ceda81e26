"""The plugin's --additional-config settings (vllm_uma/config.py)."""

import pytest

from vllm_uma.config import UmaConfig, UmaConfigError


def test_defaults_when_absent():
    assert UmaConfig.from_additional_config({}) == UmaConfig(wire_weights=True)
    assert UmaConfig.from_additional_config({"other_plugin": 1}).wire_weights


def test_wire_weights_off():
    cfg = UmaConfig.from_additional_config({"vllm_uma": {"wire_weights": False}})
    assert cfg.wire_weights is False


def test_unknown_key_is_named_with_the_known_ones():
    with pytest.raises(UmaConfigError) as err:
        UmaConfig.from_additional_config({"vllm_uma": {"wire_weight": False}})
    assert "['wire_weight']" in str(err.value)
    assert "['wire_weights']" in str(err.value)


def test_non_boolean_value_is_refused():
    with pytest.raises(UmaConfigError, match="wire_weights='no' is invalid"):
        UmaConfig.from_additional_config({"vllm_uma": {"wire_weights": "no"}})


def test_namespace_must_be_an_object():
    with pytest.raises(UmaConfigError, match="must be a JSON object"):
        UmaConfig.from_additional_config({"vllm_uma": True})
