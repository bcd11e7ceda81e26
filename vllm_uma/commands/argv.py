"""Flags on a raw command line, read the one way ``serve`` and ``fleet`` share.

``vllm-uma serve`` must know whether the user named a model before vLLM's
parser runs (it refuses --served-model-name without one), and
``vllm-uma fleet`` rewrites some flags before it passes the rest to every
server. Both ask the same question of argv, so both ask it here: a flag is
given as ``--flag VALUE`` or ``--flag=VALUE``. Pure functions, no vLLM
import, so the fleet's plan stays cheap to test.
"""

from __future__ import annotations


class FlagValueMissing(ValueError):
    """``--flag`` was the last word of the command line."""


def given(argv: list[str] | tuple[str, ...], *flags: str) -> bool:
    """True if any of ``flags`` appears in ``argv`` (``--f`` or ``--f=x``)."""
    return any(arg == flag or arg.startswith(flag + "=") for arg in argv for flag in flags)


def take(argv: list[str], flag: str) -> str | None:
    """Remove ``flag VALUE`` or ``flag=VALUE`` from ``argv``; its value, or
    None when it is not given."""
    for i, arg in enumerate(argv):
        if arg == flag:
            if i + 1 >= len(argv):
                raise FlagValueMissing(f"{flag} needs a value.")
            value = argv[i + 1]
            del argv[i : i + 2]
            return value
        if arg.startswith(flag + "="):
            del argv[i]
            return arg.split("=", 1)[1]
    return None
