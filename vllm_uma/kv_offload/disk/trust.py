"""Who could have written the store: the trust rules, checked at start-up.

Block files hold KV bytes that the server feeds to the model as if it had
computed them, and keys are predictable (sha256 of the tokens, with vLLM's
public seed). Whoever can write into the store can therefore make the
server answer with planted context, and whoever can read it can recover
prompts from the KV. So, like ssh with a key directory, the tier refuses a
``root_dir`` (and its ``.noindex``) that another user owns or that group or
others may write, and a ``.noindex`` that is a symlink or not a directory.
The message names the path, what is wrong and the command that fixes it.

Runs in the API-server process, from the fs tier's settings check (settings.py),
before any weights load, by path; and again in the engine core when the
tier opens the store (tier_startup.py), on the very handles it then walks
from (layout.py's Layout.untrusted): minutes pass between the two, enough
for the directory to be replaced. Inside the store nothing is trusted either: the
I/O never follows a symlink and reads only regular files (layout.py,
block_read.py).
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from vllm_uma.kv_offload.disk.layout import NOINDEX


class StoreTrustError(RuntimeError):
    """The store's root_dir or .noindex breaks a trust rule (the message
    says which and the fix)."""


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def untrusted_reason(path: Path, st: os.stat_result, what: str) -> str | None:
    """Why ``path`` (whose stat is ``st``) cannot hold this server's store,
    or None if it can."""
    me = os.geteuid()
    if st.st_uid != me:
        return (
            f"fs tier {what} {str(path)!r} is owned by {_user(st.st_uid)}, not by this "
            f"server's user {_user(me)}: its owner could plant KV blocks this server "
            f"would serve. Use a directory of your own, e.g. under your home directory."
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        return (
            f"fs tier {what} {str(path)!r} is writable by group or others (mode "
            f"{mode:04o}): anyone who can write it could plant KV blocks this server "
            f"would serve. Run `chmod go-w {path}` (or `chmod 700 {path}`)."
        )
    return None


def check_store_root(root_dir: Path) -> str | None:
    """The first trust rule ``root_dir`` breaks, or None. ``root_dir`` may
    itself be reached through a symlink the user chose; nothing below it is
    followed."""
    root_st = os.stat(root_dir)
    if not stat.S_ISDIR(root_st.st_mode):
        return f"fs tier root_dir {str(root_dir)!r} is not a directory. Choose a directory."
    reason = untrusted_reason(root_dir, root_st, "root_dir")
    if reason:
        return reason
    noindex = root_dir / NOINDEX
    try:
        st = os.lstat(noindex)
    except FileNotFoundError:
        return None  # the tier creates it, 0700
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        return (
            f"fs tier store directory {str(noindex)!r} is {kind}: the tier keeps its "
            f"blocks in a real directory there and follows no link. Remove it "
            f"(`rm {noindex}`) and the tier makes its own."
        )
    return untrusted_reason(noindex, st, "store directory")
