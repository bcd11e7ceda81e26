"""The benchmarks' progress lines, on stderr so that stdout keeps the figures."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

_T0 = time.monotonic()


def progress(message: str) -> None:
    """``[mm:ss] message``: minutes and seconds since the benchmark started."""
    elapsed = int(time.monotonic() - _T0)
    print(f"[{elapsed // 60:02d}:{elapsed % 60:02d}] {message}", file=sys.stderr, flush=True)


def stamped(tool: str) -> Callable[[str], None]:
    """A ``say(message)`` that prints ``[tool HH:MM:SS] message``."""

    def say(message: str) -> None:
        print(f"[{tool} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    return say
