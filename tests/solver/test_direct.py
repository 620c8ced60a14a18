"""The direct multi-path schedule: one step per phase, at the cut bound where no rank must relay."""

from __future__ import annotations

import pytest

from tests.solver import helpers as H
from tests.topo.fixtures import fixture_path
from topocoll.errors import SolverError
from topocoll.solver.bound import cut_bound
from topocoll.solver.direct import direct
from topocoll.solver.planner import PlanStatus, plan_collective
from topocoll.solver.schedule import Collective, Op
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
    """On the MI300X mesh at 64 MiB the direct allgather beats every tree layout by the event
    simulator (their relays through the CPUs pay a fill and a message per piece); on the 8-B200
    VM (one NVSwitch) the LP's stars and the direct schedule both reach the bound and the
    planner takes the one predicted faster."""
    mesh = build_preset("mi300x")
    result = plan_collective(mesh, Collective.ALLGATHER, size_bytes=64 * 2**20)
    assert result.chosen.name == "direct" and result.status is PlanStatus.DIRECT
    assert result.chosen.predicted_time_s == min(c.predicted_time_s for c in result.candidates)
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
