"""The event simulator, against times and rates worked out by hand and against the α-β model."""

from __future__ import annotations

import numpy as np
import pytest

from tests.solver import helpers as H
from topocoll.errors import ScheduleError
from topocoll.solver.alpha_beta import simulate
from topocoll.solver.baselines import recursive_doubling, ring
from topocoll.solver.events import compile_events, event_sweep, max_min_rates, simulate_events
from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer
from topocoll.solver.verify import verify
from topocoll.topo.model import LinkKind, Node, NodeKind, TopologyBuilder


def _star(bw_by_gpu: dict[str, float], latency_s: float = 0.0):
    """GPUs on one switch, each with its own port bandwidth."""
    b = TopologyBuilder("star")
    b.add_node(Node("sw", NodeKind.NVSWITCH))
    for rank, (gpu, bw) in enumerate(bw_by_gpu.items()):
        b.add_node(Node(gpu, NodeKind.GPU, rank=rank))
        b.add_link(gpu, "sw", LinkKind.NVLINK, bw, latency_s)
    return b.build()


def _one(size_bytes, schedule, topo, overhead_s=0.0):
    return simulate_events(compile_events(schedule, topo), schedule, size_bytes, overhead_s)


# ------------------------------------------------------------------ max-min fair sharing
def test_max_min_rates_by_progressive_filling():
    """Link 0 (10 units) carries flows a, b, c; link 1 (4 units) carries b and c; link 2 (1) carries c.

    c is held to 1 by link 2; b then gets link 1's other 3; a gets what link 0 has left, 6.
    """
    hops = {"a": [0], "b": [0, 1], "c": [0, 1, 2]}
    flow_links = np.array([link for links in hops.values() for link in links])
    flow_of_hop = np.repeat(np.arange(3), [len(v) for v in hops.values()])
    rates = max_min_rates(flow_links, flow_of_hop, 3, np.array([10.0, 4.0, 1.0]))
    assert rates.tolist() == pytest.approx([6.0, 3.0, 1.0])


def test_equal_flows_split_a_link_equally():
    rates = max_min_rates(np.array([0, 0, 0, 0]), np.arange(4), 4, np.array([8.0]))
    assert rates.tolist() == pytest.approx([2.0] * 4)


# ------------------------------------------------------------------------ exact times
def test_one_message_costs_overhead_bytes_and_latency():
    bw, latency, overhead, size = 20e9, 3e-6, 5e-6, 1e8
    topo = _star({"gpu0": bw, "gpu1": bw}, latency)
    chunks = (Chunk(0, 0.0, 1.0),)
    sched = Schedule(Collective.BROADCAST, ("gpu0", "gpu1"), 0, "", chunks, ((Transfer(0, 1, 0, Op.COPY, ("gpu0", "sw", "gpu1")),),))
    result = _one(size, sched, topo, overhead)
    assert result.time_s == pytest.approx(overhead + size / bw + 2 * latency, rel=1e-6, abs=0)
    assert result.algbw_bytes_per_s == pytest.approx(size / result.time_s, rel=1e-6, abs=0)
    (first, second) = result.links
    assert {(first.src, first.dst), (second.src, second.dst)} == {("gpu0", "sw"), ("sw", "gpu1")}
    assert first.bytes == pytest.approx(size) and first.utilisation == pytest.approx(size / bw / result.time_s)


