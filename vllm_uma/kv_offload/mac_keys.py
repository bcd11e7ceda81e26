"""The fleet's secret that signs KV blocks: where it is read, its keys, its rotation.

Read in two processes: the API server (network/settings.py, also in
``vllm-uma serve``'s preflight, before vLLM is imported), which refuses a
missing, unreadable or short secret with the fix; and the engine core
(network/tier.py), at start-up and again whenever the file changes, so a
rotation needs no restart. Never kept in the settings plan (which names the
variable or the file), never logged, never on a command line: messages name
a key by its id, a hash of the key that tells nothing of it.

The secret's text is one or more keys separated by whitespace (in a file:
one a line). The first signs every value written; every one is accepted on
reads. Rotation, on every host of the fleet:

1. add the new key as a second line: accepted from now on, nothing signs with it;
2. once every host has it, make it the first line: new values are signed with it,
   values signed with the old key are still read;
3. remove the old key once its values have left the KV server (or at once: those
   blocks are then recomputed once).

A host a step behind reads no value signed with a key it lacks: a counted
miss (``unknown_key``), deleted and recomputed, never served. Skipping step 1
costs such recomputes while the hosts disagree; nothing wrong is served.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass

from vllm_uma.plugin import private_key_file

# The file's rules (owner-only, keys of 32 characters or more) are shared
# with the fleet's API key (private_key_file.py).
from vllm_uma.plugin.private_key_file import GENERATE_HINT

# How often the engine core looks at the file for a rotated secret: a stat
# per transfer job at most once a second, not a read.
RELOAD_CHECK_S = 1.0
KEY_ID_BYTES = 8
# Domain separation: the id shown in logs is not the MAC key, nor a tag.
_ID_CONTEXT = b"vllm-uma kv mac key id\0"
_KEY_CONTEXT = b"vllm-uma kv mac key\0"


class SecretError(ValueError):
    """The secret cannot sign: the message names the rule and the fix, never the secret."""


@dataclass(frozen=True)
class MacKey:
    id: bytes  # KEY_ID_BYTES: written beside each tag, so a reader picks the key
    material: bytes = b""  # 32 bytes derived from the secret; never printed

    def __repr__(self) -> str:  # a log line or a traceback shows the id only
        return f"MacKey(id={self.id.hex()})"


@dataclass(frozen=True)
class KeyRing:
    signing: MacKey
    accepted: dict[bytes, MacKey]  # by id, the signing key included

    def describe(self) -> str:
        """For the start-up line: the signing key's id, and how many more are read."""
        others = len(self.accepted) - 1
        more = f", {others} previous key(s) accepted for reads" if others else ""
        return f"signed with key id {self.signing.id.hex()}{more}"


def derive(secret: bytes) -> MacKey:
    key_id = hashlib.sha256(_ID_CONTEXT + secret).digest()[:KEY_ID_BYTES]
    return MacKey(key_id, hashlib.sha256(_KEY_CONTEXT + secret).digest())


def parse_keys(text: str, where: str) -> KeyRing:
    """``text`` as keys (module docstring); ``where`` names its source in errors."""
    keys = [derive(word.encode()) for word in private_key_file.check_keys(text, where, SecretError)]
    return KeyRing(keys[0], {k.id: k for k in reversed(keys)})


def read_file(path: str) -> KeyRing:
    """The keys in ``path``, refused when others may read it (anyone who
    reads the secret can sign KV every host serves): private_key_file.py."""
    words = private_key_file.read_keys(
        path, f"secret_file={path!r}", SecretError, "the fleet's secret", "fix the path"
    )
    return parse_keys(" ".join(words), f"secret_file={path!r}")


def checked_source(path: str | None, env: str | None) -> tuple[str | None, str | None]:
    """A tier's ``secret_file`` (made absolute: the engine core may start
    elsewhere) and ``secret_env`` after reading the keys once, so that a
    missing, unreadable or short secret is refused where the settings
    enter; SecretError otherwise. The keys are not kept."""
    if path is not None and env is not None:
        raise SecretError("it names both secret_file and secret_env: keep one.")
    for given, value in (("secret_file", path), ("secret_env", env)):
        if value is not None and (not isinstance(value, str) or not value):
            kind = "a file path" if given == "secret_file" else "an environment variable's name"
            raise SecretError(f"{given}={value!r} is invalid: it must be {kind}.")
    if path is not None:
        path = os.path.abspath(path)
        read_file(path)
    elif env is not None:
        read_env(env)
    return path, env


def read_env(name: str) -> KeyRing:
    value = os.environ.get(name)
    if value is None:
        raise SecretError(
            f"secret_env={name!r} names an environment variable that is not set: export "
            f"{name}=$({GENERATE_HINT}) (the same on every host) before starting the server."
        )
    return parse_keys(value, f"the environment variable {name}")


class KeySource:
    """The keys of a secret file or variable, read again when the file changes.

    Shared by the transfer threads: ``keys()`` is a stat at most once a
    second and a reference swap under a lock; a file that fails to read
    (an editor's half-written save) keeps the keys in use and is reported
    once per change by ``on_problem``."""

    def __init__(self, *, env: str | None, path: str | None, on_problem=None):
        if (env is None) == (path is None):
            raise ValueError("a KeySource reads one variable or one file")
        self._env, self._path = env, path
        self._on_problem = on_problem or (lambda message: None)
        self._lock = threading.Lock()
        self._stamp = self._file_stamp()
        self._ring = read_env(env) if env is not None else read_file(path)
        self._checked = time.monotonic()

    def keys(self) -> KeyRing:
        if self._path is None or time.monotonic() - self._checked < RELOAD_CHECK_S:
            return self._ring
        with self._lock:
            self._checked = time.monotonic()
            stamp = self._file_stamp()
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._ring = read_file(self._path)
                except SecretError as exc:
                    self._on_problem(f"{exc} The keys read before are kept.")
            return self._ring

    def _file_stamp(self) -> tuple | None:
        if self._path is None:
            return None
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)


def generate_file(path: str) -> bool:
    """Create ``path`` with a fresh key (mode 0600) unless it exists; whether
    it was created (private_key_file.py)."""
    return private_key_file.generate(path)
