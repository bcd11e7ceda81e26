"""GLIBC_TUNABLES for the engine core's KV copies (vllm_uma/kv_offload/streaming_copies.py).
As a new process's loader parses it: tests/integration/test_streaming_copies_loader.py."""

from __future__ import annotations

import pytest

from vllm_uma.kv_offload.streaming_copies import (
    ENV,
    SETTING,
    TUNABLE,
    applies,
    stream_engine_copies,
)

X86 = {"machine": "x86_64", "libc": "glibc"}


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
