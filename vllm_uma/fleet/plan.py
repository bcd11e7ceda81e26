"""What each process of a fleet gets: a pure function of the flags and the machine.

Runs in the ``vllm-uma fleet`` process, before anything starts, so that a
bad flag fails at once, in one line, and the plan can be unit-tested.

A server's share:
- cores: the supervisor's allowed CPUs, split into disjoint contiguous
  ranges (the first servers take the remainder), handed to vLLM CPU's own
  ``VLLM_CPU_OMP_THREADS_BIND``;
- memory: ``--gpu-memory-utilization`` (the fleet's, default 0.9) divided
  by the number of servers: together they stay within the one ceiling;
- KV events through its own relay (relay.py): the server publishes on a
  Unix socket in this user's private directory (``events_dir``, mode 0700,
  commands/kv_events_endpoint.private_dir), the router subscribes at
  <address>:out;
- its address: 127.0.0.1, or with ``--advertise ADDR`` this host's address
  on the network the other hosts share, where the server and its relay
  listen and the router reaches them (one host of several);
- with the shared disk store (one ``root_dir`` for all, its cap shared,
  disk/ledger/), the automatic host pool: a staging area for the disk tier,
  the rest of each server's budget its KV cache (kv_offload/pool_size.py);
  without a store, a host pool of ``--kv-offloading-size`` 1 GiB each;
- with ``--kv-network URL``, the network tier on the KV server (Valkey/Redis)
  every host reaches, after the disk store (or alone): what one host
  stored, another restores (kv_offload/network/). Its values are signed
  with the fleet's secret, a file every server of every host names
  (``--kv-secret-file``, commands/fleet.py creates it if missing): a server
  serves no block that a holder of the secret did not write.

The router: this fleet's own, which also routes to ``--peer`` servers of
other hosts; or, with ``--join URL``, another host's router, to which each
server is added once it is ready (vllm-router's ``/add_worker``) and from
which it is removed when it stops. This fleet's own router listens on
127.0.0.1 on a port of its own; clients reach it at ``--host``/``--port``
through the gate (gate.py), which keeps its worker administration to the
fleet's hosts.

The fleet's API key (``--api-key-file``, api_key.py): every server requires
it (``vllm-uma serve --api-key-file``), the router sends it (router_main.py,
and the gate on each request it passes), and only a holder may add or
remove the router's workers. Every command line names the file, never the key.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from vllm_uma.commands.argv import FlagValueMissing, given, take
from vllm_uma.commands.kv_events_endpoint import MAX_SOCKET_PATH
from vllm_uma.plugin.block_size import DEFAULT_BLOCK_TOKENS

DEFAULT_UTILIZATION = 0.9  # vLLM's default for --gpu-memory-utilization
DEFAULT_POOL_GIB = 1.0
# vllm-router 0.1.17 subscribes to a static source's events under the
# empty topic and drops, frame by frame, any other (src/kv_index/subscriber.rs).
EVENTS_TOPIC = ""
# Router policies that need each request's tokens (from the servers).
TOKEN_POLICIES = ("kv_aware", "cache_aware")
# Flags the fleet sets per server; given by the user they would be wrong.
OWNED_FLAGS = ("--port", "--host", "--kv-events-config", "--uds")
# The servers' key is the fleet's, from its file (api_key.py).
KEY_FLAGS = ("--api-key", "--api-key-file")
ROUTER_HOST = "127.0.0.1"  # the router's own address: only the gate faces the network


class FleetPlanError(ValueError):
    """A fleet that cannot be planned; the message has the value and the fix."""


@dataclass(frozen=True)
class MemberPlan:
    index: int  # 1-based, as in the breakdown line
    port: int
    cores: tuple[int, ...]
    events_in: str  # ipc:// the server publishes on (binds); its relay connects
    events_out_port: int  # the relay's: the router subscribes (connects) here
    argv: tuple[str, ...]  # everything after `vllm-uma serve`
    env: dict[str, str] = field(default_factory=dict)
    address: str = "127.0.0.1"  # where it and its relay listen

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @property
    def events_endpoint(self) -> str:
        """Where the router reads this server's events."""
        return f"tcp://{self.address}:{self.events_out_port}"


@dataclass(frozen=True)
class Peer:
    """A server of another host's fleet, for this fleet's router: its URL
    and, for kv_aware, where its relay publishes its KV events."""

    url: str
    events: str | None = None

    @classmethod
    def parse(cls, text: str) -> Peer:
        url, _, events = text.partition("=")
        if not re.fullmatch(r"http://[^/\s:]+:\d+", url) or (
            events and not re.fullmatch(r"tcp://[^/\s:]+:\d+", events)
        ):
            raise FleetPlanError(
                f"--peer {text!r} is invalid: it must be http://HOST:PORT of another host's "
                f"server, with =tcp://HOST:PORT of its KV events for kv_aware (the line "
                f"that host's `vllm-uma fleet --join` prints)."
            )
        return cls(url, events or None)


