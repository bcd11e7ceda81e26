"""Where the stop during start-up arms (vllm_uma/startup_stop.py): only in
vllm-uma serve's API server, inside its event loop. A stop while a real
stand-in server starts: tests/integration/test_startup_stop.py."""

from __future__ import annotations

import os
import signal

from vllm_uma import lifeline, startup_stop


def test_it_arms_only_in_vllm_uma_serves_api_server(monkeypatch):
    # (It arms inside asyncio.run, as in vLLM: tests/integration/test_startup_stop.py.)
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setenv(lifeline.API_SERVER_ENV, str(os.getpid() + 1))
    assert startup_stop.arm() is False  # a plain `vllm serve`, or the engine core
    monkeypatch.delenv(lifeline.API_SERVER_ENV)
    assert startup_stop.arm() is False  # the LLM class in a user's program
    monkeypatch.setenv(lifeline.API_SERVER_ENV, str(os.getpid()))
    assert startup_stop.arm() is False  # no event loop: headless, several API servers
    assert signal.getsignal(signal.SIGTERM) is before
