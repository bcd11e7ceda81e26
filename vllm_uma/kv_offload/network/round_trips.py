"""One round trip per node: how the tier's threads talk to the engine.

Engine-core process, on the transfer threads and the lookup thread. A
batch of keys is routed to its nodes (engine_nodes.py); each node's
commands go out as one pipeline, to every node before any reply is read,
so the nodes work at the same time. A standalone engine is one node with
one group, and a load is one MGET, as it always was. In a cluster a
multi-key command must stay within one slot, so a load is one MGET per
slot, all of a node's in its one pipeline.

A node that is down is skipped (its keys answer NoAnswer at once), one that
fails now is put down (engine_link.py), and the others' replies are kept:
a gone node makes misses of its own keys only. Replies are read until one
deadline, a timeout after the last send; a node whose turn to be read
comes after that deadline still gets a tenth of a timeout
(``LAST_READ_SHARE``), so a round trip can last up to that much longer,
and a node is not put down for another node's delay.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import valkey
from valkey.exceptions import ResponseError

from vllm_uma.kv_offload.network.engine_link import (
    LINK_ERRORS,
    REDIRECTIONS,
    EngineLink,
    NoAnswer,
    NodeRefused,
)
from vllm_uma.kv_offload.network.engine_nodes import Node, RefusedNode

# A node whose replies come after the round trip's deadline still gets
# this share of a timeout: it is not put down for another node's delay.
LAST_READ_SHARE = 0.1


def each_key(
    link: EngineLink, names: Sequence[bytes], commands: Sequence[tuple], what: str
) -> list:
    """``commands[i]`` (about ``names[i]``) on its node; per key its reply,
    an error reply as its ResponseError, a node that did not answer as
    a NoAnswer."""
    routes = link.route(names)
    plan = {node: [commands[i] for g in groups for i in g] for node, groups in routes.items()}
    replies = _round_trip(link, plan, what)
    out: list = [None] * len(names)
    for node, groups in routes.items():
        for i, reply in zip((i for group in groups for i in group), replies[node], strict=True):
            out[i] = reply
    return out


def mget(link: EngineLink, names: Sequence[bytes], what: str) -> list:
    """The values of ``names``: one MGET per slot, one round trip per node.
    Per key: bytes, None (absent), or an exception as in ``each_key``."""
    routes = link.route(names)
    plan = {
        node: [("MGET", *(names[i] for i in group)) for group in groups]
        for node, groups in routes.items()
    }
    replies = _round_trip(link, plan, what)
    out: list = [None] * len(names)
    for node, groups in routes.items():
        for group, reply in zip(groups, replies[node], strict=True):
            values = reply if isinstance(reply, list) else [reply] * len(group)
            for i, value in zip(group, values, strict=True):
                out[i] = value
    return out


def _round_trip(
    link: EngineLink, plan: dict[Node | RefusedNode | None, list[tuple]], what: str
) -> dict:
    """Every node's commands as one pipeline, all sent before any reply is
    read; per node, one reply per command."""
    replies: dict = {}
    sent = []
    try:
        for node, commands in plan.items():
            if isinstance(node, RefusedNode):  # never connected to: no password goes there
                why = f"{node.address} is not a trusted node (cluster_allowed_hosts)"
                replies[node] = [NodeRefused(why)] * len(commands)
                continue
            if node is None or link.skipped(node):
                why = "no node holds the slot" if node is None else f"{node.address} is down"
                replies[node] = [NoAnswer(why)] * len(commands)
                continue
            connection = _send(link, node, commands, what)
            if connection is None:
                replies[node] = [NoAnswer(f"{node.address} did not answer")] * len(commands)
            else:
                sent.append((node, connection, commands))
        deadline = time.monotonic() + link.timeout_s
        while sent:
            node, connection, commands = sent.pop(0)
            replies[node] = _read(link, node, connection, commands, deadline, what)
    finally:
        for node, connection, _ in sent:  # a bug of ours left replies unread
            connection.disconnect()
            node.pool.release(connection)
    return replies


def _send(link: EngineLink, node: Node, commands: list[tuple], what: str):
    connection = None
    try:
        connection = node.pool.get_connection(commands[0][0])
        connection.send_packed_command(connection.pack_commands(commands))
        return connection
    except LINK_ERRORS as exc:
        if connection is not None:
            connection.disconnect()
            node.pool.release(connection)
        link.node_down(node, exc, what)
        return None


def _read(link: EngineLink, node: Node, connection, commands, deadline: float, what: str) -> list:
    try:
        wait = max(deadline - time.monotonic(), LAST_READ_SHARE * link.timeout_s)
        if not connection.can_read(timeout=wait):
            raise valkey.exceptions.TimeoutError(f"no reply in {link.timeout_s:g} s")
        replies = []
        for command in commands:
            try:
                replies.append(node.client.parse_response(connection, command[0]))
            except ResponseError as exc:  # the next replies follow it
                replies.append(exc)
                if str(exc).startswith(REDIRECTIONS):
                    link.slots_moved()
        return replies
    except LINK_ERRORS as exc:
        connection.disconnect()  # replies may be left in it
        link.node_down(node, exc, what)
        return [NoAnswer(f"{node.address} did not answer")] * len(commands)
    finally:
        node.pool.release(connection)
