"""The variables that tie a child to its parent (vllm_uma/lifeline.py), read
in this process. Children that stop when their parent is killed, with real
processes: tests/integration/test_lifeline.py."""

from __future__ import annotations

import os

from vllm_uma import lifeline


def test_the_api_server_itself_does_not_follow_itself(monkeypatch):
    monkeypatch.setenv(lifeline.API_SERVER_ENV, str(os.getpid()))
    assert not lifeline.follow_api_server()


def test_a_supervisor_names_itself():
    assert lifeline.supervised_env() == {lifeline.SUPERVISOR_ENV: str(os.getpid())}
