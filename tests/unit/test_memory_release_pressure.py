"""The kernel's memory-pressure signals (vllm_uma/memory_release/pressure.py),
read from fake /proc and /sys/fs/cgroup trees in tmp_path.

The machine in every test has 10,000,000 kB of RAM: 10% is 1,024,000,000
bytes (the low-water mark), 5% 512,000,000 (the margin, and the step given
back when only PSI or a cgroup event counter speaks).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_uma.memory_release.pressure import NO_PRESSURE, Pressure, PressureWatch

KB = 1024
TOTAL_KB = 10_000_000
LOW, STEP = 1_024_000_000, 512_000_000
MiB = 1 << 20
V1_NO_LIMIT = 9223372036854771712  # what cgroup v1 shows without a limit


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Machine:
    def __init__(self, root: Path):
        self.clock = Clock()
        self.proc, self.cgroup = root / "proc", root / "cgroup"
        (self.proc / "self").mkdir(parents=True)
        self.cgroup.mkdir()
        self.meminfo(available_kb=TOTAL_KB // 2)

    def meminfo(self, available_kb: int) -> None:
        (self.proc / "meminfo").write_text(
            f"MemTotal:       {TOTAL_KB} kB\n"
            "MemFree:          100000 kB\n"
            f"MemAvailable:   {available_kb} kB\n"
            "HugePages_Total:       0\n"
        )

    def psi(self, some_total_us: int) -> None:
        # avg10 high on purpose: the watch must read the total, not avg10.
        (self.proc / "pressure").mkdir(exist_ok=True)
        (self.proc / "pressure" / "memory").write_text(
            f"some avg10=99.00 avg60=1.00 avg300=0.50 total={some_total_us}\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
        )

    def stall(self, watch: PressureWatch, seconds: float, stalled_us: int) -> Pressure:
        """``seconds`` pass, ``stalled_us`` of them with some task stalled."""
        self.clock.t += seconds
        self.psi(self._psi_total() + stalled_us)
        return watch.read()

    def _psi_total(self) -> int:
        text = (self.proc / "pressure" / "memory").read_text()
        return int(text.split("total=")[1].split()[0])

    def cgroup_v2(self, path: str, current: int, limit: str, events: int = 0) -> Path:
        (self.proc / "self" / "cgroup").write_text(f"0::/{path}\n")
        group = self.cgroup / path
        group.mkdir(parents=True, exist_ok=True)
        (group / "memory.current").write_text(f"{current}\n")
        (group / "memory.max").write_text(f"{limit}\n")
        self.events(group, events)
        return group

    def events(self, group: Path, high: int, oom_kill: int = 0) -> None:
        (group / "memory.events").write_text(
            f"low 7\nhigh {high}\nmax 0\noom 0\noom_kill {oom_kill}\noom_group_kill 0\n"
        )

    def cgroup_v1(self, path: str, usage: int, limit: int, in_root: bool = False) -> None:
        (self.proc / "self" / "cgroup").write_text(
            f"12:cpu,cpuacct:/{path}\n4:memory:/{path}\n1:name=systemd:/{path}\n"
        )
        group = self.cgroup / "memory" if in_root else self.cgroup / "memory" / path
        group.mkdir(parents=True, exist_ok=True)
        (group / "memory.usage_in_bytes").write_text(f"{usage}\n")
        (group / "memory.limit_in_bytes").write_text(f"{limit}\n")

    def watch(self) -> PressureWatch:
        return PressureWatch(proc=self.proc, cgroup_root=self.cgroup, clock=self.clock)


@pytest.fixture
def machine(tmp_path) -> Machine:
    return Machine(tmp_path)


def test_nothing_speaks_no_pressure(machine):
    assert machine.watch().read() == NO_PRESSURE
    assert NO_PRESSURE == Pressure(False, "", 0)


def test_mem_available_below_ten_percent_is_pressure_with_its_shortfall(machine):
    watch = machine.watch()
    machine.meminfo(available_kb=500_000)  # 512,000,000 bytes
    pressure = watch.read()
    assert pressure.under
    assert pressure.shortfall == LOW - 500_000 * KB + STEP == 1_024_000_000
    assert pressure.reason == "MemAvailable 0.48 GiB < 0.95 GiB"


def test_mem_available_at_ten_percent_is_not_pressure(machine):
    machine.meminfo(available_kb=TOTAL_KB // 10)
    assert machine.watch().read() == NO_PRESSURE
    machine.meminfo(available_kb=TOTAL_KB // 10 - 1)
    assert machine.watch().read().shortfall == KB + STEP


@pytest.mark.parametrize("stalled_ms, under", [(49, False), (50, True), (300, True)])
def test_psi_stall_share_since_the_last_reading_at_the_threshold_is_pressure(
    machine, stalled_ms, under
):
    machine.psi(1_000_000)
    watch = machine.watch()  # the first reading: no interval yet
    pressure = machine.stall(watch, 0.5, stalled_ms * 1000)
    if under:
        share = stalled_ms / 5  # of 500 ms, in percent
        assert pressure == Pressure(True, f"PSI memory some {share:.1f}% of the last reading", STEP)
    else:
        assert pressure == NO_PRESSURE


def test_an_old_stall_is_not_pressure_again(machine):
    # avg10 would still say 99% for seconds; the total has not moved.
    machine.psi(0)
    watch = machine.watch()
    assert machine.stall(watch, 0.5, 200_000).under
    assert machine.stall(watch, 0.5, 0) == NO_PRESSURE


def test_missing_psi_is_ignored(machine):
    assert not (machine.proc / "pressure").exists()
    assert machine.watch().read() == NO_PRESSURE


def test_the_tightest_signal_sets_the_shortfall_and_all_are_named(machine):
    machine.psi(0)
    watch = machine.watch()
    machine.meminfo(available_kb=900_000)
    pressure = machine.stall(watch, 1.0, 500_000)
    assert pressure.shortfall == LOW - 900_000 * KB + STEP  # above PSI's one step
    assert pressure.reason == (
        "MemAvailable 0.86 GiB < 0.95 GiB; PSI memory some 50.0% of the last reading"
    )


def test_cgroup_v2_event_counters_speak_only_when_they_rise(machine):
    group = machine.cgroup_v2("system.slice/vllm.service", current=MiB, limit="max", events=3)
    watch = machine.watch()
    assert watch.read() == NO_PRESSURE  # 3 high events before we started
    machine.events(group, high=5, oom_kill=1)
    assert watch.read() == Pressure(True, "cgroup memory.events +3", STEP)
    assert watch.read() == NO_PRESSURE  # no new event since the last read
    machine.events(group, high=6, oom_kill=1)
    assert watch.read() == Pressure(True, "cgroup memory.events +1", STEP)


def test_cgroup_v2_max_means_no_limit(machine):
    machine.cgroup_v2("app", current=TOTAL_KB * KB, limit="max")
    assert machine.watch().read() == NO_PRESSURE


def test_cgroup_v2_usage_near_its_limit_is_pressure(machine):
    group = machine.cgroup_v2("app", current=950 * MiB, limit=str(1000 * MiB))
    watch = machine.watch()
    # Headroom 50 MiB < 100 MiB: back above the mark plus a 50 MiB margin.
    assert watch.read() == Pressure(
        True, "cgroup headroom 0.05 GiB of 0.98 GiB", 100 * MiB - 50 * MiB + 50 * MiB
    )
    (group / "memory.current").write_text(f"{900 * MiB}\n")
    assert watch.read() == NO_PRESSURE  # exactly 10% headroom


def test_cgroup_v2_root_without_memory_max_is_no_cgroup(machine):
    (machine.proc / "self" / "cgroup").write_text("0::/\n")
    (machine.cgroup / "memory.current").write_text(f"{TOTAL_KB * KB}\n")
    assert machine.watch().read() == NO_PRESSURE


@pytest.mark.parametrize("in_root", [False, True], ids=["host-path", "container-root"])
def test_cgroup_v1_usage_near_its_limit_is_pressure(machine, in_root):
    machine.cgroup_v1("docker/abc", usage=970 * MiB, limit=1000 * MiB, in_root=in_root)
    pressure = machine.watch().read()
    assert pressure.under
    assert pressure.shortfall == 100 * MiB - 30 * MiB + 50 * MiB
    assert pressure.reason.startswith("cgroup headroom 0.03 GiB")


def test_cgroup_v1_no_limit_value_is_ignored(machine):
    machine.cgroup_v1("docker/abc", usage=TOTAL_KB * KB, limit=V1_NO_LIMIT)
    watch = machine.watch()
    assert watch.read() == NO_PRESSURE
    assert watch._cgroup_usage() is None  # not a limit at all, not a far one
    machine.cgroup_v1("docker/abc", usage=TOTAL_KB * KB, limit=2 * TOTAL_KB * KB)
    assert watch._cgroup_usage() == (TOTAL_KB * KB, 2 * TOTAL_KB * KB)


def test_no_proc_self_cgroup_is_no_cgroup(machine):
    assert not (machine.proc / "self" / "cgroup").exists()
    assert machine.watch().read() == NO_PRESSURE


def test_the_thresholds_are_settings(machine):
    machine.psi(0)
    machine.meminfo(available_kb=TOTAL_KB // 4)
    watch = PressureWatch(
        proc=machine.proc,
        cgroup_root=machine.cgroup,
        low_fraction=0.3,
        margin_fraction=0.1,
        psi_some_share=5.0,
        clock=machine.clock,
    )
    pressure = machine.stall(watch, 1.0, 50_000)
    total = TOTAL_KB * KB
    assert pressure.shortfall == int(total * 0.3) - total // 4 + int(total * 0.1)
    assert "PSI memory some 5.0% of the last reading" in pressure.reason


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_inactive_page_cache_is_not_cgroup_usage(machine, version):
    # 970 of 1000 MiB used, 200 MiB of it inactive file cache the kernel
    # takes back first: 770 MiB of working set, no pressure.
    if version == "v2":
        group = machine.cgroup_v2("app", current=970 * MiB, limit=str(1000 * MiB))
        key = "inactive_file"
    else:
        machine.cgroup_v1("docker/abc", usage=970 * MiB, limit=1000 * MiB)
        group, key = machine.cgroup / "memory" / "docker/abc", "total_inactive_file"
    watch = machine.watch()
    assert watch.read().under
    (group / "memory.stat").write_text(f"anon 1000\n{key} {200 * MiB}\nactive_file 5\n")
    assert watch.read() == NO_PRESSURE
    assert watch._cgroup_usage() == (770 * MiB, 1000 * MiB)


def test_room_is_what_may_become_resident_before_the_margin_above_the_mark(machine):
    # Mark 10% of the total, margin 5%: room is MemAvailable above 15%.
    machine.meminfo(available_kb=TOTAL_KB // 2)
    total = TOTAL_KB * 1024
    assert machine.watch().room() == TOTAL_KB // 2 * 1024 - int(total * 0.15)
    machine.meminfo(available_kb=TOTAL_KB // 10)
    assert machine.watch().room() < 0  # at the mark: no room


def test_room_is_the_tighter_of_the_machine_and_the_cgroup(machine):
    machine.cgroup_v2("app", current=700 * MiB, limit=str(1000 * MiB))
    # cgroup: 300 MiB headroom, 150 MiB of it below the mark and margin.
    assert machine.watch().room() == 150 * MiB
