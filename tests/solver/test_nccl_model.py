"""The model of NCCL's collectives: what it reads from the graph, the latencies and bandwidths it
derives (checked against NCCL's published constants and the presets' links, written out here),
the algorithm it picks per size, its calibration's agreement with the committed report, and the
planner handing a collective to NCCL where NCCL is predicted faster."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest

from topocoll.errors import SolverError
from topocoll.solver.nccl_model import (
    CALIBRATION,
    Algorithm,
    NcclEstimate,
    NcclNative,
    Protocol,
    nccl_estimates,
    nccl_algorithms,
    nccl_native,
    nccl_time,
    nccl_view,
)
from topocoll.solver.alpha_beta import simulate
from topocoll.solver.baselines import ring
from topocoll.solver.events import event_sweep
from topocoll.solver.planner import DEFAULT_PER_MESSAGE_OVERHEAD_S, backend_topology, plan_collective, predict_times
from topocoll.solver.schedule import NATIVE, Collective
from topocoll.solver.verify import verify
from topocoll.topo.cluster import make_cluster
from topocoll.topo.discover import flat_topology
from topocoll.topo.model import LinkKind, NodeKind, Topology
from topocoll.topo.presets import build_preset

REPO = Path(__file__).resolve().parents[2]
US = 1e-6
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
NATIVE_COLLECTIVES = (Collective.ALLREDUCE, Collective.ALLGATHER)


def nvlink_to_switches(topology, gpu):
    """A GPU's NVLink bandwidth to NVSwitches, summed from the topology's links."""
    switches = {n.id for n in topology.nodes if n.kind is NodeKind.NVSWITCH}
    return sum(l.bw_bytes_per_s for l in topology.links if l.src == gpu and l.kind is LinkKind.NVLINK and l.dst in switches)


def by_label(estimates):
    return {(e.algorithm, e.protocol): e for e in estimates}


def test_view_of_one_nvswitch_machine():
    h100 = build_preset("dgx-h100")
    ranks = h100.compute_nodes()
    view = nccl_view(h100, ranks)
    assert (view.ranks, view.machines, view.intra, view.nvls) == (8, 1, "nvlink", True)
    assert view.sm == min(h100.node(r).sm for r in ranks)
    assert view.gpu_bw_bytes_per_s == pytest.approx(min(nvlink_to_switches(h100, r) for r in ranks))
    assert view.network_bw_bytes_per_s is None
    a100 = build_preset("dgx-a100")
    assert nccl_view(a100, a100.compute_nodes()).nvls is False  # NVSwitch, but no NVLS before Hopper


def test_view_of_two_machines_sums_each_machines_nics():
    cluster = make_cluster("dgx-h100", 2, nics_per_node=8, nic_bw_bytes_per_s=25e9)
    view = nccl_view(cluster, cluster.compute_nodes())
    assert (view.ranks, view.machines, view.ranks_per_machine) == (16, 2, 8)
    assert view.network_bw_bytes_per_s == pytest.approx(8 * 25e9)


def test_view_of_a_pcie_box_and_a_partial_mesh():
    pcie = build_preset("pcie-8gpu")
    view = nccl_view(pcie, pcie.compute_nodes())
    assert view.intra == "pcie" and not view.nvls
    # rings cross the PCIe tree: never more than one GPU's own PCIe link
    widest_pcie = max(l.bw_bytes_per_s for l in pcie.links if l.src == pcie.compute_nodes()[0] and l.kind is LinkKind.PCIE)
    assert 0 < view.gpu_bw_bytes_per_s <= widest_pcie
    assert Protocol.LL128 not in {e.protocol for e in nccl_estimates(view, Collective.ALLREDUCE)}  # NCCL keeps LL128 to NVLink
    dgx1 = build_preset("dgx1-v100")
    five = dgx1.compute_nodes()[:5]
    partial = nccl_view(dgx1, five)
    # only NVLinks among the five can carry a ring: less than a GPU's six NVLinks
    own = sum(l.bw_bytes_per_s for l in dgx1.links if l.src == five[0] and l.kind is LinkKind.NVLINK)
    assert partial.intra == "nvlink" and 0 < partial.gpu_bw_bytes_per_s < own


def test_ring_latencies_are_nccls_constants_times_the_hops():
    """NCCL's tuning constants (src/graph/tuning.cc), written out: ring base latency LL 6.6,
    LL128 14, Simple 8.4 us; per NVLink hop 0.6, 1.9, 3.4 us; an allreduce ring takes 2 (n - 1) hops;
    all of them times the calibrated latency scale. The host's cost per call is apart from them."""
    h100 = build_preset("dgx-h100")
    view = nccl_view(h100, h100.compute_nodes())
    overhead = CALIBRATION.overhead_s(90)
    estimates = by_label(nccl_estimates(view, Collective.ALLREDUCE))
    scale = CALIBRATION.latency_scale
    for protocol, base, hop in ((Protocol.LL, 6.6, 0.6), (Protocol.LL128, 14.0, 1.9), (Protocol.SIMPLE, 8.4, 3.4)):
        assert estimates[Algorithm.RING, protocol].latency_s == pytest.approx(scale * (base + 14 * hop) * US)
        assert estimates[Algorithm.RING, protocol].host_s == overhead
    # an allgather ring takes n - 1 hops
    gather = by_label(nccl_estimates(view, Collective.ALLGATHER))
    assert gather[Algorithm.RING, Protocol.LL].latency_s == pytest.approx(scale * (6.6 + 7 * 0.6) * US)


