"""Synthesis: every schedule verifies, never beats the cut bound, and reaches it.

The bound is the independent yardstick (itself checked by brute force in test_bound.py); the
symbolic verifier proves each schedule and measures its bandwidth time.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.solver import helpers as H
from tests.solver.helpers import BOUNDED, MIN_RATIO, NEVER_BELOW, ratio_to_bound
from topocoll.errors import SolverError
from topocoll.solver.schedule import SYNTHESIZED, Collective, Op
from topocoll.solver.synthesize import SynthesisOptions, synthesize
from topocoll.solver.verify import verify
from topocoll.topo.model import LinkKind, Node, NodeKind, TopologyBuilder
from topocoll.topo.presets import build_preset

REACHES = (Collective.ALLGATHER, Collective.REDUCE_SCATTER, Collective.ALLREDUCE)


@st.composite
def switched_topologies(draw):
    """Random connected full-duplex topologies with at least one switch and 2-5 GPUs.

    When the random draw has no switch, one (``swx``) is added and joined to some GPUs.
    """
    topo = H.random_topology(draw, max_switches=3)
    if any(n.kind is NodeKind.PCIE_SWITCH for n in topo.nodes):
        return topo
    b = TopologyBuilder("random+switch")
    for n in topo.nodes:
        b.add_node(n)
    for link in topo.links:
        b.add_link(link.src, link.dst, link.kind, link.bw_bytes_per_s, link.latency_s, duplex=False)
    b.add_node(Node("swx", NodeKind.PCIE_SWITCH))
    bw = draw(st.sampled_from(H.RANDOM_BWS))
    for gpu in draw(st.lists(st.sampled_from(list(topo.compute_nodes())), min_size=1, unique=True)):
        b.add_link(gpu, "swx", LinkKind.PCIE, bw)
    return b.build()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(switched_topologies(), st.data())
def test_random_topologies_all_collectives(topo, data):
    ranks = list(topo.compute_nodes())
    ranks = data.draw(st.permutations(ranks))
    root = data.draw(st.integers(0, len(ranks) - 1))
    for collective in SYNTHESIZED:
        synthesis = synthesize(topo, collective, ranks, root=root if collective.is_rooted else None)
        ratio = ratio_to_bound(topo, synthesis)
        if collective in BOUNDED:
            assert ratio <= NEVER_BELOW, f"{collective.value}: beats the bound ({ratio})"
        if collective in REACHES:
            assert ratio >= MIN_RATIO, f"{collective.value}: only {ratio:.4f} of the bound on {topo.to_json()}"


@st.composite
def _topologies(draw, min_gpus: int = 2, symmetric: bool = True):
    return H.random_topology(draw, min_gpus=min_gpus, symmetric=symmetric)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_rank_subsets(data):
    topo = data.draw(_topologies(min_gpus=3))
    gpus = list(topo.compute_nodes())
    ranks = data.draw(st.lists(st.sampled_from(gpus), min_size=2, max_size=len(gpus), unique=True))
    if not H.ranks_connected(topo, ranks):
        with pytest.raises(SolverError):
            synthesize(topo, Collective.ALLGATHER, ranks)
        return
    for collective in (Collective.ALLGATHER, Collective.REDUCE_SCATTER, Collective.ALLREDUCE):
        ratio = ratio_to_bound(topo, synthesize(topo, collective, ranks))
        assert ratio >= MIN_RATIO
        if collective in BOUNDED:
            assert ratio <= NEVER_BELOW


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_asymmetric_links_verify_and_respect_the_bound(data):
    topo = data.draw(_topologies(symmetric=False))
    ranks = list(topo.compute_nodes())
    for collective in SYNTHESIZED:
        synthesis = synthesize(topo, collective, ranks, root=0 if collective.is_rooted else None)
        ratio = ratio_to_bound(topo, synthesis)
        if collective in BOUNDED:
            assert ratio <= NEVER_BELOW


@pytest.mark.parametrize("collective", list(SYNTHESIZED))
def test_relay_ring_reaches_the_bound(collective):
    topo = H.relay_ring(5)
    synthesis = synthesize(topo, collective, list(topo.compute_nodes()), root=2 if collective.is_rooted else None)
    ratio = ratio_to_bound(topo, synthesis)
    if collective in BOUNDED:
        assert ratio <= NEVER_BELOW
    assert ratio >= MIN_RATIO


def test_allgather_on_a_switch_is_a_star_per_rank():
    # One switch, equal links: the bound is (N-1)/N / B; each shard must reach every other rank
    # exactly once through the switch, so every rank's trees carry N-1 copies in all.
    topo = H.nvswitch_box(4)
    synthesis = synthesize(topo, Collective.ALLGATHER, list(topo.compute_nodes()))
    checked = verify(synthesis.schedule, topo)
    assert checked.ok
    assert synthesis.bound.time_per_byte_s / checked.t_bw_s_per_byte >= MIN_RATIO
    assert synthesis.schedule.collective is Collective.ALLGATHER


@pytest.mark.parametrize("pipeline", [1, 3])
def test_pipeline_layout(pipeline):
    topo = H.gpu_chain(4)
    ranks = list(topo.compute_nodes())
    synthesis = synthesize(topo, Collective.ALLGATHER, ranks, options=SynthesisOptions(pipeline=pipeline))
    schedule = synthesis.schedule
    assert verify(schedule, topo).ok
    # On a chain each root has one tree (the chain itself), height = farthest rank. Every tree
    # ends on the same last step: one of height h is cut into pipeline + (tallest - h) pieces.
    heights = [max(r, len(ranks) - 1 - r) for r in range(len(ranks))]
    tallest = max(heights)
    assert len(schedule.chunks) == sum(pipeline + tallest - h for h in heights)
    assert len(schedule.steps) == tallest + pipeline - 1
    assert all(t.op is Op.COPY for step in schedule.steps for t in step)


def test_reduce_scatter_uses_reduces_and_allreduce_both():
    topo = build_preset("dgx1-v100")
    ranks = ["gpu0", "gpu1", "gpu3", "gpu5"]
    rs = synthesize(topo, Collective.REDUCE_SCATTER, ranks).schedule
    assert all(t.op is Op.REDUCE for step in rs.steps for t in step)
    ar = synthesize(topo, Collective.ALLREDUCE, ranks).schedule
    ops = {t.op for step in ar.steps for t in step}
    assert ops == {Op.REDUCE, Op.COPY}
    assert verify(ar, topo).ok


def test_options_are_checked():
    with pytest.raises(SolverError):
        SynthesisOptions(pipeline=0)
    with pytest.raises(SolverError):
        SynthesisOptions(time_limit_s=0)


# ----------------------------------------------------------------------------- convergence
@pytest.mark.parametrize("preset", ["dgx1-v100", "dgx-h100"])
@pytest.mark.parametrize("collective", [Collective.BROADCAST, Collective.REDUCE], ids=lambda c: c.value)
def test_rooted_collectives_on_presets_converge(preset, collective):
    # One root, many equally good trees: the master LP is degenerate. Column generation must
    # still finish (reach the bound) well inside its time limit rather than cycle until it.
    topo = build_preset(preset)
    options = SynthesisOptions(time_limit_s=20.0)
    synthesis = synthesize(topo, collective, list(topo.compute_nodes()), root=1, options=options)
    assert synthesis.optimal
    ratio = ratio_to_bound(topo, synthesis)
    assert MIN_RATIO <= ratio <= NEVER_BELOW


def _min_cut_bw(topo, ranks) -> float:
    """The narrowest cut between two ranks (networkx max-flow, compute nodes that are not ranks
    left out): allreduce moves every byte across every such cut at least once each way, so no
    schedule's bandwidth time per byte is below one over it."""
    import networkx as nx

    keep = {n.id for n in topo.nodes if not n.kind.is_compute or n.id in ranks}
    graph = nx.DiGraph()
    for link in topo.links:
        if link.src in keep and link.dst in keep:
            graph.add_edge(link.src, link.dst, capacity=link.bw_bytes_per_s)
    return min(nx.maximum_flow_value(graph, u, v) for u in ranks for v in ranks if u != v)