@dataclass(frozen=True)
class GatePlan:
    """Where clients reach this fleet's own router (gate.py)."""

    host: str
    port: int
    client_key_file: Path | None = None  # None: any client that reaches it

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class FleetPlan:
    members: tuple[MemberPlan, ...]
    router_argv: tuple[str, ...]  # after the `vllm-router` executable; () with join
    router_url: str  # this fleet's router, or the one it joins
    kv_store: Path | None
    join: bool = False  # the router is another host's: add the servers to it
    # The servers' KV block: the router and the relays must hash the same.
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    # Where this fleet adds and removes workers: its own router on loopback,
    # or the joined router's gate; "": router_url.
    router_admin_url: str = ""
    api_key_file: Path | None = None  # the fleet's API key; None: servers take none
    gate: GatePlan | None = None  # with a router of its own

    @property
    def admin_url(self) -> str:
        return self.router_admin_url or self.router_url

    @property
    def peer_lines(self) -> list[str]:
        """What another host's fleet passes as --peer to route here."""
        return [f"{m.url}={m.events_endpoint}" for m in self.members]


@dataclass(frozen=True)
class FleetRequest:
    """The user's ask, parsed (commands/fleet.py)."""

    servers: int
    model: str  # the model the servers load, resolved: the router reads its tokenizer
    serve_flags: tuple[str, ...]  # passed to every server
    host: str
    port: int
    policy: str
    kv_store: Path | None  # None: no disk tier
    events_dir: Path  # private (0700): the servers' KV event sockets
    metrics_port: int = 29000  # the router's Prometheus /metrics
    advertise: str = "127.0.0.1"  # where the servers and relays listen
    join: str | None = None  # another host's router (http://HOST:PORT); None: our own
    peers: tuple[Peer, ...] = ()  # other hosts' servers our router also routes to
    network_url: str | None = None  # the network tier's KV server (--kv-network)
    # The file of the MAC keys every host's servers sign with (--kv-secret-file).
    network_secret_file: Path | None = None
    # The fleet's API key (--api-key-file); None only where nothing leaves
    # loopback and no server should take a key (the fleet benchmark).
    api_key_file: Path | None = None
    client_key_file: Path | None = None  # --client-key-file: the router's clients need a key


def cores_for(servers: int, allowed: list[int]) -> list[tuple[int, ...]]:
    """Disjoint contiguous ranges of ``allowed``, one per server."""
    if servers < 1:
        raise FleetPlanError(f"--servers {servers} is invalid: a fleet needs at least 1 server.")
    if len(allowed) < servers:
        raise FleetPlanError(
            f"--servers {servers} needs at least {servers} CPU cores, one per server, "
            f"and this process may use {len(allowed)} ({cpu_ranges(allowed)}). Lower "
            f"--servers to {len(allowed)} or less."
        )
    cpus = sorted(allowed)
    base, extra = divmod(len(cpus), servers)
    shares, start = [], 0
    for i in range(servers):
        size = base + (1 if i < extra else 0)
        shares.append(tuple(cpus[start : start + size]))
        start += size
    return shares


