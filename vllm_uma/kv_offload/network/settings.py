"""The network tier's settings, typed and checked once where they enter.

The user names the tier in vLLM's own flag, alone or after the disk tier::

    --kv-transfer-config '{"kv_connector_extra_config": {"secondary_tiers": [
        {"type": "fs", "root_dir": "/var/cache/kv"},
        {"type": "valkey", "url": "valkey://10.0.0.5:6379/0",
         "password_env": "VLLM_UMA_VALKEY_PASSWORD"}]}}'

``parse_network_tier`` runs in the API-server process (through
``kv_offload.config.translate``), before any weights load, and does no
network I/O: the engine is checked by the tier itself in the engine core
(engine_check.py), where a gone engine is a warning, not a failed start.

A Valkey/Redis Cluster is ``"cluster": true`` with the url of any one of
its nodes; the tier reads the others from it. A setting, not guessed from
the engine: node_checks.py says why, and refuses a mode that does not
match the engine, with the fix.

Credentials never travel in the settings: a password in the URL is refused
(URLs end up in logs, shell histories and ``ps``); the settings name an
environment variable or a file, checked here to exist, and read again at
every connection (credentials.py), so a rotated secret needs no restart.
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

TIER_TYPE = "valkey"
PLAIN_SCHEMES = ("valkey", "redis")
TLS_SCHEMES = ("valkeys", "rediss")
DEFAULT_PORT = 6379
# A command on a healthy engine on the same network answers in well under a
# millisecond plus the transfer (a 2.9 MB block: 3 ms at 10 Gbit/s): two
# seconds is a sick engine. A restore that waits that long is a miss, then
# recomputed; no request waits longer than its recompute plus this.
DEFAULT_TIMEOUT_S = 2.0
# Connecting: a dead host (no RST, packets dropped) costs this per attempt.
DEFAULT_CONNECT_TIMEOUT_S = 1.0
MAX_TIMEOUT_S = 60.0
KNOWN_TIER_KEYS = frozenset(
    {
        "type",
        "url",
        "password_env",
        "password_file",
        "tls_ca_file",
        "timeout_s",
        "connect_timeout_s",
        "cluster",
    }
)


class NetworkTierConfigError(ValueError):
    """A network-tier setting the plugin cannot serve; the message has the fix."""


@dataclass(frozen=True)
class NetworkTierConfig:
    scheme: str  # valkey, redis, valkeys or rediss
    host: str
    port: int
    db: int
    username: str | None  # an ACL user (from the URL); None: the default user
    tls: bool
    tls_ca_file: str | None  # None: the system's CAs
    password_env: str | None  # the variable that holds the password
    password_file: str | None  # or the file that does
    timeout_s: float
    connect_timeout_s: float
    # The url names one node of a Valkey/Redis Cluster; the tier finds the
    # others (network/cluster_map.py).
    cluster: bool = False
    # vLLM's KV cache events are on (--kv-events-config): the tier publishes
    # its stores and its removals of bad values (set by kv_offload/config.py).
    kv_events: bool = False

    @property
    def cache_id(self) -> str:
        """The engine as a KV-aware router names a cache every host reads
        (the events' ``ownership``): the same on every host that names the
        engine by the same address, never a secret."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"valkey://{host}:{self.port}/{self.db}"

    @property
    def url(self) -> str:
        """The engine's address, for messages: never a secret."""
        user = f"{self.username}@" if self.username else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{user}{host}:{self.port}/{self.db}"


def parse_network_tier(raw: dict[str, Any]) -> NetworkTierConfig:
    """The tier object whose ``"type"`` is ``"valkey"``, checked."""
    unknown = sorted(set(raw) - KNOWN_TIER_KEYS)
    if unknown:
        raise NetworkTierConfigError(
            f"unknown key(s) {unknown} in the valkey secondary tier; the known keys are "
            f"{sorted(KNOWN_TIER_KEYS)}. Remove or correct them."
        )
    parts = _url_parts(raw.get("url"))
    if importlib.util.find_spec("valkey") is None:
        raise NetworkTierConfigError(
            "the valkey tier needs the valkey client, which is not installed: "
            "pip install 'vllm-uma[valkey]' (or remove the valkey tier)."
        )
    tls = parts.scheme in TLS_SCHEMES
    password_env, password_file = _password_source(raw, parts.username)
    return NetworkTierConfig(
        scheme=parts.scheme,
        host=parts.hostname or "",
        port=_port(parts),
        db=_db(parts),
        username=parts.username or None,
        tls=tls,
        tls_ca_file=_ca_file(raw.get("tls_ca_file"), tls),
        password_env=password_env,
        password_file=password_file,
        timeout_s=_seconds(raw, "timeout_s", DEFAULT_TIMEOUT_S),
        connect_timeout_s=_seconds(raw, "connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S),
        cluster=_cluster(raw.get("cluster", False)),
    )


def _masked(url: str, parts: SplitResult) -> str:
    """``url`` with any password replaced, for a message."""
    if parts.password is None:
        return url
    user = parts.username or ""
    return url.replace(f"{user}:{parts.password}@", f"{user}:***@", 1)


def _url_parts(url: Any) -> SplitResult:
    example = '"url": "valkey://HOST:6379/0"'
    if not isinstance(url, str) or not url:
        raise NetworkTierConfigError(
            f"valkey tier url={url!r} is invalid: it must be the engine's address. "
            f"Add {example} (valkeys:// for TLS)."
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (parses the port: raises on a bad one)
    except ValueError as exc:
        raise NetworkTierConfigError(
            f"valkey tier url is invalid ({exc}): write it as {example}."
        ) from None
    shown = _masked(url, parts)
    if parts.password is not None:
        raise NetworkTierConfigError(
            f"valkey tier url={shown!r} holds a password: URLs end up in logs and process "
            f"lists. Remove it from the URL and name where to read it: "
            f'"password_env": "VLLM_UMA_VALKEY_PASSWORD" or "password_file": "/path".'
        )
    if parts.scheme not in PLAIN_SCHEMES + TLS_SCHEMES:
        raise NetworkTierConfigError(
            f"valkey tier url={shown!r} has the scheme {parts.scheme!r}: use valkey:// or "
            f"redis:// (valkeys:// or rediss:// for TLS)."
        )
    if not parts.hostname:
        raise NetworkTierConfigError(
            f"valkey tier url={shown!r} names no host: write it as {example}."
        )
    if parts.query or parts.fragment:
        raise NetworkTierConfigError(
            f"valkey tier url={shown!r} has a query or fragment: options are keys of the "
            f"tier object (timeout_s, connect_timeout_s, tls_ca_file, cluster). Remove it."
        )
    return parts


def _port(parts: SplitResult) -> int:
    port = parts.port
    if port == 0:
        raise NetworkTierConfigError(
            f"valkey tier url port 0 is invalid: name the engine's port (default {DEFAULT_PORT})."
        )
    return DEFAULT_PORT if port is None else port


def _db(parts: SplitResult) -> int:
    path = parts.path.strip("/")
    if not path:
        return 0
    if not path.isdigit():
        raise NetworkTierConfigError(
            f"valkey tier url path {parts.path!r} is invalid: it is the database number, "
            f"e.g. valkey://HOST:6379/0 (or nothing, for 0)."
        )
    return int(path)


def _password_source(raw: dict[str, Any], username: str | None) -> tuple[str | None, str | None]:
    env, path = raw.get("password_env"), raw.get("password_file")
    if env is not None and path is not None:
        raise NetworkTierConfigError(
            "the valkey tier names both password_env and password_file: keep one."
        )
    if env is not None:
        if not isinstance(env, str) or not env:
            raise NetworkTierConfigError(
                f"valkey tier password_env={env!r} is invalid: it must be the name of an "
                f'environment variable, e.g. "VLLM_UMA_VALKEY_PASSWORD".'
            )
        if env not in os.environ:
            raise NetworkTierConfigError(
                f"valkey tier password_env={env!r} names an environment variable that is not "
                f"set: export {env}=... before starting the server, or remove the key."
            )
    if path is not None:
        if not isinstance(path, str) or not path:
            raise NetworkTierConfigError(
                f"valkey tier password_file={path!r} is invalid: it must be a file path."
            )
        if not os.access(path, os.R_OK) or not os.path.isfile(path):
            raise NetworkTierConfigError(
                f"valkey tier password_file={path!r} is not a readable file: create it "
                f"(mode 0600, the password on its first line) or fix the path."
            )
    if username and env is None and path is None:
        raise NetworkTierConfigError(
            f"the valkey tier's url names the ACL user {username!r} but no password: add "
            f'"password_env": "VLLM_UMA_VALKEY_PASSWORD" or "password_file": "/path".'
        )
    return env, path


def _ca_file(value: Any, tls: bool) -> str | None:
    if value is None:
        return None
    if not tls:
        raise NetworkTierConfigError(
            "the valkey tier sets tls_ca_file but its url is not TLS: use valkeys:// "
            "(or rediss://), or remove tls_ca_file."
        )
    if not isinstance(value, str) or not os.path.isfile(value):
        raise NetworkTierConfigError(
            f"valkey tier tls_ca_file={value!r} is not a file: give the PEM file of the CA "
            f"that signed the engine's certificate, or remove the key (system CAs)."
        )
    return value


def _cluster(value: Any) -> bool:
    if not isinstance(value, bool):
        raise NetworkTierConfigError(
            f"valkey tier cluster={value!r} is invalid: it must be true (the url names one "
            f"node of a Valkey/Redis Cluster) or false (one engine). Set true or false, or "
            f"remove the key (default false)."
        )
    return value


def _seconds(raw: dict[str, Any], name: str, default: float) -> float:
    value = raw.get(name, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= MAX_TIMEOUT_S
    ):
        raise NetworkTierConfigError(
            f"valkey tier {name}={value!r} is invalid: it must be a number of seconds, "
            f"> 0 and <= {MAX_TIMEOUT_S:g}. Set one, or remove the key (default {default:g})."
        )
    return float(value)
