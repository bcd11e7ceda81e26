"""Which keys in the KV server are ours, told by their names alone, without vLLM.

Other applications may share the KV server, so the network tier and
``vllm-uma kv-store URL`` read or delete only names of these two shapes::

    vllm-uma:kv:<namespace, 32 hex>:{<block hash hex>}:<group hex>   a block (value_format.py)
    vllm-uma:kv:<namespace, 32 hex>:namespace                        its descriptor

A name under our prefix of any other shape is not ours, and is left alone.
No vLLM import here: the command answers in a third of a second (vLLM's
import alone costs three seconds here).
"""

from __future__ import annotations

import re

NAME_PREFIX = "vllm-uma:kv:"
DESCRIPTOR = "namespace"

_OURS = re.compile(
    rb"vllm-uma:kv:(?P<ns>[0-9a-f]{32}):(?:\{[0-9a-f]+\}:[0-9a-f]+|(?P<descriptor>namespace))"
)


def descriptor_name(namespace: bytes) -> bytes:
    return f"{NAME_PREFIX}{namespace.hex()}:{DESCRIPTOR}".encode()


def match_ours(namespace: str | None = None) -> bytes:
    """A SCAN MATCH pattern for our names (of ``namespace`` only, if given).
    It is a first filter: ``namespace_of`` decides."""
    return f"{NAME_PREFIX}{namespace or '*'}:*".encode()


def match_blocks(namespace: bytes) -> bytes:
    """A SCAN MATCH pattern for the blocks of ``namespace`` ('{' is no glob)."""
    return f"{NAME_PREFIX}{namespace.hex()}:{{*".encode()


def namespace_of(name: bytes) -> tuple[str, bool] | None:
    """(namespace hex, is a block) for a name of ours; None for any other."""
    match = _OURS.fullmatch(name)
    if match is None:
        return None
    return match["ns"].decode(), match["descriptor"] is None


def is_namespace_id(text: str) -> bool:
    """A namespace id as `ls` shows it: 32 lower-case hex digits."""
    return re.fullmatch("[0-9a-f]{32}", text) is not None