def test_a_call_takes_the_longer_of_the_hosts_cost_and_the_devices_time():
    """nccl-tests issues its calls back to back and waits once: the host's cost of the next call
    overlaps with the device's work on this one, so the slower of the two sets the pace."""
    estimate = NcclEstimate(Algorithm.RING, Protocol.LL, latency_s=20 * US, algbw_bytes_per_s=10e9, host_s=40 * US)
    assert estimate.time_s(1024) == pytest.approx(40 * US)  # the device's 20.1 us hide behind the host
    assert estimate.time_s(1 << 20) == pytest.approx(20 * US + (1 << 20) / 10e9)  # 125 us: the device's
    assert estimate.time_s(200_000) == pytest.approx(40 * US)  # both 40 us
    a100 = build_preset("dgx-a100")
    native = nccl_native(a100, a100.compute_nodes())
    assert native.call_s(1 * US) == native.call_overhead_s == CALIBRATION.overhead_s(80)
    assert native.call_s(1.0) == 1.0


def test_bandwidths_follow_the_protocols_and_the_in_switch_limit():
    h100 = build_preset("dgx-h100")
    view = nccl_view(h100, h100.compute_nodes())
    b = view.gpu_bw_bytes_per_s
    n = 8
    estimates = by_label(nccl_estimates(view, Collective.ALLREDUCE))
    ring_simple = estimates[Algorithm.RING, Protocol.SIMPLE].algbw_bytes_per_s
    assert ring_simple == pytest.approx(b * CALIBRATION.ring_efficiency * n / (2 * (n - 1)))  # busbw -> algbw
    assert estimates[Algorithm.RING, Protocol.LL128].algbw_bytes_per_s == pytest.approx(0.92 * ring_simple)
    # LL: half the bandwidth, at most NCCL's 141 GB/s of busbw on Hopper
    assert estimates[Algorithm.RING, Protocol.LL].algbw_bytes_per_s == pytest.approx(min(0.5 * b * CALIBRATION.ring_efficiency, 141e9) * n / (2 * (n - 1)))
    # NVLS: each GPU sends its buffer up and takes the reduced one down, plus its shard: B / (1 + 1/n)
    assert estimates[Algorithm.NVLS, Protocol.SIMPLE].algbw_bytes_per_s == pytest.approx(b * CALIBRATION.nvls_efficiency / (1 + 1 / n))


