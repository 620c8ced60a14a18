"""The cut bound, checked against independent computations.

- allgather / reduce-scatter: brute force over every node set ``S`` of the graph that the ranks
  can use (compute nodes outside the ranks removed: they cannot forward), with the formula of
  the design's "Measures" section;
- broadcast / reduce: the smallest networkx max-flow from the root to a rank (to the root on
  the reversed graph);
- closed forms derived by hand for a switch, rings and three GPUs of a DGX-1.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.solver import helpers as H
from topocoll.errors import ScheduleError, SolverError, TopocollError, TopologyError
from topocoll.solver.bound import NVLS_MIN_SM, cut_bound, in_network_bound
from topocoll.solver.planner import plan_collective
from topocoll.solver.schedule import SYNTHESIZED, Collective
from topocoll.topo.bandwidth import nvlink_bw_bytes_per_s
from topocoll.topo.model import LinkKind, Node, NodeKind, Topology, TopologyBuilder
from topocoll.topo.presets import build_preset

#: The bound goes through integer max-flow capacities scaled to 1e9: rounding stays far below this.
REL = 1e-6


# ----------------------------------------------------------------------------- independent references
def usable_graph(topology: Topology, ranks, reverse: bool = False) -> nx.DiGraph:
    """The topology's graph without the compute nodes that are not ranks (capacity = bandwidth)."""
    graph = nx.DiGraph()
    keep = {n.id for n in topology.nodes if not n.kind.is_compute or n.id in set(ranks)}
    graph.add_nodes_from(keep)
    for link in topology.links:
        if link.src in keep and link.dst in keep:
            a, b = (link.dst, link.src) if reverse else (link.src, link.dst)
            graph.add_edge(a, b, capacity=link.bw_bytes_per_s)
    return graph


def brute_force_shard_time(topology: Topology, ranks, reverse: bool = False) -> float:
    """``(1/N) max_S |ranks outside S| / B_in(S)`` over every node set S holding a rank."""
    graph = usable_graph(topology, ranks, reverse)
    nodes = sorted(graph.nodes)
    rank_set = set(ranks)
    worst = 0.0
    for size in range(1, len(nodes) + 1):
        for subset in itertools.combinations(nodes, size):
            inside = set(subset)
            outside_ranks = len(rank_set - inside)
            if not inside & rank_set or outside_ranks == 0:
                continue
            b_in = sum(d["capacity"] for u, v, d in graph.edges(data=True) if u not in inside and v in inside)
            worst = max(worst, math.inf if b_in == 0 else outside_ranks / b_in)
    return worst / len(ranks)


def maxflow_broadcast_time(topology: Topology, ranks, root: int, reverse: bool = False) -> float:
    """``1 / min_v maxflow(root -> v)`` with networkx (on the reversed graph for reduce)."""
    graph = usable_graph(topology, ranks, reverse)
    flows = [nx.maximum_flow_value(graph, ranks[root], v) for i, v in enumerate(ranks) if i != root]
    return 1.0 / min(flows)


# ----------------------------------------------------------------------------- strategies
@st.composite
def topologies(draw, symmetric: bool = True):
    return H.random_topology(draw, symmetric=symmetric)


@st.composite
def topology_and_ranks(draw, symmetric: bool = True):
    """A random topology and a random subset (>= 2, in random order) of its GPUs as ranks."""
    topo = H.random_topology(draw, symmetric=symmetric)
    gpus = list(topo.compute_nodes())
    ranks = draw(st.lists(st.sampled_from(gpus), min_size=2, max_size=len(gpus), unique=True))
    return topo, ranks


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- property tests
@SETTINGS
@given(topology_and_ranks(symmetric=False))
def test_allgather_and_reduce_scatter_equal_the_brute_force_cut(case):
    topo, ranks = case
    if not H.ranks_connected(topo, ranks):
        with pytest.raises(SolverError):
            cut_bound(topo, Collective.ALLGATHER, ranks)
        return
    gather = cut_bound(topo, Collective.ALLGATHER, ranks)
    scatter = cut_bound(topo, Collective.REDUCE_SCATTER, ranks)
    assert gather.time_per_byte_s == pytest.approx(brute_force_shard_time(topo, ranks), rel=REL, abs=0)
    assert scatter.time_per_byte_s == pytest.approx(brute_force_shard_time(topo, ranks, reverse=True), rel=REL, abs=0)
    both = cut_bound(topo, Collective.ALLREDUCE, ranks)
    assert both.time_per_byte_s == pytest.approx(gather.time_per_byte_s + scatter.time_per_byte_s, rel=REL, abs=0)


