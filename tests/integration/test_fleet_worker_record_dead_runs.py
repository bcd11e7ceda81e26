"""The records a dead run of a joined fleet left (vllm_uma/fleet/worker_record.py),
its pid taken from a real process that has exited: leftovers, oldest
first; other routers' and other hosts' records and damaged files left
alone. Written and read back in one process:
tests/unit/test_fleet_worker_record.py."""

from __future__ import annotations

import json
import os
import subprocess

import psutil

from vllm_uma.fleet.worker_record import WorkerRecord, this_host

ROUTER = "http://10.0.0.1:8000"


def gone_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()  # reaped: the pid names no process now
    return child.pid


def left_by(directory, pid, started, urls, router=ROUTER, name=None, host=None):
    path = directory / (name or f"joined-10.0.0.1-8000-{pid}-{os.urandom(2).hex()}.json")
    host = this_host() if host is None else host
    record = {"router": router, "host": host, "pid": pid, "started": started, "urls": urls}
    path.write_text(json.dumps(record))
    return path


def test_the_records_of_dead_runs_are_leftovers_oldest_first(tmp_path):
    newer = left_by(tmp_path, gone_pid(), 2000.0, ["http://10.0.0.5:2"])
    older = left_by(tmp_path, gone_pid(), 1000.0, ["http://10.0.0.5:1"])
    # A pid that a younger process reuses is not the run that wrote the record.
    reused = left_by(tmp_path, os.getpid(), psutil.Process().create_time() - 60, ["u"])
    live = left_by(tmp_path, os.getpid(), psutil.Process().create_time(), ["v"])
    found = WorkerRecord(tmp_path, ROUTER).leftovers()
    assert [r.path for r in found] == [older, newer, reused]
    assert live.exists()


def test_other_routers_records_and_damaged_files_are_left_alone(tmp_path):
    dead = gone_pid()
    left_by(tmp_path, dead, 1.0, ["a"], router="http://10.0.0.2:8000",
            name=f"joined-10.0.0.2-8000-{dead}-x.json")  # fmt: skip
    # The same file name for another router's URL (names are sanitized).
    left_by(tmp_path, dead, 1.0, ["b"], router="http://10.0.0.1:8000/other")
    (tmp_path / "joined-10.0.0.1-8000-1-cut.json").write_text('{"router": ')
    left_by(tmp_path, dead, 1.0, "http://10.0.0.5:1")  # urls not a list
    (tmp_path / "joined-10.0.0.1-8000-2-link.json").symlink_to(
        left_by(tmp_path, dead, 1.0, ["c"], name="elsewhere.json")
    )
    # Another host's, in a cache directory they share: its pid means nothing here.
    left_by(tmp_path, dead, 1.0, ["d"], host="another machine")
    os.mkfifo(tmp_path / "joined-10.0.0.1-8000-3-fifo.json")  # never waited on
    (tmp_path / "joined-10.0.0.1-8000-4-x.json.4-ab.tmp").write_text("{}")  # a write in flight
    assert WorkerRecord(tmp_path, ROUTER).leftovers() == []
