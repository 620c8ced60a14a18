"""Baselines: every one verifies on varied topologies and rank subsets; their shapes and loads."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.solver import helpers as H
from topocoll.errors import ScheduleError
from topocoll.solver.baselines import (
    BASELINES,
    double_binary_tree,
    hierarchical,
    multichannel_ring,
    rank_order_ring,
    recursive_doubling,
    ring,
    ring_order,
    weighted_rings,
)
from topocoll.solver.planner import max_network_flows_per_link
from topocoll.solver.schedule import SYNTHESIZED, Collective, Op, Transfer
from topocoll.solver.bound import cut_bound
from topocoll.solver.verify import verify
from topocoll.topo.model import LinkKind, Node, NodeKind, TopologyBuilder

TOPOLOGIES = {
    "nvswitch4": H.nvswitch_box(4),
    "pcie8": H.pcie_tree(8),
    "relay_ring5": H.relay_ring(5),
    "cluster2x4": H.cluster(2, 4),
    "cluster3x2": H.cluster(3, 2, leaves=2),
    "chain6": H.gpu_chain(6),
    "hosts6": H.host_star(6),
}


def _subsets(topo):
    nodes = topo.compute_nodes()
    yield nodes
    for size in (3, 5, 6):
        if size < len(nodes):
            yield nodes[len(nodes) - size:][::-1]  # odd sizes, reversed rank order


@pytest.mark.parametrize("baseline", sorted(BASELINES))
@pytest.mark.parametrize("topo_name", sorted(TOPOLOGIES))
def test_every_baseline_verifies(baseline, topo_name):
    topo = TOPOLOGIES[topo_name]
    build = BASELINES[baseline]
    for ranks in _subsets(topo):
        for collective in SYNTHESIZED:
            roots = (0, len(ranks) - 1, len(ranks) // 2) if collective.is_rooted else (None,)
            for root in roots:
                sched = build(topo, collective, ranks, root=root)
                assert sched.topology_digest == topo.digest()
                assert sched.ranks == tuple(ranks)
                result = verify(sched, topo, size_bytes=1e6)
                assert result.ok, (collective, len(ranks), root, result.errors)


def test_single_rank_schedules_are_empty_and_valid():
    topo = H.nvswitch_box(2)
    for build in BASELINES.values():
        for collective in SYNTHESIZED:
            sched = build(topo, collective, ["gpu1"])
            assert sched.steps == () and verify(sched, topo).ok


def test_ring_shapes():
    topo = H.nvswitch_box(4)
    assert len(ring(topo, Collective.ALLREDUCE).steps) == 2 * 3
    assert len(ring(topo, Collective.ALLGATHER).steps) == 3
    # chain of 3 hops with 5 pieces: 3 + 5 - 1 steps
    assert len(ring(topo, Collective.BROADCAST, root=2, nchunks=5).steps) == 7


def test_ring_follows_the_physical_ring():
    topo = H.relay_ring(5)
    order = ring_order(topo, topo.compute_nodes())
    assert order in ((0, 1, 2, 3, 4), (0, 4, 3, 2, 1))
    result = verify(ring(topo, Collective.ALLGATHER), topo)
    # every relay link carries each of the other 4 shards once
    assert result.t_bw_s_per_byte == pytest.approx((4 / 5) / H.PCIE_BW, rel=1e-6, abs=0)


def test_the_rank_order_ring_ignores_the_physical_ring():
    """relay_ring(5) is cabled 0-1-2-3-4-0; in rank order 0,2,4,1,3 every hop crosses two
    cables, so each cable carries twice what the physical ring puts on it."""
    topo = H.relay_ring(5)
    nodes = topo.compute_nodes()
    shuffled = [nodes[i] for i in (0, 2, 4, 1, 3)]
    blind = rank_order_ring(topo, Collective.ALLGATHER, shuffled)
    assert blind.name == "rank_order_ring"
    assert {(t.src, t.dst) for step in blind.steps for t in step} == {(i, (i + 1) % 5) for i in range(5)}
    aware = verify(ring(topo, Collective.ALLGATHER, shuffled), topo)
    assert verify(blind, topo).t_bw_s_per_byte == pytest.approx(2 * aware.t_bw_s_per_byte, rel=1e-6, abs=0)
    with pytest.raises(ScheduleError, match="must hold every rank"):
        ring(topo, Collective.ALLGATHER, order=(0, 1, 1, 2, 3))


def test_hierarchical_allreduce_sends_only_a_shard_across_hosts():
    topo = H.cluster(2, 4)
    sched = hierarchical(topo, Collective.ALLREDUCE)
    n_hosts, per_host = 2, 4
    assert len(sched.steps) == 2 * (per_host - 1) + 2 * (n_hosts - 1)
    result = verify(sched, topo)
    assert result.ok
    # each GPU's PCIe link to its NIC carries 2(G-1)/G of a 1/L segment (NVSwitch does the rest)
    expected = 2 * (n_hosts - 1) / n_hosts / per_host
    assert result.link_load[("n0.gpu0", "n0.nic0")] == pytest.approx(expected)
    assert result.t_bw_s_per_byte == pytest.approx(expected / H.PCIE_BW, rel=1e-6, abs=0)
    flat = verify(ring(topo, Collective.ALLREDUCE), topo)
    assert result.t_bw_s_per_byte <= flat.t_bw_s_per_byte


def test_hierarchical_falls_back_to_a_ring_for_unequal_hosts():
    topo = H.cluster(2, 3)
    ranks = topo.compute_nodes()[:5]  # 3 + 2
    assert hierarchical(topo, Collective.ALLREDUCE, ranks).name == "ring"
    assert hierarchical(topo, Collective.BROADCAST, ranks, root=4).name == "hierarchical"


def test_recursive_doubling_step_counts():
    topo = H.host_star(8)
    assert len(recursive_doubling(topo, Collective.ALLREDUCE).steps) == 3
    assert len(recursive_doubling(topo, Collective.ALLGATHER).steps) == 3
    # 6 = 4 + 2: fold in, two doubling steps, copy out
    assert len(recursive_doubling(topo, Collective.ALLREDUCE, topo.compute_nodes()[:6]).steps) == 4
    assert len(recursive_doubling(topo, Collective.BROADCAST, root=5).steps) == 3


def test_double_binary_tree_uses_both_halves_and_falls_back_for_gathers():
    topo = H.nvswitch_box(8)
    sched = double_binary_tree(topo, Collective.ALLREDUCE, nchunks=2)
    assert [c.size for c in sched.chunks] == [0.25] * 4
    senders = {t.src for step in sched.steps for t in step if t.op is Op.REDUCE}
    assert len(senders) == 8  # the root of one tree is a leaf or inner node of the other
    assert double_binary_tree(topo, Collective.ALLGATHER).name == "ring"


def test_bad_arguments():
    topo = H.relay_ring(3)
    with pytest.raises(ScheduleError, match="root"):
        ring(topo, Collective.BROADCAST, root=3)
    with pytest.raises(ScheduleError, match="relay0"):
        ring(topo, Collective.ALLREDUCE, ["gpu0", "relay0"])
    with pytest.raises(ScheduleError, match="nchunks"):
        ring(topo, Collective.REDUCE, nchunks=0)
    with pytest.raises(ScheduleError, match="distinct"):
        ring(topo, Collective.ALLREDUCE, ["gpu0", "gpu0"])


# ------------------------------------------------------------------- properties
@st.composite
def random_topologies(draw):
    n_compute = draw(st.integers(2, 6))
    n_switch = draw(st.integers(1, 3))
    names = [f"gpu{i}" for i in range(n_compute)] + [f"sw{i}" for i in range(n_switch)]
    order = draw(st.permutations(names))
    bws = st.sampled_from([10e9, 25e9, 50e9])
    hosts = draw(st.sampled_from([None, 1, 2]))
    b = TopologyBuilder("random")
    for i, name in enumerate(names):
        if name.startswith("gpu"):
            host = None if hosts is None else f"h{int(name[3:]) % hosts}"
            b.add_node(Node(name, NodeKind.GPU, host_id=host))
        else:
            b.add_node(Node(name, draw(st.sampled_from([NodeKind.NVSWITCH, NodeKind.PCIE_SWITCH, NodeKind.NET_SWITCH]))))
    for i in range(1, len(order)):
        b.add_link(order[i], order[draw(st.integers(0, i - 1))], LinkKind.PCIE, draw(bws), 1e-6)
    for _ in range(draw(st.integers(0, 3))):
        a, c = draw(st.sampled_from(names)), draw(st.sampled_from(names))
        if a != c:
            b.add_link(a, c, LinkKind.NVLINK, draw(bws), 0.5e-6)
    return b.build()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=random_topologies(), data=st.data())
def test_baselines_verify_on_random_topologies(topo, data):
    nodes = list(topo.compute_nodes())
    ranks = data.draw(st.permutations(nodes))
    ranks = ranks[: data.draw(st.integers(2, len(ranks)))]
    # Compute nodes outside the ranks do not forward: the subset must connect without them.
    assume(H.ranks_connected(topo, ranks))
    collective = data.draw(st.sampled_from(list(SYNTHESIZED)))
    root = data.draw(st.integers(0, len(ranks) - 1)) if collective.is_rooted else None
    for build in BASELINES.values():
        sched = build(topo, collective, ranks, root=root)
        result = verify(sched, topo)
        assert result.ok, (build.__name__, collective, result.errors)


def _mutants(sched, topo, data):
    steps = [list(s) for s in sched.steps]
    s = data.draw(st.integers(0, len(steps) - 1))
    k = data.draw(st.integers(0, len(steps[s]) - 1))
    victim = steps[s][k]
    dropped = [list(x) for x in steps]
    del dropped[s][k]
    yield "dropped", dataclasses.replace(sched, steps=tuple(tuple(x) for x in dropped if x))
    reduces = [(i, t) for i, step in enumerate(steps) for t in step if t.op is Op.REDUCE]
    if reduces:
        i, t = data.draw(st.sampled_from(reduces))
        doubled = [list(x) for x in steps]
        doubled[i].append(t)
        yield "duplicated reduce", dataclasses.replace(sched, steps=tuple(tuple(x) for x in doubled))
    a, b = victim.path[0], victim.path[-1]
    if not topo.has_link(a, b):
        shortcut = [list(x) for x in steps]
        shortcut[s][k] = Transfer(victim.src, victim.dst, victim.chunk, victim.op, (a, b))
        yield "non-edge", dataclasses.replace(sched, steps=tuple(tuple(x) for x in shortcut))
    yield "digest", dataclasses.replace(sched, topology_digest="sha256:" + "0" * 64)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=random_topologies(), data=st.data())
def test_verifier_rejects_mutated_baselines(topo, data):
    collective = data.draw(st.sampled_from(list(SYNTHESIZED)))
    build = BASELINES[data.draw(st.sampled_from(sorted(BASELINES)))]
    sched = build(topo, collective, root=0 if collective.is_rooted else None)
    if not sched.steps:
        return
    for kind, mutant in _mutants(sched, topo, data):
        assert not verify(mutant, topo).ok, kind


def test_large_rings_keep_hosts_together():
    topo = H.cluster(3, 4, leaves=2)
    ranks = topo.compute_nodes()
    # interleave the hosts in the rank order: the ring should regroup them
    shuffled = [ranks[i] for g in range(4) for i in range(g, 12, 4)]
    order = ring_order(topo, shuffled)
    hosts = [topo.node(shuffled[r]).host_id for r in order]
    crossings = sum(hosts[i] != hosts[(i + 1) % 12] for i in range(12))
    assert crossings == 3  # one hop into each host


def test_baselines_survive_the_json_round_trip():
    from topocoll.solver.schedule import Schedule

    topo = H.cluster(2, 2)
    for build in BASELINES.values():
        for collective in SYNTHESIZED:
            sched = build(topo, collective, root=1 if collective.is_rooted else None)
            again = Schedule.from_json(sched.to_json())
            assert again == sched
            assert verify(again, topo).ok


# ------------------------------------------------------------------ multi-channel ring
def test_one_channel_is_the_ring():
    topo = H.cluster(2, 4)
    for collective in (Collective.ALLREDUCE, Collective.ALLGATHER):
        one = verify(multichannel_ring(topo, collective, channels=1), topo)
        plain = verify(ring(topo, collective), topo)
        assert one.t_bw_s_per_byte == pytest.approx(plain.t_bw_s_per_byte, rel=1e-6, abs=0)


def test_channels_split_the_buffer_evenly():
    topo = H.nvswitch_box(4)
    sched = multichannel_ring(topo, Collective.ALLREDUCE, channels=3)
    assert len(sched.chunks) == 3 * 4 and all(c.size == pytest.approx(1 / 12) for c in sched.chunks)
    sched = multichannel_ring(topo, Collective.ALLGATHER, channels=3)
    for rank in range(4):  # rank r's shard [r/4, (r+1)/4) is cut into one piece per channel
        mine = [c for c in sched.chunks if rank / 4 - 1e-12 <= c.offset < (rank + 1) / 4 - 1e-12]
        assert len(mine) == 3 and sum(c.size for c in mine) == pytest.approx(0.25)


def test_channels_cross_between_machines_through_different_nics():
    """Two machines of 4 GPUs, one NIC per GPU: one ring leaves each machine through one NIC;
    the channels leave through several, so the busiest NIC link carries less."""
    topo = H.cluster(2, 4)
    sched = multichannel_ring(topo, Collective.ALLGATHER)
    nics_used = {node for step in sched.steps for t in step for node in t.path if "nic" in node}
    assert len({n for n in nics_used if n.startswith("n0.")}) >= 2
    assert verify(sched, topo).t_bw_s_per_byte < verify(ring(topo, Collective.ALLGATHER), topo).t_bw_s_per_byte


def test_channels_spread_over_nvswitch_planes():
    """A DGX H100's GPUs reach each other through 4 NVSwitch chips (5/4/4/5 links each): the one
    widest route uses one chip, the channels use all four."""
    from topocoll.topo.presets import build_preset

    topo = build_preset("dgx-h100")
    sched = multichannel_ring(topo, Collective.ALLREDUCE)
    switches = {node for step in sched.steps for t in step for node in t.path if node.startswith("nvswitch")}
    assert switches == {f"nvswitch{i}" for i in range(4)}
    best = verify(sched, topo).t_bw_s_per_byte
    assert best < 0.5 * verify(ring(topo, Collective.ALLREDUCE), topo).t_bw_s_per_byte


def test_bad_channel_count_is_refused():
    with pytest.raises(ScheduleError, match="channels must be an integer >= 1"):
        multichannel_ring(H.nvswitch_box(4), Collective.ALLREDUCE, channels=0)


@pytest.mark.parametrize("topo_name", sorted(TOPOLOGIES))
def test_weighted_rings_verify(topo_name):
    topo = TOPOLOGIES[topo_name]
    for ranks in _subsets(topo):
        for collective in SYNTHESIZED:
            roots = (0, len(ranks) - 1) if collective.is_rooted else (None,)
            for root in roots:
                sched = weighted_rings(topo, collective, ranks, root=root)
                assert sched.name == "weighted_rings" and sched.ranks == tuple(ranks)
                assert abs(sum(c.size for c in sched.chunks) - 1.0) < 1e-9
                result = verify(sched, topo, size_bytes=1e6)
                assert result.ok, (collective, len(ranks), root, result.errors)
    assert weighted_rings(topo, Collective.ALLREDUCE, topo.compute_nodes()[:1]).steps == ()


def _multi_rail():
    from topocoll.bench import scenario as sc

    return sc.scenario_topology(sc.load_scenario("multi-rail"))


@pytest.mark.parametrize("collective", [Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCE_SCATTER, Collective.BROADCAST])
def test_weighted_rings_split_two_rails_by_their_rates(collective):
    """The shipped multi-rail scenario: 3 hosts on two rails of different rates. One ring per rail
    carries the rail's share of the summed rates, every transfer stays on its rail, no network
    link carries two transfers in one step, and together they reach the cut bound; NCCL's equal
    channel shares need several transfers per NIC to get there."""
    from topocoll.bench import scenario as sc

    scenario = sc.load_scenario("multi-rail")
    rate = {link.b: link.rate_bits_per_s for link in scenario.links if link.a == "h0"}
    assert set(rate) == {"rail0", "rail1"} and rate["rail0"] != rate["rail1"]
    topo = _multi_rail()
    root = 0 if collective.is_rooted else None
    sched = weighted_rings(topo, collective, root=root)
    rails = {}
    for step in sched.steps:
        for t in step:
            rail = {n for n in t.path if n.startswith("rail")}
            assert len(rail) == 1, t.path
            rails.setdefault(t.chunk, set()).update(rail)
    by_rail = {"rail0": 0.0, "rail1": 0.0}
    for chunk in sched.chunks:
        (rail,) = rails[chunk.id]
        by_rail[rail] += chunk.size
    for rail in by_rail:
        assert by_rail[rail] == pytest.approx(rate[rail] / sum(rate.values()))
    assert max_network_flows_per_link(sched, topo) == 1
    bound = cut_bound(topo, collective, topo.compute_nodes(), root)
    assert verify(sched, topo).t_bw_s_per_byte == pytest.approx(bound.time_per_byte_s, rel=1e-4, abs=0)
    even = multichannel_ring(topo, collective, root=root)
    assert max_network_flows_per_link(even, topo) >= 2


def test_weighted_rings_keep_one_ring_where_one_is_best():
    """Every host on one switch: a second ring adds nothing, so one ring carries everything."""
    topo = H.host_star(4)
    sched = weighted_rings(topo, Collective.ALLREDUCE)
    assert len(sched.chunks) == 4 and all(c.size == pytest.approx(0.25) for c in sched.chunks)


def test_weighted_rings_keep_one_ring_per_rail_when_measured_rates_differ_a_little():
    """Measured NIC rates of one rail differ by a few per cent: one ring per rail still carries
    everything, one transfer per link. Each ring is held to its rail's slowest link (here 3 %
    and 1.5 % below the rest), so it stays within the planner's near tie (2 %) of the bound,
    where an exact split would need more rings, and more connections per NIC."""
    from topocoll.topo.model import Topology

    topo = _multi_rail()
    wobble = {("h1.eth0", "rail0"): 0.97, ("rail1", "h2.eth1"): 0.985, ("h0.eth1", "rail1"): 1.02}
    links = tuple(dataclasses.replace(l, bw_bytes_per_s=l.bw_bytes_per_s * wobble.get((l.src, l.dst), 1.0)) for l in topo.links)
    measured = Topology(topo.nodes, links, name="measured")
    sched = weighted_rings(measured, Collective.ALLGATHER)
    assert max_network_flows_per_link(sched, measured) == 1
    bound = cut_bound(measured, Collective.ALLGATHER, measured.compute_nodes())
    assert verify(sched, measured).t_bw_s_per_byte <= bound.time_per_byte_s * 1.02
