"""How a link is shaped: a rate and a one-way delay, applied with tc on both
ends of a host's veth (the host's egress and the switch's egress towards it),
so that each direction sees the same link.

The rate is a token bucket filter (``tbf``). It is in every kernel that has
traffic control at all (this machine's has tbf and htb, and no netem), and a
single tbf per direction is all a point-to-point link needs: htb's classes
would only matter to share one link among flows by rule. The delay needs
``netem`` (CONFIG_NET_SCH_NETEM); where the kernel has it, netem is the root
qdisc and the tbf its child, the recipe of tc-netem(8), so the rate is the
same tbf with or without delay. Where it has not, asking for a delay is
refused with the fix rather than silently giving a link without one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tools.hosts.ipcmd import HostsError, run

# The kernel here ticks at 250 Hz; a bucket smaller than a tick's worth of
# bytes cannot reach the rate. 64 KiB also holds one whole GSO packet, which
# tbf would otherwise split into segments on the way through.
_MIN_BURST_BYTES = 64 * 1024
_TICK_S = 1 / 250
# How long a packet may wait in tbf's queue before it is dropped: enough for
# TCP to fill the link, short enough not to add bufferbloat to the RTT.
_QUEUE_LATENCY_MS = 25


@dataclass(frozen=True)
class LinkShape:
    """One link's shape, the same in both directions. ``None``: unshaped."""

    rate_mbit: float | None = None
    delay_ms: float = 0.0

    def __post_init__(self):
        if self.rate_mbit is not None and not (
            math.isfinite(self.rate_mbit) and self.rate_mbit > 0
        ):
            raise HostsError(
                f"rate_mbit={self.rate_mbit} is invalid: it must be a number > 0 "
                "(Mbit/s, each direction). Leave it out for an unshaped link."
            )
        if not (math.isfinite(self.delay_ms) and self.delay_ms >= 0):
            raise HostsError(
                f"delay_ms={self.delay_ms} is invalid: it must be >= 0 (one-way, "
                "milliseconds; the round trip is twice it). Use 0 for none."
            )

    @property
    def shaped(self) -> bool:
        return self.rate_mbit is not None or self.delay_ms > 0

    def describe(self) -> str:
        rate = f"{self.rate_mbit:g} Mbit/s" if self.rate_mbit is not None else "unlimited"
        return f"{rate}, {self.delay_ms:g} ms one way"


def _tbf_args(rate_mbit: float) -> list[str]:
    rate_bytes = rate_mbit * 1e6 / 8
    burst = max(_MIN_BURST_BYTES, int(rate_bytes * _TICK_S))
    return ["tbf", "rate", f"{rate_mbit:g}mbit", "burst", str(burst),
            "latency", f"{_QUEUE_LATENCY_MS}ms"]  # fmt: skip


def apply(netns: str, dev: str, shape: LinkShape) -> None:
    """Shape the egress of ``dev`` in ``netns`` (one direction of the link)."""
    if not shape.shaped:
        return
    tc = ["tc", "-n", netns, "qdisc", "replace", "dev", dev]
    if shape.delay_ms == 0:
        run(*tc, "root", "handle", "1:", *_tbf_args(shape.rate_mbit))
        return
    done = run(*tc, "root", "handle", "1:", "netem", "delay", f"{shape.delay_ms:g}ms",
               "limit", "10000", check=False)  # fmt: skip
    if done.returncode != 0:
        if "unknown" in done.stderr.lower():
            raise HostsError(
                f"delay_ms={shape.delay_ms:g} needs tc's netem, which this kernel lacks "
                "(CONFIG_NET_SCH_NETEM is not set; tbf, the rate limit, is there). "
                "Set delay_ms=0 (--delay-ms 0) for a rate-only link, or run on a kernel "
                "with netem (`modprobe sch_netem` where it is a module)."
            )
        raise HostsError(f"netem on {netns}/{dev} failed: {done.stderr.strip()}")
    if shape.rate_mbit is not None:
        run("tc", "-n", netns, "qdisc", "replace", "dev", dev, "parent", "1:1", "handle", "10:",
            *_tbf_args(shape.rate_mbit))  # fmt: skip
