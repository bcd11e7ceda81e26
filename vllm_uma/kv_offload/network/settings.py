"""The network tier's settings, typed and checked once where they enter.

The user names the tier in vLLM's own flag, alone or after the disk tier::

    --kv-transfer-config '{"kv_connector_extra_config": {"secondary_tiers": [
        {"type": "fs", "root_dir": "/var/cache/kv"},
        {"type": "valkey", "url": "valkey://10.0.0.5:6379/0",
         "password_env": "VLLM_UMA_VALKEY_PASSWORD",
         "secret_file": "/etc/vllm-uma/kv-network.secret"}]}}'

``parse_network_tier`` runs in the API-server process (through
``kv_offload.config.translate``), before any weights load, and does no
network I/O: the KV server is checked by the tier itself in the engine core
(server_check.py), where a gone KV server is a warning, not a failed start.

A Valkey/Redis Cluster is ``"cluster": true`` with the url of any one of
its nodes; the tier reads the others from it. A setting, not guessed from
the KV server: node_checks.py says why, and refuses a mode that does not
match the KV server, with the fix.

Credentials never travel in the settings: a password in the URL is refused
(URLs end up in logs, shell histories and ``ps``); the settings name an
environment variable or a file, checked here to exist, and read again at
every connection (credentials.py), so a rotated secret needs no restart.

TLS (``valkeys://``, ``rediss://``): the CA and the client certificate are
files, loaded here once so that a wrong one is refused before the KV server
core starts (tls.py loads them again at every connection). A cluster's
nodes get the password only over TLS or at the addresses
``cluster_allowed_hosts`` names (node_trust.py says why).

Every value is signed with the fleet's secret (block_mac.py): the settings
name where it is (``secret_file`` or ``secret_env``, read here once to
refuse a missing or short one before vLLM loads, never kept), or opt out
with ``"unsigned": true``. Neither is refused: a KV server anyone else can
write to would otherwise steer every host's answers.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import math
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

from vllm_uma.kv_offload import mac_keys
from vllm_uma.kv_offload.network.tls import client_context

TIER_TYPE = "valkey"
PLAIN_SCHEMES = ("valkey", "redis")
TLS_SCHEMES = ("valkeys", "rediss")
DEFAULT_PORT = 6379
# A command on a healthy KV server on the same network answers in well under a
# millisecond plus the transfer (a 2.9 MB block: 3 ms at 10 Gbit/s): two
# seconds is a sick KV server. A restore that waits that long is a miss, then
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
        "tls_cert_file",
        "tls_key_file",
        "timeout_s",
        "connect_timeout_s",
        "cluster",
        "cluster_allowed_hosts",
        "secret_file",
        "secret_env",
        "unsigned",
    }
)
# A host name as a cluster's map may give it (RFC 1123 labels).
HOST_NAME = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?$")
# What the refusal of a tier without a secret suggests for secret_env.
SECRET_ENV_EXAMPLE = "VLLM_UMA_KV_SECRET"


class NetworkTierSettingsError(ValueError):
    """A network-tier setting the plugin cannot serve; the message has the fix."""


@dataclass(frozen=True)
class NetworkTierSettings:
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
    # The client's certificate and key, for a KV server that asks for one
    # (tls-auth-clients yes, the KV server's default). The key None: in the cert file.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # Where a cluster's map may send the tier (and its password): addresses,
    # networks (CIDR) or host names. None: the url's host, or any node over
    # TLS (node_trust.py).
    cluster_allowed_hosts: tuple[str, ...] | None = None
    # vLLM's KV cache events are on (--kv-events-config): the tier publishes
    # its stores and its removals of bad values (set by kv_offload/config.py).
    kv_events: bool = False
    # Where the fleet's MAC keys are (mac_keys.py): one of them, or neither
    # with unsigned True (the user's choice, said at start-up).
    secret_file: str | None = None
    secret_env: str | None = None
    unsigned: bool = False

    def __post_init__(self):
        # The settings plan carries this object as JSON, which has no tuples.
        if isinstance(self.cluster_allowed_hosts, list):
            object.__setattr__(self, "cluster_allowed_hosts", tuple(self.cluster_allowed_hosts))

    @property
    def cache_id(self) -> str:
        """The KV server as a KV-aware router names a cache every host reads
        (the events' ``ownership``): the same on every host that names the
        KV server by the same address, never a secret."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"valkey://{host}:{self.port}/{self.db}"

    @property
    def url(self) -> str:
        """The KV server's address, for messages: never a secret."""
        user = f"{self.username}@" if self.username else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{user}{host}:{self.port}/{self.db}"


def parse_network_tier(raw: dict[str, Any], *, reads_values: bool = True) -> NetworkTierSettings:
    """The tier object whose ``"type"`` is ``"valkey"``, checked.
    ``reads_values`` False: a tool that reads and writes no value (``vllm-uma
    kv-store``, the fleet's check of its URL) needs no secret."""
    unknown = sorted(set(raw) - KNOWN_TIER_KEYS)
    if unknown:
        raise NetworkTierSettingsError(
            f"unknown key(s) {unknown} in the valkey secondary tier; the known keys are "
            f"{sorted(KNOWN_TIER_KEYS)}. Remove or correct them."
        )
    parts = _url_parts(raw.get("url"))
    if importlib.util.find_spec("valkey") is None:
        raise NetworkTierSettingsError(
            "the valkey tier needs the valkey client, which is not installed: "
            "pip install 'vllm-uma[valkey]' (or remove the valkey tier)."
        )
    tls = parts.scheme in TLS_SCHEMES
    password_env, password_file = _password_source(raw, parts.username)
    cluster = _cluster(raw.get("cluster", False))
    settings = NetworkTierSettings(
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
        cluster=cluster,
        tls_cert_file=_tls_file(raw, "tls_cert_file", tls),
        tls_key_file=_tls_file(raw, "tls_key_file", tls),
        cluster_allowed_hosts=_allowed_hosts(raw.get("cluster_allowed_hosts"), cluster),
    )
    if tls:
        _check_tls_files(settings)
    # Last: the secret is read only once everything else is right.
    secret_file, secret_env, unsigned = _signing(raw, reads_values)
    return dataclasses.replace(
        settings, secret_file=secret_file, secret_env=secret_env, unsigned=unsigned
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
        raise NetworkTierSettingsError(
            f"valkey tier url={url!r} is invalid: it must be the KV server's address. "
            f"Add {example} (valkeys:// for TLS)."
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (parses the port: raises on a bad one)
    except ValueError as exc:
        raise NetworkTierSettingsError(
            f"valkey tier url is invalid ({exc}): write it as {example}."
        ) from None
    shown = _masked(url, parts)
    if parts.password is not None:
        raise NetworkTierSettingsError(
            f"valkey tier url={shown!r} holds a password: URLs end up in logs and process "
            f"lists. Remove it from the URL and name where to read it: "
            f'"password_env": "VLLM_UMA_VALKEY_PASSWORD" or "password_file": "/path".'
        )
    if parts.scheme not in PLAIN_SCHEMES + TLS_SCHEMES:
        raise NetworkTierSettingsError(
            f"valkey tier url={shown!r} has the scheme {parts.scheme!r}: use valkey:// or "
            f"redis:// (valkeys:// or rediss:// for TLS)."
        )
    if not parts.hostname:
        raise NetworkTierSettingsError(
            f"valkey tier url={shown!r} names no host: write it as {example}."
        )
    if parts.query or parts.fragment:
        raise NetworkTierSettingsError(
            f"valkey tier url={shown!r} has a query or fragment: options are keys of the "
            f"tier object (timeout_s, connect_timeout_s, tls_ca_file, cluster). Remove it."
        )
    return parts


def _port(parts: SplitResult) -> int:
    port = parts.port
    if port == 0:
        raise NetworkTierSettingsError(
            f"valkey tier url port 0 is invalid: name the KV server's port "
            f"(default {DEFAULT_PORT})."
        )
    return DEFAULT_PORT if port is None else port


def _db(parts: SplitResult) -> int:
    path = parts.path.strip("/")
    if not path:
        return 0
    if not path.isdigit():
        raise NetworkTierSettingsError(
            f"valkey tier url path {parts.path!r} is invalid: it is the database number, "
            f"e.g. valkey://HOST:6379/0 (or nothing, for 0)."
        )
    return int(path)


def _password_source(raw: dict[str, Any], username: str | None) -> tuple[str | None, str | None]:
    env, path = raw.get("password_env"), raw.get("password_file")
    if env is not None and path is not None:
        raise NetworkTierSettingsError(
            "the valkey tier names both password_env and password_file: keep one."
        )
    if env is not None:
        if not isinstance(env, str) or not env:
            raise NetworkTierSettingsError(
                f"valkey tier password_env={env!r} is invalid: it must be the name of an "
                f'environment variable, e.g. "VLLM_UMA_VALKEY_PASSWORD".'
            )
        if env not in os.environ:
            raise NetworkTierSettingsError(
                f"valkey tier password_env={env!r} names an environment variable that is not "
                f"set: export {env}=... before starting the server, or remove the key."
            )
    if path is not None:
        if not isinstance(path, str) or not path:
            raise NetworkTierSettingsError(
                f"valkey tier password_file={path!r} is invalid: it must be a file path."
            )
        if not os.access(path, os.R_OK) or not os.path.isfile(path):
            raise NetworkTierSettingsError(
                f"valkey tier password_file={path!r} is not a readable file: create it "
                f"(mode 0600, the password on its first line) or fix the path."
            )
    if username and env is None and path is None:
        raise NetworkTierSettingsError(
            f"the valkey tier's url names the ACL user {username!r} but no password: add "
            f'"password_env": "VLLM_UMA_VALKEY_PASSWORD" or "password_file": "/path".'
        )
    return env, path


def _signing(raw: dict[str, Any], reads_values: bool) -> tuple[str | None, str | None, bool]:
    """(secret_file, secret_env, unsigned), the secret read once to be checked."""
    path, env, unsigned = raw.get("secret_file"), raw.get("secret_env"), raw.get("unsigned", False)
    if not isinstance(unsigned, bool):
        raise NetworkTierSettingsError(
            f"valkey tier unsigned={unsigned!r} is invalid: it must be true (values neither "
            f"signed nor checked) or false. Set true or false, or remove the key."
        )
    given = "secret_file" if path is not None else "secret_env" if env is not None else None
    if unsigned and given:
        raise NetworkTierSettingsError(
            f'the valkey tier sets "unsigned": true and names {given}: keep one (the secret, '
            f"unless no one else can write to the KV server)."
        )
    if given is None:
        if reads_values and not unsigned:
            raise NetworkTierSettingsError(
                "the valkey tier has no secret to sign its values with: anyone who can write "
                "to the KV server could plant KV that every server would serve. Add "
                f'"secret_file": "/path" (mode 0600, one key from `{mac_keys.GENERATE_HINT}`, '
                f'the same on every host) or "secret_env": "{SECRET_ENV_EXAMPLE}"; or, for an '
                f'KV server no one else can write to, "unsigned": true.'
            )
        return None, None, unsigned
    try:
        path, env = mac_keys.checked_source(path, env)
    except mac_keys.SecretError as exc:
        raise NetworkTierSettingsError(f"valkey tier: {exc}") from None
    return path, env, False


def _ca_file(value: Any, tls: bool) -> str | None:
    if value is None:
        return None
    if not tls:
        raise NetworkTierSettingsError(
            "the valkey tier sets tls_ca_file but its url is not TLS: use valkeys:// "
            "(or rediss://), or remove tls_ca_file."
        )
    if not isinstance(value, str) or not os.path.isfile(value):
        raise NetworkTierSettingsError(
            f"valkey tier tls_ca_file={value!r} is not a file: give the PEM file of the CA "
            f"that signed the KV server's certificate, or remove the key (system CAs)."
        )
    return value


def _tls_file(raw: dict[str, Any], name: str, tls: bool) -> str | None:
    value = raw.get(name)
    if value is None:
        return None
    if not tls:
        raise NetworkTierSettingsError(
            f"the valkey tier sets {name} but its url is not TLS: use valkeys:// "
            f"(or rediss://), or remove {name}."
        )
    if not isinstance(value, str) or not os.path.isfile(value):
        raise NetworkTierSettingsError(
            f"valkey tier {name}={value!r} is not a file: give the PEM file of the client's "
            f"{'certificate' if name == 'tls_cert_file' else 'private key'}, or remove the key."
        )
    return value


def _check_tls_files(settings: NetworkTierSettings) -> None:
    """Each file loaded as a connection will load it (tls.py): a file that
    is unreadable, not PEM, or a key that is not the certificate's is
    refused now, not at the first connection in the engine core."""
    if settings.tls_key_file is not None and settings.tls_cert_file is None:
        raise NetworkTierSettingsError(
            f"the valkey tier sets tls_key_file={settings.tls_key_file!r} without "
            f"tls_cert_file: add the client's certificate, or remove tls_key_file."
        )
    try:
        client_context(settings)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise NetworkTierSettingsError(
            f"the valkey tier's TLS files do not load ({type(exc).__name__}: {exc}): "
            f"tls_ca_file={settings.tls_ca_file!r} must be readable PEM certificates of the "
            f"CA that signed the KV server's; tls_cert_file={settings.tls_cert_file!r} and "
            f"tls_key_file={settings.tls_key_file!r} the client's PEM certificate and its "
            f"unencrypted key. Fix or remove them."
        ) from None


def _allowed_hosts(value: Any, cluster: bool) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not cluster:
        raise NetworkTierSettingsError(
            'the valkey tier sets cluster_allowed_hosts but not "cluster": true: the list '
            "says which nodes of a cluster's map may be connected to. Remove it, or add "
            '"cluster": true.'
        )
    example = '["10.0.0.5", "10.0.1.0/24", "valkey-2.internal"]'
    if not isinstance(value, list) or not value:
        raise NetworkTierSettingsError(
            f"valkey tier cluster_allowed_hosts={value!r} is invalid: it must be a non-empty "
            f"list of addresses, networks or host names, e.g. {example}. Fix it, or remove "
            f"the key (default: the url's host, or any node over TLS)."
        )
    for entry in value:
        if not isinstance(entry, str) or not (_is_network(entry) or HOST_NAME.match(entry)):
            raise NetworkTierSettingsError(
                f"valkey tier cluster_allowed_hosts entry {entry!r} is invalid: it must be an "
                f"IP address, a network (CIDR) or a host name, e.g. {example}."
            )
    return tuple(value)


def _is_network(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
    return True


def _cluster(value: Any) -> bool:
    if not isinstance(value, bool):
        raise NetworkTierSettingsError(
            f"valkey tier cluster={value!r} is invalid: it must be true (the url names one "
            f"node of a Valkey/Redis Cluster) or false (one KV server). Set true or false, or "
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
        raise NetworkTierSettingsError(
            f"valkey tier {name}={value!r} is invalid: it must be a number of seconds, "
            f"> 0 and <= {MAX_TIMEOUT_S:g}. Set one, or remove the key (default {default:g})."
        )
    return float(value)