def cpu_ranges(cpus: list[int] | tuple[int, ...]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``, the form VLLM_CPU_OMP_THREADS_BIND takes."""
    out, cpus = [], sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def _take(flags: list[str], name: str) -> str | None:
    try:
        return take(flags, name)
    except FlagValueMissing as exc:
        raise FleetPlanError(str(exc)) from None


def plan_fleet(ask: FleetRequest, allowed_cpus: list[int], free_port) -> FleetPlan:
    tokens = block_tokens(ask)
    flags, utilization, additional = _shared_flags(ask)
    shares = cores_for(ask.servers, allowed_cpus)
    members = [
        _member_plan(i, cores, ask, flags, utilization, additional, free_port)
        for i, cores in enumerate(shares, start=1)
    ]
    if ask.join is not None:
        if ask.peers:
            raise FleetPlanError(
                "--peer and --join: a fleet that joins another host's router has no router "
                "of its own to give peers to; pass the --peer lines to the joined host's fleet."
            )
        if ask.client_key_file is not None:
            raise FleetPlanError(
                "--client-key-file and --join: the router's clients are the joined host's; "
                "pass --client-key-file to its fleet."
            )
        url = ask.join.rstrip("/")
        return FleetPlan(tuple(members), (), url, ask.kv_store, True, tokens,
                         api_key_file=ask.api_key_file)  # fmt: skip
    router_port = free_port()
    router = _router_argv(ask, members, tokens, router_port)
    gate = GatePlan(ask.host, ask.port, ask.client_key_file)
    return FleetPlan(
        tuple(members), tuple(router), gate.url, ask.kv_store, False, tokens,
        router_admin_url=f"http://{ROUTER_HOST}:{router_port}",
        api_key_file=ask.api_key_file, gate=gate,
    )  # fmt: skip


def block_tokens(ask: FleetRequest) -> int:
    """The servers' KV block in tokens: their --block-size, else vllm-uma's
    default (plugin/block_size.py)."""
    value = take(list(ask.serve_flags), "--block-size")
    if value is None:
        return DEFAULT_BLOCK_TOKENS
    try:
        tokens = int(value)
    except ValueError:
        tokens = 0
    if tokens <= 0 or tokens % 32:
        raise FleetPlanError(
            f"--block-size {value!r}: vLLM CPU's attention takes a positive multiple of 32 "
            f"tokens. Pass one (e.g. --block-size {DEFAULT_BLOCK_TOKENS}), or leave it out "
            f"for {DEFAULT_BLOCK_TOKENS}."
        )
    return tokens


def _shared_flags(ask: FleetRequest) -> tuple[list[str], float, dict]:
    """The serve flags every server gets, the fleet's utilization and the
    user's --additional-config (both split per server by _member_plan)."""
    flags = list(ask.serve_flags)
    for owned in OWNED_FLAGS:
        if given(flags, owned):
            raise FleetPlanError(
                f"{owned} is set by `vllm-uma fleet` for each server; remove it "
                f"(the router's address is --host/--port of the fleet)."
            )
    for key_flag in KEY_FLAGS:
        if given(flags, key_flag):
            raise FleetPlanError(
                f"{key_flag}: the servers of a fleet require the fleet's API key, in the "
                f"fleet's own --api-key-file (the same file on every host), and the router "
                f"sends it; remove {key_flag}. For the router's clients: --client-key-file."
            )
    utilization = _utilization(_take(flags, "--gpu-memory-utilization"))
    additional = _additional_config(_take(flags, "--additional-config"))
    if ask.policy in TOKEN_POLICIES and not given(flags, "--enable-scale-out"):
        # The router tokenizes each request through the server's
        # /v1/completions/render (and the chat one); vLLM answers 403
        # there unless scale-out endpoints are on, and both prefix policies
        # then route by load alone ("missing_tokens" in the router's metrics).
        flags.append("--enable-scale-out")
    return flags + _offloading_flags(ask, flags), utilization, additional


def _offloading_flags(ask: FleetRequest, flags: list[str]) -> list[str]:
    """A host pool and, with --kv-store, the shared disk store, unless the
    user configured offloading; their KV events self-describing."""
    added: list[str] = []
    user_pool = given(flags, "--kv-offloading-size")
    lower = ask.kv_store is not None or ask.network_url is not None
    if not user_pool and not given(flags, "--kv-transfer-config") and not lower:
        added += ["--kv-offloading-size", str(DEFAULT_POOL_GIB)]
    if ask.kv_store is not None and given(flags, "--kv-transfer-config"):
        raise FleetPlanError(
            "--kv-transfer-config and the fleet's shared disk store (--kv-store) "
            "both configure offloading: remove one (--kv-store none turns the "
            "store off)."
        )
    if ask.network_url is not None and given(flags, "--kv-transfer-config"):
        raise FleetPlanError(
            "--kv-transfer-config and --kv-network both configure offloading: remove one "
            '(or put {"type": "valkey", "url": ..., "secret_file": ...} in your secondary_tiers).'
        )
    if not given(flags, "--kv-transfer-config"):
        # Pool and disk events with their tokens and parent: without them
        # the router can place L1 blocks only (router_admission.py).
        extra: dict = {"self_describing_kv_events": True}
        config: dict = {"kv_connector_extra_config": extra}
        tiers = []
        if ask.kv_store is not None:
            tiers.append({"type": "fs", "root_dir": str(ask.kv_store)})
        if ask.network_url is not None:  # after the disk: a local hit is never fetched
            tiers.append(_network_tier(ask))
        if tiers:
            extra["secondary_tiers"] = tiers
            if not user_pool:
                # The connector named without a size: the pool is sized as
                # the lower tiers' staging area, L1 gets the rest.
                config.update(kv_connector="OffloadingConnector", kv_role="kv_both")
        added += ["--kv-transfer-config", json.dumps(config)]
    return added


def _network_tier(ask: FleetRequest) -> dict:
    """The network tier every server gets: the KV server and the file of the
    fleet's secret (its path on the command line, never a key)."""
    if ask.network_secret_file is None:
        raise FleetPlanError(
            "--kv-network needs the fleet's secret to sign the values: pass --kv-secret-file "
            "PATH (the same file on every host)."
        )
    return {"type": "valkey", "url": ask.network_url, "secret_file": str(ask.network_secret_file)}


def _member_plan(
    index: int,
    cores: tuple[int, ...],
    ask: FleetRequest,
    flags: list[str],
    utilization: float,
    additional: dict,
    free_port,
) -> MemberPlan:
    """Server ``index``'s ports, its share of the memory and its cores, its
    fleet identity and where it publishes its KV events."""
    port, events_out = free_port(), free_port()
    # Named by the router's address, which no other live fleet holds (and a
    # fleet started again on it reuses the names instead of adding files).
    if ask.join is None:
        socket = ask.events_dir / f"fleet-{ask.host}-{ask.port}-server-{index}.sock"
    else:
        # No router here holds an address to name the fleet by: the
        # server's own port, which no live server on this host shares.
        socket = ask.events_dir / f"fleet-joined-{ask.advertise}-{port}.sock"
    if len(str(socket)) > MAX_SOCKET_PATH:
        raise FleetPlanError(
            f"the KV events socket {socket} is {len(str(socket))} characters long, over "
            f"the {MAX_SOCKET_PATH} a Unix socket allows. Set a shorter VLLM_UMA_CACHE_DIR "
            f"(or XDG_RUNTIME_DIR)."
        )
    events_in = f"ipc://{socket}"
    uma = {**additional.get("vllm_uma", {}), "fleet_member": index, "fleet_size": ask.servers}
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        # vLLM binds an ipc:// endpoint; only this user may reach it.
        "endpoint": events_in,
        "topic": EVENTS_TOPIC,
    }
    argv = [
        *flags,  # the model as the user named it (or none: the default)
        "--gpu-memory-utilization",
        f"{utilization / ask.servers:.4f}",
        "--additional-config",
        json.dumps({**additional, "vllm_uma": uma}),
        "--kv-events-config",
        json.dumps(events),
    ]
    if ask.api_key_file is not None:  # its path: the key is read by the server
        argv += ["--api-key-file", str(ask.api_key_file)]
    env = {"VLLM_CPU_OMP_THREADS_BIND": cpu_ranges(cores)}
    return MemberPlan(index, port, cores, events_in, events_out, tuple(argv), env, ask.advertise)


