"""``secondary_tiers``: which lower tiers the user asked for, in which order.

API-server process, from config.py's ``translate``, before either tier's
own settings are read (disk/settings.py, network/settings.py). vLLM asks its
secondary tiers in the list's order and stops at the first hit, so the
order is a choice: the disk tier, when there is one, comes first (a block
on local disk is never fetched over the network).
"""

from __future__ import annotations

from typing import Any

from vllm_uma.kv_offload.disk.settings import TIER_TYPE as FS
from vllm_uma.kv_offload.network.settings import TIER_TYPE as VALKEY
from vllm_uma.kv_offload.refusals import OffloadingConfigError

EXAMPLE = f'[{{"type": "{FS}", "root_dir": "/path"}}, {{"type": "{VALKEY}", "url": "valkey://HOST:6379/0"}}]'


def split_tiers(secondary_tiers: Any) -> tuple[dict | None, dict | None]:
    """The fs tier's object and the valkey tier's (None where absent)."""
    if secondary_tiers is None or secondary_tiers == []:
        return None, None
    if not isinstance(secondary_tiers, list) or not all(
        isinstance(t, dict) for t in secondary_tiers
    ):
        raise OffloadingConfigError(
            f"kv_connector_extra_config 'secondary_tiers'={secondary_tiers!r} is invalid: it "
            f"must be a list of tier objects, e.g. {EXAMPLE}."
        )
    types = [t.get("type") for t in secondary_tiers]
    for tier_type in types:
        if tier_type not in (FS, VALKEY):
            raise OffloadingConfigError(
                f"secondary tier type {tier_type!r} is not supported by vllm-uma: the tier "
                f'types are "{FS}" (a disk directory) and "{VALKEY}" (a KV server: '
                f"Valkey or Redis). Set one of them."
            )
    if types not in ([FS], [VALKEY], [FS, VALKEY]):
        raise OffloadingConfigError(
            f"'secondary_tiers' lists the tier types {types}; vllm-uma takes one disk tier, "
            f"one network tier, or both with the disk tier first (a local block is never "
            f"fetched over the network), e.g. {EXAMPLE}."
        )
    by_type = {t["type"]: t for t in secondary_tiers}
    return by_type.get(FS), by_type.get(VALKEY)
