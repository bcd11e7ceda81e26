"""The lower tiers' shared reports (vllm_uma/kv_offload/lower_tier/reports.py,
metrics.py): the names and help every tier's users see, the counts, KV
events, bad values and rate-limited warnings, the start-up line."""

from __future__ import annotations

import logging
import math

from disk_tier_kit import counters
from vllm.v1.kv_offload.base import Locality, Medium

from vllm_uma.kv_offload.disk import reports as disk_metrics
from vllm_uma.kv_offload.lower_tier.metrics import TierMetrics
from vllm_uma.kv_offload.lower_tier.reports import TierReports, Warnings
from vllm_uma.kv_offload.network import metrics as network_metrics

NAMES = TierMetrics("test", "the test tier", bad="bad_things")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage()))


def _logger() -> tuple[logging.Logger, Lines]:
    logger = logging.getLogger("test_lower_tier_reports")
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    lines = Lines()
    logger.addHandler(lines)
    return logger, lines


def _counters(reports: TierReports) -> dict:
    stats = reports.stats.take()
    assert stats is not None
    return counters(stats)


def test_every_tier_names_its_shared_counters_under_its_prefix():
    assert NAMES.written_blocks == "vllm:kv_offload_test_written_blocks"
    assert NAMES.bad_values == "vllm:kv_offload_test_bad_things"
    assert NAMES.store_failed == "vllm:kv_offload_test_store_failed_blocks"
    helps = {name: md.documentation for name, md in NAMES.moved_definitions().items()}
    assert helps == {
        "vllm:kv_offload_test_written_blocks": "KV blocks written to the test tier.",
        "vllm:kv_offload_test_written_bytes": "Payload bytes written to the test tier.",
        "vllm:kv_offload_test_read_blocks": "KV blocks restored from the test tier.",
        "vllm:kv_offload_test_read_bytes": "Payload bytes restored from the test tier.",
        "vllm:kv_offload_test_lookup_hits": "Lookups the test tier answered with a hit.",
    }


def test_the_tiers_metric_names_and_help_are_what_users_saw_before_the_skeleton():
    disk, network = disk_metrics.definitions(), network_metrics.definitions()
    assert disk["vllm:kv_offload_disk_read_bytes"].documentation == (
        "Payload bytes restored from the disk tier."
    )
    assert network["vllm:kv_offload_network_written_blocks"].documentation == (
        "KV blocks written to the network tier's KV server."
    )
    assert "vllm:kv_offload_disk_bad_blocks" in disk
    assert "vllm:kv_offload_network_bad_values" in network
    # The shared counters come first, in the order they always had.
    assert list(disk)[:5] == list(disk_metrics.NAMES.moved_definitions())
    # disk: + the two pinned gauges (pins/); network: + its four of pins (pin_refresh.py)
    assert len(disk) == 15 and len(network) == 15


def test_counts_go_under_the_tiers_names_and_reasons():
    logger, lines = _logger()
    reports = TierReports(NAMES, Medium.STORAGE, Locality.LOCAL, False, Warnings(logger))
    reports.hit()
    reports.moved(True, 2, 4096)
    reports.moved(False, 0, 0)  # nothing moved: nothing counted
    reports.store_failed("io_error")
    reports.store_skipped(3)
    reports.bad("corrupted", 2, "bad %s", "x")
    assert _counters(reports) == {
        ("vllm:kv_offload_test_lookup_hits", ()): 1,
        ("vllm:kv_offload_test_read_blocks", ()): 2,
        ("vllm:kv_offload_test_read_bytes", ()): 4096,
        ("vllm:kv_offload_test_store_failed_blocks", ("io_error",)): 1,
        ("vllm:kv_offload_test_store_skipped_blocks", ()): 3,
        ("vllm:kv_offload_test_bad_things", ("corrupted",)): 2,
    }
    assert lines.lines == [(logging.WARNING, "bad x")]
    assert reports.stats.take() is None  # an idle interval reports nothing


def test_a_warning_of_each_kind_once_or_once_an_interval():
    logger, lines = _logger()
    clock = Clock()
    once = Warnings(logger, math.inf, clock)
    per_minute = Warnings(logger, 60.0, clock)
    for _ in range(3):
        once.warn("a", "once a")
        per_minute.warn("a", "minute a")
        per_minute.warn("b", "minute b")
        clock.now += 30.0
    assert [line for _, line in lines.lines] == [
        "once a",
        "minute a",
        "minute b",
        "minute a",  # 60 s after the first
        "minute b",
    ]


def test_bad_values_warn_once_per_reason_but_count_every_one():
    logger, lines = _logger()
    reports = TierReports(NAMES, Medium.STORAGE, Locality.LOCAL, False, Warnings(logger))
    for reason in ("corrupted", "corrupted", "forged"):
        reports.bad(reason, 1, "bad block: %s", reason)
    assert [line for _, line in lines.lines] == ["bad block: corrupted", "bad block: forged"]
    counters = _counters(reports)
    assert counters[("vllm:kv_offload_test_bad_things", ("corrupted",))] == 2


def test_kv_events_carry_the_tiers_locality_and_ownership_only_when_asked_for():
    logger, _ = _logger()
    off = TierReports(NAMES, Medium.STORAGE, Locality.LOCAL, False, Warnings(logger))
    off.event([b"k"], removed=False)
    assert list(off.take_events()) == []
    on = TierReports(NAMES, Medium.STORAGE, Locality.REMOTE, True, Warnings(logger), "cache-1")
    on.event([], removed=True)  # no keys: no event
    on.event([b"k1", b"k2"], removed=True)
    (event,) = on.take_events()
    assert (event.keys, event.removed, event.locality, event.ownership) == (
        [b"k1", b"k2"],
        True,
        Locality.REMOTE,
        "cache-1",
    )
    assert list(on.take_events()) == []


def test_the_start_up_line_has_one_shape():
    logger, lines = _logger()
    reports = TierReports(NAMES, Medium.STORAGE, Locality.LOCAL, False, Warnings(logger))
    reports.started("Test KV tier", "/x", ["3 blocks", "no cap"])
    assert lines.lines == [(logging.INFO, "Test KV tier at /x: 3 blocks; no cap.")]
