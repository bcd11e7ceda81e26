"""The KV server checked node by node: its mode, and every primary's cap and policy.

Engine-core process: at start-up while vLLM builds the tier, and on the
link's watch thread when a node answers again or joins the map. One node's
cap and policy are server_check.py's verdict; here that verdict is asked of
every primary of a cluster (each evicts on its own: one node in
noeviction refuses the writes of its slots forever), and the mode the
settings name is checked against the KV server:

- a standalone tier on a cluster node: refused. A cluster refuses a
  multi-key command across slots (CROSSSLOT), and a prefix's keys are in
  many slots. The fix: ``"cluster": true``.
- ``"cluster": true`` on a KV server that is not one: refused (CLUSTER SLOTS
  fails). The fix: remove the key.
- ``cluster-require-full-coverage yes`` (the KV server's default): when a
  primary is lost every node refuses every command (CLUSTERDOWN) until it
  is back, so the whole tier misses for one node. Warned, with the fix.

Why the mode is a setting and not read from the KV server: it decides how
every key is routed, and the KV server may not answer at start-up (the tier
then serves without it and connects later); the same settings mean the
same routing on every host. The check above turns a wrong setting into a
refused start with the fix, instead of misses.
"""

from __future__ import annotations

from valkey.exceptions import ResponseError

from vllm_uma.kv_offload.network.server_check import ServerRefused, ServerReport, check_server
from vllm_uma.kv_offload.network.server_link import LINK_ERRORS, ServerLink
from vllm_uma.kv_offload.network.server_nodes import SLOTS, Node

COVERAGE_FIX = "CONFIG SET cluster-require-full-coverage no"


def check_at_start(link: ServerLink) -> ServerReport:
    """Raises ServerRefused (with the fix), or the client's errors if the
    url's node does not answer."""
    if link.cluster is None:
        if _cluster_enabled(link.seed):
            raise ServerRefused(_is_a_cluster(link.seed))
        return check_server(link.seed.client, link.seed.url)
    try:
        link.cluster.read(link.seed)
    except ResponseError as exc:
        if link.db != 0:  # SELECT failed: a cluster has database 0 alone by default
            raise ServerRefused(
                f"the cluster at {link.url} refused database {link.db} ({exc}): use /0 in "
                f"the url, or give the cluster more (Valkey 9: cluster-databases)."
            ) from None
        raise ServerRefused(
            f"the valkey tier says cluster, but the KV server at {link.url} does not serve "
            f"CLUSTER SLOTS ({exc}): if it is not a cluster, remove "
            '"cluster": true from the tier; if it is, let the ACL user of the tier run it '
            "(+cluster|slots)."
        ) from None
    reports, full_coverage = [], []
    for node in link.cluster.primaries:
        try:
            reports.append(check_server(node.client, node.url))
            if _requires_full_coverage(node):
                full_coverage.append(node.address)
        except LINK_ERRORS as exc:
            link.node_down(node, exc, "the start-up check")
    return _merged(link, reports, full_coverage)


def check_again(link: ServerLink, node: Node) -> str | None:
    """A node that answers again (it may be a new KV server) or joined the
    map: what is wrong with it, to warn of (the server is serving by now)."""
    if link.cluster is None and _cluster_enabled(node):
        return _is_a_cluster(node)
    problem = check_server(node.client, node.url).problem
    if link.cluster is not None and _requires_full_coverage(node):
        problem = "; ".join(filter(None, [problem, _coverage_problem([node.address])]))
    return problem


def _cluster_enabled(node: Node) -> bool:
    try:
        return bool(int(node.client.info("cluster").get("cluster_enabled", 0)))
    except ResponseError:  # INFO refused by the ACL: its commands will tell
        return False


def _is_a_cluster(node: Node) -> str:
    return (
        f"the KV server at {node.url} is a node of a cluster (cluster_enabled:1), which refuses "
        f"one command for keys of many slots, as a prefix's are: add "
        '"cluster": true to the valkey tier.'
    )


def _requires_full_coverage(node: Node) -> bool:
    try:
        config = node.client.config_get("cluster-require-full-coverage")
    except ResponseError:  # CONFIG refused: server_check.py warns of it already
        return False
    # One exact name asked: one pair back (bytes or str, as the client decodes).
    return next(iter(config.values()), b"") in (b"yes", "yes")


def _coverage_problem(addresses: list[str]) -> str:
    return (
        f"the cluster node(s) at {', '.join(addresses)} run cluster-require-full-coverage "
        f"yes: when a primary is lost, every node refuses every command (CLUSTERDOWN) "
        f"until it is back, and the network tier misses every block. For a cache, run "
        f"{COVERAGE_FIX} on every node."
    )


def _merged(link: ServerLink, reports: list[ServerReport], full_coverage: list[str]):
    """One report for the cluster: caps and use added up, every node's problem."""
    problems = [report.problem for report in reports if report.problem]
    if full_coverage:
        problems.append(_coverage_problem(full_coverage))
    uncovered = link.cluster.uncovered
    if uncovered:
        problems.append(
            f"{uncovered} of the {SLOTS} slots of the cluster at {link.url} have no node: "
            f"their blocks are misses until the cluster gives them one."
        )
    policies = sorted({str(report.policy) for report in reports})
    versions = sorted({str(report.version) for report in reports})
    size = f"cluster of {len(link.cluster.primaries)} primaries"
    return ServerReport(
        maxmemory=_total([report.maxmemory for report in reports]),
        policy="/".join(policies) or None,
        used_memory=_total([report.used_memory for report in reports]),
        version=f"{'/'.join(versions) or 'version unknown'}, {size}",
        problem="; ".join(problems) or None,
        refuse=any(report.refuse for report in reports),
    )


def _total(values: list[int | None]) -> int | None:
    if not values or any(value is None for value in values):
        return None
    return sum(values)
