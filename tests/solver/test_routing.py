"""Routing: the widest-path rule, checked against a brute-force enumeration of simple paths."""

from __future__ import annotations

import math

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.solver import helpers as H
from topocoll.errors import SolverError, TopologyError
from topocoll.solver.routing import route_table, widest_path
from topocoll.topo.model import LinkKind, Node, NodeKind, Topology, TopologyBuilder


def _key(topology: Topology, path: tuple[str, ...]) -> tuple[float, int, int, float]:
    """The rule of the module, written out independently: (-bottleneck, hops, relays, latency)."""
    relays = sum(1 for node in path[1:-1] if topology.node(node).kind.is_compute)
    return (-topology.path_bw_bytes_per_s(path), len(path) - 1, relays, topology.path_latency_s(path))


def _best_key(topology: Topology, src: str, dst: str) -> tuple:
    return min(_key(topology, tuple(p)) for p in nx.all_simple_paths(topology.graph, src, dst))


def _builder(*gpus: str) -> TopologyBuilder:
    b = TopologyBuilder()
    for g in gpus:
        b.add_node(Node(g, NodeKind.GPU))
    return b


def test_prefers_the_wider_route_over_the_shorter():
    b = _builder("gpu0", "gpu1")
    b.add_node(Node("sw", NodeKind.NVSWITCH))
    b.add_link("gpu0", "gpu1", LinkKind.PCIE, 10e9)
    b.add_link("gpu0", "sw", LinkKind.NVLINK, 100e9)
    b.add_link("sw", "gpu1", LinkKind.NVLINK, 100e9)
    assert widest_path(b.build(), "gpu0", "gpu1") == ("gpu0", "sw", "gpu1")


def test_equal_bandwidth_prefers_fewer_hops_then_switch_over_gpu_relay():
    b = _builder("gpu0", "gpu1", "gpu2")
    for sw in ("sw_a", "sw_b1", "sw_b2"):
        b.add_node(Node(sw, NodeKind.PCIE_SWITCH))
    # three routes gpu0 -> gpu2 of equal bandwidth: via a switch (2 hops), via gpu1 (2 hops),
    # via two switches (3 hops)
    for a, c in [("gpu0", "sw_a"), ("sw_a", "gpu2"), ("gpu0", "gpu1"), ("gpu1", "gpu2"),
                 ("gpu0", "sw_b1"), ("sw_b1", "sw_b2"), ("sw_b2", "gpu2")]:
        b.add_link(a, c, LinkKind.PCIE, 16e9)
    assert widest_path(b.build(), "gpu0", "gpu2") == ("gpu0", "sw_a", "gpu2")


def test_lower_latency_breaks_the_last_tie():
    b = _builder("gpu0", "gpu1")
    b.add_node(Node("slow", NodeKind.PCIE_SWITCH))
    b.add_node(Node("fast", NodeKind.PCIE_SWITCH))
    b.add_link("gpu0", "slow", LinkKind.PCIE, 16e9, latency_s=2e-6)
    b.add_link("slow", "gpu1", LinkKind.PCIE, 16e9, latency_s=2e-6)
    b.add_link("gpu0", "fast", LinkKind.PCIE, 16e9, latency_s=1e-6)
    b.add_link("fast", "gpu1", LinkKind.PCIE, 16e9, latency_s=1e-6)
    assert widest_path(b.build(), "gpu0", "gpu1") == ("gpu0", "fast", "gpu1")


def test_gpus_relay_when_nothing_else_connects():
    assert widest_path(H.gpu_chain(3), "gpu0", "gpu2") == ("gpu0", "gpu1", "gpu2")


def test_one_way_links_are_respected():
    b = _builder("gpu0", "gpu1")
    b.add_node(Node("sw", NodeKind.PCIE_SWITCH))
    b.add_link("gpu0", "gpu1", LinkKind.NVLINK, 100e9, duplex=False)
    b.add_link("gpu0", "sw", LinkKind.PCIE, 10e9)
    b.add_link("sw", "gpu1", LinkKind.PCIE, 10e9)
    topo = b.build()
    assert widest_path(topo, "gpu0", "gpu1") == ("gpu0", "gpu1")
    assert widest_path(topo, "gpu1", "gpu0") == ("gpu1", "sw", "gpu0")


