"""EngineDeathWatch notices vLLM's own reports of a dead engine core, only those."""

from __future__ import annotations

import logging

from vllm.v1.engine.exceptions import EngineDeadError

from vllm_uma.commands.engine_watch import EngineDeathWatch


def test_an_engine_dead_error_is_noticed():
    logger = logging.getLogger("vllm.v1.engine.async_llm")
    with EngineDeathWatch() as watch:
        try:
            raise EngineDeadError()
        except EngineDeadError:
            logger.exception("AsyncLLM output_handler failed.")
    assert watch.report is not None


def test_the_monitors_line_is_noticed():
    with EngineDeathWatch() as watch:
        logging.getLogger("vllm.v1.engine.core_client").warning(
            "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup"
        )
    assert "exited unexpectedly" in watch.report


def test_other_errors_and_a_clean_stop_are_not_a_death():
    with EngineDeathWatch() as watch:
        logging.getLogger("vllm.entrypoints").error("a request failed: bad JSON")
        logging.getLogger("vllm.entrypoints").info("Shutting down")
    assert watch.report is None
    assert watch not in logging.getLogger("vllm").handlers


def test_a_requested_stop_is_not_a_death_whatever_the_order(monkeypatch):
    # A server's vllm logger passes INFO (VLLM_LOGGING_LEVEL's default).
    monkeypatch.setattr(logging.getLogger("vllm"), "level", logging.INFO)
    for death_first in (True, False):
        with EngineDeathWatch() as watch:
            died = lambda: logging.getLogger("vllm.v1.engine.core_client").warning(  # noqa: E731
                "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup"
            )
            stop = lambda: logging.getLogger("vllm.entrypoints.launchers").info(  # noqa: E731
                "[shutdown] API server: shutdown triggered"
            )
            for log in (died, stop) if death_first else (stop, died):
                log()
        assert watch.report is None