def test_a_slow_port_holds_back_only_the_flows_through_it():
    """gpu0 sends 1/2 of S to gpu1 (fast port) and 1/2 to gpu2 (port 1/4 as fast), in one step.

    Max-min: the flow to gpu2 runs at bw/4 throughout; the one to gpu1 gets the rest of gpu0's
    port, 3 bw/4, and ends at (S/2)/(3bw/4); then it is alone, so the message to gpu2 ends at
    (S/2)/(bw/4) = 2 S/bw. The α-β model says the same for the step (its slowest link).
    """
    bw, size = 40e9, 1e9
    topo = _star({"gpu0": bw, "gpu1": bw, "gpu2": bw / 4})
    chunks = (Chunk(0, 0.0, 0.5), Chunk(1, 0.5, 0.5))
    step = (Transfer(0, 1, 0, Op.COPY, ("gpu0", "sw", "gpu1")), Transfer(0, 2, 1, Op.COPY, ("gpu0", "sw", "gpu2")))
    sched = Schedule(Collective.BROADCAST, ("gpu0", "gpu1", "gpu2"), 0, "", chunks, (step,))
    result = _one(size, sched, topo)
    assert result.time_s == pytest.approx(2 * size / bw, rel=1e-6, abs=0)
    assert [(u.src, u.dst) for u in result.bottlenecks()] == [("sw", "gpu2")]
    assert result.links[0].utilisation == pytest.approx(1.0)


def test_a_rank_forwards_what_arrived_without_waiting_for_the_step():
    """Step 0: gpu0 -> gpu1 a large chunk, gpu2 -> gpu3 a small one. Step 1: gpu3 -> gpu2 the small one.

    The α-β model holds step 1 until step 0's large message is done; here gpu3 forwards as
    soon as the small chunk arrived: the run ends with the large message.
    """
    bw, size = 10e9, 1e9
    topo = _star({f"gpu{i}": bw for i in range(4)})
    chunks = (Chunk(0, 0.0, 0.9), Chunk(1, 0.9, 0.1))
    path = lambda a, b: (f"gpu{a}", "sw", f"gpu{b}")  # noqa: E731
    steps = (
        (Transfer(0, 1, 0, Op.COPY, path(0, 1)), Transfer(2, 3, 1, Op.COPY, path(2, 3))),
        (Transfer(3, 2, 1, Op.REDUCE, path(3, 2)),),
    )
    sched = Schedule(Collective.BROADCAST, tuple(f"gpu{i}" for i in range(4)), 0, "", chunks, steps)
    assert _one(size, sched, topo).time_s == pytest.approx(0.9 * size / bw, rel=1e-6, abs=0)
    (alpha_beta,) = simulate(sched, topo, [size])
    assert alpha_beta.time_s == pytest.approx(size / bw, rel=1e-6, abs=0)  # 0.9 then 0.1: lock step


def test_pieces_on_one_connection_go_in_order_and_pipeline():
    """A chain gpu0 -> gpu1 -> gpu2 broadcasting p pieces: (p + 1) piece times, not 2 p."""
    bw, size, pieces = 10e9, 1e9, 8
    topo = H.gpu_chain(3, bw=bw)
    chunks = tuple(Chunk(j, j / pieces, 1 / pieces) for j in range(pieces))
    steps = []
    for s in range(pieces + 1):
        step = []
        if s < pieces:
            step.append(Transfer(0, 1, s, Op.COPY, ("gpu0", "gpu1")))
        if s >= 1:
            step.append(Transfer(1, 2, s - 1, Op.COPY, ("gpu1", "gpu2")))
        steps.append(tuple(step))
    sched = Schedule(Collective.BROADCAST, ("gpu0", "gpu1", "gpu2"), 0, "", chunks, tuple(steps))
    lat = topo.link("gpu0", "gpu1").latency_s
    piece_s = size / pieces / bw
    # gpu0's pieces leave back to back; gpu1 forwards each once it has arrived
    expected = pieces * piece_s + lat + piece_s + lat
    assert _one(size, sched, topo).time_s == pytest.approx(expected, rel=1e-6, abs=0)


