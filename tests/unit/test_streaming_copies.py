"""GLIBC_TUNABLES for the engine core's KV copies (vllm_uma/kv_offload/streaming_copies.py)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from vllm_uma.kv_offload.streaming_copies import (
    ENV,
    SETTING,
    THRESHOLD_BYTES,
    TUNABLE,
    applies,
    stream_engine_copies,
)

X86 = {"machine": "x86_64", "libc": "glibc"}
# Debian's dynamic loader on x86-64: it lists the tunables as glibc parsed them.
LOADER = Path("/lib64/ld-linux-x86-64.so.2")


def test_set_when_absent_and_said():
    env: dict[str, str] = {}
    note = stream_engine_copies(env, **X86)
    assert env == {ENV: SETTING}
    assert note is not None and "streaming stores above 192 KiB" in note and SETTING in note


def test_added_to_the_users_other_tunables():
    env = {ENV: "glibc.malloc.arena_max=2"}
    assert stream_engine_copies(env, **X86) is not None
    assert env[ENV] == f"glibc.malloc.arena_max=2:{SETTING}"


def test_the_users_own_threshold_is_kept_and_said():
    env = {ENV: f"{TUNABLE}=0x100000:glibc.malloc.arena_max=2"}
    note = stream_engine_copies(env, **X86)
    assert env[ENV] == f"{TUNABLE}=0x100000:glibc.malloc.arena_max=2"
    assert note is not None and f"{TUNABLE}=0x100000, kept" in note and SETTING in note


def test_an_item_without_a_value_is_not_the_users_value():
    env = {ENV: TUNABLE}
    assert stream_engine_copies(env, **X86) is not None
    assert env[ENV] == f"{TUNABLE}:{SETTING}"


def test_inherited_from_the_api_server_it_is_left_as_is_silently():
    env = {ENV: f"glibc.malloc.arena_max=2:{SETTING}"}
    assert stream_engine_copies(env, **X86) is None
    assert env[ENV] == f"glibc.malloc.arena_max=2:{SETTING}"


@pytest.mark.parametrize(
    "machine, libc", [("aarch64", "glibc"), ("x86_64", "musl"), ("x86_64", "")]
)
def test_nothing_is_set_where_the_tunable_does_not_exist(machine, libc):
    env = {ENV: "glibc.malloc.arena_max=2"}
    assert not applies(machine, libc)
    assert stream_engine_copies(env, machine=machine, libc=libc) is None
    assert env == {ENV: "glibc.malloc.arena_max=2"}


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
