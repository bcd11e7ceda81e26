"""The plugin's --additional-config settings (vllm_uma/plugin/uma_settings.py)."""

import pytest

from vllm_uma.plugin.uma_settings import UmaSettings, UmaSettingsError


def test_defaults_when_absent():
    assert UmaSettings.from_additional_config({}) == UmaSettings(wire_weights=True)
    assert UmaSettings.from_additional_config({"other_plugin": 1}).wire_weights


def test_wire_weights_off():
    cfg = UmaSettings.from_additional_config({"vllm_uma": {"wire_weights": False}})
    assert cfg.wire_weights is False


def test_unknown_key_is_named_with_the_known_ones():
    with pytest.raises(UmaSettingsError) as err:
        UmaSettings.from_additional_config({"vllm_uma": {"wire_weight": False}})
    assert "['wire_weight']" in str(err.value)
    assert "'wire_weights'" in str(err.value)


def test_non_boolean_value_is_refused():
    with pytest.raises(UmaSettingsError, match="wire_weights='no' is invalid"):
        UmaSettings.from_additional_config({"vllm_uma": {"wire_weights": "no"}})


def test_namespace_must_be_an_object():
    with pytest.raises(UmaSettingsError, match="must be a JSON object"):
        UmaSettings.from_additional_config({"vllm_uma": True})


def test_fleet_membership_is_two_whole_numbers_given_together():
    from vllm_uma.plugin.uma_settings import UmaSettings, UmaSettingsError

    config = UmaSettings.from_additional_config({"vllm_uma": {"fleet_member": 2, "fleet_size": 3}})
    assert (config.fleet_member, config.fleet_size) == (2, 3)
    for bad in (
        {"fleet_member": 1},
        {"fleet_member": 4, "fleet_size": 3},
        {"fleet_member": "1", "fleet_size": 2},
        {"fleet_member": True, "fleet_size": 2},
        {"fleet_member": -1, "fleet_size": 2},
    ):
        with pytest.raises(UmaSettingsError, match="fleet_member|whole number"):
            UmaSettings.from_additional_config({"vllm_uma": bad})


def test_the_breakdown_line_says_a_server_is_a_fleet_member():
    from vllm_uma.plugin.memory import MemoryBreakdown, parse_breakdown

    breakdown = MemoryBreakdown(100, 50, 10, 5, 20, 5, 10, 2, 10, 1280)
    line = breakdown.log_line((1, 2))
    assert parse_breakdown(line)["fleet_member"] == 1 and parse_breakdown(line)["fleet_size"] == 2
    assert "fleet member 1 of 2" in line
    assert "fleet" not in breakdown.log_line()


# -- the KV memory release settings (memory_release/) -------------------------


def test_memory_release_defaults():
    config = UmaSettings.from_additional_config({})
    assert config.release_free_kv is True
    assert config.release_idle_seconds == 60
    assert config.memory_pressure == "psi"
    assert config.warm_kv_tokens == 8192


def test_memory_release_settings_are_read():
    config = UmaSettings.from_additional_config(
        {
            "vllm_uma": {
                "release_free_kv": False,
                "release_idle_seconds": 0,
                "memory_pressure": "off",
                "warm_kv_tokens": 0,
            }
        }
    )
    assert (
        config.release_free_kv,
        config.release_idle_seconds,
        config.memory_pressure,
        config.warm_kv_tokens,
    ) == (False, 0, "off", 0)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_release_free_kv_must_be_a_boolean(value):
    with pytest.raises(UmaSettingsError) as err:
        UmaSettings.from_additional_config({"vllm_uma": {"release_free_kv": value}})
    assert str(err.value) == (
        f"--additional-config vllm_uma.release_free_kv={value!r} is invalid: "
        "it must be true or false."
    )


@pytest.mark.parametrize("key", ["release_idle_seconds", "warm_kv_tokens"])
@pytest.mark.parametrize("value", [-1, 1.5, "60", True, None])
def test_whole_number_settings_must_be_at_least_zero(key, value):
    with pytest.raises(UmaSettingsError) as err:
        UmaSettings.from_additional_config({"vllm_uma": {key: value}})
    assert str(err.value) == (
        f"--additional-config vllm_uma.{key}={value!r} is invalid: it must be a whole number >= 0."
    )


@pytest.mark.parametrize("value", ["PSI", "on", "", True, None, ["psi"]])
def test_memory_pressure_must_be_psi_or_off(value):
    with pytest.raises(UmaSettingsError) as err:
        UmaSettings.from_additional_config({"vllm_uma": {"memory_pressure": value}})
    assert str(err.value) == (
        f"--additional-config vllm_uma.memory_pressure={value!r} is invalid: "
        "it must be one of ['psi', 'off']."
    )


def test_every_choice_is_accepted():
    from vllm_uma.plugin.uma_settings import CHOICES

    assert CHOICES == {"memory_pressure": ("psi", "off")}
    for value in CHOICES["memory_pressure"]:
        config = UmaSettings.from_additional_config({"vllm_uma": {"memory_pressure": value}})
        assert config.memory_pressure == value
