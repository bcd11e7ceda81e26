"""A file of keys only its owner may read: the fleet's API key and the KV secret.

Both secrets reach each process as a path, never as text on a command line
(``/proc/*/cmdline`` is world-readable) or in a log, and both files follow
one rule set, read here once for both callers (fleet/api_key.py,
kv_offload/mac_keys.py):

- opened with O_NOFOLLOW (a link would let whoever can write the directory
  name another file) and O_NONBLOCK (a FIFO put there does not hang a
  start), then checked to be a regular file before Python opens it as text
  (``fdopen`` refuses a directory with its own words);
- refused when its group or others may read or write it;
- one key a word (a line each, by convention), at least
  :data:`MIN_KEY_CHARS` characters: 128 bits as hex, what a guess tested
  offline against a tag or a header must face.

Every refusal is one line in the caller's own error class, naming the file
and the fix, never a key.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

MIN_KEY_CHARS = 32
GENERATE_HINT = "openssl rand -hex 32"


def read_keys(
    path: str | Path, where: str, error: type[Exception], what: str, missing_fix: str
) -> list[str]:
    """The keys in ``path``, in order. ``where`` names the file in messages
    (``--api-key-file PATH``), ``what`` says what it holds (``the fleet's
    API key``); ``missing_fix`` ends the message of a file that cannot be
    read. Raises ``error`` with the rule and the fix."""
    path = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise error(
            f"{where} cannot be read ({exc.strerror}): create it with one key a line, mode "
            f"0600 (`(umask 077; {GENERATE_HINT} > {path})`), or {missing_fix}."
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise error(f"{where} is not a regular file: name the file of {what}.")
    if st.st_mode & 0o077:
        os.close(fd)
        raise error(
            f"{where} has mode {stat.S_IMODE(st.st_mode):04o}: other users may read "
            f"{what}, or change it. Run chmod 600 {path}."
        )
    with os.fdopen(fd, encoding="utf-8") as f:
        return check_keys(f.read(), where, error)


def check_keys(text: str, where: str, error: type[Exception]) -> list[str]:
    """``text``'s keys, one a word, in order; ``error`` when there is none
    or one is shorter than :data:`MIN_KEY_CHARS`."""
    keys = text.split()
    if not keys:
        raise error(
            f"{where} holds no key: put one on its first line, e.g. the output of "
            f"`{GENERATE_HINT}`, the same on every host that shares it."
        )
    for n, key in enumerate(keys, start=1):
        if len(key) < MIN_KEY_CHARS:
            raise error(
                f"key {n} of {where} has {len(key)} characters: a key needs at least "
                f"{MIN_KEY_CHARS}, as one of fewer can be guessed offline "
                f"(`{GENERATE_HINT}` makes one)."
            )
    return keys


def generate(path: str | Path) -> bool:
    """Create ``path`` with a fresh key (mode 0600) unless it exists; whether
    it was created. O_EXCL: two fleets started at once keep one key."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(secrets.token_hex(32) + "\n")
    return True
