"""Calibration from probe measurements: experiments planned on emulated-cluster shapes, rates
made by an independent max-min fair model of the true capacities, capacities recovered."""

from __future__ import annotations

import pytest

from topocoll.errors import TopologyError
from topocoll.topo.calibrate import Experiment, Flow, Measurement, calibrate, plan_experiments, probe_ranks, route
from topocoll.topo.model import LinkKind, Node, NodeKind, TopologyBuilder
from topocoll.topo.rails import find_rails

MBIT = 1e6 / 8  # bytes per second of 1 Mbit/s
NOMINAL = 10e9 / 8  # what a NIC of unknown speed is assumed to have
INSIDE = 1e12  # host to its NIC: never the limit


def build(hosts, switches, links, rate=lambda a, b, r: r):
    """links: (a, b, rate_mbit); a host end gets NIC eth<k> in order. ``rate`` picks the bandwidth."""
    builder = TopologyBuilder(name="cluster")
    for index, host in enumerate(hosts):
        builder.add_node(Node(host, NodeKind.HOST, rank=index, host_id=host))
    for switch in switches:
        builder.add_node(Node(switch, NodeKind.NET_SWITCH))
    nics = {host: 0 for host in hosts}

    def end(node):
        if node not in nics:
            return node
        nic = f"{node}.eth{nics[node]}"
        builder.add_node(Node(nic, NodeKind.NIC, host_id=node, name=f"eth{nics[node]}"))
        builder.add_link(node, nic, LinkKind.LOOPBACK, INSIDE)
        nics[node] += 1
        return nic

    for a, b, mbit in links:
        builder.add_link(end(a), end(b), LinkKind.NET, rate(a, b, mbit * MBIT))
    return builder.build()


def max_min_rates(truth, flows):
    """Progressive filling: raise every unfrozen flow's rate together; freeze the flows of a
    link when it fills. Independent of the code under test."""
    rates = {i: 0.0 for i in range(len(flows))}
    active = set(rates)
    while active:
        headroom = {}
        for i in active:
            for link in flows[i].links:
                users = [j for j in range(len(flows)) if link in flows[j].links]
                used = sum(rates[j] for j in users)
                live = sum(1 for j in users if j in active)
                headroom[link] = (truth.link(*link).bw_bytes_per_s - used) / live
        step = min(headroom.values())
        for i in active:
            rates[i] += step
        full = {link for link, room in headroom.items() if room <= step * (1 + 1e-9)}
        active = {i for i in active if not any(link in full for link in flows[i].links)}
    return tuple(rates[i] for i in range(len(flows)))


def fluid_durations(truth, flows, size_bytes):
    """When each flow of ``size_bytes`` (one size, or one per flow) finishes if all start
    together and share max-min fairly, the survivors speeding up as others finish (a fluid model
    of streams on shaped links)."""
    sizes = [size_bytes] * len(flows) if isinstance(size_bytes, int) else list(size_bytes)
    left = {i: float(sizes[i]) for i in range(len(flows))}
    done, now = {}, 0.0
    while left:
        alive = sorted(left)
        rates = max_min_rates(truth, [flows[i] for i in alive])
        step = min(left[i] / r for i, r in zip(alive, rates))
        now += step
        for i, r in zip(alive, rates):
            left[i] -= r * step
            if left[i] <= sizes[i] * 1e-12:
                done[i] = now
                del left[i]
    return tuple(done[i] for i in range(len(flows)))


SIZE = 4 << 20


