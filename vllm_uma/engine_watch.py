"""Notice that vLLM's engine core died, so ``vllm-uma serve`` exits non-zero.

When the engine-core process dies while serving (a crash in a kernel, the
OOM killer), vLLM's API server logs it, fails the requests in flight with
HTTP 500, shuts itself down and returns normally: ``vllm serve`` then exits
with status 0, as if stopped on purpose. A supervisor (systemd, a fleet
manager) must see a failure to restart the server, so this handler, on the
``vllm`` logger of the API-server process, remembers vLLM's own report of
the death: an EngineDeadError logged with its traceback, or the engine
monitor's "engine core exited unexpectedly".
"""

from __future__ import annotations

import logging

ENGINE_DEAD = "EngineDeadError"
MONITOR_LINE = "engine core exited unexpectedly"


class EngineDeathWatch(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.report: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.report is not None:
            return
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and type(exc).__name__ == ENGINE_DEAD:
            self.report = str(exc) or ENGINE_DEAD
        elif MONITOR_LINE in record.getMessage():
            self.report = record.getMessage()

    def __enter__(self) -> "EngineDeathWatch":
        logging.getLogger("vllm").addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("vllm").removeHandler(self)
