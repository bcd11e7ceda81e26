"""The disk tier's pause on a full disk (vllm_uma/kv_offload/disk/full_disk.py):
its back-off and its end, on a clock of the test's own. On a real full file
system: tests/integration/test_disk_full.py."""

from __future__ import annotations

from vllm_uma.kv_offload.disk.full_disk import FullDisk


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_pause_backs_off_and_ends_when_space_is_back():
    clock = Clock()
    full = FullDisk(first_retry_s=5, max_retry_s=20, clock=clock)
    assert not full.paused
    assert full.on_full() is True  # the pause starts: log it
    assert full.paused and full.retry_in_s == 5
    # Stores sent before the pause fail too: no longer back-off for them.
    assert full.on_full() is False and full.retry_in_s == 5
    clock.now += 5
    assert not full.paused  # time to try again
    assert full.on_full() is False and full.retry_in_s == 10  # still full
    clock.now += 10
    full.on_full()
    assert full.retry_in_s == 20
    clock.now += 20
    full.on_full()
    assert full.retry_in_s == 20  # capped
    assert full.on_space() is True and not full.paused
    assert full.on_space() is False  # already resumed
