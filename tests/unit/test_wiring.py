"""Wiring the memory a model load creates (vllm_uma/plugin/wiring.py). As
root, with a real unprivileged process and a real locked range:
tests/integration/test_wiring_root.py."""

import errno
import mmap

import pytest

from vllm_uma.plugin import wiring

MAPS = """\
55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0          [heap]
7f0000000000-7f0000100000 rw-p 00000000 00:00 0
7f0000100000-7f0000200000 r-xp 00000000 fd:01 123        /usr/lib/libc.so.6
7f0000200000-7f0000201000 rw-p 00100000 fd:01 123        /usr/lib/libc.so.6
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0          [stack]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0  [vsyscall]
"""


def test_writable_ranges_skip_code_stack_and_kernel_pages():
    assert wiring.writable_ranges(MAPS) == [
        (0x55D0C0000000, 0x55D0C0021000),
        (0x7F0000000000, 0x7F0000100000),
        (0x7F0000200000, 0x7F0000201000),
    ]


@pytest.mark.parametrize(
    "after, before, expected",
    [
        ([(0, 100)], [], [(0, 100)]),
        ([(0, 100)], [(0, 100)], []),
        ([(0, 100)], [(0, 40)], [(40, 100)]),  # a heap that grew
        ([(0, 100)], [(20, 30), (50, 60)], [(0, 20), (30, 50), (60, 100)]),
        ([(0, 10), (20, 30)], [(5, 25)], [(0, 5), (25, 30)]),
        ([(10, 20)], [(0, 5), (30, 40)], [(10, 20)]),
    ],
)
def test_subtract_ranges(after, before, expected):
    assert wiring.subtract_ranges(after, before) == expected


def test_wires_a_new_mapping_and_counts_it_with_the_kernel():
    before = wiring.read_maps()
    size = 8 << 20
    region = mmap.mmap(-1, size)
    region.write(b"x" * size)  # make it resident: ONFAULT locks resident pages
    try:
        result = wiring.wire_new_memory(before, expected_bytes=size)
        if result.error:  # not root, or a tiny limit: the warning path
            assert "ulimit -l" in result.error
        else:
            assert result.wired_bytes >= size
    finally:
        region.close()


def wire_a_new_region_with_enomem(monkeypatch, limit_applies: bool, expected: int):
    """wire_new_memory over one new mapping, with every mlock failing ENOMEM."""
    monkeypatch.setattr(wiring, "mlock_range", lambda start, end: errno.ENOMEM)
    monkeypatch.setattr(wiring, "memlock_limit_applies", lambda: limit_applies)
    before = wiring.read_maps()
    region = mmap.mmap(-1, 1 << 20)
    try:
        return wiring.wire_new_memory(before, expected_bytes=expected)
    finally:
        region.close()


def test_a_refused_lock_explains_how_to_raise_the_limit(monkeypatch):
    result = wire_a_new_region_with_enomem(monkeypatch, limit_applies=True, expected=2 << 30)
    assert result.wired_bytes == 0
    assert "ulimit -l unlimited" in result.error
    assert "LimitMEMLOCK" in result.error
    assert "--no-wire-weights" in result.error
    assert "2.0 GiB" in result.error


def test_enomem_without_a_limit_means_the_range_vanished(monkeypatch):
    result = wire_a_new_region_with_enomem(monkeypatch, limit_applies=False, expected=1 << 20)
    assert result.error is None