@pytest.mark.parametrize("preset, small, large", [
    # Hopper: NVLS's latency in the switch (NCCL's 25 us times 1.22, as the NVLS tables show it)
    # is below the LL ring's (NCCL's 15 us times 2.31)
    ("dgx-h100", (Algorithm.NVLS, Protocol.SIMPLE), (Algorithm.NVLS, Protocol.SIMPLE)),
    ("dgx-a100", (Algorithm.RING, Protocol.LL), (Algorithm.RING, Protocol.SIMPLE)),
])
def test_small_messages_take_the_least_latency_and_large_ones_the_widest_algorithm(preset, small, large):
    topology = build_preset(preset)
    view = nccl_view(topology, topology.compute_nodes())
    estimates = nccl_estimates(view, Collective.ALLREDUCE)
    assert min(estimates, key=lambda e: e.latency_s).label == "/".join(a.value for a in small)
    assert (nccl_time(view, Collective.ALLREDUCE, KIB).algorithm, nccl_time(view, Collective.ALLREDUCE, KIB).protocol) == small
    big = nccl_time(view, Collective.ALLREDUCE, 8 * GIB)
    assert (big.algorithm, big.protocol) == large
    assert big.algbw_bytes_per_s == max(e.algbw_bytes_per_s for e in nccl_estimates(view, Collective.ALLREDUCE))
    times = [nccl_time(view, Collective.ALLREDUCE, 1 << k).time_s(1 << k) for k in range(3, 34)]
    floor = CALIBRATION.overhead_s(topology.node(topology.compute_nodes()[0]).sm)
    # 8 bytes: the host's cost per call or the least latency, whichever is longer
    assert times[0] == pytest.approx(max(floor, min(e.latency_s for e in estimates)), rel=1e-5)
    assert all(a <= b for a, b in zip(times, times[1:]))
    assert all(a < b for a, b in zip(times, times[1:]) if b > floor)


def test_two_machines_run_trees_whose_network_share_doubles():
    """Between two machines a tree sends and receives each byte once per machine (algbw up to
    the network's), where a ring's busbw is held to it: so trees win at large sizes."""
    cluster = make_cluster("dgx-h100", 2, nics_per_node=8, nic_bw_bytes_per_s=25e9)
    view = nccl_view(cluster, cluster.compute_nodes())
    big = nccl_time(view, Collective.ALLREDUCE, 8 * GIB)
    assert big.algorithm is Algorithm.NVLS_TREE
    network = view.network_bw_bytes_per_s * CALIBRATION.network_efficiency
    assert big.algbw_bytes_per_s == pytest.approx(min(network, view.gpu_bw_bytes_per_s * CALIBRATION.nvls_efficiency / (1 + 1 / 8)))
    ring = by_label(nccl_estimates(view, Collective.ALLREDUCE))[Algorithm.RING, Protocol.SIMPLE]
    assert ring.algbw_bytes_per_s * 2 * 15 / 16 == pytest.approx(network)  # busbw = the network's
    # the network's latency counts once per hop for LL, twice (data, then flush) for Simple
    slow = dataclasses.replace(view, network_latency_s=50 * US)
    hops = 2  # between two machines a ring crosses 2 (machines - 1) times, a tree 2 log2(machines)
    for (algorithm, protocol), e in by_label(nccl_estimates(slow, Collective.ALLREDUCE)).items():
        before = by_label(nccl_estimates(view, Collective.ALLREDUCE))[algorithm, protocol].latency_s
        assert e.latency_s - before == pytest.approx(hops * 50 * US * (2 if protocol is Protocol.SIMPLE else 1))
    # a transport that stages Simple's chunks through the host: Simple's own figure replaces the rule
    staged = dataclasses.replace(slow, network_simple_latency_s=400 * US)
    for (algorithm, protocol), e in by_label(nccl_estimates(staged, Collective.ALLREDUCE)).items():
        before = by_label(nccl_estimates(view, Collective.ALLREDUCE))[algorithm, protocol].latency_s
        assert e.latency_s - before == pytest.approx(hops * (400 if protocol is Protocol.SIMPLE else 50) * US)
    rdma_less = dataclasses.replace(view, network_rdma=False)
    assert Protocol.LL128 not in {e.protocol for e in nccl_estimates(rdma_less, Collective.ALLREDUCE)}


def test_nccl_algo_restricts_the_tuner_as_nccl_does():
    h100 = build_preset("dgx-h100")
    view = nccl_view(h100, h100.compute_nodes())
    nvls = nccl_algorithms("NVLS")
    assert nvls == {Algorithm.NVLS}
    for spec, algorithm in (("NVLS", Algorithm.NVLS), ("Ring", Algorithm.RING), ("tree", Algorithm.TREE)):
        for k in range(10, 34, 3):
            size = 1 << k
            forced = nccl_time(view, Collective.ALLREDUCE, size, algorithms=nccl_algorithms(spec))
            assert forced.algorithm is algorithm
            # the free choice is the fastest; a restricted one can only be as fast or slower
            assert forced.time_s(size) >= nccl_time(view, Collective.ALLREDUCE, size).time_s(size)
    # the syntax: any case, NVLSTree's spelling, '^' for all but
    assert nccl_algorithms("ring,nvlstree") == {Algorithm.RING, Algorithm.NVLS_TREE}
    assert nccl_algorithms("^Ring,Tree") == set(Algorithm) - {Algorithm.RING, Algorithm.TREE}
    for bad, message in (("", "names no algorithm"), ("CollNetDirect", "unknown algorithm 'CollNetDirect'"), ("Ring,Bogus", "'Bogus'")):
        with pytest.raises(ValueError, match=message):
            nccl_algorithms(bad)
    # the A100 has no NVLS: NCCL fails such a call, and so does the model
    a100 = build_preset("dgx-a100")
    with pytest.raises(ValueError, match="none of the algorithms nvls runs allreduce"):
        nccl_time(nccl_view(a100, a100.compute_nodes()), Collective.ALLREDUCE, KIB, algorithms=nvls)


