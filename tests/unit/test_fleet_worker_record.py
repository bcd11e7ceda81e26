"""The record of the workers a joined fleet added to a router
(vllm_uma/fleet/worker_record.py): written atomically and privately, read
back; a live run's record is never a leftover; the directory is this
user's only. Dead runs' records (a real process that has exited), and
other routers' and hosts' records and damaged files left alone:
tests/integration/test_fleet_worker_record_dead_runs.py.

What the supervisor does with the records, against a stand-in router and
vllm-router itself: tests/integration/test_fleet_supervisor.py.
"""

from __future__ import annotations

import os
import stat

import pytest

from vllm_uma.commands.preflight import PreflightError
from vllm_uma.fleet.worker_record import WorkerRecord, read_record, record_dir

ROUTER = "http://10.0.0.1:8000"


def test_a_record_is_written_privately_and_read_back(tmp_path):
    record = WorkerRecord(tmp_path, ROUTER + "/")
    record.write(["http://10.0.0.5:9002", "http://10.0.0.5:9001"])
    assert stat.S_IMODE(record.path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [record.path.name]  # no temp file left
    read = read_record(record.path)
    assert read.router == ROUTER and read.pid == os.getpid()
    assert read.urls == ("http://10.0.0.5:9001", "http://10.0.0.5:9002")
    assert read.owner_alive()  # this process
    assert record.leftovers() == []  # a live run's URLs are never taken back
    record.remove()
    record.remove()  # twice: no error
    assert list(tmp_path.iterdir()) == []


def test_the_directory_is_made_private_and_refused_when_open(tmp_path):
    directory = record_dir(tmp_path)
    assert directory == tmp_path / "fleet"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    directory.chmod(0o755)
    with pytest.raises(PreflightError) as err:
        record_dir(tmp_path)
    message = str(err.value)
    assert message.startswith(f"{directory} is open to other users (mode 755)")
    assert "Remove it (vllm-uma creates it again with mode 700)" in message


def test_a_directory_that_is_a_symlink_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "fleet").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PreflightError, match="is a symbolic link"):
        record_dir(tmp_path)