@SETTINGS
@given(topology_and_ranks(symmetric=False), st.data())
def test_broadcast_and_reduce_equal_the_smallest_max_flow(case, data):
    topo, ranks = case
    if not H.ranks_connected(topo, ranks):
        return  # covered by the disconnected-rank tests
    root = data.draw(st.integers(0, len(ranks) - 1))
    broadcast = cut_bound(topo, Collective.BROADCAST, ranks, root=root)
    reduce = cut_bound(topo, Collective.REDUCE, ranks, root=root)
    assert broadcast.time_per_byte_s == pytest.approx(maxflow_broadcast_time(topo, ranks, root), rel=REL, abs=0)
    assert reduce.time_per_byte_s == pytest.approx(maxflow_broadcast_time(topo, ranks, root, reverse=True), rel=REL, abs=0)
    assert broadcast.root == root


@SETTINGS
@given(topologies())
def test_full_duplex_graphs_have_equal_gather_and_scatter_bounds(topo):
    ranks = list(topo.compute_nodes())
    gather = cut_bound(topo, Collective.ALLGATHER, ranks).time_per_byte_s
    scatter = cut_bound(topo, Collective.REDUCE_SCATTER, ranks).time_per_byte_s
    assert gather == pytest.approx(scatter, rel=REL)


def test_rank_order_does_not_change_the_bound():
    topo = build_preset("dgx1-v100")
    ranks = ["gpu0", "gpu1", "gpu2", "gpu5", "gpu6"]
    forward = cut_bound(topo, Collective.ALLGATHER, ranks).time_per_byte_s
    backward = cut_bound(topo, Collective.ALLGATHER, list(reversed(ranks))).time_per_byte_s
    assert forward == pytest.approx(backward, rel=REL)


# ----------------------------------------------------------------------------- closed forms
def _switch(n: int, bw: float) -> Topology:
    b = TopologyBuilder("switch")
    b.add_node(Node("sw", NodeKind.PCIE_SWITCH))
    for i in range(n):
        b.add_node(Node(f"gpu{i}", NodeKind.GPU))
        b.add_link(f"gpu{i}", "sw", LinkKind.PCIE, bw)
    return b.build()


def _ring(n: int, bw: float, duplex: bool) -> Topology:
    b = TopologyBuilder("ring")
    for i in range(n):
        b.add_node(Node(f"gpu{i}", NodeKind.GPU))
    for i in range(n):
        b.add_link(f"gpu{i}", f"gpu{(i + 1) % n}", LinkKind.NVLINK, bw, duplex=duplex)
    return b.build()


@pytest.mark.parametrize("n", [2, 4, 7])
def test_gpus_on_one_switch(n):
    bw = 20e9
    topo = _switch(n, bw)
    ranks = list(topo.compute_nodes())
    # Each GPU receives (N-1)/N of the output through its one link of bandwidth B.
    expected = (n - 1) / n / bw
    for collective in (Collective.ALLGATHER, Collective.REDUCE_SCATTER):
        assert cut_bound(topo, collective, ranks).time_per_byte_s == pytest.approx(expected, rel=REL, abs=0)
    assert cut_bound(topo, Collective.ALLREDUCE, ranks).time_per_byte_s == pytest.approx(2 * expected, rel=REL, abs=0)
    # Broadcast: every receiver takes the whole buffer through one link.
    assert cut_bound(topo, Collective.BROADCAST, ranks, root=1).time_per_byte_s == pytest.approx(1 / bw, rel=REL, abs=0)


