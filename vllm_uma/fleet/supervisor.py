"""Run a fleet plan: start, watch, restart, stop (the `vllm-uma fleet` process).

Order matters:
- the gate where clients will reach the router first (router_front.py: a
  busy --port fails in a second), then the servers, all at once (each waits
  for its own health), then the router behind the gate, so that its first
  routing decisions see every server and its KV event subscriptions find
  the sockets bound;
- a server whose start fails or hangs is stopped before anything else
  happens: nothing stays on its port;
- a server that exits while the fleet runs is reported in one line and
  started again with the same port, cores and flags (the router's health
  checks take it out of rotation meanwhile, and its retries send its
  requests to the others); one that keeps dying (RESTART_LIMIT exits of
  that server within RESTART_WINDOW_S; each server has its own count)
  stops the fleet rather than loop;
- the router exiting stops the fleet: clients have no address any more;
- a fleet that joined another host's router (--join) has none of its own:
  every JOIN_CHECK_S it asks that router which workers it lists and adds
  back those of its servers it forgot (a router restarted since). That
  router outlives us: our servers' URLs are recorded on disk before the
  first is added, and a start first removes those of runs that died
  without stopping (worker_record.py);
- stop (Ctrl-C, SIGTERM, or one of the above): the gate and the router
  first (no new requests), then the servers in parallel, each given the
  time its disk tier needs to drain (server_process.Server.stop: SIGTERM,
  30 s, SIGKILL).
  A stop asked for while servers start is honoured within a second or two:
  the starts are abandoned and those servers stopped.
- if this process dies without stopping (SIGKILL), its servers and the
  router stop by themselves (vllm_uma/lifeline.py).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
import zmq

from vllm_uma.fleet.api_key import ApiKeyError, ApiKeys, read_key_file
from vllm_uma.fleet.plan import FleetPlan, MemberPlan
from vllm_uma.fleet.relay import EventRelay
from vllm_uma.fleet.router_front import RouterFront, RouterFrontError
from vllm_uma.fleet.worker_record import WorkerRecord
from vllm_uma.log import get_logger
from vllm_uma.server_process import READY_TIMEOUT_S, Server, StartCancelled

logger = get_logger(__name__)

RESTART_LIMIT = 3
RESTART_WINDOW_S = 300.0
POLL_S = 1.0
# How often a fleet that joined another host's router checks that the router
# still lists its servers: vllm-router keeps workers added by /add_worker in
# memory only, so a restarted router has forgotten them.
JOIN_CHECK_S = 10.0
# vllm-router 0.1.17's answer (400) to /add_worker of a URL it lists.
LISTED = "already exists"


class FleetError(RuntimeError):
    """The fleet cannot run on; the message says which process and why."""


class Fleet:
    def __init__(
        self,
        plan: FleetPlan,
        serve_exe: list[str],
        log_dir: Path,
        record_dir: Path | None = None,
    ):
        """``record_dir``: where a fleet that joins a router records the URLs
        it adds there (worker_record.record_dir); None: nothing recorded."""
        self.plan = plan
        self._serve_exe = serve_exe
        self._log_dir = log_dir
        self.servers: dict[int, Server] = {}
        self.front: RouterFront | None = None  # a router of its own, and its gate
        self._keys: ApiKeys | None = None  # the fleet's API key, read at start
        self.ready_timeout = READY_TIMEOUT_S
        self._exits: dict[int, deque[float]] = {m.index: deque() for m in plan.members}
        self._stop = threading.Event()
        self._stopped = False
        self._join_lost = False  # the joined router did not answer its last check
        self._zmq = zmq.Context()
        self._relays: list[EventRelay] = []
        self._record = None
        if plan.join and record_dir is not None:
            self._record = WorkerRecord(record_dir, plan.router_url)
        self._leftovers = False  # a dead run's URLs the router did not all take back

    @property
    def router(self) -> subprocess.Popen | None:
        return None if self.front is None else self.front.proc

    def _start_member(self, member: MemberPlan) -> Server:
        log = self._log_dir / f"server-{member.index}.log"
        server = Server(
            self._serve_exe,
            list(member.argv),
            log,
            env=member.env,
            port=member.port,
            host=member.address,
        )
        logger.info(
            "fleet: server %d of %d starting on %s, cores %s (log %s)",
            member.index, len(self.plan.members), member.url, member.env.get(
                "VLLM_CPU_OMP_THREADS_BIND"), log,
        )  # fmt: skip
        try:
            return server.wait_ready(self.ready_timeout, cancel=self._stop)
        except BaseException:
            server.stop()  # a start that failed, hung or was cancelled: nothing left
            raise

    def start(self) -> None:
        if self.plan.api_key_file is not None:
            try:
                self._keys = read_key_file(self.plan.api_key_file)
            except ApiKeyError as exc:
                raise FleetError(str(exc)) from None
        if not self.plan.join:  # where clients will reach it, bound first
            self.front = RouterFront(self.plan, self._keys, self._log_dir)
            self._front(self.front.open_gate)
        if self._record is not None:
            self._take_back_leftovers()
            try:
                self._record.write([m.url for m in self.plan.members])
            except OSError as exc:
                raise FleetError(
                    f"cannot record the servers this fleet adds to the router at "
                    f"{self.plan.router_url} in {self._record.path} ({exc.strerror}): after "
                    f"a crash the next start could not remove them. Free space there, or set "
                    f"VLLM_UMA_CACHE_DIR to a writable directory."
                ) from None
        # Relays first: each connects to its server's socket once that is bound.
        for member in self.plan.members:
            self._relays.append(
                EventRelay(
                    self._zmq,
                    member.events_in,
                    member.events_out_port,
                    self.plan.block_tokens,
                    f"server {member.index}",
                    member.address,
                )
            )
        with ThreadPoolExecutor(max_workers=len(self.plan.members)) as pool:
            futures = {m.index: pool.submit(self._start_member, m) for m in self.plan.members}
            failed = []
            for index, future in futures.items():
                try:
                    self.servers[index] = future.result()
                except StartCancelled:
                    pass
                except Exception as exc:  # noqa: BLE001 - reported with the server's log
                    failed.append(f"server {index}: {exc}")
        if failed:
            raise FleetError("a server did not start:\n" + "\n".join(failed))
        if self._stop.is_set():
            return
        if self.plan.join:
            self._join()
        else:
            self._front(self.front.start, len(self.servers), self._stop)

    @staticmethod
    def _front(step, *args) -> None:
        try:
            step(*args)
        except RouterFrontError as exc:
            raise FleetError(str(exc)) from None

    def _join(self) -> None:
        """Add every server to the router of another host (--join); each
        line also says what that host's fleet passes as --peer for KV-aware
        routing, since vllm-router reads KV events only from the sources it
        started with."""
        for index, server in sorted(self.servers.items()):
            if not self._router_admin("add_worker", server.url):
                raise FleetError(
                    f"the router at {self.plan.router_url} did not take server {index} "
                    f"({server.url}); is it running, and can it reach this host's address?"
                )
        for line in self.plan.peer_lines:
            logger.info(
                "fleet: joined vllm-router at %s; for kv_aware, start that router's fleet "
                "with --peer %s",
                self.plan.router_url,
                line,
            )

    def watch(self) -> int:
        """Until stopped: restart servers that exit, and (a fleet that joined
        another host's router) add its servers again to a router that
        forgot them. Returns the exit status."""
        next_join_check = time.monotonic() + JOIN_CHECK_S
        while not self._stop.wait(POLL_S):
            if self.plan.join and time.monotonic() >= next_join_check:
                self.rejoin()
                next_join_check = time.monotonic() + JOIN_CHECK_S
            if self.router is not None and self.router.poll() is not None:
                logger.error(
                    "fleet: vllm-router exited with %d; stopping the fleet.",
                    self.router.returncode,
                )
                return 1
            for member in self.plan.members:
                server = self.servers.get(member.index)
                if server is not None and server.proc.poll() is not None:
                    if not self._restart(member, server.proc.returncode):
                        return 1
        return 0

    def _restart(self, member: MemberPlan, status: int) -> bool:
        exits = self._exits[member.index]
        if not keep_restarting(exits, time.monotonic()):
            logger.error(
                "fleet: server %d exited %d times in %.0f s (status %d last); stopping "
                "the fleet. See %s.",
                member.index, len(exits), RESTART_WINDOW_S, status, self._log_dir,
            )  # fmt: skip
            return False
        logger.warning(
            "fleet: server %d exited with %d; the router serves from the others while "
            "it restarts (log %s).",
            member.index, status, self.servers[member.index].log_path,
        )  # fmt: skip
        # Out of the router's rotation at once: its health checks would take
        # seconds, and its retries go back to the worker the policy chose.
        self._router_admin("remove_worker", member.url)
        self.servers[member.index].stop()  # its children, and the log file
        try:
            self.servers[member.index] = self._start_member(member)
        except StartCancelled:
            return True  # the fleet is stopping
        except Exception as exc:  # noqa: BLE001 - the next poll tries again
            logger.error("fleet: server %d did not come back: %s", member.index, exc)
            return True
        self._router_admin("add_worker", member.url)
        logger.info("fleet: server %d is back in the router's rotation.", member.index)
        return True

    def rejoin(self) -> None:
        """Add again those of our running servers the joined router does not
        list (GET /list_workers): it restarted, or dropped them. A router
        that does not answer is said once until it answers again."""
        try:
            reply = requests.get(
                f"{self.plan.admin_url}/list_workers", headers=self._auth(), timeout=5
            )
            reply.raise_for_status()
            # Compared without a trailing slash, in case the router keeps one.
            listed = {url.rstrip("/") for url in reply.json()["urls"]}
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            if not self._join_lost:
                logger.warning(
                    "fleet: the router at %s does not list its workers (%s); its servers "
                    "stay as they are, asked again every %.0f s.",
                    self.plan.router_url, exc, JOIN_CHECK_S,
                )  # fmt: skip
            self._join_lost = True
            return
        self._join_lost = False
        if self._leftovers:
            self._take_back_leftovers()
        for index, server in sorted(self.servers.items()):
            if server.url.rstrip("/") in listed or server.proc.poll() is not None:
                continue  # listed, or exited: the restart adds it when it is back
            if self._router_admin("add_worker", server.url):
                logger.warning(
                    "fleet: the router at %s no longer listed server %d (%s): it restarted "
                    "or dropped it; added it again.",
                    self.plan.router_url, index, server.url,
                )  # fmt: skip

    def _take_back_leftovers(self) -> None:
        """Remove from the joined router the URLs of this host's runs that
        died without stopping (worker_record.py). At the first URL the
        router does not take, the rest waits (each try may cost a timeout):
        the records are kept and tried again once it lists its workers."""
        self._leftovers = False
        for record in self._record.leftovers():
            for url in record.urls:
                if not self._router_admin("remove_worker", url):
                    self._leftovers = True
                    return
            record.path.unlink(missing_ok=True)
            logger.warning(
                "fleet: removed from the router at %s the %d server(s) a run that did not "
                "stop (pid %d) left there: %s.",
                self.plan.router_url, len(record.urls), record.pid, ", ".join(record.urls),
            )  # fmt: skip

    def _auth(self) -> dict[str, str]:
        return {} if self._keys is None else self._keys.header()

    def _router_admin(self, action: str, url: str) -> bool:
        """vllm-router's own worker management (POST /remove_worker,
        /add_worker), on this fleet's router (its loopback port) or through
        the gate of the one it joined, with the fleet's API key."""
        try:
            reply = requests.post(
                f"{self.plan.admin_url}/{action}",
                params={"url": url},
                headers=self._auth(),
                timeout=10,
            )
            if action == "add_worker" and reply.status_code == 400 and LISTED in reply.text:
                return True  # the URL is listed: what was asked
            if reply.status_code == 403:
                logger.error(
                    "fleet: the router at %s refused %s %s: it takes worker changes only with "
                    "the fleet's API key, and this host's (--api-key-file %s) is not its: copy "
                    "the router host's file here.",
                    self.plan.router_url, action, url, self.plan.api_key_file,
                )  # fmt: skip
                return False
            reply.raise_for_status()
        except requests.RequestException as exc:
            logger.warning("fleet: vllm-router %s %s failed: %s", action, url, exc)
            return False
        return True

    def request_stop(self, *_) -> None:
        self._stop.set()

    def stop(self) -> None:
        """Everything this fleet started, once; one server that will not stop
        does not keep the others running."""
        if self._stopped:
            return
        self._stopped = True
        if self.plan.join:  # out of the other host's rotation before we go
            removed = [self._router_admin("remove_worker", m.url) for m in self.plan.members]
            if self._record is not None and all(removed):
                self._record.remove()
            elif self._record is not None:
                logger.warning(
                    "fleet: kept %s: the next fleet started here for that router removes "
                    "the servers it still lists.",
                    self._record.path,
                )
        if self.front is not None:
            self.front.stop()
        with ThreadPoolExecutor(max_workers=max(1, len(self.servers))) as pool:
            list(pool.map(_stop_server, self.servers.items()))
        for relay in self._relays:
            relay.stop()
        self._zmq.term()
        for member in self.plan.members:  # a killed server leaves its socket file
            Path(member.events_in.removeprefix("ipc://")).unlink(missing_ok=True)
        logger.info("fleet: stopped.")


def keep_restarting(exits: deque[float], now: float) -> bool:
    """Record one server's exit at ``now``; False once it has exited more
    than RESTART_LIMIT times within RESTART_WINDOW_S."""
    exits.append(now)
    while exits and now - exits[0] > RESTART_WINDOW_S:
        exits.popleft()
    return len(exits) <= RESTART_LIMIT


def _stop_server(item: tuple[int, Server]) -> None:
    index, server = item
    try:
        server.stop()
    except Exception as exc:  # noqa: BLE001 - the others are stopped regardless
        logger.error("fleet: server %d did not stop cleanly: %s", index, exc)
