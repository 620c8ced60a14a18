"""Rails: which NIC of every host shares a network with which NIC of the others."""

from __future__ import annotations

import pytest

from tests.topo.fixtures import TOPOLOGY_DIR
from tests.topo.test_assemble import H800, gpu_busids, machine
from topocoll.topo.assemble import RankPlacement, assemble_cluster
from topocoll.topo.model import LinkKind, Node, NodeKind, TopologyBuilder
from topocoll.topo.rails import find_rails

NET_BW = 12.5e9


def cluster(wiring: dict[str, list[str]], names: bool = True):
    """Hosts h0, h1, ... (one rank each) whose NICs eth0, eth1, ... go to the switches listed."""
    builder = TopologyBuilder(name="wired")
    switches = sorted({s for ends in wiring.values() for s in ends})
    for switch in switches:
        builder.add_node(Node(switch, NodeKind.NET_SWITCH))
    for index, (host, ends) in enumerate(sorted(wiring.items())):
        builder.add_node(Node(host, NodeKind.HOST, rank=index, host_id=host))
        for k, switch in enumerate(ends):
            nic = f"{host}.eth{k}"
            builder.add_node(Node(nic, NodeKind.NIC, host_id=host, name=f"eth{k}" if names else None))
            builder.add_link(host, nic, LinkKind.LOOPBACK, 1e12)
            builder.add_link(nic, switch, LinkKind.NET, NET_BW)
    return builder.build()


def ranks(topology):
    return [n.id for n in topology.nodes_of(NodeKind.HOST)]


def test_two_rails_are_found_and_channels_follow_the_first_nic_on_a_path():
    topo = cluster({"h0": ["rail0", "rail1"], "h1": ["rail0", "rail1"], "h2": ["rail0", "rail1"]})
    rails = find_rails(topo, ranks(topo))
    assert rails is not None and rails.count == 2
    assert dict(rails.interfaces) == {"h0": ("eth0", "eth1"), "h1": ("eth0", "eth1"), "h2": ("eth0", "eth1")}
    assert rails.nic_rail["h2.eth1"] == 1 and rails.nic_rail["h0.eth0"] == 0
    assert rails.channel_of(("h0", "h0.eth1", "rail1", "h1.eth1", "h1")) == 2
    assert rails.channel_of(("h0", "h0.eth0", "rail0", "h2.eth0", "h2")) == 1
    assert rails.channel_of(("h0",)) == 0  # nothing crosses a NIC: the group's own transport


@pytest.mark.parametrize(
    "wiring",
    [
        {"h0": ["sw"], "h1": ["sw"]},  # one NIC each
        {"h0": ["sw", "sw"], "h1": ["sw", "sw"]},  # two NICs on one network
        {"h0": ["rail0", "rail1"], "h1": ["rail0"]},  # uneven
        {"h0": ["rail0", "rail1"], "h1": ["rail1", "rail0"]},  # eth0 of h1 on the other network
    ],
    ids=["one-nic", "one-network", "uneven", "crossed"],
)
def test_no_rails_where_a_transfer_has_one_route(wiring):
    topo = cluster(wiring)
    assert find_rails(topo, ranks(topo)) is None


def test_unnamed_nics_cannot_be_bound_and_one_host_needs_no_rails():
    topo = cluster({"h0": ["rail0", "rail1"], "h1": ["rail0", "rail1"]}, names=False)
    assert find_rails(topo, ranks(topo)) is None
    topo = cluster({"h0": ["rail0", "rail1"], "h1": ["rail0", "rail1"]})
    assert find_rails(topo, ["h0"]) is None


def test_a_rail_cluster_of_two_h800_machines_has_one_rail_per_nic(tmp_path):
    """hgx-h800-8gpu-8nic.nccl-topo.xml lists 8 NICs; the rail model puts NIC i of both
    machines on switch i, so there are 8 rails, NIC i of each machine on rail i."""
    a, b = machine(tmp_path, H800, "a"), machine(tmp_path, H800, "b")
    placed = [RankPlacement(8 * k + i, k, busid=busid) for k, host in enumerate((a, b)) for i, busid in enumerate(gpu_busids(host))]
    topo = assemble_cluster([a, b], ranks=placed)
    rails = find_rails(topo, topo.compute_nodes())
    assert rails is not None and rails.count == (TOPOLOGY_DIR / H800).read_text().count("<net ") == 8
    assert all(rails.nic_rail[f"n{k}.nic{i}"] == i for k in (0, 1) for i in range(8))
    names = tuple(topo.node(f"n0.nic{i}").name for i in range(8))
    assert rails.interfaces == {"a": names, "b": names}
