"""A fleet of fake servers (fake_serve.py) that joins a router, in a process
of its own for a test to SIGKILL:
``python fake_fleet.py ROUTER_URL RECORD_DIR WORK_DIR PORT...``; prints
``ready`` once every server is added to the router, then waits.
"""

import sys
import time
from pathlib import Path

from vllm_uma.fleet.plan import FleetPlan, MemberPlan
from vllm_uma.fleet.supervisor import Fleet
from vllm_uma.server_process import free_port

FAKE_SERVE = [sys.executable, str(Path(__file__).with_name("fake_serve.py"))]


def main() -> int:
    router, records, work, *ports = sys.argv[1:]
    members = tuple(
        MemberPlan(i, int(port), (0,), f"ipc://{work}/fleet-{i}.sock", free_port(), ())
        for i, port in enumerate(ports, start=1)
    )
    plan = FleetPlan(members, (), router, None, join=True)
    Fleet(plan, FAKE_SERVE, Path(work), Path(records)).start()
    print("ready", flush=True)
    time.sleep(3600)  # until killed
    return 0


if __name__ == "__main__":
    sys.exit(main())