def test_allreduce_over_uneven_machines_sends_each_byte_once_each_way():
    """Two GPUs of one machine on a switch, a third GPU of another machine behind a 10 GB/s link.

    Every byte's reduction and result cross that link once each way, so the allreduce needs
    ``S / 10 GB/s`` of it; reduce-scatter and allgather packed apart each count the third GPU's
    two thirds (the reference bound: ``2 x (2/3) S / 10 GB/s``). Packed together the schedule
    takes the link's time exactly: 4/3 of the reference.
    """
    b = TopologyBuilder("uneven")
    for name, host in (("a", "h0"), ("b", "h0"), ("c", "h1")):
        b.add_node(Node(name, NodeKind.GPU, host_id=host))
    b.add_node(Node("sw", NodeKind.PCIE_SWITCH, host_id="h0"))
    b.add_link("a", "sw", LinkKind.PCIE, 100e9)
    b.add_link("b", "sw", LinkKind.PCIE, 100e9)
    b.add_link("sw", "c", LinkKind.NET, 10e9)
    topo = b.build()
    synthesis = synthesize(topo, Collective.ALLREDUCE, list(topo.compute_nodes()))
    checked = verify(synthesis.schedule, topo)
    assert checked.ok, checked.errors[:3]
    # within the 0.01 % the packing gives up for shallower trees
    assert checked.t_bw_s_per_byte == pytest.approx(1 / 10e9, rel=2e-4, abs=0)
    assert synthesis.bound.time_per_byte_s == pytest.approx(2 * (2 / 3) / 10e9, rel=1e-9, abs=0)


