"""The JSON flags and the offloading settings, checked before vLLM is imported.

``vllm-uma serve``'s preflight (preflight.py checks the model and the port):
what vLLM's parser or our platform hook (kv_offload/config.py's
``translate``) would refuse anyway, refused in a second instead of after
10-40 s of importing vLLM, with the same message as the platform's. Only
what the command line decides (serve_line.py) and only what needs no vLLM
config; everything is checked again where it is today.

- each whole JSON value of --kv-transfer-config, --kv-events-config,
  --additional-config parses (with vLLM's ``80m``-style numbers), and the
  first two are objects;
- with the plugin active (vLLM loads it): the offloading flags
  (refusals.py's ``refuse_flags``), the keys of ``kv_connector_extra_config``,
  ``secondary_tiers`` without the pool, the tier list, the fs tier's
  settings and an existing root_dir's trust (disk/settings.py's
  ``check_disk_tier``), the valkey tier's settings (network/settings.py),
  and either lower tier with weights that can change at run time
  (``VLLM_SERVER_DEV_MODE``, --weight-transfer-config: weight_updates.py).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from typing import Any

from vllm_uma.commands.preflight import PreflightError
from vllm_uma.commands.serve_line import ServeLine
from vllm_uma.kv_offload.disk.settings import DiskTierSettingsError, check_disk_tier
from vllm_uma.kv_offload.network.settings import NetworkTierSettingsError, parse_network_tier
from vllm_uma.kv_offload.refusals import (
    CONNECTOR,
    OffloadingConfigError,
    refuse_disk_tier_without_pool,
    refuse_flags,
    refuse_unknown_keys,
)
from vllm_uma.kv_offload.tier_list import split_tiers
from vllm_uma.kv_offload.weight_updates import (
    TURN_OFF_TIERS,
    refuse_weight_updates,
    tiers_named,
)

PLUGIN_NAME = "uma"  # our vllm.platform_plugins entry point (pyproject.toml)
# Flags whose value vLLM validates as a config dataclass: a JSON object.
OBJECT_FLAGS = ("--kv-transfer-config", "--kv-events-config")
# vLLM's _expand_json_human_readable_numbers (engine/arg_utils.py): bare
# 1k/2M/80g outside strings are numbers in its JSON flags.
_STRINGS = re.compile(r'("(?:[^"\\]|\\.)*")')
_SUFFIXED = re.compile(r"\b\d+(?:\.\d+)?[kKmMgGtT]\b")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def plugin_active(environ: Mapping[str, str], platform: str = sys.platform) -> bool:
    """Whether vLLM will load this plugin's platform (vllm/platforms/__init__.py:
    VLLM_TARGET_DEVICE=cpu bypasses plugins; VLLM_PLUGINS lists the allowed)."""
    if environ.get("VLLM_TARGET_DEVICE", "").lower() == "cpu":
        return False
    allowed = environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        return False
    return platform.startswith("linux")


def _number(text: str) -> str:
    number, suffix = text[:-1], text[-1]
    if suffix in _DECIMAL:
        return str(int(float(number) * _DECIMAL[suffix]))
    return str(int(number) * _BINARY[suffix])  # a decimal: ValueError, as in vLLM


def loads(text: str, numbers: bool = True) -> Any:
    """``text`` as vLLM reads a JSON flag (``numbers``: one it reads as a
    config dataclass, with 80m-style numbers); ValueError if it cannot."""
    try:
        return json.loads(text)
    except ValueError:
        if not numbers:
            raise
        parts = _STRINGS.split(text)
        for i in range(0, len(parts), 2):  # outside strings
            parts[i] = _SUFFIXED.sub(lambda m: _number(m.group()), parts[i])
        return json.loads("".join(parts))


def check_json_values(line: ServeLine) -> None:
    for flag, text in line.json_values:
        try:
            value = loads(text, numbers=flag in OBJECT_FLAGS)
        except ValueError as exc:
            raise PreflightError(
                f"{flag} {text!r} is not valid JSON ({exc}). Write it as a JSON object, "
                f'e.g. {flag} \'{{"key": "value"}}\', or one key at a time: '
                f"{flag}.key value."
            ) from None
        if flag in OBJECT_FLAGS and not isinstance(value, dict):
            # null too: vLLM's parser refuses it ("Input should be an object").
            kind = "null" if value is None else f"a JSON {type(value).__name__}"
            raise PreflightError(
                f"{flag} {text!r} is {kind}, not an object: write "
                f'it as {flag} \'{{"key": "value"}}\'.'
            )


def asks_disk_tier(line: ServeLine) -> bool:
    """The line's kv_transfer_config names an fs tier (False for one that
    does not parse: check_json_values refuses it)."""
    try:
        transfer = {} if line.kv_transfer_config is None else loads(line.kv_transfer_config)
    except ValueError:
        return False
    extra = transfer.get("kv_connector_extra_config") if isinstance(transfer, dict) else None
    if not isinstance(extra, dict):
        return False
    try:
        fs_tier, _ = split_tiers(extra.get("secondary_tiers"))
    except OffloadingConfigError:
        return False
    return fs_tier is not None


def check_offloading(line: ServeLine, environ: Mapping[str, str]) -> None:
    """What the platform's ``translate`` refuses without a vLLM config, in its
    order and words; nothing when the line leaves any of it to vLLM."""
    if not line.decided_offloading or not plugin_active(environ):
        return
    try:
        transfer = {} if line.kv_transfer_config is None else loads(line.kv_transfer_config)
        size = None if line.kv_offloading_size is None else float(line.kv_offloading_size)
    except ValueError:
        return  # vLLM's parser refuses it (check_json_values said so for JSON)
    if not isinstance(transfer, dict):
        return
    extra = transfer.get("kv_connector_extra_config", {})
    if not isinstance(extra, dict):
        return  # vLLM's config refuses it
    try:
        _translate_refusals(line, size, transfer.get("kv_connector"), extra, environ)
    except (OffloadingConfigError, DiskTierSettingsError, NetworkTierSettingsError) as exc:
        raise PreflightError(str(exc)) from None


def _translate_refusals(
    line: ServeLine, size: float | None, connector, extra: dict, environ: Mapping[str, str]
) -> None:
    if size is None and connector != CONNECTOR:
        refuse_disk_tier_without_pool(extra)  # offloading is off
        return
    refuse_flags(line.kv_offloading_backend, size, connector)
    refuse_unknown_keys(extra)
    fs_tier, network_tier = split_tiers(extra.get("secondary_tiers"))
    refuse_weight_updates(
        tiers_named(fs_tier is not None, network_tier is not None),
        environ,
        line.weight_transfer,
        TURN_OFF_TIERS,
    )
    if fs_tier is not None:
        check_disk_tier([fs_tier])
    if network_tier is not None:
        parse_network_tier(network_tier)
