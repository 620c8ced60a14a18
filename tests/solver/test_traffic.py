"""Routing traffic matrices: hand-derived optima, invariants of every routing, the bound, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from topocoll.errors import RequestError, SolverError
from topocoll.solver import traffic as T
from topocoll.solver.request import check_request
from topocoll.solver.schedule import Collective
from topocoll.solver.verify import verify
from topocoll.topo.cluster import make_cluster
from topocoll.topo.model import LinkKind, Node, NodeKind, Topology, TopologyBuilder
from topocoll.topo.presets import build_preset

GB = 1e9


def _two_paths() -> Topology:
    """gpu0 and gpu1 joined directly at 10 GB/s and through a switch at 30 GB/s: the widest
    route is the switch; both together carry 40 GB/s."""
    b = TopologyBuilder("two-paths")
    for i in range(2):
        b.add_node(Node(f"gpu{i}", NodeKind.GPU, rank=i))
    b.add_node(Node("sw", NodeKind.NVSWITCH))
    b.add_link("gpu0", "gpu1", LinkKind.NVLINK, 10 * GB)
    b.add_link("gpu0", "sw", LinkKind.NVLINK, 30 * GB)
    b.add_link("gpu1", "sw", LinkKind.NVLINK, 30 * GB)
    return b.build()


def _zipf(n: int, s: float, total: float, seed: int) -> np.ndarray:
    """Each rank sends ``total`` bytes, Zipf(s) over the other ranks in a random order."""
    rng = np.random.default_rng(seed)
    matrix = np.zeros((n, n))
    for i in range(n):
        weights = 1.0 / np.arange(1, n) ** s
        rng.shuffle(weights)
        matrix[i, [j for j in range(n) if j != i]] = weights / weights.sum() * total
    return matrix


def test_two_parallel_paths_by_hand():
    topo = _two_paths()
    ranks = topo.compute_nodes()
    matrix = [[0, 8 * GB], [0, 0]]
    single = T.route_single_path(topo, ranks, matrix)
    assert single.time_s == pytest.approx(8 / 30, rel=1e-6, abs=0)  # all of it on the 30 GB/s route
    assert [s.path for s in single.splits] == [("gpu0", "sw", "gpu1")]
    direct = T.route_direct(topo, ranks, matrix)
    assert direct.time_s == pytest.approx(8 / 30, rel=1e-6, abs=0)  # the switch forwards: still no relay through a rank
    optimum = T.route_lp(topo, ranks, matrix)
    assert optimum.time_s == pytest.approx(8 / 40, rel=1e-6, abs=0)  # split 1 : 3 over the two paths
    by_path = {s.path: s.bytes for s in optimum.splits}
    assert by_path[("gpu0", "gpu1")] == pytest.approx(2 * GB)
    assert by_path[("gpu0", "sw", "gpu1")] == pytest.approx(6 * GB)
    bound = T.traffic_bound(topo, ranks, matrix)
    assert bound.time_s == pytest.approx(8 / 40, rel=1e-6, abs=0) and bound.cut == ("gpu0",) and bound.outbound
    fast = T.route_fast(T.candidate_paths(topo, ranks), matrix)
    assert fast.time_s == pytest.approx(8 / 40, rel=0.02, abs=0)


def _check_routing(topo: Topology, ranks, matrix: np.ndarray, routing: T.Routing) -> None:
    """Every byte of every pair delivered, along links of the topology, from its source to its
    destination; the reported time is the busiest link's."""
    delivered = np.zeros_like(matrix)
    loads: dict[tuple[str, str], float] = {}
    for split in routing.splits:
        assert split.path[0] == ranks[split.src] and split.path[-1] == ranks[split.dst]
        assert split.bytes > 0
        for hop in zip(split.path, split.path[1:]):
            assert topo.has_link(*hop), hop
            loads[hop] = loads.get(hop, 0.0) + split.bytes
        delivered[split.src, split.dst] += split.bytes
    np.testing.assert_allclose(delivered, matrix, rtol=1e-6, atol=1e-3)
    busiest = max(load / topo.capacity(*hop) for hop, load in loads.items())
    assert routing.time_s == pytest.approx(busiest, rel=1e-9, abs=0)


