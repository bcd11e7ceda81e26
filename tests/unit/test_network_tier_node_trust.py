"""Which nodes of a cluster's map the tier may connect to (network/node_trust.py),
without a KV server: the rule alone.
tests/integration/test_network_tier_cluster_trust.py shows it on a real
cluster, with a node outside the rule that never hears the password."""

from __future__ import annotations

import pytest

from vllm_uma.kv_offload.network.node_trust import NodeTrust
from vllm_uma.kv_offload.network.settings import parse_network_tier


def trust(url: str = "valkey://10.0.0.5:7000/0", **settings) -> NodeTrust:
    # Unsigned: who may be sent the password is not the values' MAC.
    raw = {"type": "valkey", "url": url, "cluster": True, "unsigned": True, **settings}
    return NodeTrust(parse_network_tier(raw))


def test_a_plain_url_trusts_its_own_host_alone_by_default():
    allowed = trust().checker()
    assert allowed("10.0.0.5")
    assert not allowed("10.0.0.6") and not allowed("127.0.0.1") and not allowed("evil.example")
    assert "the url's host 10.0.0.5" in trust().describe()


def test_a_tls_url_trusts_any_node_its_certificate_proves_unless_a_list_is_given():
    assert trust("valkeys://10.0.0.5:7000/0").checker()("192.0.2.9")
    listed = trust("valkeys://10.0.0.5:7000/0", cluster_allowed_hosts=["10.0.0.0/24"])
    assert listed.checker()("10.0.0.9") and not listed.checker()("192.0.2.9")


@pytest.mark.parametrize(
    "host, expected",
    [
        ("10.0.1.77", True),  # in the network
        ("10.0.2.1", False),
        ("10.0.0.6", True),  # the address itself
        ("fd00::1", True),
        ("fd01::1", False),
        ("Valkey-2.Internal.", True),  # a name as a map may give it
        ("valkey-3.internal", False),
        ("127.0.0.1", True),  # what "localhost" resolves to when the map is read
    ],
)
def test_a_list_allows_its_addresses_networks_and_names(host, expected):
    hosts = ["10.0.0.6", "10.0.1.0/24", "fd00::/64", "valkey-2.internal", "localhost"]
    assert trust(cluster_allowed_hosts=hosts).checker()(host) is expected