@pytest.mark.parametrize("n", [3, 5, 8])
def test_bidirectional_ring(n):
    bw = 25e9
    topo = _ring(n, bw, duplex=True)
    ranks = list(topo.compute_nodes())
    # A single GPU has 2B entering; any arc of k GPUs also only 2B, for N-k missing shards:
    # the single GPU binds. Time = (M/N)(N-1)/(2B).
    expected = (n - 1) / (2 * n * bw)
    assert cut_bound(topo, Collective.ALLGATHER, ranks).time_per_byte_s == pytest.approx(expected, rel=REL, abs=0)
    # Broadcast: two edge-disjoint paths to every GPU -> 2B.
    assert cut_bound(topo, Collective.BROADCAST, ranks, root=0).time_per_byte_s == pytest.approx(1 / (2 * bw), rel=REL, abs=0)


@pytest.mark.parametrize("n", [3, 6])
def test_one_way_ring(n):
    bw = 25e9
    topo = _ring(n, bw, duplex=False)
    ranks = list(topo.compute_nodes())
    expected = (n - 1) / (n * bw)
    assert cut_bound(topo, Collective.ALLGATHER, ranks).time_per_byte_s == pytest.approx(expected, rel=REL, abs=0)
    assert cut_bound(topo, Collective.REDUCE_SCATTER, ranks).time_per_byte_s == pytest.approx(expected, rel=REL, abs=0)
    assert cut_bound(topo, Collective.BROADCAST, ranks, root=2).time_per_byte_s == pytest.approx(1 / bw, rel=REL, abs=0)


def test_ring_with_an_idle_gpu_between_two_ranks():
    # In a 3-ring with gpu1 idle, gpu0 and gpu2 keep only their direct link: the way round
    # through gpu1 is gone (an idle GPU does not forward).
    bw = 10e9
    topo = _ring(3, bw, duplex=True)
    bound = cut_bound(topo, Collective.ALLGATHER, ["gpu0", "gpu2"])
    # Two ranks, one link each way: each receives M/2 at B.
    assert bound.time_per_byte_s == pytest.approx(0.5 / bw, rel=REL, abs=0)


def test_three_gpus_of_a_dgx1():
    topo = build_preset("dgx1-v100")
    # Wiring (DGX-1 hybrid cube mesh): gpu0-gpu1 one NVLink, gpu0-gpu2 one, gpu1-gpu2 two.
    # The other GPUs are idle and drop out; gpu0 and gpu1 share a PCIe switch, gpu2 is under
    # the next one, both switches on the same CPU.
    nvl = nvlink_bw_bytes_per_s(2)
    assert topo.link("gpu1", "gpu0").bw_bytes_per_s == pytest.approx(nvl)
    assert topo.link("gpu2", "gpu0").bw_bytes_per_s == pytest.approx(nvl)
    assert topo.link("gpu1", "gpu2").bw_bytes_per_s == pytest.approx(2 * nvl)
    pcie_into_gpu0 = sum(
        topo.link(u, "gpu0").bw_bytes_per_s for u in topo.graph.predecessors("gpu0") if topo.link(u, "gpu0").kind is LinkKind.PCIE
    )
    assert pcie_into_gpu0 > 0
    # gpu0 has the least entering bandwidth: 2 NVLinks + its PCIe link, for 2 missing shards.
    # Every larger set has at least as much per missing shard (it gains NVLinks or the CPU's
    # links while losing at most one missing shard), so x = (2L + P) / 2 and
    # time per byte = 1 / (3x).
    x = (2 * nvl + pcie_into_gpu0) / 2
    bound = cut_bound(topo, Collective.ALLGATHER, ["gpu0", "gpu1", "gpu2"])
    assert bound.time_per_byte_s == pytest.approx(1 / (3 * x), rel=REL, abs=0)
    assert bound.bottleneck == ("gpu0",)
    assert bound.time_per_byte_s == pytest.approx(brute_force_shard_time(topo, ["gpu0", "gpu1", "gpu2"]), rel=REL, abs=0)


def test_full_dgx1_allgather_bound_matches_brute_force_on_its_nvlink_graph():
    # NVLinks only (6 per GPU, per the preset's wiring table): each GPU takes 6L for 7 shards.
    # The cube mesh has no sparser cut per missing shard: checked by brute force over 2^8 sets.
    b = TopologyBuilder("dgx1-nvlink")
    full = build_preset("dgx1-v100")
    for g in full.nodes_of(NodeKind.GPU):
        b.add_node(Node(g.id, NodeKind.GPU))
    for link in full.links:
        if link.kind is LinkKind.NVLINK:
            b.add_link(link.src, link.dst, link.kind, link.bw_bytes_per_s, duplex=False)
    topo = b.build()
    ranks = list(topo.compute_nodes())
    nvl = nvlink_bw_bytes_per_s(2)
    expected = 7 / (8 * 6 * nvl)
    assert brute_force_shard_time(topo, ranks) == pytest.approx(expected, rel=REL)
    assert cut_bound(topo, Collective.ALLGATHER, ranks).time_per_byte_s == pytest.approx(expected, rel=REL, abs=0)


