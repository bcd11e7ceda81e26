"""The disk tier's settings (L3), typed and checked once where they enter.

The user names the tier in vLLM's own flag::

    --kv-transfer-config '{"kv_connector_extra_config": {"secondary_tiers":
        [{"type": "fs", "root_dir": "/var/cache/kv", "max_size_gib": 50}]}}'

``parse_disk_tier`` runs in the API-server process, from the platform's
``check_and_update_config`` (through ``kv_offload.config.translate``), before
any weights load: a typo, a refused tier type, a directory that cannot be
written or a volume too small for the default cap fails start-up there, with
one line naming the value, the rule and the fix. A root_dir another user
owns or may write is refused here too (trust.py). The resolved
``DiskTierSettings`` travels to the engine-core process in the plugin's
settings plan (plugin/settings_plan.py), so the directory is created, probed and
measured once, in one process.

With ``secret_file`` or ``secret_env`` (the network tier's settings, the
same secret), every block file is signed and checked as a network value
is (block_mac.py): an option, since the store is this host's own and
refused when others can write to it (trust.py); for a directory other
processes of the host may write to all the same.

The cap is resolved here too, so that every later reader sees bytes:
``max_size_gib`` unset means 10% of the volume's size (refused if the volume
has less free space than that), ``0`` means no cap.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_uma.kv_offload import mac_keys
from vllm_uma.kv_offload.disk.layout import NOINDEX
from vllm_uma.kv_offload.disk.trust import check_store_root

GiB = 1 << 30
TIER_TYPE = "fs"
DEFAULT_CAP_FRACTION = 0.10
# Pins (pins/) may hold at most this share of the cap and of the host pool.
DEFAULT_PIN_SHARE = 0.5
KNOWN_TIER_KEYS = frozenset(
    {
        "type", "root_dir", "max_size_gib", "enable_kv_events", "secret_file", "secret_env",
        "pin_share",
    }
)  # fmt: skip


class DiskTierSettingsError(ValueError):
    """A disk-tier setting the plugin cannot serve; the message has the fix."""


@dataclass(frozen=True)
class DiskTierSettings:
    root_dir: Path
    # None: no cap (max_size_gib=0). Otherwise the most bytes of block files
    # that may sit under root_dir; a store that would cross it evicts first.
    cap_bytes: int | None
    # Publish disk stores and removals as KV events (only ever True when
    # vLLM's global KV events are on).
    enable_kv_events: bool
    # For the log: where the cap came from.
    cap_reason: str
    # Where the MAC keys of signed block files are (mac_keys.py); neither:
    # block files unsigned, as before (the store is this host's own).
    secret_file: str | None = None
    secret_env: str | None = None
    # The share of the cap (and of the host pool's rows) pins may hold.
    pin_share: float = DEFAULT_PIN_SHARE


def parse_disk_tier(
    secondary_tiers: Any, *, kv_events_enabled: bool
) -> tuple[DiskTierSettings | None, list[str]]:
    """The disk tier named in ``secondary_tiers`` (None if the list is empty),
    and the warnings to log."""
    if secondary_tiers is None or secondary_tiers == []:
        return None, []
    raw = _the_fs_tier(secondary_tiers)
    root_dir = _root_dir(raw.get("root_dir"))
    warnings = []
    events = _kv_events(raw.get("enable_kv_events"), kv_events_enabled, warnings)
    secret_file, secret_env = _signing(raw)
    share = pin_share(raw.get("pin_share"))
    prepare_root(root_dir)
    warning = _filesystem_warning(root_dir)
    if warning is not None:
        warnings.append(warning)
    cap_bytes, reason = resolve_cap(raw.get("max_size_gib"), root_dir)
    return (
        DiskTierSettings(
            root_dir=root_dir,
            cap_bytes=cap_bytes,
            # On whenever vLLM's events are on, unless the user turned it off.
            enable_kv_events=kv_events_enabled and events is not False,
            cap_reason=reason,
            secret_file=secret_file,
            secret_env=secret_env,
            pin_share=share,
        ),
        warnings,
    )


def check_disk_tier(secondary_tiers: Any) -> None:
    """What ``parse_disk_tier`` refuses that can be told without creating,
    writing or measuring anything: the tier's keys and values, and an
    existing root_dir's trust (trust.py). For ``vllm-uma serve``'s
    preflight, before vLLM is imported; the rest (a root_dir that cannot be
    created or written, the default cap against free space) is left to
    ``parse_disk_tier``, which repeats all of it."""
    if secondary_tiers is None or secondary_tiers == []:
        return
    raw = _the_fs_tier(secondary_tiers)
    root_dir = _root_dir(raw.get("root_dir"))
    _kv_events(raw.get("enable_kv_events"), True, [])
    _signing(raw)
    pin_share(raw.get("pin_share"))
    try:
        untrusted = check_store_root(root_dir) if root_dir.is_dir() else None
    except OSError:
        untrusted = None  # prepare_root says what is wrong
    if untrusted is not None:
        raise DiskTierSettingsError(untrusted)
    if raw.get("max_size_gib") is not None:
        given_cap(raw["max_size_gib"])


def _the_fs_tier(secondary_tiers: Any) -> dict[str, Any]:
    """The one tier object of a non-empty ``secondary_tiers``: an fs tier
    with known keys only."""
    if not isinstance(secondary_tiers, list) or not all(
        isinstance(t, dict) for t in secondary_tiers
    ):
        raise DiskTierSettingsError(
            f"kv_connector_extra_config 'secondary_tiers'={secondary_tiers!r} is "
            f"invalid: it must be a list of tier objects, e.g. "
            f'[{{"type": "fs", "root_dir": "/path"}}].'
        )
    if len(secondary_tiers) > 1:
        raise DiskTierSettingsError(
            f"'secondary_tiers' names {len(secondary_tiers)} tiers; vllm-uma has "
            f"one disk tier per server. Keep a single "
            f'{{"type": "fs", ...}} entry.'
        )
    raw = secondary_tiers[0]
    tier_type = raw.get("type")
    if tier_type != TIER_TYPE:
        raise DiskTierSettingsError(
            f"secondary tier type {tier_type!r} is not supported by vllm-uma: the "
            f'only tier type is "fs" (a disk directory). Set "type": "fs".'
        )
    unknown = sorted(set(raw) - KNOWN_TIER_KEYS)
    if unknown:
        raise DiskTierSettingsError(
            f"unknown key(s) {unknown} in the fs secondary tier; the known keys "
            f"are {sorted(KNOWN_TIER_KEYS)}. Remove or correct them."
        )
    return raw


def pin_share(value: Any) -> float:
    """The fs tier's pin_share, checked: a number above 0 and at most 1."""
    if value is None:
        return DEFAULT_PIN_SHARE
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= 1
    ):
        raise DiskTierSettingsError(
            f"fs tier pin_share={value!r} is invalid: it is the share of the cap (and of the "
            f"host pool) that pinned prefixes may hold, a number above 0 and at most 1 "
            f"(default {DEFAULT_PIN_SHARE})."
        )
    return float(value)


