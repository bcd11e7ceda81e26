"""The fleet's API key: one file every host holds, read where it is needed.

What the key is for (docs/fleet.md, "Who can steer a fleet"):
- every server of the fleet requires it (``vllm-uma serve --api-key-file``:
  vLLM's own ``--api-key`` for its guarded prefixes, fleet/server_guard.py
  for every other path but /health and /metrics);
- the router sends it to the servers (router_main.py: vllm-router's
  ``--api-key``; gate.py: on each client request it passes);
- the router's worker administration (/add_worker, /remove_worker, ...)
  takes it from the fleet's hosts only (gate.py).

Never on a command line (``/proc/*/cmdline`` is world-readable): every
process is given the file's path and reads the key itself; never logged
(:class:`ApiKeys` prints its source only). The file is refused when others
may read or change it, as the network tier's secret is (mac_keys.py).

Its text is one or more keys, one a line: the first is sent, every one is
accepted. Rotation, host by host: add the new key as a second line on
every host, restart their fleets; move it first, restart; drop the old one.
A host a step behind is refused by the others (401, 403), nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from pathlib import Path

from vllm_uma.plugin import private_key_file

# The file's rules are the KV secret's (private_key_file.py): 32 characters
# at least, as the key crosses the network in every request.
from vllm_uma.plugin.private_key_file import GENERATE_HINT, MIN_KEY_CHARS  # noqa: F401


class ApiKeyError(ValueError):
    """The key file cannot be used: the message names the rule and the fix, never a key."""


@dataclass(frozen=True)
class ApiKeys:
    source: str  # for messages: the file's path
    keys: tuple[str, ...] = field(repr=False)  # the first one is sent

    def __repr__(self) -> str:  # a log line or a traceback shows where, never what
        return f"ApiKeys({self.source!r}, {len(self.keys)} key(s))"

    @property
    def sent(self) -> str:
        return self.keys[0]

    def header(self) -> dict[str, str]:
        """The ``Authorization`` header a request of the fleet's carries."""
        return {"Authorization": f"Bearer {self.sent}"}

    def accepts(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header carries one of the keys.
        Compared as digests, each in constant time (as vLLM's own check)."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        given = hashlib.sha256(token.strip().encode()).digest()
        found = False
        for key in self.keys:
            found |= hmac.compare_digest(given, hashlib.sha256(key.encode()).digest())
        return found


def read_key_file(path: str | Path, flag: str = "--api-key-file") -> ApiKeys:
    """The keys in ``path``; ApiKeyError when it is missing, not a regular
    file, open to others, or holds no key long enough (private_key_file.py)."""
    path = str(path)
    keys = private_key_file.read_keys(
        path, f"{flag} {path}", ApiKeyError, "the fleet's API key",
        "name the file that holds the fleet's key",
    )  # fmt: skip
    return ApiKeys(path, tuple(keys))


def generate_key_file(path: str | Path) -> bool:
    """Create ``path`` with a fresh key (mode 0600) unless it exists; whether
    it was created (private_key_file.py)."""
    return private_key_file.generate(path)
