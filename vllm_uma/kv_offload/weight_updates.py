"""Weights that can change at run time: the disk and network tiers refuse them.

The disk and network tiers file every block under a namespace computed once,
at start-up, from the weights' files (disk/namespace.py: a BLAKE3 of the
checkpoint, the dtype, the layout...). Blocks outlive the process and are
shared: every server on the store or the KV server with the same namespace
serves them. vLLM 0.32 can replace a running server's weights:

- ``VLLM_SERVER_DEV_MODE=1`` adds the development endpoints to the API
  server (vllm/entrypoints/launchers/api_server/routers.py): ``/collective_rpc``
  calls any worker method, ``reload_weights`` with another ``weights_path``
  among them, and the RL endpoints ``/update_weights``, ``/weight_checker``
  (``reset`` zeroes the weights), ``/pause``...;
- ``--weight-transfer-config`` (``LLM(weight_transfer_config=...)``) creates
  the worker's weight-transfer engine, without which ``update_weights``
  fails (vllm/v1/worker/gpu_worker.py): with it, ``LLM.update_weights`` and
  the endpoints above replace the weights from a trainer;
- in-process, ``LLM.collective_rpc("reload_weights", ...)`` needs neither.

After such a change the tiers would keep serving, and writing for other
servers, KV of the old weights under the old namespace.

Refused rather than re-keyed, because vLLM gives no point where the KV's
owner learns of the change: the weight version (``finish_weight_update``'s
``weight_version``) is an optional label the engine core attaches to its
outputs, never seen by the scheduler or the connector; ``reload_weights``
sets none. Re-keying at the change would also need every block already in
L1, in the pool and in flight to the disk or the KV server fenced and dropped,
and the new namespace would name weights no other server holds (they exist
in this process only), so nothing would be shared anyway: a server whose
weights change gains nothing from a shared tier. So:

- at start-up (vllm-uma serve's preflight before vLLM loads, the platform's
  config hook for ``vllm serve`` and ``LLM(...)``, and ``vllm-uma fleet``):
  a disk or network tier with the dev mode or a weight-transfer config is
  refused, naming the setting and the fix;
- in the worker, ``reload_weights``, ``reset_weights`` and ``update_config``
  (the in-process path that needs no setting) raise instead of changing the
  weights under a disk or network tier. A callable passed to
  ``collective_rpc`` runs code of the caller's choosing and is not guarded.

vLLM CPU has no sleep mode, whose wake-up reloads the weights, so refusing
``reload_weights`` costs nothing a CPU server does.
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm_uma.kv_offload.refusals import OffloadingConfigError
from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)

DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
# The fix a refusal names where the tiers were configured as vLLM takes them.
TURN_OFF_TIERS = "remove 'secondary_tiers' (the disk and network tiers)"


class WeightChangeRefused(RuntimeError):
    """A run-time weight change under a disk or network tier."""


def dev_mode_on(environ: Mapping[str, str]) -> bool:
    """Whether vLLM's API server adds its development endpoints, read as
    vllm/envs.py reads the variable (``bool(int(value))``). A value that is
    no integer: False, vLLM's own import of its CLI arguments refuses it."""
    try:
        return bool(int(environ.get(DEV_MODE_ENV, "0")))
    except ValueError:
        return False


def tiers_named(disk: bool, network: bool) -> str | None:
    """The lower tiers configured, as a message names them; None: none."""
    if disk and network:
        return "the disk and network tiers"
    if disk or network:
        return "the disk tier" if disk else "the network tier"
    return None


def refuse_weight_updates(
    tiers: str | None, environ: Mapping[str, str], weight_transfer: bool, turn_off: str
) -> None:
    """Refuse ``tiers`` (tiers_named) when the weights can change at run time.
    ``turn_off``: how the user removes the tiers where they were set
    ("remove 'secondary_tiers'", the fleet's own flags)."""
    if tiers is None:
        return
    stale = (
        f"{tiers} would keep serving, and sharing with other servers, KV filed under "
        f"the namespace of the weights loaded at start-up"
    )
    if dev_mode_on(environ):
        raise OffloadingConfigError(
            f"{DEV_MODE_ENV}={environ[DEV_MODE_ENV]} opens vLLM's development endpoints, "
            f"which change the weights at run time (/collective_rpc reload_weights, "
            f"/update_weights, /weight_checker reset): {stale}. Unset {DEV_MODE_ENV} "
            f"(or set it to 0), or {turn_off}."
        )
    if weight_transfer:
        raise OffloadingConfigError(
            f"--weight-transfer-config lets a trainer replace the weights at run time "
            f"(update_weights): {stale}. Remove --weight-transfer-config "
            f"(weight_transfer_config for LLM(...)), or {turn_off}."
        )


def refuse_weight_change(method: str, tiers: str | None) -> None:
    """In the worker: ``method`` would change the weights under ``tiers``."""
    if tiers is None:
        return
    raise WeightChangeRefused(
        f"{method} would change this server's weights, but {tiers} file KV under the "
        f"namespace of the weights loaded at start-up, and would keep serving and "
        f"sharing the old weights' KV. Start a server with the new weights instead "
        f"(its tiers compute a new namespace), or start this one without "
        f"'secondary_tiers'."
    )