def test_time_and_algbw_helpers():
    topo = _switch(4, 20e9)
    bound = cut_bound(topo, Collective.ALLGATHER, list(topo.compute_nodes()))
    assert bound.time_s(4e9) == pytest.approx(4e9 * 3 / 4 / 20e9, rel=REL, abs=0)
    assert bound.algbw_bytes_per_s == pytest.approx(20e9 * 4 / 3, rel=REL)


# ----------------------------------------------------------------------------- bad input
def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and text
    return text


def test_unknown_rank_names_the_node():
    topo = _switch(3, 20e9)
    with pytest.raises(TopologyError) as info:
        cut_bound(topo, Collective.ALLGATHER, ["gpu0", "gpu9"])
    assert "gpu9" in _one_line(info.value)
    with pytest.raises(TopologyError) as info:
        plan_collective(topo, "allgather", ["gpu0", "gpu9"], size_bytes=1024)
    assert "gpu9" in _one_line(info.value)


def test_switch_as_rank_is_refused():
    topo = _switch(3, 20e9)
    with pytest.raises(SolverError) as info:
        cut_bound(topo, Collective.ALLGATHER, ["gpu0", "sw"])
    assert "sw" in _one_line(info.value)


@pytest.mark.parametrize("root", [None, -1, 3, 7])
def test_root_outside_the_ranks(root):
    topo = _switch(4, 20e9)
    with pytest.raises(SolverError) as info:
        cut_bound(topo, Collective.BROADCAST, ["gpu0", "gpu1", "gpu2"], root=root)
    assert str(root) in _one_line(info.value)
    with pytest.raises(SolverError):
        plan_collective(topo, "reduce", ["gpu0", "gpu1", "gpu2"], root=root)


@pytest.mark.parametrize("ranks", [[], ["gpu0"]])
def test_fewer_than_two_ranks(ranks):
    topo = _switch(3, 20e9)
    with pytest.raises(SolverError) as info:
        cut_bound(topo, Collective.ALLGATHER, ranks)
    assert "2 ranks" in _one_line(info.value)
    with pytest.raises(SolverError):
        plan_collective(topo, "allgather", ranks)


def test_duplicate_ranks():
    topo = _switch(3, 20e9)
    with pytest.raises(SolverError):
        cut_bound(topo, Collective.ALLGATHER, ["gpu0", "gpu0"])


@pytest.mark.filterwarnings("error::RuntimeWarning")  # no NaN capacities on the way to the error
@pytest.mark.parametrize("collective", list(SYNTHESIZED))
def test_ranks_joined_only_through_an_idle_gpu(collective):
    # gpu0 - gpu1 - gpu2 in a line; with gpu1 not a rank, gpu0 and gpu2 cannot exchange data.
    topo = H.gpu_chain(3)
    root = 0 if collective.is_rooted else None
    with pytest.raises(SolverError) as info:
        cut_bound(topo, collective, ["gpu0", "gpu2"], root=root)
    text = _one_line(info.value)
    assert "gpu0" in text or "gpu2" in text
    with pytest.raises(SolverError) as info:
        plan_collective(topo, collective, ["gpu0", "gpu2"], root=root, size_bytes=1 << 20)
    text = _one_line(info.value)
    assert "gpu0" in text or "gpu2" in text


def test_unknown_collective():
    topo = _switch(3, 20e9)
    with pytest.raises(TopocollError) as info:
        plan_collective(topo, "allscatter", size_bytes=1024)
    assert isinstance(info.value, (ScheduleError, SolverError))
    assert "allscatter" in _one_line(info.value)


def test_non_positive_size():
    topo = _switch(3, 20e9)
    with pytest.raises(SolverError) as info:
        plan_collective(topo, "allgather", size_bytes=0)
    assert "size" in _one_line(info.value)



