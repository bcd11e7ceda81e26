"""The kernel's memory-pressure signals, read into one decision.

Runs on the release thread in the engine-core process (scheduler.py), every
half second: reading three small files costs microseconds.

Signals, all the kernel's own:
- ``MemAvailable`` (/proc/meminfo): below ``low_fraction`` of MemTotal the
  machine is close to reclaiming or OOM-killing. This is the signal that
  sees a hog coming before anything stalls (without swap, PSI rises only
  once reclaim already hurts).
- Linux PSI (/proc/pressure/memory): the share of the time since the last
  reading in which some task waited for memory, from the cumulative
  ``some total=`` (microseconds). At ``psi_some_share`` percent or more,
  memory is short even if MemAvailable looks fine (e.g. page cache
  thrashing). Not ``avg10``: it decays over about 10 s, so one stall would
  read as pressure for twenty more ticks, each giving back more.
- The cgroup's limit: with cgroup v2, a rise of ``memory.events``' high,
  max or oom counters, or ``memory.current`` within ``low_fraction`` of
  ``memory.max``; with cgroup v1, ``memory.usage_in_bytes`` within
  ``low_fraction`` of ``memory.limit_in_bytes``. Usage counts without the
  inactive page cache (``memory.stat``'s ``inactive_file``, v1
  ``total_inactive_file``), as kubelet's working set does: the kernel
  fills a cgroup with cache up to its limit and takes it back first. A
  container's limit can bite long before the machine's RAM runs out.

``shortfall`` is how much to give back: enough to bring the tightest signal
back above its low-water mark plus a margin of ``margin_fraction``, or, when
only PSI or an event counter speaks, one margin's worth per step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30
LOW_FRACTION = 0.10  # MemAvailable (or cgroup headroom) below 10% of the total
MARGIN_FRACTION = 0.05  # give back up to 5% of the total above the mark
PSI_SOME_SHARE = 10.0  # percent of the time since the last reading some task stalled


@dataclass(frozen=True)
class Pressure:
    under: bool
    reason: str  # what spoke, with its figure, for the log
    shortfall: int  # bytes to give back


NO_PRESSURE = Pressure(False, "", 0)


def read_meminfo(path: Path) -> dict[str, int]:
    values = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return values


def read_psi_some_total(path: Path) -> int | None:
    """Microseconds some task has stalled on memory since boot."""
    try:
        text = path.read_text()
    except OSError:
        return None  # no PSI in this kernel (or not allowed to read it)
    for line in text.splitlines():
        if line.startswith("some "):
            for field in line.split()[1:]:
                key, _, value = field.partition("=")
                if key == "total":
                    return int(value)
    return None


def _inactive_file(stat: Path, key: str) -> int:
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" means no limit


def _events_count(path: Path) -> int | None:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    counts = dict(line.split() for line in lines if len(line.split()) == 2)
    return sum(int(counts.get(k, 0)) for k in ("high", "max", "oom", "oom_kill"))


def cgroup_dirs(proc_cgroup: Path, root: Path) -> tuple[Path | None, Path | None]:
    """This process's cgroup v2 directory and v1 memory directory, if found."""
    v2 = v1 = None
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "" and (root / rel / "memory.max").exists():
            v2 = root / rel
        elif "memory" in controllers.split(","):
            for candidate in (root / "memory" / rel, root / "memory"):
                if (candidate / "memory.limit_in_bytes").exists():
                    v1 = candidate
                    break
    return v2, v1


class PressureWatch:
    def __init__(
        self,
        proc: Path = Path("/proc"),
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        low_fraction: float = LOW_FRACTION,
        margin_fraction: float = MARGIN_FRACTION,
        psi_some_share: float = PSI_SOME_SHARE,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._meminfo = proc / "meminfo"
        self._psi_path = proc / "pressure" / "memory"
        self._v2, self._v1 = cgroup_dirs(proc / "self" / "cgroup", cgroup_root)
        self.low_fraction = low_fraction
        self.margin_fraction = margin_fraction
        self.psi_threshold = psi_some_share
        self._clock = clock
        self._events = self._cgroup_events()
        self._psi = (clock(), read_psi_some_total(self._psi_path))

    def _cgroup_events(self) -> int | None:
        return None if self._v2 is None else _events_count(self._v2 / "memory.events")

    def _cgroup_usage(self) -> tuple[int, int] | None:
        """(used, limit) of this cgroup, None without a limit."""
        if self._v2 is not None:
            used, limit = (_read_int(self._v2 / n) for n in ("memory.current", "memory.max"))
            cache = _inactive_file(self._v2 / "memory.stat", "inactive_file")
        elif self._v1 is not None:
            used, limit = (
                _read_int(self._v1 / n) for n in ("memory.usage_in_bytes", "memory.limit_in_bytes")
            )
            cache = _inactive_file(self._v1 / "memory.stat", "total_inactive_file")
        else:
            return None
        if used is None or limit is None or limit >= 1 << 60:  # v1's "no limit"
            return None
        return max(0, used - cache), limit

    def _psi_share(self) -> float | None:
        """Percent of the time since the last reading some task stalled."""
        now, total = self._clock(), read_psi_some_total(self._psi_path)
        (then, before), self._psi = self._psi, (now, total)
        if total is None or before is None or now <= then:
            return None
        return 100.0 * (total - before) / ((now - then) * 1e6)

    def room(self) -> int:
        """Bytes that could still become resident before MemAvailable (or
        the cgroup's headroom) falls within the give-back margin of the
        pressure mark: what the warm reserve may fault in without bringing
        the pressure pass back (warm_reserve.py). Negative when short."""
        meminfo = read_meminfo(self._meminfo)
        total, available = meminfo["MemTotal"], meminfo["MemAvailable"]
        share = self.low_fraction + self.margin_fraction
        room = available - int(total * share)
        usage = self._cgroup_usage()
        if usage is not None:
            used, limit = usage
            room = min(room, limit - used - int(limit * share))
        return room

    def read(self) -> Pressure:
        meminfo = read_meminfo(self._meminfo)
        total, available = meminfo["MemTotal"], meminfo["MemAvailable"]
        found: list[Pressure] = []
        low = int(total * self.low_fraction)
        if available < low:
            shortfall = low - available + int(total * self.margin_fraction)
            reason = f"MemAvailable {available / GiB:.2f} GiB < {low / GiB:.2f} GiB"
            found.append(Pressure(True, reason, shortfall))
        usage = self._cgroup_usage()
        if usage is not None:
            used, limit = usage
            headroom, low_cg = limit - used, int(limit * self.low_fraction)
            if headroom < low_cg:
                shortfall = low_cg - headroom + int(limit * self.margin_fraction)
                reason = f"cgroup headroom {headroom / GiB:.2f} GiB of {limit / GiB:.2f} GiB"
                found.append(Pressure(True, reason, shortfall))
        step = int(total * self.margin_fraction)
        events = self._cgroup_events()
        if events is not None and self._events is not None and events > self._events:
            found.append(Pressure(True, f"cgroup memory.events +{events - self._events}", step))
        self._events = events
        share = self._psi_share()
        if share is not None and share >= self.psi_threshold:
            found.append(Pressure(True, f"PSI memory some {share:.1f}% of the last reading", step))
        if not found:
            return NO_PRESSURE
        return Pressure(
            True,
            "; ".join(p.reason for p in found),
            max(p.shortfall for p in found),
        )
