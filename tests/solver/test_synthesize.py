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
