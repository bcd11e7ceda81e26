"""Children never outlive their parent (vllm_uma/lifeline.py), with real
processes and a real SIGKILL.

Each case runs three processes: a grandparent that makes itself the child
subreaper (so the orphan becomes its child and it can read how the orphan
ended), a parent that starts the child with the environment a supervisor or
API server gives, and the child. The grandparent SIGKILLs the parent and
prints the child's exit status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from vllm_uma import lifeline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GRANDPARENT = textwrap.dedent(
    """
    import ctypes, json, os, signal, subprocess, sys, time
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    parent_code, ready = sys.argv[1], sys.argv[2]
    parent = subprocess.Popen([sys.executable, "-c", parent_code, *sys.argv[2:]])
    deadline = time.monotonic() + 30
    while not (os.path.exists(ready) and open(ready).read().strip()):
        assert time.monotonic() < deadline, "the child never got ready"
        assert parent.poll() is None, f"the parent exited with {parent.returncode}"
        time.sleep(0.05)
    orphan = int(open(ready).read())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    killed = time.monotonic()
    while time.monotonic() < killed + 20:
        pid, status = os.waitpid(orphan, os.WNOHANG)
        if pid:
            print(json.dumps({"status": os.waitstatus_to_exitcode(status),
                              "seconds": round(time.monotonic() - killed, 2)}))
            break
        time.sleep(0.05)
    else:
        os.kill(orphan, signal.SIGKILL)
        print(json.dumps({"status": "still running 20 s after its parent"}))
    """
)

# The parent: starts the child with ENV set to its own pid, reports the
# child's pid, and waits to be killed.
PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    ready, env_name, child_code = sys.argv[1], sys.argv[2], sys.argv[3]
    env = {**os.environ, env_name: str(os.getpid())}
    child = subprocess.Popen([sys.executable, "-c", child_code, ready], env=env)
    time.sleep(120)
    """
)

CHILD_HEAD = textwrap.dedent(
    """
    import os, signal, sys, time
    from vllm_uma import lifeline
    ready = sys.argv[1]
    def mark_ready():
        with open(ready + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(ready + ".tmp", ready)
    """
)


def orphan_status(tmp_path, env_name: str, child_body: str) -> dict:
    child = CHILD_HEAD + textwrap.dedent(child_body) + "\nmark_ready()\ntime.sleep(120)\n"
    ready = tmp_path / "ready"
    out = subprocess.run(
        [sys.executable, "-c", GRANDPARENT, PARENT, str(ready), env_name, child],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_supervised_server_stops_as_sigterm_would_when_its_supervisor_is_killed(tmp_path):
    ended = orphan_status(
        tmp_path,
        lifeline.SUPERVISOR_ENV,
        """
        signal.signal(signal.SIGTERM, lambda *a: os._exit(42))  # the server's own stop
        assert lifeline.stop_with_supervisor()
        """,
    )
    assert ended["status"] == 42
    assert ended["seconds"] < 10


def test_an_engine_core_runs_vllms_handler_when_its_api_server_is_killed(tmp_path):
    ended = orphan_status(
        tmp_path,
        lifeline.API_SERVER_ENV,
        """
        signal.signal(signal.SIGTERM, lambda *a: os._exit(43))  # vLLM's handler
        assert lifeline.follow_api_server()
        """,
    )
    assert ended["status"] == 43
    assert ended["seconds"] < 10


def test_an_engine_core_in_teardown_gets_no_signal_but_exits_after_the_grace(tmp_path):
    # SIG_DFL, as vLLM restores it before its teardown: a SIGTERM would kill
    # the drain (status -15); the grace ends it instead (status 1).
    ended = orphan_status(
        tmp_path,
        lifeline.API_SERVER_ENV,
        """
        lifeline.GRACE_S = 1.0
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        assert lifeline.follow_api_server()
        """,
    )
    assert ended["status"] == 1


def test_the_shim_stops_its_program_when_its_supervisor_is_killed(tmp_path):
    # The shim as the fleet runs vllm-router (lifeline.shim_command): the
    # program reports the shim's pid, its parent, as the one to watch.
    program = [
        sys.executable,
        "-c",
        "import os, sys, time\n"
        "ready = sys.argv[1]\n"
        "open(ready + '.tmp', 'w').write(str(os.getppid()))\n"
        "os.replace(ready + '.tmp', ready)\n"
        "time.sleep(120)\n",
    ]
    ended = orphan_status(
        tmp_path,
        lifeline.SUPERVISOR_ENV,
        f"""
        os.environ[lifeline.SUPERVISOR_ENV] = str(os.getppid())
        shim = lifeline.shim_command({program!r} + [ready])
        os.execv(shim[0], shim)
        """,
    )
    assert ended["status"] == 128 + 15  # its program ended by SIGTERM
    assert ended["seconds"] < 10


@pytest.mark.parametrize("value", [None, "not a pid", "not our parent"])
def test_no_tie_unless_the_variable_names_our_parent(monkeypatch, value):
    # Unset (a server a user starts), garbage, or inherited from further up
    # (a pid that is not our parent: our own child's, here).
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as other:
        for name in (lifeline.SUPERVISOR_ENV, lifeline.API_SERVER_ENV):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, str(other.pid) if value == "not our parent" else value)
        tied = lifeline.stop_with_supervisor(), lifeline.follow_api_server()
        other.kill()
    assert tied == (False, False)


def test_a_parent_gone_before_the_child_looked_still_stops_it(tmp_path):
    # The race the watch must not lose: the supervisor dies before the
    # child checks its parent. A pid that no process has: "gone".
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    code = (
        "import os, signal, sys, time\n"
        "from vllm_uma import lifeline\n"
        "signal.signal(signal.SIGTERM, lambda *a: os._exit(42))\n"
        "assert lifeline.stop_with_supervisor()\n"
        "time.sleep(30)\n"
    )
    env = {**os.environ, "PYTHONPATH": ROOT, lifeline.SUPERVISOR_ENV: dead.stdout.strip()}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=30).returncode == 42
    shim = lifeline.shim_command([sys.executable, "-c", "import time; time.sleep(30)"])
    started = subprocess.run(shim, env=env, timeout=30, capture_output=True, text=True)
    assert started.returncode == 1 and "not starting" in started.stderr