# vllm-router's health checks, as every fleet sets them: a dead server
# leaves the rotation within seconds, not vllm-router's default minute.
ROUTER_HEALTH_FLAGS = ("--health-check-interval-secs", "5", "--health-failure-threshold", "2")


def _router_argv(
    ask: FleetRequest, members: list[MemberPlan], block_tokens: int, port: int
) -> list[str]:
    argv = [
        "--host", ROUTER_HOST,
        "--port", str(port),
        "--policy", ask.policy,
        "--worker-urls", *[m.url for m in members], *[p.url for p in ask.peers],
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(ask.metrics_port),
        *ROUTER_HEALTH_FLAGS,
    ]  # fmt: skip
    if ask.policy == "kv_aware":
        for m in members:
            argv += ["--kv-event-source", f"{m.url}={m.events_endpoint}"]
        for p in ask.peers:  # a peer without its events is routed by load alone
            if p.events is not None:
                argv += ["--kv-event-source", f"{p.url}={p.events}"]
        argv += ["--kv-event-block-size", str(block_tokens), "--kv-event-model", ask.model]
    return argv


def _utilization(value: str | None) -> float:
    if value is None:
        return DEFAULT_UTILIZATION
    try:
        util = float(value)
    except ValueError:
        util = -1.0
    if not 0 < util <= 1:
        raise FleetPlanError(
            f"--gpu-memory-utilization {value} is invalid: it must be in (0, 1], the "
            f"fraction of RAM the whole fleet may use (each server gets its share)."
        )
    return util


def _additional_config(value: str | None) -> dict:
    if value is None:
        return {}
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise FleetPlanError(f"--additional-config {value!r} is not JSON ({exc}).") from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("vllm_uma", {}), dict):
        raise FleetPlanError(
            f'--additional-config {value!r} must be a JSON object (with "vllm_uma" an '
            f"object if present)."
        )
    return parsed