def test_bad_requests_are_refused():
    flat = flat_topology(4)
    with pytest.raises(SolverError, match="GPU ranks"):
        nccl_view(flat, flat.compute_nodes())
    assert nccl_native(flat, flat.compute_nodes()) is None
    h100 = build_preset("dgx-h100")
    view = nccl_view(h100, h100.compute_nodes())
    with pytest.raises(ValueError, match="size"):
        nccl_time(view, Collective.ALLREDUCE, 0)
    with pytest.raises(ValueError, match="two ranks"):
        nccl_time(nccl_view(h100, h100.compute_nodes()[:1]), Collective.ALLREDUCE, KIB)


def _tables_module():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import nccl_tables
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return nccl_tables


def test_the_calibration_is_the_committed_fit_and_the_report_is_current():
    report = json.loads((REPO / "benchmarks" / "results" / "nccl_tables.json").read_text())
    fitted = report["calibration"]
    assert CALIBRATION.overhead_s(80) == pytest.approx(fitted["call_overhead_sm80_us"] * US, abs=1e-9)
    assert CALIBRATION.overhead_s(90) == pytest.approx(fitted["call_overhead_sm90_us"] * US, abs=1e-9)
    for name in ("ring_efficiency", "nvls_efficiency", "network_efficiency", "latency_scale", "nvls_latency_scale"):
        assert getattr(CALIBRATION, name) == pytest.approx(fitted[name], abs=5e-4)
    assert CALIBRATION.nvls_chunk_s == pytest.approx(fitted["nvls_chunk_us"] * US, abs=1e-9)
    # every committed prediction is what the model says today, from the tables' own files
    tables = _tables_module()
    for table in tables.load_tables():
        committed = next(t for t in report["tables"] if t["table"] == table.name)
        assert [r["measured_busbw_bytes_per_s"] for r in committed["rows"]] == [busbw for _, busbw in table.measured]
        predicted = tables.predicted_busbw(table, CALIBRATION, committed["network_latency_s"], committed["network_simple_latency_s"])
        for row, (busbw, label) in zip(committed["rows"], predicted):
            assert busbw == pytest.approx(row["predicted_busbw_bytes_per_s"], rel=2e-3)
            assert label == row["algorithm"]


def test_the_tables_are_fitted_as_their_publisher_ran_them():
    tables = _tables_module()
    report = json.loads((REPO / "benchmarks" / "results" / "nccl_tables.json").read_text())
    forced = {name: machine["nccl_algo"] for name, _, machine in tables.MACHINES if "nccl_algo" in machine}
    assert forced == {"azure-ndv5-h100-8gpu.allreduce-busbw-table.txt": "NVLS", "azure-ndh200v5-h200-8gpu.allreduce-busbw-table.txt": "NVLS"}
    run, free = tables.load_tables(), tables.load_tables(free_choice=True)
    for table, unforced in zip(run, free, strict=True):
        assert table.algorithms == (nccl_algorithms(forced[table.name]) if table.name in forced else None)
        assert unforced.algorithms is None and unforced.measured == table.measured
        committed = next(t for t in report["tables"] if t["table"] == table.name)
        assert all(row["algorithm"] == "nvls/Simple" for row in committed["rows"]) == (table.name in forced)
    # the comparison fit, every table predicted by NCCL's free choice, is current too
    values = [report["free_choice"]["calibration"][name] for name, _, _ in tables.PARAMETERS]
    for table in free:
        committed = next(t for t in report["free_choice"]["tables"] if t["table"] == table.name)
        predicted = tables.predicted_busbw(table, tables.calibration_of(values), committed["network_latency_s"], committed["network_simple_latency_s"])
        for row, (busbw, label) in zip(committed["rows"], predicted, strict=True):
            assert busbw == pytest.approx(row["predicted_busbw_bytes_per_s"], rel=2e-3)
            assert label == row["algorithm"]


