"""A long start-up step that says how far it got (disk tier, engine core).

Fingerprinting a large checkpoint or reading a large store can take minutes
before the server is ready; a line every PROGRESS_EVERY_S tells the operator
it is working, not hung. Steps shorter than that log nothing extra.
"""

from __future__ import annotations

import time

from vllm_uma.log import get_logger

logger = get_logger(__name__)

PROGRESS_EVERY_S = 10.0


class Progress:
    def __init__(
        self,
        what: str,
        unit: str,
        total: float | None = None,
        scale: float = 1.0,
        every_s: float | None = None,
    ):
        """``what`` names the step; amounts are divided by ``scale`` and
        shown in ``unit`` (e.g. scale 2**30, unit "GiB")."""
        self._what, self._unit, self._total, self._scale = what, unit, total, scale
        self._every_s = PROGRESS_EVERY_S if every_s is None else every_s
        self._start = self._last = time.monotonic()
        self.done = 0.0

    def advance(self, amount: float) -> None:
        self.done += amount
        now = time.monotonic()
        if now - self._last >= self._every_s:
            self._last = now
            of = "" if self._total is None else f" of {self._amount(self._total)}"
            logger.info(
                "Disk KV tier: %s: %s%s %s after %.0f s ...",
                self._what,
                self._amount(self.done),
                of,
                self._unit,
                now - self._start,
            )

    def _amount(self, value: float) -> str:
        return f"{value:.0f}" if self._scale == 1 else f"{value / self._scale:.1f}"