def test_allreduce_on_a_scheduler_s_uneven_job_of_dgx_h100s():
    """8, 8 and 1 GPUs of three DGX H100s: the lone GPU reaches the network only through its
    PCIe link (its NVSwitches join no other GPU of the job), which then carries every byte once
    each way, where the reference bound counts 16/17 of it twice."""
    from topocoll.topo.allocation import allocate
    from topocoll.topo.cluster import make_cluster

    job = allocate(make_cluster("dgx-h100", 4), gpus_per_node=(8, 8, 1), seed=0)
    ranks = list(job.compute_nodes())
    lone = ranks[-1]
    (pcie,) = [link for link in job.links if link.src == lone and link.kind is LinkKind.PCIE]
    synthesis = synthesize(job, Collective.ALLREDUCE, ranks)
    checked = verify(synthesis.schedule, job)
    assert checked.ok, checked.errors[:3]
    assert checked.t_bw_s_per_byte == pytest.approx(1 / pcie.bw_bytes_per_s, rel=1e-3, abs=0)
    assert synthesis.bound.time_per_byte_s / checked.t_bw_s_per_byte == pytest.approx(2 * 16 / 17, rel=1e-3)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_uneven_machines(data):
    """Random graphs whose GPUs sit on machines holding different numbers of them: the
    allreduce verifies, reaches the reference bound, and never beats the narrowest cut."""
    topo = data.draw(_topologies(min_gpus=3))
    gpus = list(topo.compute_nodes())
    hosts = data.draw(st.lists(st.integers(0, 1), min_size=len(gpus), max_size=len(gpus)).filter(lambda h: 0 < sum(h) != len(h) - sum(h)))
    builder = TopologyBuilder("random-uneven")
    for node in topo.nodes:
        builder.add_node(Node(node.id, node.kind, host_id=f"h{hosts[gpus.index(node.id)]}") if node.id in gpus else node)
    for link in topo.links:
        builder.add_link(link.src, link.dst, link.kind, link.bw_bytes_per_s, link.latency_s, duplex=False)
    topo = builder.build()
    synthesis = synthesize(topo, Collective.ALLREDUCE, gpus)
    assert ratio_to_bound(topo, synthesis) >= MIN_RATIO
    checked = verify(synthesis.schedule, topo)
    assert checked.t_bw_s_per_byte >= 1 / _min_cut_bw(topo, gpus) * (1 - 1e-6)
