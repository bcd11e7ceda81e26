"""Server's ports (vllm_uma/server_process.py), in this process: free_port()
stays out of the kernel's ephemeral range and never repeats, and a taken
port is refused with the text Server looks for. A server started on a taken
port, and its stop: tests/integration/test_server_process.py."""

from __future__ import annotations

import socket

import pytest

from vllm_uma import server_process
from vllm_uma.server_process import free_port


def listener() -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", free_port()))
    holder.listen()
    return holder


def test_free_port_is_outside_the_ephemeral_range_and_never_repeats():
    low, high = server_process._ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(not low <= port <= high for port in ports)


def test_the_refusal_text_is_the_one_preflight_prints():
    from vllm_uma.commands.preflight import PreflightError, check_port

    taken = listener()
    try:
        with pytest.raises(PreflightError, match=server_process.PORT_TAKEN):
            check_port("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()