def _signing(raw: dict[str, Any]) -> tuple[str | None, str | None]:
    """(secret_file, secret_env), the secret read once to be checked."""
    try:
        return mac_keys.checked_source(raw.get("secret_file"), raw.get("secret_env"))
    except mac_keys.SecretError as exc:
        raise DiskTierSettingsError(f"fs tier: {exc}") from None


def _kv_events(events: Any, kv_events_enabled: bool, warnings: list[str]) -> bool | None:
    """The tier's enable_kv_events (None: not set), checked; a warning when
    it asks for events that vLLM's are off to carry."""
    if events is not None and not isinstance(events, bool):
        raise DiskTierSettingsError(
            f"fs tier enable_kv_events={events!r} is invalid: it must be true or "
            f"false (or left out: it follows --kv-events-config)."
        )
    if events and not kv_events_enabled:
        warnings.append(
            "the fs tier sets enable_kv_events, but KV cache events are off: the "
            "disk tier will publish nothing. Add --kv-events-config "
            '\'{"enable_kv_cache_events": true, "publisher": "zmq"}\' to publish them.'
        )
    return events


def _filesystem_warning(root_dir: Path) -> str | None:
    """What to warn of the filesystem ``root_dir`` is on, if anything: one
    that other hosts may mount, or one that keeps its files in RAM."""
    fstype = filesystem_of(root_dir)
    if fstype in NETWORK_FILESYSTEMS:
        return (
            f"the fs tier's root_dir {root_dir} is on {fstype}, a network filesystem: "
            f"its shared ledger (SQLite WAL) works for the servers of this host only. "
            f"Never give another host the same root_dir; give each host its own store."
        )
    if fstype in MEMORY_FILESYSTEMS:
        return (
            f"the fs tier's root_dir {root_dir} is on {fstype}, which keeps its files in "
            f"RAM: the 'disk' tier then takes memory from the KV cache and the host "
            f"pool, and does not survive a reboot. Give it a directory on a disk."
        )
    return None


