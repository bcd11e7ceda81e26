"""Which of a cluster's nodes the tier may connect to, and so send its password.

Engine-core process, where a cluster's map is read (cluster_map.py).

A cluster names its nodes itself: ``CLUSTER SLOTS`` gives each slot range's
primary as an address, and the tier authenticates to every primary it
connects to. Whoever can change that reply can name a host of theirs and
collect the password: anyone on the path of a plain link, or a node of the
cluster that another party runs. So a node is connected to only if

- the url is TLS and the node presents a certificate the CA signed for the
  address the map gives (tls.py's verification, before a byte of the
  password leaves): any such node, unless ``cluster_allowed_hosts`` says
  more; or
- its address is in ``cluster_allowed_hosts`` (addresses, networks in CIDR
  form, host names). Without it, on a plain url: the url's host alone (a
  cluster on one host needs no setting; one across hosts lists them, and
  the warning that refuses a node names it).

A host name in the list allows the name as a map may give it (Valkey's
``cluster-preferred-endpoint-type hostname``) and the addresses it
resolves to when the map is read.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

from vllm_uma.kv_offload.network.settings import NetworkTierSettings

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class NodeTrust:
    def __init__(self, settings: NetworkTierSettings):
        given = settings.cluster_allowed_hosts
        # Over TLS with no list, a certificate is the proof.
        self.any_node = settings.tls and given is None
        self.explicit = given is not None
        self.entries: tuple[str, ...] = (settings.host,) if given is None else given
        self._networks: list[Network] = []
        self._names: list[str] = []
        for entry in self.entries:
            try:
                self._networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                self._names.append(entry.rstrip(".").lower())

    def checker(self) -> Callable[[str], bool]:
        """The rule for one map: whether a host it names may be connected
        to, the names resolved once for it."""
        if self.any_node:
            return lambda host: True
        resolved = self._resolved()

        def allowed(host: str) -> bool:
            address = _address(host)
            if address is None:
                return host.rstrip(".").lower() in self._names
            return address in resolved or any(address in net for net in self._networks)

        return allowed

    def describe(self) -> str:
        if self.any_node:
            return "any node with a certificate the CA signed"
        if not self.explicit:
            return f"the url's host {self.entries[0]} (cluster_allowed_hosts is not set)"
        return f"cluster_allowed_hosts {list(self.entries)}"

    def _resolved(self) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        addresses = set()
        for name in self._names:
            try:
                infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
            except OSError:  # not resolvable now: the name itself still matches
                continue
            addresses.update(_address(info[4][0]) for info in infos)
        return addresses - {None}


def _address(host: str):
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])  # an IPv6 zone is not part of it
    except ValueError:
        return None
