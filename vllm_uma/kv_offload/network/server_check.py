"""The KV server's cap and eviction policy, read at start-up and at each reconnect.

Engine-core process: at start-up while vLLM builds the tier (blocking is
fine there), and on the link's watch thread when a gone KV server answers
again (server_link.py). The cap and the LRU of the network tier are the
KV server's own, so the check is what makes them ours:

- ``maxmemory-policy noeviction``: a full KV server refuses every write (OOM
  errors), forever. Refused at start-up; warned of at a reconnect (the
  server is serving by then: its stores fail and are counted).
- ``volatile-*``: only keys with a TTL are evicted, and ours have none (a
  block is as good tomorrow as today), so for us it is noeviction. Warned.
- ``maxmemory 0``: no cap; the KV server grows until its host runs out of
  memory. Warned.
- an ACL user that may not run CONFIG GET: the policy cannot be read.
  Warned, never a failed start: many managed KV servers refuse CONFIG.

At start-up the tier also says what its namespace holds there, and its
share of ``maxmemory`` (``namespace_share``): counted with SCAN and MEMORY
USAGE (server_usage.py) for at most ``COUNT_DEADLINE_S`` or
``COUNT_MAX_KEYS`` names, then "at least". A refused count is a phrase in
the line; a KV server gone meanwhile raises, for the link to handle.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from valkey.exceptions import ResponseError

from vllm_uma.kv_offload.network.server_usage import namespace_usage, write_descriptor

GOOD_POLICIES = ("allkeys-lru", "allkeys-lfu", "allkeys-random")
FIX = "CONFIG SET maxmemory-policy allkeys-lru (and CONFIG SET maxmemory <bytes>)"
# The start-up count's bounds: vLLM waits for it. Measured here on loopback
# (nice 19, a benchmark running): 200k names of ours among 300k keys
# counted in 0.95 s. A shared KV server with a large keyspace takes longer, as
# SCAN walks every key and MATCH filters after; 200k blocks of the default
# model are 580 GB, so the cap is rarely what cuts a count.
COUNT_DEADLINE_S = 1.0
COUNT_MAX_KEYS = 200_000


class ServerRefused(RuntimeError):
    """The KV server is set up so that the tier would fail; the message has the fix."""


@dataclass(frozen=True)
class ServerReport:
    maxmemory: int | None  # bytes, 0: no cap; None: could not be read
    policy: str | None
    used_memory: int | None
    version: str | None
    problem: str | None  # what is wrong, with the fix; None: nothing
    refuse: bool  # the problem is one to refuse a start-up for

    def summary(self) -> str:
        cap = "unknown" if self.maxmemory is None else "none"
        if self.maxmemory:
            cap = _gib(self.maxmemory)
        used = "unknown" if self.used_memory is None else _gib(self.used_memory)
        return (
            f"KV server {self.version or 'version unknown'}, maxmemory {cap}, "
            f"policy {self.policy or 'unknown'}, used {used}"
        )

    def share(self, nbytes: int) -> str:
        """``nbytes`` as a share of what the KV server may hold, for a message."""
        if self.maxmemory:
            return f"{nbytes / self.maxmemory:.1%} of maxmemory"
        if self.used_memory:
            why = "no maxmemory" if self.maxmemory == 0 else "maxmemory unknown"
            return f"{nbytes / self.used_memory:.1%} of the memory used ({why})"
        return "share of the KV server unknown"


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_server(client, url: str) -> ServerReport:
    """Read the KV server's cap and policy (raises the client's ConnectionError
    or TimeoutError if it does not answer)."""
    used, version = _info(client)
    try:
        config = client.config_get("maxmemory*")
    except ResponseError as exc:  # NOPERM, or CONFIG renamed away
        problem = (
            f"cannot read the KV server's maxmemory-policy at {url} ({exc}): make sure it runs "
            f"with a cap and allkeys-lru ({FIX}), or let the tier's ACL user run CONFIG GET "
            f"(+config|get) so that vllm-uma checks it."
        )
        return ServerReport(None, None, used, version, problem, refuse=False)
    policy = str(_text(config.get(b"maxmemory-policy", config.get("maxmemory-policy"))))
    maxmemory = int(_text(config.get(b"maxmemory", config.get("maxmemory", 0))) or 0)
    problem, refuse = _verdict(policy, maxmemory, url)
    return ServerReport(maxmemory, policy, used, version, problem, refuse)


def _verdict(policy: str, maxmemory: int, url: str) -> tuple[str | None, bool]:
    if policy == "noeviction":
        return (
            f"the KV server at {url} runs maxmemory-policy noeviction: once full it refuses "
            f"every write, and the network tier stops storing. Run {FIX} on it.",
            True,
        )
    if policy.startswith("volatile-"):
        return (
            f"the KV server at {url} runs maxmemory-policy {policy}, which evicts only keys "
            f"with a TTL; the network tier's have none, so a full KV server refuses its "
            f"writes. Run {FIX} on it.",
            False,
        )
    if maxmemory == 0:
        return (
            f"the KV server at {url} has no maxmemory: it grows until its host runs out of "
            f"memory. Give it a cap: CONFIG SET maxmemory <bytes>.",
            False,
        )
    if policy not in GOOD_POLICIES:
        return f"the KV server at {url} runs an unknown maxmemory-policy {policy!r}.", False
    return None, False


def _info(client) -> tuple[int | None, str | None]:
    try:
        info = client.info("memory")
        server = client.info("server")
    except ResponseError:  # INFO refused by the ACL: not needed to serve
        return None, None
    version = server.get("valkey_version") or server.get("redis_version")
    return info.get("used_memory"), None if version is None else str(version)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def namespace_share(client, namespace: bytes, info: dict | None, report: ServerReport) -> str:
    """What ``namespace`` holds in the KV server, for the start-up line; writes
    its descriptor first. Raises the client's link errors, never a refusal."""
    keep_descriptor(client, namespace, info)
    try:
        usage = namespace_usage(
            client, namespace, time.monotonic() + COUNT_DEADLINE_S, COUNT_MAX_KEYS
        )
    except ResponseError as exc:  # an ACL without SCAN or MEMORY: not needed to serve
        detail = str(exc).split("caused error: ")[-1]  # a pipeline's: the key is noise
        return (
            f"its blocks not counted ({detail}): let the tier's ACL user run SCAN and "
            f"MEMORY USAGE (+scan +memory|usage) to see them here"
        )
    if usage.complete:
        return f"{usage.blocks} blocks, {_gib(usage.bytes)}, {report.share(usage.bytes)}"
    return (
        f"at least {usage.blocks} blocks, {_gib(usage.bytes)}, {report.share(usage.bytes)} "
        f"(counting stops at {COUNT_DEADLINE_S:g} s or {COUNT_MAX_KEYS} names)"
    )


def keep_descriptor(client, namespace: bytes, info: dict | None) -> None:
    """The namespace's descriptor, for `vllm-uma kv-store URL ls`; a refusal
    (an ACL, a full KV server) costs only the model's name in that listing."""
    if info is None:
        return
    try:
        write_descriptor(client, namespace, info)
    except ResponseError:
        pass
