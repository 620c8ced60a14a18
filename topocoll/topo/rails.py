"""Rails: the parallel networks a cluster's hosts all reach through one NIC each.

A schedule's path names the NIC a transfer leaves by. The network stack, though, picks the
route of a connection by its destination, so two transfers between the same two hosts take
the same NIC unless each goes through a connection bound to the NIC its path names. That is
only possible where every host has one NIC on each of several separate networks: a *rail*
(a multi-rail cluster: NIC k of every host on switch k). Then a connection bound to NIC k at
both ends stays on rail k.

:func:`find_rails` recognises that shape in a topology: every host of the given ranks has the
same number (two or more) of network-attached NICs; NIC k of every host (in natural order of
the NIC node ids, the order the rail model of ``topo/assemble.py`` numbers them in) sits in the
same network component, and different k in different components.
A network component is a connected set of NICs and network switches joined by ``net`` links.
Anything else (one NIC per host, hosts cabled to each other, uneven NICs) has no rails: a
transfer then takes the one route the network offers, and nothing needs steering.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import networkx as nx

from topocoll.topo.model import LinkKind, NodeKind, Topology, natural_key

__all__ = ["Rails", "find_rails"]


@dataclass(frozen=True, slots=True)
class Rails:
    """The rails of a cluster.

    Parameters
    ----------
    count : int
        Number of rails (two or more).
    nic_rail : mapping of str to int
        Rail of every NIC node on a rail, by node id.
    interfaces : mapping of str to tuple of str
        Per host (``host_id``), the interface name of its NIC on each rail, in rail order.
    """

    count: int
    nic_rail: Mapping[str, int]
    interfaces: Mapping[str, tuple[str, ...]]

    def channel_of(self, path: Sequence[str]) -> int:
        """The executor's channel for a transfer along ``path``: 1 + the rail of the first NIC
        on it, or 0 (the group's own transport) when it crosses no rail NIC (same host)."""
        for node in path:
            rail = self.nic_rail.get(node)
            if rail is not None:
                return rail + 1
        return 0


def _network_components(topology: Topology) -> dict[str, int]:
    """Component number of every node touched by a ``net`` link."""
    net = nx.Graph()
    net.add_edges_from((link.src, link.dst) for link in topology.links if link.kind is LinkKind.NET)
    components = {}
    for index, component in enumerate(sorted(nx.connected_components(net), key=lambda c: min(c))):
        for node in component:
            components[node] = index
    return components


def find_rails(topology: Topology, rank_nodes: Sequence[str]) -> Rails | None:
    """The rails the hosts of ``rank_nodes`` share, or None when the cluster has none.

    Parameters
    ----------
    topology : Topology
        The cluster.
    rank_nodes : sequence of str
        The nodes the ranks run on; their ``host_id`` names their host.

    Returns
    -------
    Rails or None
        None unless there are at least two hosts, each with the same number (two or more) of
        named NICs on separate networks, NIC k of every host on the same network as NIC k of
        the others.
    """
    hosts = sorted({topology.node(node).host_id for node in rank_nodes} - {None})
    if len(hosts) < 2:
        return None
    components = _network_components(topology)
    per_host: dict[str, list] = {host: [] for host in hosts}
    for node in topology.nodes_of(NodeKind.NIC):
        if node.host_id in per_host and node.id in components:
            per_host[node.host_id].append(node)
    for nics in per_host.values():
        nics.sort(key=lambda n: natural_key(n.id))  # the order the rail model numbers NICs in
    counts = {len(nics) for nics in per_host.values()}
    if len(counts) != 1 or (count := counts.pop()) < 2:
        return None
    rail_components = []
    for rail in range(count):
        found = {components[nics[rail].id] for nics in per_host.values()}
        if len(found) != 1:
            return None
        rail_components.append(found.pop())
    if len(set(rail_components)) != count or any(n.name is None for nics in per_host.values() for n in nics):
        return None
    return Rails(
        count=count,
        nic_rail={nic.id: rail for nics in per_host.values() for rail, nic in enumerate(nics)},
        interfaces={host: tuple(nic.name for nic in nics) for host, nics in per_host.items()},
    )
