"""Notice that vLLM's engine core died, so ``vllm-uma serve`` exits non-zero.

When the engine-core process dies while serving (a crash in a kernel, the
OOM killer), vLLM's API server logs it, fails the requests in flight with
HTTP 500, shuts itself down and returns normally: ``vllm serve`` then exits
with status 0, as if stopped on purpose. A supervisor (systemd, a fleet
manager) must see a failure to restart the server, so this handler, on the
``vllm`` logger of the API-server process, remembers vLLM's own report of
the death: an EngineDeadError logged with its traceback, or the engine
monitor's "engine core exited unexpectedly", unless vLLM's launcher logged
that a stop was requested (SIGINT/SIGTERM): then the engine's exit is part of
the stop. That line is INFO: with VLLM_LOGGING_LEVEL above INFO a stop whose
engine exits first may be reported as a death (exit 1 instead of 0).
"""

from __future__ import annotations

import logging

from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)

ENGINE_DEAD = "EngineDeadError"
MONITOR_LINE = "engine core exited unexpectedly"
# vLLM's launcher logs this from its SIGINT/SIGTERM handler, and only there:
# a stop was asked for. The engine core may then exit first (a Ctrl-C
# reaches the whole process group) and be reported as dead; that is no crash.
STOP_LINE = "[shutdown] API server: shutdown triggered"


class EngineDeathWatch(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self._report: str | None = None
        self._stop_requested = False

    @property
    def report(self) -> str | None:
        """vLLM's report of the engine's death, unless a stop was requested
        (decided once serving has ended: the two lines may come in any order)."""
        return None if self._stop_requested else self._report

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if STOP_LINE in message:
            self._stop_requested = True
            return
        if self._report is not None or record.levelno < logging.WARNING:
            return
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and type(exc).__name__ == ENGINE_DEAD:
            self._report = str(exc) or ENGINE_DEAD
        elif MONITOR_LINE in message:
            self._report = message

    def __enter__(self) -> "EngineDeathWatch":
        logging.getLogger("vllm").addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("vllm").removeHandler(self)
