"""The direct multi-path schedule: one step per phase, at the cut bound where no rank must relay."""

from __future__ import annotations

import pytest

from tests.solver import helpers as H
from tests.topo.fixtures import fixture_path
from topocoll.errors import SolverError
from topocoll.solver.bound import cut_bound
from topocoll.solver.direct import direct, two_hop, two_hop_routings
from topocoll.solver.planner import PlanStatus, plan_collective
from topocoll.solver.schedule import Collective, Op
from topocoll.solver.traffic import route_two_hop
from topocoll.solver.verify import verify
from topocoll.topo.io import load_topology
from topocoll.topo.presets import build_preset

BANDWIDTH = (Collective.ALLGATHER, Collective.REDUCE_SCATTER, Collective.ALLREDUCE)


@pytest.mark.parametrize("collective", BANDWIDTH, ids=lambda c: c.value)
def test_one_step_per_phase_at_the_bound_on_a_switch(collective):
    topo = H.nvswitch_box(4)
    sched = direct(topo, collective)
    checked = verify(sched, topo)
    assert checked.ok, checked.errors[:3]
    assert len(sched.steps) == (2 if collective is Collective.ALLREDUCE else 1)
    ops = [{t.op for t in step} for step in sched.steps]
    assert ops == ([{Op.REDUCE}, {Op.COPY}] if collective is Collective.ALLREDUCE else [{Op.COPY if collective is Collective.ALLGATHER else Op.REDUCE}])
    # every rank sends to every other rank straight away
    assert {(t.src, t.dst) for t in sched.steps[-1]} == {(a, b) for a in range(4) for b in range(4) if a != b}
    bound = cut_bound(topo, collective, topo.compute_nodes(), None)
    assert checked.t_bw_s_per_byte == pytest.approx(bound.time_per_byte_s, rel=1e-6, abs=0)


def test_a_dgx_h100_spreads_every_pair_over_its_nvswitch_chips():
    """Each GPU has 5/4/4/5 NVLinks to the four chips: one chip's route carries at most 5/18 of a
    pair's bytes, so the bound needs all four, and the schedule uses all four."""
    topo = build_preset("dgx-h100")
    sched = direct(topo, Collective.ALLGATHER)
    checked = verify(sched, topo)
    bound = cut_bound(topo, Collective.ALLGATHER, topo.compute_nodes(), None)
    assert checked.ok and checked.t_bw_s_per_byte == pytest.approx(bound.time_per_byte_s, rel=1e-6, abs=0)
    chips = {node for t in sched.steps[0] for node in t.path if node.startswith("nvswitch")}
    assert chips == {f"nvswitch{i}" for i in range(4)}


def test_a_pair_reached_only_through_a_rank_takes_its_widest_route():
    topo = H.gpu_chain(3)  # gpu0 reaches gpu2 only through gpu1
    for collective in BANDWIDTH:
        sched = direct(topo, collective)
        assert verify(sched, topo).ok
        assert ("gpu0", "gpu1", "gpu2") in {t.path for step in sched.steps for t in step}


def test_rooted_collectives_have_no_direct_form():
    for collective in (Collective.BROADCAST, Collective.REDUCE):
        with pytest.raises(SolverError, match="no direct schedule"):
            direct(H.nvswitch_box(4), collective)


def test_the_planner_runs_it_where_it_is_fastest():
    """On the MI300X mesh at 64 MiB the two-hop allgather beats the relay-free one and every
    tree layout by the event simulator (the trees' relays through the CPUs pay a fill and a
    message per piece); on the 8-B200 VM (one NVSwitch) the LP's stars and the direct schedule
    both reach the bound and the planner takes the one predicted faster."""
    mesh = build_preset("mi300x")
    result = plan_collective(mesh, Collective.ALLGATHER, size_bytes=64 * 2**20)
    assert result.chosen.name == "two-hop" and result.status is PlanStatus.DIRECT
    assert result.chosen.predicted_time_s == min(c.predicted_time_s for c in result.candidates)
    assert result.chosen.predicted_time_s < result.candidate("direct").predicted_time_s
    vm = load_topology(fixture_path("modal-b200-vm-gvisor.nccl-topo.xml"))
    result = plan_collective(vm, Collective.ALLGATHER, size_bytes=64 * 2**20)
    assert "direct" in {c.name for c in result.candidates}
    assert result.chosen.predicted_time_s == min(c.predicted_time_s for c in result.candidates)
    assert result.ratio_to_bound >= 0.995


