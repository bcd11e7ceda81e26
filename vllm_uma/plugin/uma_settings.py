"""The user's ``"vllm_uma"`` keys of ``--additional-config``, parsed once into ``UmaSettings``.

vLLM passes ``--additional-config`` (a JSON object) to every process in the
``VllmConfig``; it is the channel vLLM provides for platform plugins. Our keys
live under ``"vllm_uma"`` so they cannot collide with another plugin's::

    --additional-config '{"vllm_uma": {"wire_weights": false}}'

(``vllm-uma serve --no-wire-weights`` writes exactly that.) The object is
checked where it enters, in the platform's ``check_and_update_config`` in the
API-server process, so a typo fails start-up before any weights load; the
worker reads the same dataclass.

Vocabulary: "config" is what the user and vLLM give (``--additional-config``,
vLLM's ``VllmConfig``); "settings" is what we parsed from it, checked and
frozen: :class:`UmaSettings` here, ``DiskTierSettings`` and
``NetworkTierSettings`` (kv_offload/disk/settings.py, network/settings.py);
the settings plan (settings_plan.py) carries all of them to the engine core.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

NAMESPACE = "vllm_uma"
# The values a text setting may take.
CHOICES = {"memory_pressure": ("psi", "off")}


class UmaSettingsError(ValueError):
    """A bad ``vllm_uma`` setting; the message names the key and the fix."""


@dataclass(frozen=True)
class UmaSettings:
    # Lock the weights in RAM after loading (wiring.py).
    wire_weights: bool = True
    # Set by `vllm-uma fleet` (fleet/plan.py): this server is member
    # fleet_member (1-based) of fleet_size, and its memory budget and cores
    # are its share of the fleet's; 0 and 0 outside a fleet.
    fleet_member: int = 0
    fleet_size: int = 0
    # Give the pages of free KV blocks back to the system once the server
    # has been idle release_idle_seconds (memory_release/): blocks that hold
    # nothing, and blocks whose prefix the host pool or disk tier also holds.
    release_free_kv: bool = True
    release_idle_seconds: int = 60
    # "psi": watch the kernel's memory-pressure signals and give KV memory
    # back under pressure (memory_release/pressure.py); "off": do not.
    memory_pressure: str = "psi"
    # Keep the KV of the next warm_kv_tokens tokens resident ahead of use:
    # the free KV blocks and host-pool rows the next request gets
    # (memory_release/warm_reserve.py). 0 turns it off.
    warm_kv_tokens: int = 8192

    @classmethod
    def from_additional_config(cls, additional: Any) -> "UmaSettings":
        if not isinstance(additional, dict):
            return cls()
        raw = additional.get(NAMESPACE, {})
        if not isinstance(raw, dict):
            raise UmaSettingsError(
                f"--additional-config {NAMESPACE!r} must be a JSON object, got "
                f'{raw!r}. Example: \'{{"{NAMESPACE}": {{"wire_weights": false}}}}\'.'
            )
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise UmaSettingsError(
                f"unknown key(s) {unknown} in --additional-config "
                f"{NAMESPACE!r}; the known keys are {sorted(known)}. Remove or "
                f"correct them."
            )
        values = {}
        for name, value in raw.items():
            if known[name].type in (bool, "bool") and not isinstance(value, bool):
                raise UmaSettingsError(
                    f"--additional-config {NAMESPACE}.{name}={value!r} is "
                    f"invalid: it must be true or false."
                )
            if known[name].type in (int, "int") and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise UmaSettingsError(
                    f"--additional-config {NAMESPACE}.{name}={value!r} is "
                    f"invalid: it must be a whole number >= 0."
                )
            if name in CHOICES and value not in CHOICES[name]:
                raise UmaSettingsError(
                    f"--additional-config {NAMESPACE}.{name}={value!r} is "
                    f"invalid: it must be one of {list(CHOICES[name])}."
                )
            values[name] = value
        config = cls(**values)
        config._check_fleet()
        return config

    def _check_fleet(self) -> None:
        member, size = self.fleet_member, self.fleet_size
        if (member == 0) != (size == 0) or member > size:
            raise UmaSettingsError(
                f"--additional-config {NAMESPACE}.fleet_member={member} with "
                f"fleet_size={size} is invalid: give both, with 1 <= fleet_member "
                f"<= fleet_size, or neither (`vllm-uma fleet` sets them)."
            )