def test_nvls_pays_per_chunk_and_its_chunks_grow_with_the_message():
    h100 = build_preset("dgx-h100")
    view = nccl_view(h100, h100.compute_nodes())
    (nvls,) = [e for e in nccl_estimates(view, Collective.ALLREDUCE) if e.algorithm is Algorithm.NVLS]
    # NCCL's rule with 16 channels x 8 heads = 128 pieces in flight: 16 KiB chunks below
    # 2 * 128 * 32 KiB = 8 MiB, 32 KiB below 8 * 128 * 64 KiB = 64 MiB, 64 KiB below
    # 64 * 128 * 128 KiB = 1 GiB, then 128 KiB; each piece moves size / 128 in such chunks.
    for size, chunk in ((4 << 20, 16 << 10), (8 << 20, 32 << 10), (32 << 20, 32 << 10), (64 << 20, 64 << 10), (1 << 30, 128 << 10)):
        chunks = size / 128 / chunk
        expected = nvls.latency_s + size / nvls.algbw_bytes_per_s + chunks * CALIBRATION.nvls_chunk_s
        assert nvls.device_s(size) == pytest.approx(expected, rel=1e-12)
    # so its bandwidth steps up where the chunks double: 8 MiB costs less per byte than just below
    below, at = (8 << 20) - 1024, 8 << 20
    assert at / (nvls.device_s(at) - nvls.latency_s) > below / (nvls.device_s(below) - nvls.latency_s)
    # NVLS-tree pipelines the switch with the network: where the network is the narrower, the
    # chunks' cost hides behind it
    slow = make_cluster("dgx-h100", 2, nics_per_node=1, nic_bw_bytes_per_s=12.5e9)
    two = nccl_view(slow, slow.compute_nodes())
    (tree,) = [e for e in nccl_estimates(two, Collective.ALLREDUCE) if e.algorithm is Algorithm.NVLS_TREE]
    assert tree.algbw_bytes_per_s < tree.nvls.bw_bytes_per_s
    assert tree.device_s(1 << 30) == pytest.approx(tree.latency_s + (1 << 30) / tree.algbw_bytes_per_s, rel=1e-12)


def test_planner_hands_nccl_what_nccl_does_faster():
    h100 = build_preset("dgx-h100")
    ranks = h100.compute_nodes()
    model = nccl_native(h100, ranks)
    small = plan_collective(h100, Collective.ALLREDUCE, ranks, size_bytes=KIB, native=NATIVE_COLLECTIVES, native_model=model)
    assert small.chosen.name == NATIVE
    assert small.chosen.predicted_time_s == pytest.approx(model.time_s(Collective.ALLREDUCE, KIB), rel=1e-6, abs=0)
    # every candidate is predicted at least as slow as the one chosen
    assert all(c.predicted_time_s >= small.chosen.predicted_time_s * (1 - 1e-9) for c in small.candidates)
    # a collective the runtime cannot hand over gets no native candidate
    broadcast = plan_collective(h100, Collective.BROADCAST, ranks, root=0, size_bytes=KIB, native=NATIVE_COLLECTIVES, native_model=model)
    assert broadcast.candidate(NATIVE) is None


def _narrowed(topology):
    """The graph as NCCL's transfers see it, rebuilt here link by link: inside a machine its
    rings' share of each link, between machines the network's, every latency scaled."""
    return Topology(
        [*topology.nodes],
        [
            dataclasses.replace(
                link,
                bw_bytes_per_s=link.bw_bytes_per_s * (CALIBRATION.network_efficiency if link.kind is LinkKind.NET else CALIBRATION.ring_efficiency),
                latency_s=link.latency_s * CALIBRATION.latency_scale,
            )
            for link in topology.links
        ],
        name="narrowed",
    )


