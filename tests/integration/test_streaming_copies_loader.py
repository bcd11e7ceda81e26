"""GLIBC_TUNABLES for the engine core's KV copies (vllm_uma/kv_offload/streaming_copies.py),
as the dynamic loader of a new process parses them. The setting itself:
tests/unit/test_streaming_copies.py."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from vllm_uma.kv_offload.streaming_copies import (
    ENV,
    THRESHOLD_BYTES,
    TUNABLE,
    applies,
    stream_engine_copies,
)

# Debian's dynamic loader on x86-64: it lists the tunables as glibc parsed them.
LOADER = Path("/lib64/ld-linux-x86-64.so.2")


@pytest.mark.skipif(not (applies() and LOADER.exists()), reason="glibc on x86-64 only")
def test_glibc_takes_the_value():
    """The loader of a new process parses the variable as set: a name or a
    value glibc refuses (below its floor of 0x4040) would list the default."""
    env = dict(os.environ)
    env.pop(ENV, None)
    stream_engine_copies(env)
    listed = subprocess.run(
        [str(LOADER), "--list-tunables"], env=env, capture_output=True, text=True, check=True
    ).stdout
    match = re.search(rf"^{re.escape(TUNABLE)}: (0x[0-9a-f]+)", listed, re.M)
    assert match is not None, listed
    assert int(match.group(1), 16) == THRESHOLD_BYTES
