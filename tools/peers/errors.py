"""The one error the peer tools raise: a single line naming what failed and the fix."""

from __future__ import annotations


class PeerError(RuntimeError):
    """A peer could not be fetched, built or prepared. ``str()`` is one line
    a user can act on: what failed, the value or the log that says why, and
    what to do; the benchmark prints it and exits."""