@pytest.mark.parametrize(
    "name", ["dgx1-v100", "dgx-a100", "mi300x", "pcie-8gpu", "h100x2"],
)
def test_every_routing_delivers_and_none_beats_the_bound(name):
    topo = make_cluster("dgx-h100", 2) if name == "h100x2" else build_preset(name)
    ranks = topo.compute_nodes()
    matrix = _zipf(len(ranks), 1.2, 64e6, seed=len(ranks))
    bound = T.traffic_bound(topo, ranks, matrix).time_s
    routings = [
        T.route_lp(topo, ranks, matrix),
        T.route_fast(T.candidate_paths(topo, ranks), matrix),
        T.route_single_path(topo, ranks, matrix),
        T.route_direct(topo, ranks, matrix),
    ]
    for routing in routings:
        _check_routing(topo, ranks, matrix, routing)
        assert routing.time_s >= bound * (1 - 1e-9), routing.method
        # as a schedule, the verifier replays it and finds the routing's own busiest link
        schedule = T.routing_schedule(routing, topo, matrix)
        result = verify(schedule, topo, size_bytes=schedule.reference_bytes)
        assert result.ok, (routing.method, result.errors)
        assert result.t_bw_s == pytest.approx(routing.time_s, rel=1e-9, abs=0), routing.method
    optimum = routings[0]
    assert optimum.optimal
    assert all(optimum.time_s <= r.time_s * (1 + 1e-6) for r in routings[1:])
    assert routings[1].time_s <= optimum.time_s * 1.08  # the fast path: close to the optimum


def test_a_hot_pair_across_hosts_uses_every_rail():
    """Two DGX H100 (8 NICs each, one rail per GPU index): one pair sends everything. One path
    crosses one NIC pair; the optimum spreads over every rail, bounded by the hosts' NICs."""
    topo = make_cluster("dgx-h100", 2)
    ranks = topo.compute_nodes()
    matrix = np.zeros((16, 16))
    matrix[0, 8] = 1 * GB
    single = T.route_single_path(topo, ranks, matrix)
    optimum = T.route_lp(topo, ranks, matrix)
    rails = {hop for s in optimum.splits for hop in zip(s.path, s.path[1:]) if hop[0].startswith("n0.nic")}
    assert len(rails) == 8  # every NIC of the sending host
    assert optimum.time_s < single.time_s / 4
    bound = T.traffic_bound(topo, ranks, matrix)
    assert optimum.time_s >= bound.time_s * (1 - 1e-9)


def test_no_traffic_routes_nothing():
    topo = _two_paths()
    routing = T.route_lp(topo, topo.compute_nodes(), [[0, 0], [0, 0]])
    assert routing.splits == () and routing.time_s == 0.0


def test_alltoall_is_routed_not_synthesized():
    topo = _two_paths()
    with pytest.raises(RequestError, match="use 'topocoll route'"):
        check_request(topo, Collective.ALLTOALL, topo.compute_nodes(), None)


@pytest.mark.parametrize(
    ("matrix", "message"),
    [
        ([[0, 1, 2], [0, 0, 0]], r"must be 2 x 2"),
        ([[0, -1], [0, 0]], r"entry \[0\]\[1\] = -1.0"),
        ([[0, float("nan")], [0, 0]], r"entry \[0\]\[1\] = nan"),
        ([[0, float("inf")], [0, 0]], r"entry \[0\]\[1\] = inf"),
    ],
)
def test_bad_matrices_are_refused(matrix, message):
    topo = _two_paths()
    with pytest.raises(SolverError, match=message):
        T.route_lp(topo, topo.compute_nodes(), matrix)
    with pytest.raises(SolverError, match=message):
        T.route_fast(T.candidate_paths(topo, topo.compute_nodes()), matrix)


def test_relay_free_routing_uses_no_rank_as_a_relay_and_is_at_least_as_good_as_one_link_per_pair():
    """On the MI300X mesh every pair has its own xGMI link: the relay-free optimum of the uniform
    all-to-all is no slower than one byte per pair on that link alone (1 / its bandwidth), and
    no faster than the traffic bound, which lets ranks relay."""
    topo = build_preset("mi300x")
    ranks = tuple(n.id for n in topo.nodes if n.kind is NodeKind.GPU)
    matrix = np.ones((len(ranks), len(ranks))) - np.eye(len(ranks))
    routing = T.route_lp(topo, ranks, matrix, relays=False)
    assert all(not set(split.path[1:-1]) & set(ranks) for split in routing.splits)
    star_time_s = 1.0 / topo.link(ranks[0], ranks[1]).bw_bytes_per_s
    assert routing.time_s <= star_time_s * (1 + 1e-6)
    assert routing.time_s >= T.traffic_bound(topo, ranks, matrix).time_s * (1 - 1e-6)
    relayed = T.route_lp(topo, ranks, matrix)
    assert any(set(split.path[1:-1]) & set(ranks) for split in relayed.splits)
