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
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

# 32 characters: 128 bits as hex. The key crosses the network in every
# request; what a guess must face is the same as for the KV secret.
MIN_KEY_CHARS = 32
GENERATE_HINT = "openssl rand -hex 32"


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
    file, open to others, or holds no key long enough."""
    path = str(path)
    where = f"{flag} {path}"
    try:
        # O_NOFOLLOW: a link would let whoever can write the directory name
        # another file; O_NONBLOCK: a FIFO put there does not hang the start.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ApiKeyError(
            f"{where} cannot be read ({exc.strerror}): create it with one key a line, mode "
            f"0600 (`(umask 077; {GENERATE_HINT} > {path})`), or name the file that holds "
            f"the fleet's key."
        ) from None
    st = os.fstat(fd)  # before fdopen, which refuses a directory with its own words
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ApiKeyError(f"{where} is not a regular file: name the file of the key.")
    if st.st_mode & 0o077:
        os.close(fd)
        raise ApiKeyError(
            f"{where} has mode {stat.S_IMODE(st.st_mode):04o}: other users may read the "
            f"fleet's API key (and steer its router, or call its servers). Run chmod 600 "
            f"{path}."
        )
    with os.fdopen(fd, encoding="utf-8") as f:
        return ApiKeys(path, _parse(f.read(), where))


def _parse(text: str, where: str) -> tuple[str, ...]:
    keys = tuple(text.split())
    if not keys:
        raise ApiKeyError(
            f"{where} holds no key: put one on its first line, e.g. the output of "
            f"`{GENERATE_HINT}`, the same on every host of the fleet."
        )
    for n, key in enumerate(keys, start=1):
        if len(key) < MIN_KEY_CHARS:
            raise ApiKeyError(
                f"key {n} of {where} has {len(key)} characters: a key needs at least "
                f"{MIN_KEY_CHARS} (`{GENERATE_HINT}` makes one)."
            )
    return keys


def generate_key_file(path: str | Path) -> bool:
    """Create ``path`` with a fresh key (mode 0600) unless it exists; whether
    it was created. O_EXCL: two fleets started at once keep one key."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(secrets.token_hex(32) + "\n")
    return True