def probe(truth, nominal, unfair=False, own_sizes=False):
    """Measurements of every planned experiment on ``truth``. ``unfair``: while the flows of an
    experiment all run, they reach only part of their fair rates (the first 60 %, the others
    10 %), as competing TCP streams at a shaped link that drops do; the full durations (fluid
    model: the link busy until the last flow is done) stay as they are. ``own_sizes``: each flow
    sends bytes in proportion to its fair rate, as the probe's sizing round makes them (so that
    all would end together)."""
    nodes = [n.id for n in sorted(nominal.nodes_of(NodeKind.HOST), key=lambda n: n.rank)]
    rails = find_rails(nominal, nodes)
    experiments, notes = plan_experiments(nominal, nodes, rails)
    measured = []
    for e in experiments:
        rates = list(max_min_rates(truth, e.flows))
        if unfair and len(rates) > 1:
            rates = [0.6 * rates[0]] + [0.1 * r for r in rates[1:]]
        fair = max_min_rates(truth, e.flows)
        size = tuple(max(1, int(SIZE * r / max(fair))) for r in fair) if own_sizes else SIZE
        measured.append(Measurement(e, tuple(rates), size, fluid_durations(truth, e.flows, size)))
    return calibrate(nominal, measured), experiments, notes


def net_links(topology):
    return {(l.src, l.dst): l.bw_bytes_per_s for l in topology.links if l.kind is LinkKind.NET}


UNIFORM = (["h0", "h1", "h2", "h3"], ["sw"], [(h, "sw", 100) for h in ("h0", "h1", "h2", "h3")])
TWO_RACKS = (
    ["h0", "h1", "h2", "h3"],
    ["rack0", "rack1"],
    [("h0", "rack0", 200), ("h1", "rack0", 200), ("h2", "rack1", 200), ("h3", "rack1", 200), ("rack0", "rack1", 50)],
)
MULTI_RAIL = (
    ["h0", "h1", "h2"],
    ["rail0", "rail1"],
    [(h, "rail0", 100) for h in ("h0", "h1", "h2")] + [(h, "rail1", 60) for h in ("h0", "h1", "h2")],
)
RING = (
    ["h0", "h1", "h2", "h3"],
    [],
    [("h0", "h1", 100), ("h1", "h2", 100), ("h2", "h3", 100), ("h3", "h0", 25)],
)


SHAPES = [
    pytest.param(UNIFORM, False, False, id="uniform"),
    pytest.param(TWO_RACKS, False, False, id="two-racks"),
    pytest.param(MULTI_RAIL, False, False, id="multi-rail"),
    pytest.param(RING, False, False, id="asym-ring"),
    # flows of an incast or outcast here run to the same kind of limit, so their unfair share of
    # it while they compete is made up for by the full durations (in two-racks an outcast mixes
    # an in-rack flow and a cross-rack one, whose limits differ: there the window rates count)
    pytest.param(UNIFORM, True, False, id="uniform-unfair"),
    pytest.param(MULTI_RAIL, True, False, id="multi-rail-unfair"),
    pytest.param(RING, True, False, id="asym-ring-unfair"),
    # with flows sized to their own rates (as probed), the full durations make up for it there too
    pytest.param(TWO_RACKS, True, True, id="two-racks-unfair-own-sizes"),
]


@pytest.mark.parametrize(("shape", "unfair", "own_sizes"), SHAPES)
def test_every_network_link_is_recovered_from_nominal_guesses(shape, unfair, own_sizes):
    """Every link starts at 10 Gb/s nominal; max-min rates of the true capacities identify each
    network link's true rate (links of host-to-host cables and switches alike), also when
    competing flows share a link unevenly and leave it part idle while they compete."""
    truth = build(*shape)
    nominal = build(*shape, rate=lambda a, b, r: NOMINAL)
    result, experiments, _ = probe(truth, nominal, unfair, own_sizes)
    assert net_links(result.topology) == pytest.approx(net_links(truth), rel=1e-9)
    # the in-host links were never the limit: they keep their nominal figure
    assert all(l.bw_bytes_per_s == INSIDE for l in result.topology.links if l.kind is LinkKind.LOOPBACK)
    assert {e.kind for e in experiments} >= {"pair", "incast", "outcast"}


