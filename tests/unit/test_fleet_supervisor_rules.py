"""The fleet supervisor's rules (vllm_uma/fleet/supervisor.py) without a
process: each server's restart budget, and a stop that removes the event
sockets killed servers left. Its joins and stops with real processes:
tests/integration/test_fleet_supervisor.py."""

from __future__ import annotations

from collections import deque
from pathlib import Path

from vllm_uma.fleet import supervisor
from vllm_uma.fleet.plan import FleetPlan, MemberPlan
from vllm_uma.fleet.supervisor import Fleet, keep_restarting
from vllm_uma.server_process import free_port

NEVER_RUN = ["vllm-uma"]  # the fleets here stop before any start


def plan(tmp_path: Path, servers: int) -> FleetPlan:
    members = tuple(
        MemberPlan(
            index=i,
            port=free_port(),
            cores=(0,),
            events_in=f"ipc://{tmp_path}/server-{i}.sock",
            events_out_port=free_port(),
            argv=(),
            env={},
        )
        for i in range(1, servers + 1)
    )
    return FleetPlan(members=members, router_argv=(), router_url="", kv_store=None)


def test_a_stop_removes_the_event_sockets_killed_servers_left(tmp_path):
    fleet_plan = plan(tmp_path, 2)
    left = [Path(m.events_in.removeprefix("ipc://")) for m in fleet_plan.members]
    for path in left:  # what a server killed with SIGKILL leaves behind
        path.touch()
    Fleet(fleet_plan, NEVER_RUN, tmp_path).stop()
    assert [path for path in left if path.exists()] == []


def test_each_server_has_its_own_restart_budget():
    window = supervisor.RESTART_WINDOW_S
    one, two = deque(), deque()
    for t in range(supervisor.RESTART_LIMIT):  # each dies 3 times: both restart
        assert keep_restarting(one, float(t))
        assert keep_restarting(two, float(t))
    assert not keep_restarting(one, 10.0)  # server 1's 4th exit in the window
    assert keep_restarting(deque([0.0, 1.0, 2.0]), window + 5.0)  # old exits expire
