"""JSON flags and offloading settings refused before vLLM is imported
(vllm_uma/commands/preflight_config.py). The messages are the platform's
(tests/unit/test_offload_config.py, test_disk_settings.py,
test_network_tier_settings.py): these tests show which reach the preflight."""

import json

import pytest

from vllm_uma.commands.preflight import PreflightError
from vllm_uma.commands.preflight_config import (
    check_json_values,
    check_offloading,
    loads,
    plugin_active,
)
from vllm_uma.commands.serve_line import read_serve_line

ACTIVE: dict[str, str] = {}  # an environment in which vLLM loads the plugin


def offloading(tiers=None, *flags, size="1", extra=None) -> list[str]:
    extra = dict(extra or {})
    if tiers is not None:
        extra["secondary_tiers"] = tiers
    config = json.dumps({"kv_connector_extra_config": extra})
    sized = ["--kv-offloading-size", size] if size is not None else []
    return [*sized, "--kv-transfer-config", config, *flags]


def refusal(argv, environ=ACTIVE) -> str:
    with pytest.raises(PreflightError) as err:
        check_offloading(read_serve_line(argv), environ)
    return str(err.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"kv_connector": ', "is not valid JSON (Expecting value: line 1 column 18"),
        ("[1, 2]", "is a JSON list, not an object"),
        ('"OffloadingConnector"', "is a JSON str, not an object"),
        ("null", "is null, not an object"),  # vLLM's parser refuses it too
    ],
)
def test_a_json_flag_that_vllm_cannot_read(text, message):
    with pytest.raises(PreflightError) as err:
        check_json_values(read_serve_line(["--kv-transfer-config", text]))
    assert str(err.value).startswith(f"--kv-transfer-config {text!r} {message}")


def test_what_vllm_reads_passes():
    check_json_values(
        read_serve_line(
            [
                "--kv-transfer-config", '{"kv_connector_extra_config": {"cpu_bytes_to_use": 80m}}',
                "--kv-events-config", '{"enable_kv_cache_events": true}',
                "--additional-config", "[1]",  # a dict or not: vLLM's config says
            ]
        )
    )  # fmt: skip


def test_numbers_as_vllm_reads_them():
    assert loads('{"a": 80m, "b": 1K, "s": "2G"}') == {"a": 80_000_000, "b": 1024, "s": "2G"}
    with pytest.raises(ValueError):
        loads('{"a": 80m}', numbers=False)  # --additional-config: plain json.loads


def test_lmcache_is_refused_with_offloading_on():
    message = refusal(["--kv-offloading-backend", "lmcache", "--kv-offloading-size", "1"])
    assert message.startswith("--kv-offloading-backend lmcache is not supported by vllm-uma")


def test_lmcache_without_offloading_is_vllms_business():
    check_offloading(read_serve_line(["--kv-offloading-backend", "lmcache"]), ACTIVE)


def test_unknown_extra_key():
    assert refusal(offloading(extra={"cpu_byts": 1})).startswith("unknown key(s) ['cpu_byts']")


def test_tiers_without_the_pool():
    message = refusal(offloading([{"type": "fs", "root_dir": "/x"}], size=None))
    assert "needs the host pool: add --kv-offloading-size" in message


def test_unknown_tier_type():
    assert refusal(offloading([{"type": "s3"}])).startswith("secondary tier type 's3' is not")


def test_an_existing_root_others_may_write_is_refused(tmp_path):
    root = tmp_path / "kv"
    root.mkdir(mode=0o700)
    root.chmod(0o777)
    message = refusal(offloading([{"type": "fs", "root_dir": str(root)}]))
    assert message.startswith(f"fs tier root_dir {str(root)!r} is writable by group or others")


def test_a_store_directory_that_is_a_symlink_is_refused(tmp_path):
    root = tmp_path / "kv"
    root.mkdir(mode=0o700)
    (root / ".noindex").symlink_to(tmp_path)
    assert "is a symlink" in refusal(offloading([{"type": "fs", "root_dir": str(root)}]))


def test_a_missing_root_passes_and_is_not_created(tmp_path):
    root = tmp_path / "kv"
    check_offloading(read_serve_line(offloading([{"type": "fs", "root_dir": str(root)}])), ACTIVE)
    assert not root.exists()  # created by the platform, once vLLM accepted the rest


def test_a_bad_cap_is_refused(tmp_path):
    tier = {"type": "fs", "root_dir": str(tmp_path), "max_size_gib": -1}
    assert refusal(offloading([tier])).startswith("fs tier max_size_gib=-1 is invalid")


def test_the_valkey_tier_settings_are_parsed():
    tier = {"type": "valkey", "url": "valkey://u:secret@host:6379/0"}
    message = refusal(offloading([tier]))
    assert "holds a password" in message and "secret" not in message


def test_a_valkey_tier_without_a_secret_is_refused_before_vllm_loads():
    # Unsigned values would let anyone who writes to the KV server steer answers.
    tier = {"type": "valkey", "url": "valkey://host:6379/0"}
    message = refusal(offloading([tier]))
    assert message.startswith("the valkey tier has no secret to sign its values with")
    check_offloading(read_serve_line(offloading([{**tier, "unsigned": True}])), ACTIVE)


@pytest.mark.parametrize(
    "environ", [{"VLLM_PLUGINS": ""}, {"VLLM_PLUGINS": "other"}, {"VLLM_TARGET_DEVICE": "CPU"}]
)
def test_nothing_of_the_plugins_when_vllm_does_not_load_it(environ):
    assert not plugin_active(environ)
    check_offloading(read_serve_line(offloading([{"type": "s3"}])), environ)


def test_plugin_active_by_default_and_when_listed():
    assert plugin_active({}, "linux") and plugin_active({"VLLM_PLUGINS": "x,uma"}, "linux")
    assert not plugin_active({}, "darwin")


def test_a_config_file_leaves_offloading_to_vllm():
    check_offloading(read_serve_line(["--config", "s.yaml", *offloading([{"type": "s3"}])]), ACTIVE)


DISK = [{"type": "fs", "root_dir": "/nonexistent/kv"}]
NETWORK = [{"type": "valkey", "url": "valkey://127.0.0.1:6379/0"}]


@pytest.mark.parametrize("tiers, named", [(DISK, "the disk tier"), (NETWORK, "the network tier")])
def test_a_lower_tier_is_refused_in_dev_mode(tiers, named):
    message = refusal(offloading(tiers), {"VLLM_SERVER_DEV_MODE": "1"})
    assert message.startswith("VLLM_SERVER_DEV_MODE=1 opens vLLM's development endpoints")
    assert f"{named} would keep serving" in message
    assert "Unset VLLM_SERVER_DEV_MODE (or set it to 0), or remove 'secondary_tiers'" in message


@pytest.mark.parametrize(
    "flags",
    [["--weight-transfer-config", '{"backend": "ipc"}'], ["--weight-transfer-config.x", "y"]],
)
def test_a_lower_tier_is_refused_with_a_weight_transfer_config(flags):
    message = refusal(offloading(DISK + NETWORK, *flags))
    assert message.startswith("--weight-transfer-config lets a trainer replace the weights")
    assert "the disk and network tiers would keep serving" in message


def test_the_host_pool_alone_takes_weight_updates():
    line = read_serve_line(offloading(None, "--weight-transfer-config", "{}"))
    check_offloading(line, {"VLLM_SERVER_DEV_MODE": "1"})  # the pool dies with the process
    check_offloading(read_serve_line(offloading(DISK)), {"VLLM_SERVER_DEV_MODE": "0"})
