"""Scheduler side: the host pool's cache policy, skipping pinned blocks.

vLLM's CPU offloading manager evicts through its cache policy's public
``evict(n, protected)`` (in prepare_store, when the pool is full), and the
memory release through the same call (pool_manager.release_idle). The
policy classes here are vLLM's LRU and ARC with one change: a block a live
pin holds counts as protected. They are registered with vLLM's public
``CachePolicyFactory.register_cache_policy`` under names of their own, and
the tiered spec asks for them in place of "lru" / "arc" when a disk tier
(where pins live) is on (spec.py); ``set_pinned`` gives the policy the disk
tier's ``is_pinned`` (the feed thread's set, replaced whole: read here on
the scheduler thread without a lock).

A policy of the user's own (cache_policy_module_path) is kept as it is:
pins then hold in the disk tier only, and the start-up log says so.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm.v1.kv_offload.base import OffloadKey
from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

from vllm_uma.plugin import vllm_contract

vllm_contract.require(__name__)

IsPinned = Callable[[OffloadKey], bool]


class _Protected(set):
    """vLLM's protected set, and every pinned key besides (``in`` only:
    what vLLM's policies ask of it)."""

    def __init__(self, keys, pinned: IsPinned):
        super().__init__(keys)
        self._pinned = pinned

    def __contains__(self, key) -> bool:
        return set.__contains__(self, key) or self._pinned(key)


class PinAware:
    """Mixed in before a vLLM policy: its evict skips pinned keys."""

    _pinned: IsPinned | None = None

    def set_pinned(self, pinned: IsPinned) -> None:
        self._pinned = pinned

    def evict(self, n: int, protected: set[OffloadKey]):
        if self._pinned is not None:
            protected = _Protected(protected, self._pinned)
        return super().evict(n, protected)


class PinnedLRU(PinAware, LRUCachePolicy):
    """vLLM's LRU policy, pins kept."""


class PinnedARC(PinAware, ARCCachePolicy):
    """vLLM's ARC policy, pins kept."""


# vLLM's built-in policy name -> ours.
_OURS = {"lru": ("vllm-uma-pinned-lru", "PinnedLRU"), "arc": ("vllm-uma-pinned-arc", "PinnedARC")}


def pin_aware_policy(name: str, module_path: str | None) -> str | None:
    """The name of our pin-aware twin of vLLM's policy ``name`` (registered
    with vLLM's factory on first use); None for a user's own policy."""
    if module_path is not None or name not in _OURS:
        return None
    ours, class_name = _OURS[name]
    try:
        CachePolicyFactory.register_cache_policy(ours, __name__, class_name)
    except ValueError:
        pass  # registered by an earlier engine of this process
    return ours