def test_on_a_mesh_no_path_is_overloaded_by_left_out_relays():
    """Every pair of the MI300X mesh has its own xGMI link, so sending each shard over it alone
    takes (S / 8) / its bandwidth; the direct schedule, routed over relay-free paths, is no
    slower (a routing made with relays and then stripped of them was 22 % slower)."""
    topo = build_preset("mi300x")
    size = 64 * 2**20
    for collective in BANDWIDTH:
        sched = direct(topo, collective)
        assert not any(set(t.path[1:-1]) & set(sched.ranks) for step in sched.steps for t in step)
        star_s = (size / 8) / topo.link("gpu0", "gpu1").bw_bytes_per_s * (2 if collective is Collective.ALLREDUCE else 1)
        assert verify(sched, topo, size_bytes=size).t_bw_s <= star_s * (1 + 1e-6)


@pytest.mark.parametrize("collective", BANDWIDTH, ids=lambda c: c.value)
def test_forwarding_once_reaches_the_bound_the_straight_paths_miss(collective):
    """On the MI300X each GPU takes in 7 xGMI links and one PCIe link; the bound needs all
    eight, and the PCIe links can be filled only with parts of shards that a GPU of the same
    socket got over xGMI. Relay-free, the direct schedule stays at about 89 %; forwarded once,
    at the bound (expected value: the cut bound, computed independently by max-flows)."""
    topo = build_preset("mi300x")
    size = 64 * 2**20
    bound = cut_bound(topo, collective, topo.compute_nodes(), None)
    straight = verify(direct(topo, collective), topo, size_bytes=size)
    assert straight.t_bw_s_per_byte > bound.time_per_byte_s * 1.1
    routings = two_hop_routings(topo, collective, topo.compute_nodes())
    for depth in (1, 2):
        sched = two_hop(topo, collective, pipeline=depth, routings=routings)
        checked = verify(sched, topo, size_bytes=size)
        assert checked.ok, checked.errors[:3]
        assert checked.t_bw_s_per_byte == pytest.approx(bound.time_per_byte_s, rel=1e-4, abs=0)
        assert not any(set(t.path[1:-1]) & set(sched.ranks) for step in sched.steps for t in step)
        per_phase = 6 if collective is Collective.ALLREDUCE else 3
        assert len(sched.steps) <= per_phase * depth


@pytest.mark.parametrize("reverse", (False, True), ids=("allgather", "reduce_scatter"))
def test_two_hop_routes_forward_only_what_the_forwarder_got_straight(reverse):
    """Every (owner, member)'s routes carry the whole shard; the parts forwarded for one owner's
    shard fit in it side by side; a forwarder is neither end; no path passes through a rank."""
    topo = build_preset("mi300x")
    ranks = topo.compute_nodes()
    routing = route_two_hop(topo, ranks, reverse=reverse)
    n = len(ranks)
    whole = {(o, m): 0.0 for o in range(n) for m in range(n) if o != m}
    forwarded = [0.0] * n
    for route in routing.routes:
        whole[(route.owner, route.member)] += route.fraction
        assert not set(route.path[1:-1]) & set(ranks)
        if route.via is None:
            ends = (ranks[route.member], ranks[route.owner]) if reverse else (ranks[route.owner], ranks[route.member])
        else:
            assert route.via not in (route.owner, route.member)
            forwarded[route.owner] += route.fraction
            ends = (ranks[route.member], ranks[route.via]) if reverse else (ranks[route.via], ranks[route.member])
        assert (route.path[0], route.path[-1]) == ends
    assert all(v == pytest.approx(1.0, abs=1e-6) for v in whole.values())
    assert max(forwarded) <= 1 + 1e-6 and sum(forwarded) > 0
    bound = cut_bound(topo, Collective.REDUCE_SCATTER if reverse else Collective.ALLGATHER, ranks, None)
    assert routing.time_per_shard_byte_s == pytest.approx(bound.time_per_byte_s * n, rel=1e-4, abs=0)


def test_two_hop_refuses_what_it_cannot_run():
    topo = H.gpu_chain(3)  # gpu0 reaches gpu2 only through gpu1
    with pytest.raises(SolverError, match=r"rank 0 \(gpu0\) reaches rank 2 \(gpu2\) only through other ranks"):
        two_hop(topo, Collective.ALLGATHER)
    mesh = build_preset("mi300x")
    with pytest.raises(SolverError, match="pipeline depth must be >= 1"):
        two_hop(mesh, Collective.ALLGATHER, pipeline=0)
    with pytest.raises(SolverError, match="no direct schedule"):
        two_hop(mesh, Collective.BROADCAST)