def test_a_connection_keeps_step_order_even_when_a_later_message_is_ready():
    """gpu2 sends chunk 0 to gpu0 (step 0), which forwards it to gpu1 (step 1) and then sends its
    own chunk 1 to gpu1 (step 2). Chunk 1 is there from the start, but the connection gpu0 -> gpu1
    takes its messages in step order, as a thread block does: three half-buffer sends in a row."""
    bw, size = 10e9, 1e9
    topo = _star({f"gpu{i}": bw for i in range(3)})
    chunks = (Chunk(0, 0.0, 0.5), Chunk(1, 0.5, 0.5))
    path = lambda a, b: (f"gpu{a}", "sw", f"gpu{b}")  # noqa: E731
    steps = (
        (Transfer(2, 0, 0, Op.COPY, path(2, 0)),),
        (Transfer(0, 1, 0, Op.COPY, path(0, 1)),),
        (Transfer(0, 1, 1, Op.COPY, path(0, 1)),),
    )
    sched = Schedule(Collective.BROADCAST, ("gpu0", "gpu1", "gpu2"), 0, "", chunks, steps)
    latency = topo.path_latency_s(path(0, 1))
    # chunk 0 arrives at gpu0 after S/2 / bw + latency; both sends to gpu1 follow back to back
    assert _one(size, sched, topo).time_s == pytest.approx(3 * 0.5 * size / bw + 2 * latency, rel=1e-6, abs=0)


# ------------------------------------------------------------ the two limits of the model
@pytest.mark.parametrize("make", [ring, recursive_doubling], ids=["ring", "recursive_doubling"])
def test_tiny_messages_cost_what_the_alpha_beta_model_says(make):
    """At 8 bytes only latency and overhead count; every step of these depends on the one before."""
    topo = H.nvswitch_box(8)
    sched = make(topo, Collective.ALLGATHER)
    overhead = 8e-6
    (ab,) = simulate(sched, topo, [8], overhead)
    assert _one(8, sched, topo, overhead).time_s == pytest.approx(ab.time_s, rel=1e-6, abs=0)


def test_large_messages_take_the_bandwidth_time_when_nothing_waits():
    """Direct allgather on a switch: one step, all messages at once; T = T_bw + overhead + latency."""
    topo = H.nvswitch_box(4)
    ranks = tuple(f"gpu{i}" for i in range(4))
    chunks = tuple(Chunk(i, i / 4, 0.25) for i in range(4))
    step = tuple(
        Transfer(a, b, a, Op.COPY, (ranks[a], "nvswitch0", ranks[b])) for a in range(4) for b in range(4) if a != b
    )
    sched = Schedule(Collective.ALLGATHER, ranks, None, topo.digest(), chunks, (step,))
    size, overhead = 4e9, 8e-6
    t_bw = verify(sched, topo, size_bytes=size).t_bw_s_per_byte * size
    latency = topo.path_latency_s(("gpu0", "nvswitch0", "gpu1"))
    result = _one(size, sched, topo, overhead)
    assert result.time_s == pytest.approx(t_bw + overhead + latency, rel=1e-6, abs=0)
    assert min(u.utilisation for u in result.links) == pytest.approx(t_bw / result.time_s, rel=1e-6, abs=0)


def test_sweep_compiles_once_and_time_grows_with_size():
    topo = H.nvswitch_box(4)
    sched = ring(topo, Collective.ALLREDUCE)
    points = event_sweep(sched, topo, [0, 1e3, 1e6, 1e9], 1e-6)
    times = [p.time_s for p in points]
    assert times == sorted(times) and times[0] > 0  # latency and overhead even for 0 bytes
    assert points[0].algbw_bytes_per_s == 0.0 and points[-1].busbw_bytes_per_s > 0


def test_bad_size_and_overhead_are_refused():
    topo = H.gpu_chain(2)
    sched = ring(topo, Collective.ALLGATHER)
    program = compile_events(sched, topo)
    for size, overhead, word in ((-1, 0, "size"), (float("nan"), 0, "size"), (1e6, -1e-6, "overhead")):
        with pytest.raises(ScheduleError, match=word):
            simulate_events(program, sched, size, overhead)


def test_a_path_outside_the_topology_is_named():
    topo = H.gpu_chain(3)
    sched = Schedule(
        Collective.BROADCAST, ("gpu0", "gpu1", "gpu2"), 0, "", (Chunk(0, 0.0, 1.0),), ((Transfer(0, 2, 0, Op.COPY, ("gpu0", "gpu2")),),)
    )
    with pytest.raises(ScheduleError, match="gpu0->gpu2"):
        compile_events(sched, topo)