def test_the_slow_uplink_needs_flows_that_share_it():
    hosts, switches, links = TWO_RACKS
    nominal = build(hosts, switches, links, rate=lambda a, b, r: NOMINAL)
    experiments, _ = plan_experiments(nominal, hosts)
    shared = [e for e in experiments if e.kind == "shared"]
    # one per direction of rack0 <-> rack1, each with two flows from different racks' hosts
    assert len(shared) == 2 and all(len(e.flows) == 2 for e in shared)
    for e in shared:
        assert len({f.src for f in e.flows} | {f.dst for f in e.flows}) == 4


def test_ring_pairs_with_two_equal_routes_are_left_out():
    hosts, switches, links = RING
    nominal = build(hosts, switches, links)
    assert route(nominal, "h0", "h2") is None  # both ways round are two cables
    assert route(nominal, "h0", "h1") == ("h0", "h0.eth0", "h1.eth0", "h1")
    _, notes = plan_experiments(nominal, hosts)
    assert sorted(notes) == sorted(f"ranks {a}->{b} (channel 0): no unique route, not probed" for a, b in ((0, 2), (2, 0), (1, 3), (3, 1)))


def test_multi_rail_flows_stay_on_their_rail():
    hosts, switches, links = MULTI_RAIL
    nominal = build(hosts, switches, links)
    rails = find_rails(nominal, hosts)
    experiments, _ = plan_experiments(nominal, hosts, rails)
    for e in experiments:
        rail = f"rail{e.flows[0].channel - 1}"
        assert all(rail in f.path for f in e.flows)
    assert {e.flows[0].channel for e in experiments} == {1, 2}


def test_identical_series_links_are_one_class_set_on_the_narrowest():
    """A NIC's link to its switch and the switch's link on to the host carry the same flows:
    the measured capacity goes on the narrower one by nominal figure, the other stays."""
    hosts, switches, links = UNIFORM
    truth = build(*UNIFORM)
    nominal = build(hosts, switches, links, rate=lambda a, b, r: NOMINAL)
    result, _, _ = probe(truth, nominal)
    assert any("measured 12.5 MB/s" in note for note in result.notes)
    assert result.topology.link("h0", "h0.eth0").bw_bytes_per_s == INSIDE


def test_latencies_are_spread_over_the_network_links_of_a_pair():
    hosts, switches, links = UNIFORM
    nominal = build(hosts, switches, links)
    flow = Flow(0, 1, 0, route(nominal, "h0", "h1"))
    measured = [Measurement(Experiment("pair", (flow,)), (12.5e6,))]
    result = calibrate(nominal, measured, latencies_s={(0, 1): 300e-6})
    assert result.topology.link("h0.eth0", "sw").latency_s == pytest.approx(150e-6)
    assert result.topology.link("sw", "h1.eth0").latency_s == pytest.approx(150e-6)


def test_bad_measurements_are_refused():
    nominal = build(*UNIFORM)
    flow = Flow(0, 1, 0, route(nominal, "h0", "h1"))
    with pytest.raises(TopologyError, match="rates for 1 flows"):
        Measurement(Experiment("pair", (flow,)), (1.0, 2.0))
    with pytest.raises(TopologyError, match="must be > 0"):
        Measurement(Experiment("pair", (flow,)), (0.0,))
    with pytest.raises(TopologyError, match="tolerance"):
        calibrate(nominal, [], tolerance=1.5)


def test_one_rank_per_host_probes():
    builder = TopologyBuilder()
    for rank, (node, host) in enumerate((("a0", "a"), ("a1", "a"), ("b0", "b"))):
        builder.add_node(Node(node, NodeKind.HOST, rank=rank, host_id=host))
    builder.add_link("a0", "a1", LinkKind.SHM, 1e10)
    builder.add_link("a1", "b0", LinkKind.NET, 1e9)
    assert probe_ranks(builder.build(), ["a0", "a1", "b0"]) == (0, 2)