# ----------------------------------------------------------------------------- in-switch reduction
def _nvlink_to_switches(topology, gpu):
    """The GPU's NVLink bandwidth up to the NVSwitches, added up from the links one by one."""
    switches = {n.id for n in topology.nodes if n.kind.value == "nvswitch"}
    return sum(l.bw_bytes_per_s for l in topology.links if l.src == gpu and l.dst in switches and l.kind.value == "nvlink")


@pytest.mark.parametrize("count", [8, 4, 2])
def test_nvls_bound_of_an_h100_box_follows_from_its_nvlinks(count):
    """Every byte up to the switch once and down once, plus the own shard: S (1 + 1/N) / B."""
    from topocoll.topo.presets import build_preset

    h100 = build_preset("dgx-h100")
    ranks = h100.compute_nodes()[:count]
    bw = min(_nvlink_to_switches(h100, g) for g in ranks)
    assert bw == pytest.approx(18 * 25e9)  # 18 NVLink-4 links of 25 GB/s each way per H100
    found = in_network_bound(h100, Collective.ALLREDUCE, ranks)
    assert found is not None and found.mechanism == "NVLS"
    assert found.time_per_byte_s == pytest.approx((1 + 1 / count) / bw, rel=1e-6, abs=0)
    # with 4 GPUs or more it passes the point-to-point cut (so the commands report it); with 2 the
    # up-and-down traffic costs more than the one exchange a pair needs
    cut = cut_bound(h100, Collective.ALLREDUCE, ranks).algbw_bytes_per_s
    assert (found.algbw_bytes_per_s > cut) == (count >= 4)


def test_no_nvls_bound_without_hopper_nvswitches_or_for_other_collectives():
    from topocoll.topo.cluster import make_cluster
    from topocoll.topo.presets import build_preset

    a100 = build_preset("dgx-a100")  # NVSwitch, but sm 80
    assert all(a100.node(g).sm == 80 < NVLS_MIN_SM for g in a100.compute_nodes())
    assert in_network_bound(a100, Collective.ALLREDUCE, a100.compute_nodes()) is None
    h100 = build_preset("dgx-h100")
    for collective in (Collective.ALLGATHER, Collective.REDUCE_SCATTER, Collective.BROADCAST):
        assert in_network_bound(h100, collective, h100.compute_nodes()) is None
    two = make_cluster("dgx-h100", 2)  # two NVLink domains: NVLS does not reach across the network
    assert in_network_bound(two, Collective.ALLREDUCE, two.compute_nodes()) is None
    assert in_network_bound(two, Collective.ALLREDUCE, two.compute_nodes()[:8]) is not None
    unknown = Topology(tuple(n if n.kind.value != "gpu" else dataclasses.replace(n, sm=None) for n in h100.nodes), h100.links)
    assert in_network_bound(unknown, Collective.ALLREDUCE, unknown.compute_nodes()) is None  # sm not known: no claim


@pytest.mark.parametrize("int_scale_max", [1_000_000_000, 1_000_000])
def test_the_bound_is_exact_when_the_integer_capacities_are_coarse(monkeypatch, int_scale_max):
    """Max-flows run on integer capacities. Scaled by the sum of every capacity, 8192 GPUs left a
    NIC a few thousand units and the rounding slack of every arc let a cut 22 % short pass. A
    million units for 16 DGX H100 is as coarse (the sum of their links' capacities is 1000x a
    NIC); the bound must still be the machine's NIC cut: a machine receives N - 8 shards
    through 8 NICs (its GPUs' own NVSwitch links, 450 GB/s each, take N - 1 at most)."""
    from topocoll.solver import bound as bound_module
    from topocoll.topo.cluster import make_cluster

    topo = make_cluster("dgx-h100", 16)
    ranks = list(topo.compute_nodes())
    n = len(ranks)
    nic_bw = topo.capacity("n0.nic0", "leaf0")
    monkeypatch.setattr(bound_module, "_INT_SCALE_MAX", int_scale_max)
    bound = cut_bound(topo, Collective.ALLGATHER, ranks)
    assert bound.time_per_byte_s == pytest.approx((n - 8) / n / (8 * nic_bw), rel=1e-6, abs=0)