def test_schedules_are_held_to_nccls_efficiency_and_fixed_cost():
    """On a PCIe box the synthesized trees beat NCCL's ring at large sizes even when every
    schedule pays NCCL's fixed cost per call and reaches only NCCL's share of each link."""
    pcie = build_preset("pcie-8gpu")
    ranks = pcie.compute_nodes()
    model = nccl_native(pcie, ranks)
    held = plan_collective(pcie, Collective.ALLREDUCE, ranks, size_bytes=64 * MIB, native=NATIVE_COLLECTIVES, native_model=model)
    assert held.chosen.name != NATIVE
    native = held.candidate(NATIVE)
    assert native.predicted_time_s == pytest.approx(model.time_s(Collective.ALLREDUCE, 64 * MIB), rel=1e-6, abs=0)
    assert native.t_bw_s_per_byte == pytest.approx(1 / model.algbw_bytes_per_s(Collective.ALLREDUCE), rel=1e-6, abs=0)
    narrowed = _narrowed(pcie)
    overhead_s = DEFAULT_PER_MESSAGE_OVERHEAD_S * CALIBRATION.latency_scale
    assert held.model.startswith("events")
    fixed_s = CALIBRATION.overhead_s(pcie.node(ranks[0]).sm)
    for c in held.candidates:
        if c.name == NATIVE:
            continue
        # each schedule is timed on the narrowed graph: by the event simulator (the shortlist) or α-β
        (simulated,) = event_sweep(c.schedule, narrowed, [64 * MIB], overhead_s)
        (stepped,) = simulate(c.schedule, narrowed, [64 * MIB], overhead_s)
        assert any(c.predicted_time_s == pytest.approx(max(fixed_s, p.time_s), rel=1e-6, abs=0) for p in (simulated, stepped)), c.name
        if c is held.chosen:
            assert c.predicted_time_s == pytest.approx(max(fixed_s, simulated.time_s), rel=1e-6, abs=0)
    assert held.chosen.predicted_time_s < native.predicted_time_s


def test_schedules_cross_the_network_at_nccls_network_share():
    """Between machines NCCL's transfers reach the network's share of a NIC, inside a machine
    its rings' share of NVLink: a schedule run on NCCL is timed on the graph narrowed so."""
    cluster = make_cluster("dgx-h100", 2, nics_per_node=8, nic_bw_bytes_per_s=25e9)
    ranks = cluster.compute_nodes()
    model = nccl_native(cluster, ranks)
    assert model.link_efficiency(LinkKind.NET) == CALIBRATION.network_efficiency != CALIBRATION.ring_efficiency
    assert model.link_efficiency(LinkKind.NVLINK) == model.link_efficiency(LinkKind.PCIE) == CALIBRATION.ring_efficiency
    ours, theirs = backend_topology(model, cluster), _narrowed(cluster)
    assert [(l.src, l.dst, l.kind) for l in ours.links] == [(l.src, l.dst, l.kind) for l in theirs.links]
    assert [x for l in ours.links for x in (l.bw_bytes_per_s, l.latency_s)] == pytest.approx(
        [x for l in theirs.links for x in (l.bw_bytes_per_s, l.latency_s)], rel=1e-12, abs=0
    )
    size = 256 * MIB
    schedule = ring(cluster, Collective.ALLREDUCE, list(ranks))
    candidate = plan_collective(cluster, Collective.ALLREDUCE, ranks, size_bytes=size).candidate("ring")
    (timed,), _ = predict_times([candidate], cluster, size, DEFAULT_PER_MESSAGE_OVERHEAD_S, native_model=model)
    (point,) = event_sweep(schedule, theirs, [size], DEFAULT_PER_MESSAGE_OVERHEAD_S * CALIBRATION.latency_scale)
    assert timed.predicted_time_s == pytest.approx(max(model.call_overhead_s, point.time_s), rel=1e-6, abs=0)
    # the ring's bottleneck is a NIC: on NCCL it runs at the network's share, not the rings'
    raw = verify(schedule, cluster)
    assert cluster.link(*raw.bottleneck_link).kind is LinkKind.NET
    assert verify(schedule, theirs).t_bw_s_per_byte == pytest.approx(raw.t_bw_s_per_byte / CALIBRATION.network_efficiency, rel=1e-9, abs=0)


