"""One round trip per node: how the tier's threads talk to the KV server.

Engine-core process, on the transfer threads and the lookup thread. A
batch of keys is routed to its nodes (server_nodes.py); each node's
commands go out as one pipeline, to every node before any reply is read,
so the nodes work at the same time. A standalone KV server is one node with
one group, and a load is one MGET, as it always was. In a cluster a
multi-key command must stay within one slot, so a load is one MGET per
slot, all of a node's in its one pipeline.

A node that is down is skipped (its keys answer NoAnswer at once), one that
fails now is put down (server_link.py), and the others' replies are kept:
a gone node makes misses of its own keys only.

One deadline for the whole round trip, its sends and every socket read
(reply_bounds.py): a timeout from its start, or its job's deadline if that
comes first (a load's: the request waits for it). A node that has not sent
all its replies by a deadline of the round trip's own (a whole timeout)
is down, whether it said nothing or trickled; a round trip cut short by
its job's deadline is that job's miss (``TooSlow``), never the node's
episode. Replies are read node after node: one read after the deadline
still takes what its node sent in time, so a node is not put down for
another node's delay. A reply larger than its bounds (a value over one
block) is refused unread: the key's reply is the ``OversizedReply``, the
replies after it on that connection are ``Unread``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from valkey.exceptions import InvalidResponse, ResponseError, TimeoutError, ValkeyError

from vllm_uma.kv_offload.network.reply_bounds import Bounds, OversizedReply, bounded
from vllm_uma.kv_offload.network.server_link import (
    LINK_ERRORS,
    REDIRECTIONS,
    NoAnswer,
    NodeRefused,
    ServerLink,
)
from vllm_uma.kv_offload.network.server_nodes import Node, RefusedNode

# A reply to one SET, EXISTS or DEL: an integer, OK, or an error line.
SMALL_REPLY_BYTES = 1024
# A value's "$N\r\n" and "\r\n"; an MGET's "*N\r\n".
BULK_FRAME_BYTES = 32


class TooSlow(ValkeyError):
    """The reply of a key not read by its job's deadline; the node stays up."""


class Unread(ValkeyError):
    """The reply of a key that followed an oversized reply on the same
    connection, dropped before it was read."""


def each_key(
    link: ServerLink,
    names: Sequence[bytes],
    commands: Sequence[tuple],
    what: str,
    deadline: float | None = None,
) -> list:
    """``commands[i]`` (about ``names[i]``) on its node; per key its reply,
    an error reply as its ResponseError, a node that did not answer as a
    NoAnswer (or TooSlow, OversizedReply, Unread: above). ``deadline``:
    the job's, if it has one."""
    routes = link.route(names)
    plan = {node: [commands[i] for g in groups for i in g] for node, groups in routes.items()}
    replies = _round_trip(link, plan, what, deadline, SMALL_REPLY_BYTES, _small_replies)
    out: list = [None] * len(names)
    for node, groups in routes.items():
        for i, reply in zip((i for group in groups for i in group), replies[node], strict=True):
            out[i] = reply
    return out


def each_slot(
    link: ServerLink, names: Sequence[bytes], verb: str, what: str, deadline: float | None
) -> list[tuple[int, object]]:
    """``verb`` over each slot's names as one command (a multi-key command
    stays within one slot in a cluster; a standalone KV server is one
    slot), one round trip per node. Per command: how many names it named,
    and its reply (a small one: an integer, or an exception as in
    ``each_key``)."""
    routes = link.route(names)
    plan = {
        node: [(verb, *(names[i] for i in group)) for group in groups]
        for node, groups in routes.items()
    }
    replies = _round_trip(link, plan, what, deadline, SMALL_REPLY_BYTES, _small_replies)
    return [
        (len(group), reply)
        for node, groups in routes.items()
        for group, reply in zip(groups, replies[node], strict=True)
    ]


def mget(
    link: ServerLink, names: Sequence[bytes], what: str, value_bytes: int, deadline: float | None
) -> list:
    """The values of ``names``, none longer than ``value_bytes``: one MGET
    per slot, one round trip per node. Per key: bytes (a bytearray for a
    large value), None (absent), or an exception as in ``each_key``."""
    routes = link.route(names)
    plan = {
        node: [("MGET", *(names[i] for i in group)) for group in groups]
        for node, groups in routes.items()
    }

    def reply_bytes(commands: list[tuple]) -> int:
        keys = sum(len(command) - 1 for command in commands)
        return BULK_FRAME_BYTES * len(commands) + keys * (value_bytes + BULK_FRAME_BYTES)

    replies = _round_trip(link, plan, what, deadline, value_bytes, reply_bytes)
    out: list = [None] * len(names)
    for node, groups in routes.items():
        for group, reply in zip(groups, replies[node], strict=True):
            for i, value in zip(group, _values(reply, len(group)), strict=True):
                out[i] = value
    return out


