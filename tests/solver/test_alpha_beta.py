"""The α-β cost model and its sweep over sizes, against hand-computed values."""

from __future__ import annotations

import math

import pytest

from tests.solver import helpers as H
from topocoll.errors import ScheduleError
from topocoll.solver.alpha_beta import alpha_beta_time_s, simulate, step_costs
from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer

N8 = 8


def _two_gpu_allreduce(topo) -> Schedule:
    path01, path10 = ("gpu0", "gpu1"), ("gpu1", "gpu0")
    chunks = (Chunk(0, 0.0, 0.5), Chunk(1, 0.5, 0.5))
    steps = (
        (Transfer(0, 1, 0, Op.REDUCE, path01), Transfer(1, 0, 1, Op.REDUCE, path10)),
        (Transfer(1, 0, 0, Op.COPY, path10), Transfer(0, 1, 1, Op.COPY, path01)),
    )
    return Schedule(Collective.ALLREDUCE, ("gpu0", "gpu1"), None, topo.digest(), chunks, steps)


def test_alpha_beta_time_by_hand():
    bw, overhead, size = 20e9, 5e-6, 1e8
    topo = H.gpu_chain(2, bw=bw)
    link_lat = topo.link("gpu0", "gpu1").latency_s
    sched = _two_gpu_allreduce(topo)
    # two steps; each moves half the buffer one way on each direction of the link
    expected = 2 * (size * 0.5 / bw + link_lat + overhead)
    assert alpha_beta_time_s(sched, topo, size, overhead) == pytest.approx(expected, rel=1e-6, abs=0)
    points = simulate(sched, topo, [size, 0], overhead)
    assert points[0].time_s == pytest.approx(expected, rel=1e-6, abs=0)
    assert points[0].algbw_bytes_per_s == pytest.approx(size / expected)
    assert points[0].busbw_bytes_per_s == pytest.approx(size / expected * 1.0)  # 2(n-1)/n = 1 for n=2
    assert points[1].time_s == pytest.approx(2 * (link_lat + overhead), rel=1e-6, abs=0)


def test_transfers_sharing_a_link_add_up():
    topo = H.gpu_chain(3)
    bw = topo.link("gpu0", "gpu1").bw_bytes_per_s
    chunks = (Chunk(0, 0.0, 0.25), Chunk(1, 0.25, 0.75))
    step = (
        Transfer(0, 1, 0, Op.COPY, ("gpu0", "gpu1")),
        Transfer(0, 2, 1, Op.COPY, ("gpu0", "gpu1", "gpu2")),
    )
    sched = Schedule(Collective.BROADCAST, ("gpu0", "gpu1", "gpu2"), 0, "", chunks, (step,))
    (cost,) = step_costs(sched, topo)
    assert cost.s_per_byte == pytest.approx(1.0 / bw, rel=1e-6, abs=0)  # 0.25 + 0.75 over gpu0->gpu1
    assert cost.latency_s == pytest.approx(topo.path_latency_s(("gpu0", "gpu1", "gpu2")))
    assert math.isclose(alpha_beta_time_s(sched, topo, 1e6), 1e6 / bw + cost.latency_s)


def test_invalid_path_and_size_are_rejected():
    topo = H.gpu_chain(3)
    chunks = (Chunk(0, 0.0, 1.0),)
    step = (Transfer(0, 2, 0, Op.COPY, ("gpu0", "gpu2")),)
    sched = Schedule(Collective.BROADCAST, ("gpu0", "gpu1", "gpu2"), 0, "", chunks, (step,))
    with pytest.raises(ScheduleError, match="gpu0->gpu2"):
        alpha_beta_time_s(sched, topo, 1e6)
    with pytest.raises(ScheduleError, match="size"):
        alpha_beta_time_s(_two_gpu_allreduce(H.gpu_chain(2)), H.gpu_chain(2), -1)


def test_simulated_time_grows_with_size_and_busbw_approaches_the_link():
    from topocoll.solver.baselines import ring

    topo = H.nvswitch_box(4)
    sched = ring(topo, Collective.ALLGATHER)
    sizes = [1e3, 1e6, 1e9, 1e12]
    points = simulate(sched, topo, sizes)
    times = [p.time_s for p in points]
    assert times == sorted(times)
    # ring allgather at large sizes: busbw -> the per-GPU port bandwidth (nccl-tests' intent)
    port_bw = H.NVLINK_BW * H.NVLINKS_PER_GPU
    assert points[-1].busbw_bytes_per_s == pytest.approx(port_bw, rel=1e-3)
