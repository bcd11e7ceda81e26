"""The settings plan: all our settings, parsed once in the API server, carried to the engine core.

Where they are parsed. In the API-server process, in the platform's
``check_and_update_config`` (platform.py), before any weights load:
:func:`build_plan` reads what we act on from vLLM's parsed config, the
``"vllm_uma"`` object of ``--additional-config`` (plugin/uma_settings.py,
into :class:`UmaSettings`), vLLM's offloading flags and
``kv_connector_extra_config`` (kv_offload/config.py, which also resolves
the disk tier and reads the namespace inputs), and
raises every refusal there (kv_offload/refusals.py and the others), so a
bad flag fails start-up in one line.

The plan. :class:`SettingsPlan`, a frozen dataclass of frozen parts: ``uma``
(wiring, fleet membership and the KV memory release: the user's
``"vllm_uma"`` keys as typed, :class:`UmaSettings`) and ``offload`` (None
when offloading is off, else the spec, the host pool's size and whether it is ours to
choose, the resolved disk tier, the namespace inputs, the warnings to log).

Where it travels. The plan's text, canonical JSON, is in the environment
variable ``VLLM_UMA_PLAN`` (:data:`PLAN_ENV`), set by the API server's hook
before vLLM starts its engine core: the engine core and its workers are
child processes and inherit it. ``additional_config["vllm_uma_plan"]``
(:data:`PLAN_KEY`) holds only a constant marker that says the hook has run
on this config; the marker travels inside the pickled VllmConfig (and
survives ``dataclasses.replace`` and deepcopy, which vLLM uses on it).

Why not the plan itself in ``additional_config``: vLLM's ``compute_hash``
hashes that dict into the compile-cache key (json.dumps, sorted keys), and
the plan holds the pool size, the disk root and the namespace inputs, none
of which changes the compiled graph; each new value would cost a fresh
compile (about 30 s at start-up on the default model, docs/architecture.md). The
marker is the same in every run, so the key is what the user's own
``--additional-config`` makes it. ``additional_config`` stays a dict: vLLM
writes keys of its own into it (arg_utils.py, the gdn/kda backends).

The marker is a :class:`PlanText`, a ``str`` subclass only this module
makes: pickle carries it as that type, while anything a user writes in
``--additional-config`` is parsed JSON, so a plain value under the key is
refused instead of being trusted. The hook's first run in a process always
builds and writes the variable, so a value inherited from elsewhere is never
read as this server's plan.

The keys vLLM itself reads (``spec_name``, ``spec_module_path``,
``cpu_bytes_to_use``, ``secondary_tiers``, ...) stay in
``kv_connector_extra_config``; none of ours ride there, and nothing edits
that dict after the platform hook.

Who reads it, with :func:`read_plan` (shape and version checked, user
input not validated again): the platform hook when vLLM runs it again on
the same config (the engine core always does, after its start-up
handshake: ``EngineCoreProc._perform_handshakes`` calls ``__post_init__``);
the worker (plugin/worker.py); the releasing scheduler
(memory_release/scheduler.py); the offloading connector and, through it,
the spec and the disk tier (kv_offload/connector.py, spec.py).

The one value decided later: an automatic host-pool size is sized again by
the worker once weights and activations are measured. That is the worker's
result (kv_offload/pool_size.py: recorded once, in the engine's context,
plugin/engine_context.py), which the connectors read when they build the
spec; the plan and vLLM's dicts keep the provisional size.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from vllm_uma.kv_offload.config import OffloadPlan, translate
from vllm_uma.kv_offload.disk.namespace_inputs import NamespaceInputs
from vllm_uma.kv_offload.disk.settings import DiskTierSettings
from vllm_uma.kv_offload.network.settings import NetworkTierSettings
from vllm_uma.kv_offload.pool_size import PoolSize
from vllm_uma.plugin import vllm_contract
from vllm_uma.plugin.uma_settings import UmaSettings, UmaSettingsError

# vLLM behaviour relied on, checked now (texts read from vLLM's files).
vllm_contract.require(__name__)

PLAN_KEY = "vllm_uma_plan"
PLAN_ENV = "VLLM_UMA_PLAN"
# Bumped whenever the plan's shape changes: the API server and the engine
# must be the same vllm-uma.
PLAN_VERSION = 1


class PlanText(str):
    """The marker under PLAN_KEY, as only :func:`attach` makes it (see above)."""


# The same in every run: the compile-cache key must not move with the plan.
MARKER = PlanText(f"the vllm-uma plan, version {PLAN_VERSION}, is in ${PLAN_ENV}")


class SettingsPlanError(ValueError):
    """The plan under PLAN_KEY is missing, not ours, or of another shape."""


@dataclass(frozen=True)
class SettingsPlan:
    uma: UmaSettings
    offload: OffloadPlan | None

    @property
    def pool_bytes(self) -> int:
        """The host pool the platform planned (0 when offloading is off)."""
        return 0 if self.offload is None else self.offload.pool.bytes


def build_plan(vllm_config, total_ram: int) -> SettingsPlan:
    """Every setting, validated, from vLLM's parsed config (the API server).

    Also points vLLM at our connector and spec (kv_offload/config.py)."""
    uma = UmaSettings.from_additional_config(vllm_config.additional_config)
    return SettingsPlan(uma=uma, offload=translate(vllm_config, total_ram))


def plan_attached(vllm_config) -> bool:
    """Whether the API server's hook already planned this config (the hook
    runs again in the engine core on it)."""
    additional = vllm_config.additional_config
    return isinstance(additional, dict) and PLAN_KEY in additional


def plan_for_hook(vllm_config, total_ram: int) -> SettingsPlan:
    """The plan in the platform hook: built and attached the first time,
    read back when vLLM runs the hook again on a config it already went
    through (the engine core, ``dataclasses.replace``)."""
    if plan_attached(vllm_config):
        return read_plan(vllm_config)
    settings = build_plan(vllm_config, total_ram)
    attach(vllm_config, settings)
    return settings


def attach(vllm_config, settings: SettingsPlan) -> None:
    additional = vllm_config.additional_config
    if not isinstance(additional, dict):
        raise UmaSettingsError(
            f"additional_config is a {type(additional).__name__}, not a dict: vllm-uma "
            f"passes its settings to the engine in it. Give additional_config as a dict "
            f"(a JSON object on the command line)."
        )
    # The text first: a child the engine starts must never see the marker
    # without this process's plan.
    os.environ[PLAN_ENV] = dumps(settings)
    # A new dict: the user's (EngineArgs') own stays as they wrote it.
    vllm_config.additional_config = {**additional, PLAN_KEY: MARKER}


def read_plan(vllm_config) -> SettingsPlan:
    """The plan the API server built; no user input is validated again."""
    additional = vllm_config.additional_config
    marker = additional.get(PLAN_KEY) if isinstance(additional, dict) else None
    if marker is None:
        raise SettingsPlanError(
            f"additional_config has no {PLAN_KEY!r}: the vllm-uma platform's "
            f"check_and_update_config did not run on this config. Start vLLM with the "
            f"vllm-uma platform plugin loaded (vllm-uma serve)."
        )
    if not isinstance(marker, PlanText):
        raise SettingsPlanError(
            f"--additional-config {PLAN_KEY!r} is written by the vllm-uma platform, not "
            f"given: remove it (the settings go under {'vllm_uma'!r})."
        )
    if marker != MARKER:
        raise SettingsPlanError(
            f"the config says {str(marker)!r}, and this vllm-uma reads version "
            f"{PLAN_VERSION}: the API server and the engine run different vllm-uma "
            f"installations. Run both from one installation."
        )
    text = os.environ.get(PLAN_ENV)
    if text is None:
        raise SettingsPlanError(
            f"${PLAN_ENV} is not set in this process, though the vllm-uma platform ran on "
            f"its config: this process was not started by the server that built the plan "
            f"(vLLM's engine core and workers inherit it). Run the engine core as a child "
            f"of its API server (vllm-uma serve)."
        )
    return loads(text)


# -- the serialised form: canonical JSON, shape checked on the way back ------


def dumps(settings: SettingsPlan) -> str:
    return json.dumps(to_plain(settings), sort_keys=True, separators=(",", ":"))


def loads(text: str) -> SettingsPlan:
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise SettingsPlanError(f"the vllm-uma plan is not JSON ({exc}).") from None
    return from_plain(raw)


def to_plain(settings: SettingsPlan) -> dict[str, Any]:
    offload = settings.offload
    return {
        "version": PLAN_VERSION,
        "uma": asdict(settings.uma),
        "offload": None if offload is None else _offload_to_plain(offload),
    }


def _offload_to_plain(offload: OffloadPlan) -> dict[str, Any]:
    disk, inputs = offload.disk, offload.namespace_inputs
    return {
        "spec_name": offload.spec_name,
        "pool": asdict(offload.pool),
        "disk": None if disk is None else {**asdict(disk), "root_dir": str(disk.root_dir)},
        "namespace_inputs": None if inputs is None else inputs.values(),
        "warnings": list(offload.warnings),
        # Names of where the password is, never the password (credentials.py).
        "network": None if offload.network is None else asdict(offload.network),
    }


def from_plain(raw: Any) -> SettingsPlan:
    body = _shaped(raw, {"version", "uma", "offload"}, "the plan")
    if body["version"] != PLAN_VERSION:
        raise SettingsPlanError(
            f"the vllm-uma plan has version {body['version']!r}, and this vllm-uma reads "
            f"version {PLAN_VERSION}: the API server and the engine run different "
            f"vllm-uma installations. Run both from one installation."
        )
    uma = UmaSettings(**_fields_of(UmaSettings, body["uma"], "uma"))
    offload = None if body["offload"] is None else _offload_from_plain(body["offload"])
    return SettingsPlan(uma=uma, offload=offload)


def _offload_from_plain(raw: Any) -> OffloadPlan:
    body = _shaped(
        raw, {"spec_name", "pool", "disk", "namespace_inputs", "warnings", "network"}, "offload"
    )
    pool = PoolSize(**_fields_of(PoolSize, body["pool"], "offload.pool"))
    disk = None
    if body["disk"] is not None:
        values = _fields_of(DiskTierSettings, body["disk"], "offload.disk")
        disk = DiskTierSettings(**{**values, "root_dir": Path(values["root_dir"])})
    inputs = body["namespace_inputs"]
    if inputs is not None and not isinstance(inputs, dict):
        raise SettingsPlanError(f"the vllm-uma plan's namespace_inputs={inputs!r} is no object.")
    return OffloadPlan(
        spec_name=str(body["spec_name"]),
        pool=pool,
        disk=disk,
        namespace_inputs=None if inputs is None else NamespaceInputs.of(inputs),
        warnings=tuple(str(w) for w in body["warnings"]),
        network=None
        if body["network"] is None
        else NetworkTierSettings(
            **_fields_of(NetworkTierSettings, body["network"], "offload.network")
        ),
    )


def _shaped(raw: Any, keys: set[str], what: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or set(raw) != keys:
        shown = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise SettingsPlanError(
            f"{what} in the vllm-uma plan has the keys {shown}, not {sorted(keys)}: it was "
            f"written by another vllm-uma. Run the API server and the engine from one "
            f"installation."
        )
    return raw


def _fields_of(cls, raw: Any, what: str) -> dict[str, Any]:
    return _shaped(raw, {f.name for f in fields(cls)}, what)