def _small_replies(commands: list[tuple]) -> int:
    return SMALL_REPLY_BYTES * len(commands)


def _values(reply, count: int) -> list:
    """An MGET's reply, one per key."""
    if isinstance(reply, list):
        if len(reply) == count:
            return reply
        reply = InvalidResponse(f"an MGET of {count} keys answered with {len(reply)} values")
    if isinstance(reply, OversizedReply) and reply.position is not None and reply.position < count:
        unread = Unread("dropped unread after an oversized value")
        return reply.partial + [reply] + [unread] * (count - reply.position - 1)
    return [reply] * count


def _round_trip(
    link: ServerLink,
    plan: dict[Node | RefusedNode | None, list[tuple]],
    what: str,
    deadline: float | None,
    max_bulk: int,
    reply_bytes: Callable[[list[tuple]], int],
) -> dict:
    """Every node's commands as one pipeline, all sent before any reply is
    read, all under one deadline; per node, one reply per command."""
    own = time.monotonic() + link.timeout_s
    end = own if deadline is None else min(own, deadline)
    cut = end < own  # the job's deadline, not a whole timeout: nobody's episode
    budget = sum(reply_bytes(commands) for node, commands in plan.items() if node is not None)
    replies: dict = {}
    sent = []
    with bounded(Bounds(end, max_bulk, budget)):
        try:
            for node, commands in plan.items():
                if isinstance(node, RefusedNode):  # never connected to: no password goes there
                    why = f"{node.address} is not a trusted node (cluster_allowed_hosts)"
                    replies[node] = [NodeRefused(why)] * len(commands)
                elif node is None or link.skipped(node):
                    why = "no node holds the slot" if node is None else f"{node.address} is down"
                    replies[node] = [NoAnswer(why)] * len(commands)
                elif time.monotonic() >= end:  # another node's send took the time
                    replies[node] = [TooSlow("not sent by the deadline")] * len(commands)
                else:
                    connection, failure = _send(link, node, commands, what, cut)
                    if failure is None:
                        sent.append((node, connection, commands))
                    else:
                        replies[node] = [failure] * len(commands)
            while sent:
                node, connection, commands = sent.pop(0)
                replies[node] = _read(link, node, connection, commands, what, cut)
        finally:
            for node, connection, _ in sent:  # a bug of ours left replies unread
                connection.disconnect()
                node.pool.release(connection)
    return replies


def _failed(link: ServerLink, node: Node, exc: Exception, what: str, cut: bool) -> ValkeyError:
    """The reply of the keys ``exc`` left without one; the node put down
    unless the job's deadline, not the node, ended the wait."""
    if cut and isinstance(exc, TimeoutError):
        return TooSlow(f"{node.address}: no whole reply by the job's deadline")
    link.node_down(node, exc, what)
    return NoAnswer(f"{node.address} did not answer")


def _send(link: ServerLink, node: Node, commands: list[tuple], what: str, cut: bool):
    """(the connection the commands went out on, None), or (None, the
    keys' reply) if they could not be sent."""
    connection = None
    try:
        connection = node.pool.get_connection(commands[0][0])
        connection.send_packed_command(connection.pack_commands(commands))
        return connection, None
    except (*LINK_ERRORS, InvalidResponse, OversizedReply) as exc:  # OversizedReply: AUTH's
        if connection is not None:
            connection.disconnect()
            node.pool.release(connection)
        return None, _failed(link, node, exc, what, cut)


def _read(link: ServerLink, node: Node, connection, commands, what: str, cut: bool) -> list:
    """The replies of ``commands``, those read before a failure kept. A
    failure drops the connection (valkey-py's read_response does)."""
    replies: list = []
    rest: ValkeyError | None = None  # the reply of every command after a failure
    try:
        for command in commands:
            try:
                replies.append(node.client.parse_response(connection, command[0]))
            except ResponseError as exc:  # the next replies follow it
                replies.append(exc)
                if str(exc).startswith(REDIRECTIONS):
                    link.slots_moved()
    except OversizedReply as exc:  # the KV server holds a value no server of ours wrote
        replies.append(exc)
        rest = Unread("dropped unread after an oversized reply")
    except (*LINK_ERRORS, InvalidResponse) as exc:
        rest = _failed(link, node, exc, what, cut)
    finally:
        node.pool.release(connection)
    return replies + [rest] * (len(commands) - len(replies))