def test_errors_name_the_node():
    b = _builder("gpu0", "gpu1")
    b.add_node(Node("lonely_nic", NodeKind.NIC))
    b.add_link("gpu0", "gpu1", LinkKind.NVLINK, 100e9)
    topo = b.build()
    with pytest.raises(TopologyError, match="nowhere"):
        widest_path(topo, "gpu0", "nowhere")
    with pytest.raises(SolverError, match="lonely_nic"):
        widest_path(topo, "gpu0", "lonely_nic")
    with pytest.raises(TopologyError, match="nowhere"):
        route_table(topo, ["gpu0", "nowhere"])


def test_route_table_matches_brute_force_on_a_cluster():
    topo = H.cluster(2, 3, leaves=2)
    ranks = topo.compute_nodes()
    table = route_table(topo, ranks)
    pairs = table.all_pairs()
    assert len(pairs) == len(ranks) * (len(ranks) - 1)
    for (a, b), path in pairs.items():
        assert path[0] == a and path[-1] == b
        assert _key(topo, path) == _best_key(topo, a, b)
        assert path == widest_path(topo, a, b)


def test_route_table_answers_do_not_depend_on_query_order():
    topo = H.cluster(2, 4, leaves=2)
    ranks = topo.compute_nodes()
    forward = route_table(topo, ranks)
    backward = route_table(topo, ranks)
    pairs = [(a, b) for a in ranks for b in ranks if a != b]
    first = {p: forward.path(*p) for p in pairs}
    second = {p: backward.path(*p) for p in reversed(pairs)}
    assert first == second


def test_route_figures():
    topo = H.cluster(2, 2)
    table = route_table(topo, topo.compute_nodes())
    route = table.route("n0.gpu0", "n1.gpu0")
    # gpu -PCIe- nic -net- leaf -net- nic -PCIe- gpu: PCIe is the narrowest link
    assert route.path == ("n0.gpu0", "n0.nic0", "leaf0", "n1.nic0", "n1.gpu0")
    assert route.bw_bytes_per_s == min(H.PCIE_BW, H.NET_BW)
    assert math.isclose(route.latency_s, topo.path_latency_s(route.path))
    assert table.path("n0.gpu0", "n0.gpu0") == ("n0.gpu0",)


@st.composite
def random_topologies(draw):
    n_compute = draw(st.integers(2, 5))
    n_switch = draw(st.integers(0, 3))
    names = [f"gpu{i}" for i in range(n_compute)] + [f"sw{i}" for i in range(n_switch)]
    order = draw(st.permutations(names))
    bws = st.sampled_from([10e9, 25e9, 50e9])
    b = TopologyBuilder("random")
    for name in names:
        b.add_node(Node(name, NodeKind.GPU if name.startswith("gpu") else NodeKind.NVSWITCH))
    for i in range(1, len(order)):
        b.add_link(order[i], order[draw(st.integers(0, i - 1))], LinkKind.NVLINK, draw(bws), draw(st.sampled_from([0.0, 1e-6])))
    for _ in range(draw(st.integers(0, 4))):
        a, c = draw(st.sampled_from(names)), draw(st.sampled_from(names))
        if a != c:
            b.add_link(a, c, LinkKind.PCIE, draw(bws), 1e-6, duplex=draw(st.booleans()))
    return b.build()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_topologies())
def test_routes_are_optimal_under_the_rule(topo):
    ranks = topo.compute_nodes()
    table = route_table(topo, ranks)
    for (a, b), path in table.all_pairs().items():
        assert all(topo.has_link(x, y) for x, y in zip(path, path[1:]))
        assert len(set(path)) == len(path)
        assert _key(topo, path) == _best_key(topo, a, b)