# Where several hosts could mount one store, which the ledger cannot serve.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "glusterfs",
        "lustre",
        "9p",
        "fuse.sshfs",
        "fuse.glusterfs",
        "fuse.cephfs",
        "afs",
        "beegfs",
        "gpfs",
    }
)


# Filesystems whose files are RAM (or swap): a disk tier there is a second
# host pool that the memory budget does not count.
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def filesystem_of(path: Path, mounts: str = "/proc/self/mounts") -> str:
    """The type of the filesystem ``path`` is on (the longest mount point
    that contains it), or "?" if /proc does not say."""
    best, kind = "", "?"
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return kind
    target = str(path.resolve())
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        # /proc escapes spaces in mount points as \040.
        mount = fields[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, fields[2]
    return kind


def _root_dir(value: Any) -> Path:
    if not isinstance(value, str) or not value:
        raise DiskTierSettingsError(
            f"fs tier root_dir={value!r} is invalid: it must be a directory path. "
            f'Add "root_dir": "/path/to/kv-cache" to the tier.'
        )
    return Path(value).expanduser().absolute()


def prepare_root(root_dir: Path) -> None:
    """Create ``root_dir`` private (0700) if missing; refuse it if another
    user could have written it (trust.py); prove it is writable."""
    try:
        root_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        untrusted = check_store_root(root_dir)
        if untrusted is None:
            # A real file, not os.access: that ignores read-only mounts and ACLs.
            with tempfile.TemporaryFile(dir=root_dir):
                pass
    except OSError as exc:
        raise DiskTierSettingsError(
            f"fs tier root_dir={str(root_dir)!r} cannot be created or written "
            f"({exc.strerror or exc}): choose a directory this user can write, "
            f"or fix its permissions."
        ) from None
    if untrusted is not None:
        raise DiskTierSettingsError(untrusted)


def resolve_cap(value: Any, root_dir: Path) -> tuple[int | None, str]:
    """Bytes the tier may use (None: no cap) and why."""
    if value is None:
        vfs = os.statvfs(root_dir)
        size, free = vfs.f_blocks * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize
        cap = int(size * DEFAULT_CAP_FRACTION)
        # The tier's own files count as room: they are within the cap and
        # evicted to make space, so a restarted server that filled its cap
        # must not be refused for it.
        # Imported here: store_scan logs through vLLM's logger, and the
        # preflight imports this module before vLLM (check_disk_tier).
        from vllm_uma.kv_offload.disk.store_scan import tree_bytes

        free += tree_bytes(root_dir / NOINDEX)
        if free < cap:
            raise DiskTierSettingsError(
                f"the fs tier's default cap is 10% of the volume holding "
                f"{str(root_dir)!r} ({cap / GiB:.1f} GiB), but only "
                f"{free / GiB:.1f} GiB is free: set max_size_gib to a size that "
                f"fits (0 means no cap), or free some space."
            )
        return cap, "10% of the volume (max_size_gib not set)"
    return given_cap(value)


def given_cap(value: Any) -> tuple[int | None, str]:
    """The cap of a max_size_gib the user gave, checked, and why."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DiskTierSettingsError(
            f"fs tier max_size_gib={value!r} is invalid: it must be a number of "
            f"GiB >= 0 (0 means no cap). Set a size in GiB or remove the key."
        )
    if value < 0:
        raise DiskTierSettingsError(
            f"fs tier max_size_gib={value} is invalid: it must be >= 0 (0 means "
            f"no cap). Set a size in GiB or remove the key."
        )
    if value == 0:
        return None, "max_size_gib=0 (no cap)"
    return int(value * GiB), f"max_size_gib={value}"