def test_no_model_where_the_graph_does_not_say_how_machines_connect():
    """Two machines of one GPU each and no NIC (as a CUDA group over sockets may describe
    itself): the CUDA planner plans without NCCL's model instead of failing."""
    from topocoll.topo.model import Link, Node, Topology

    nodes = [Node("a", NodeKind.GPU, host_id="h0", sm=90), Node("b", NodeKind.GPU, host_id="h1", sm=90), Node("cpu0", NodeKind.CPU, host_id="h0"),
             Node("cpu1", NodeKind.CPU, host_id="h1")]
    links = [Link("a", "cpu0", LinkKind.PCIE, 25e9), Link("cpu0", "a", LinkKind.PCIE, 25e9), Link("b", "cpu1", LinkKind.PCIE, 25e9),
             Link("cpu1", "b", LinkKind.PCIE, 25e9), Link("cpu0", "cpu1", LinkKind.SMP, 10e9), Link("cpu1", "cpu0", LinkKind.SMP, 10e9)]
    topology = Topology(nodes, links)
    with pytest.raises(SolverError, match="network"):
        nccl_view(topology, ["a", "b"])
    assert nccl_native(topology, ["a", "b"]) is None


def test_allgather_adds_nvls_on_one_machine_and_pat_with_one_gpu_per_machine():
    h100 = build_preset("dgx-h100")
    one = {e.algorithm for e in nccl_estimates(nccl_view(h100, h100.compute_nodes()), Collective.ALLGATHER)}
    assert one == {Algorithm.RING, Algorithm.NVLS}
    cluster = make_cluster("dgx-h100", 4, nics_per_node=8, nic_bw_bytes_per_s=50e9)
    firsts = [r for r in cluster.compute_nodes() if r.endswith(".gpu0")]
    spread = nccl_view(cluster, firsts)
    assert (spread.ranks, spread.machines) == (4, 4)
    pat = by_label(nccl_estimates(spread, Collective.REDUCE_SCATTER))[Algorithm.PAT, Protocol.SIMPLE]
    ring = by_label(nccl_estimates(spread, Collective.REDUCE_SCATTER))[Algorithm.RING, Protocol.SIMPLE]
    # NCCL: PAT at 3/4 of the rings' bus bandwidth (a ring's algbw is its busbw x n / (n - 1))
    assert pat.algbw_bytes_per_s == pytest.approx(0.75 * ring.algbw_bytes_per_s * 3 / 4)
    assert Algorithm.PAT not in {e.algorithm for e in nccl_estimates(nccl_view(cluster, cluster.compute_nodes()), Collective.ALLGATHER)}
    assert Algorithm.PAT not in {e.algorithm for e in nccl_estimates(spread, Collective.ALLREDUCE)}


def test_a_machine_reaches_the_network_through_the_nics_near_its_ranks():
    """NCCL uses the NICs under its GPUs' PCIe switches (and, over NVLink, those of the
    machine's other ranks): one GPU per machine of a DGX H100 cluster has one NIC's bandwidth."""
    cluster = make_cluster("dgx-h100", 4, nics_per_node=8, nic_bw_bytes_per_s=50e9)
    firsts = [r for r in cluster.compute_nodes() if r.endswith(".gpu0")]
    assert nccl_view(cluster, firsts).network_bw_bytes_per_s == pytest.approx(50e9)
    pairs = [r for r in cluster.compute_nodes() if r.endswith((".gpu0", ".gpu1"))]
    assert nccl_view(cluster, pairs).network_bw_bytes_per_s == pytest.approx(2 * 50e9)
    assert nccl_view(cluster, cluster.compute_nodes()).network_bw_bytes_per_s == pytest.approx(8 * 50e9)


def test_at_scale_the_native_candidate_stands_in_cheaply(monkeypatch):
    """Beyond the planner's large-world size, NCCL's collective is still a candidate (its schedule
    a double binary tree standing in, not a ring of N^2 transfers), so a CUDA group at scale is
    never slower than NCCL by the model."""
    from topocoll.solver import planner

    monkeypatch.setattr(planner, "LARGE_WORLD_RANKS", 8)  # 16 ranks count as a large world
    cluster = make_cluster("dgx-h100", 2, nics_per_node=8, nic_bw_bytes_per_s=50e9)
    ranks = cluster.compute_nodes()
    model = nccl_native(cluster, ranks)
    result = plan_collective(cluster, Collective.ALLREDUCE, ranks, size_bytes=KIB, native=NATIVE_COLLECTIVES, native_model=model)
    native = result.candidate(NATIVE)
    assert native is not None and native.schedule.name == NATIVE
    assert len(native.schedule.steps) < 2 * (len(ranks) - 1)  # not a ring's 2 (N - 1) steps
    assert result.chosen.predicted_time_s <= native.predicted_time_s
