"""Several hosts simulated on this machine: Linux network namespaces joined by
a bridge, each link shaped with tc, cut and restored on demand.

    network.py   Network: the switch, the hosts, their links; run a command on a host
    inside.py    a thread of this process inside a host: our own code on that host
    shaping.py   LinkShape (rate, delay) and the tc commands that apply it
    probe.py     a link's throughput and round trip, measured between two hosts
    runs.py      names per run, the run's state file, finding and removing leftovers
    ipcmd.py     running ip and tc, with errors that name the fix
    __main__.py  python -m tools.hosts up | down | cleanup | list

Layout of one run (prefix ``vu-<pid>-``, addresses 10.213.<net>.<i>/24)::

    netns vu-<pid>-sw                       netns vu-<pid>-h1
    +--------------------------+            +------------------------+
    | br0 (no address)         |            | lo up                  |
    |  +- h1 ---- veth ---------------------- eth0 10.213.<net>.1/24 |
    |  +- h2 ---- veth ----- ...            | (tbf: egress shaping)  |
    | (tbf on h1, h2: shaping  |            +------------------------+
    |  towards each host)      |
    +--------------------------+

Nothing is created in the root namespace: every link is made inside the
switch namespace with its peer moved straight into the host's namespace,
so removing the namespaces removes every link and the bridge with them.
"""

from tools.hosts.network import Host, Network
from tools.hosts.runs import cleanup_leftovers, leftover_runs
from tools.hosts.shaping import LinkShape

__all__ = ["Host", "LinkShape", "Network", "cleanup_leftovers", "leftover_runs"]
