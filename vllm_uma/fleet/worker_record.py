"""The workers a fleet added to another host's router, kept on disk, so that
the next start takes back what a killed run left there.

A fleet that joins a router (``--join``) adds each server with vllm-router's
``/add_worker`` and removes it with ``/remove_worker`` when it stops. A run
that never stops cleanly (SIGKILL, the OOM killer, the host's power) leaves
its URLs in the router: vllm-router 0.1.17 keeps a worker that fails its
health checks listed, and routes to it again as soon as anything answers on
that port, which any process of that host may bind (measured: a process
that bound a killed worker's port got the next client's request).

Why a record rather than stable ports: vllm-router refuses ``/add_worker``
of a URL it lists ("already exists", status 400), so a run on the same
ports must remove its predecessor's URLs first anyway; and a record also
covers a run started with other flags (fewer servers, another address),
where stable ports would leave the old URLs behind. Its ports stay drawn
at each start (server_process.free_port), clear of the kernel's ephemeral
range.

The record: one JSON file per run and router, written atomically before the
first ``/add_worker`` (a run killed at any point after leaves its URLs
recorded), removed after a clean stop removed every one of them (kept when
the router did not answer: the next start retries). Named by the router's
address, this process's pid and a random token; it holds the router's URL,
the pid and the process's start time, which tell a dead run (the pid gone,
or reused by a younger process) from a live one: another live fleet's URLs
are never taken back. And this machine's identity (``/etc/machine-id``, else
the host name): a cache directory shared by several hosts (a home on NFS)
holds other hosts' records, whose pids mean nothing here; they are theirs.

Where: ``<cache root>/fleet`` (``~/.cache/vllm-uma/fleet``), mode 0700,
never followed through a symlink; not the runtime directory, which a reboot
empties while the router, on another host, still lists the URLs.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import psutil

from vllm_uma.kv_offload.disk.layout import read_json_file, write_private_json

SUFFIX = ".json"
MACHINE_ID = Path("/etc/machine-id")
# A pid reused by another process starts later than the recorded one: a
# second of tolerance absorbs how /proc's start time is rounded.
START_TOLERANCE_S = 1.0


def record_dir(cache_root: Path) -> Path:
    """This user's directory of fleet records, created 0700 and checked."""
    from vllm_uma.commands.kv_events_endpoint import checked_private_dir

    return checked_private_dir(
        cache_root / "fleet",
        "the records of the workers a fleet added to a router must be this user's only",
        "or give the fleet another VLLM_UMA_CACHE_DIR",
    )


def this_host() -> str:
    """What tells this machine from others sharing the cache directory."""
    try:
        machine = MACHINE_ID.read_text().strip()
    except OSError:
        machine = ""
    return machine or f"hostname:{socket.gethostname()}"


@dataclass(frozen=True)
class Record:
    path: Path
    router: str
    host: str  # this_host() of the run that wrote it
    pid: int
    started: float  # the process's start time (psutil), seconds since the epoch
    urls: tuple[str, ...]

    def owner_alive(self) -> bool:
        """Whether the run that wrote this record still runs."""
        try:
            return abs(psutil.Process(self.pid).create_time() - self.started) < START_TOLERANCE_S
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return False
        except psutil.Error:
            return True  # alive, but not ours to read: never take its URLs


def _prefix(router_url: str) -> str:
    """``joined-<host>-<port>-``: the records of one router."""
    parts = urllib.parse.urlsplit(router_url)
    host = re.sub(r"[^A-Za-z0-9.-]", "_", parts.hostname or "")
    return f"joined-{host}-{parts.port}-"


class WorkerRecord:
    """This run's record of the workers it added to ``router_url``."""

    def __init__(self, directory: Path, router_url: str):
        self.directory = directory
        self.router = router_url.rstrip("/")
        name = f"{_prefix(self.router)}{os.getpid()}-{os.urandom(4).hex()}{SUFFIX}"
        self.path = directory / name

    def write(self, urls: list[str]) -> None:
        write_private_json(
            self.path,
            {
                "router": self.router,
                "host": this_host(),
                "pid": os.getpid(),
                "started": psutil.Process().create_time(),
                "urls": sorted(urls),
            },
        )

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def leftovers(self) -> list[Record]:
        """Records of this host's runs for this router that are gone, oldest first."""
        found = []
        prefix, host = _prefix(self.router), this_host()
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return []
        for name in names:
            if not (name.startswith(prefix) and name.endswith(SUFFIX)):
                continue  # another router's, or a temp file of a write in flight
            record = read_record(self.directory / name)
            if record is None or (record.router, record.host) != (self.router, host):
                continue
            if not record.owner_alive():
                found.append(record)
        return sorted(found, key=lambda r: r.started)


def read_record(path: Path) -> Record | None:
    """The record at ``path``; None for anything else (not a regular file,
    not a record): a damaged record is skipped, never a reason to stop."""
    data = read_json_file(path)
    try:
        if not isinstance(data["urls"], list):
            return None
        urls = tuple(str(url) for url in data["urls"])
        return Record(
            path,
            str(data["router"]),
            str(data["host"]),
            int(data["pid"]),
            float(data["started"]),
            urls,
        )
    except (ValueError, KeyError, TypeError):
        return None
