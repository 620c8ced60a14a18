"""Calibration: measured point-to-point rates turned into link capacities of a topology.

Probing (``topocoll topo probe``, ``TOPOCOLL_PROBE=1``) sends data between the hosts of a
cluster in *experiments*: one flow alone, or several at once, each flow between two hosts along
a known route. This module is the pure part: which experiments to run, and what their measured
rates say about the links.

Plan (:func:`plan_experiments`), between one rank per host, on every channel (each rail, or the
one network when there are no rails):

- ``pair``: every ordered pair alone;
- ``incast`` / ``outcast``: flows from / to the two nearest other hosts into / out of one host
  at once, which load its NIC link more than the links they came by (so the NIC link shows as
  the bottleneck);
- ``shared``: for a network link that no host owns (switch to switch, or a host forwarding for
  others), flows with distinct ends that all cross it, to load it beyond what one NIC can.

Only pairs whose route is unique are used: the fewest-hop path of the channel's part of the
graph (rank nodes may forward, as a host routing packets does); pairs with two equally short
routes (the two ways round a ring) are left out, since the network could take either.

Inference (:func:`calibrate`): the load of a link in an experiment is the sum of the rates of
its flows while all of them ran, or, when larger, the bytes of its flows over the time until the
last of them finished (TCP flows into one shaped link share it unfairly: one may take most of
it while the other waits, and then have it alone; the link was busy throughout). Links that carry exactly the same flows in every experiment (a NIC's link
to its switch and its link into its host) cannot be told apart by any measurement; they form
one *class*. A class's capacity is at least the largest load it carried. The class is
*identified* when, in some experiment, it is the only class on a flow's path loaded to within
``tolerance`` of its largest load: every flow is limited somewhere, and nothing else on that
path was near its limit. An identified class's largest load is its capacity; it replaces the
nominal bandwidth of the class's narrowest link (by nominal bandwidth, the one a series of
links is limited by); the other links of the class keep theirs unless it is below the measured
value. Classes not identified keep their nominal bandwidths, and the notes say so.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import islice

import networkx as nx

from topocoll.errors import TopologyError
from topocoll.topo.model import Link, LinkKind, NodeKind, Topology
from topocoll.topo.rails import Rails

__all__ = [
    "DEFAULT_TOLERANCE",
    "Flow",
    "Experiment",
    "Measurement",
    "Calibration",
    "probe_ranks",
    "route",
    "plan_experiments",
    "calibrate",
]

#: How close to its largest load a link must be, in an experiment, to count as possibly the
#: limit of a flow (a fraction). Rates of one TCP stream vary by a few per cent between runs
#: on an idle emulated link; 10 % keeps that noise from hiding the one limiting link.
DEFAULT_TOLERANCE = 0.10

#: Most flows in one ``shared`` experiment.
MAX_SHARED_FLOWS = 4


@dataclass(frozen=True, slots=True)
class Flow:
    """Data from rank ``src`` to rank ``dst`` on channel ``channel`` along ``path`` (node ids)."""

    src: int
    dst: int
    channel: int
    path: tuple[str, ...]

    @property
    def links(self) -> tuple[tuple[str, str], ...]:
        """The directed links of the path."""
        return tuple(zip(self.path, self.path[1:]))


@dataclass(frozen=True, slots=True)
class Experiment:
    """Flows that run at the same time; ``kind`` is ``pair``, ``incast``, ``outcast`` or ``shared``."""

    kind: str
    flows: tuple[Flow, ...]

    def describe(self) -> str:
        """``incast 1->0, 2->0 (channel 1)`` style text for progress and notes."""
        pairs = ", ".join(f"{f.src}->{f.dst}" for f in self.flows)
        return f"{self.kind} {pairs} (channel {self.flows[0].channel})"


@dataclass(frozen=True, slots=True)
class Measurement:
    """What one experiment measured, per flow in the experiment's order.

    Parameters
    ----------
    experiment : Experiment
    rates_bytes_per_s : tuple of float
        Each flow's rate while all of them ran (the common window).
    size_bytes : int or tuple of int, optional
        Bytes every flow sent, or each flow's.
    durations_s : tuple of float, optional
        How long each flow took in full. With ``size_bytes``, a second view of a link's load:
        all its flows' bytes over the time until the last finished, which stays right when
        flows share a link unfairly (one hogs it, then leaves it to the other).
    """

    experiment: Experiment
    rates_bytes_per_s: tuple[float, ...]
    size_bytes: int | tuple[int, ...] | None = None
    durations_s: tuple[float, ...] | None = None

    def flow_bytes(self, flow: int) -> int:
        """Bytes flow ``flow`` (its index in the experiment) sent."""
        if self.size_bytes is None:
            raise TopologyError(f"{self.experiment.describe()}: no sizes were measured")
        return self.size_bytes if isinstance(self.size_bytes, int) else self.size_bytes[flow]

    def __post_init__(self) -> None:
        where, n = self.experiment.describe(), len(self.experiment.flows)
        if len(self.rates_bytes_per_s) != n:
            raise TopologyError(f"{where}: {len(self.rates_bytes_per_s)} rates for {n} flows")
        if not all(rate > 0 for rate in self.rates_bytes_per_s):
            raise TopologyError(f"{where}: every measured rate must be > 0, got {self.rates_bytes_per_s}")
        if (self.size_bytes is None) != (self.durations_s is None):
            raise TopologyError(f"{where}: size_bytes and durations_s go together")
        sizes = (self.size_bytes,) * n if isinstance(self.size_bytes, int) else self.size_bytes
        if self.durations_s is not None and (
            len(self.durations_s) != n or not all(d > 0 for d in self.durations_s) or len(sizes) != n or not all(b > 0 for b in sizes)
        ):
            raise TopologyError(f"{where}: need {n} durations > 0 and sizes > 0, got {self.durations_s}, {self.size_bytes}")


@dataclass(frozen=True, slots=True)
class Calibration:
    """The result of :func:`calibrate`.

    Parameters
    ----------
    topology : Topology
        The input with measured capacities (and latencies) on the links they identify.
    measured : mapping of (str, str) to float
        Capacity found for each link whose bandwidth was replaced, bytes per second.
    notes : tuple of str
        What was identified, what was not, and what was left out.
    """

    topology: Topology
    measured: Mapping[tuple[str, str], float]
    notes: tuple[str, ...]


def probe_ranks(topology: Topology, rank_nodes: Sequence[str]) -> tuple[int, ...]:
    """The lowest rank of every host (hosts by ``host_id``), in rank order."""
    first: dict[object, int] = {}
    for rank, node in enumerate(rank_nodes):
        first.setdefault(topology.node(node).host_id, rank)
    return tuple(sorted(first.values()))


def _channel_graph(topology: Topology, rails: Rails | None, channel: int) -> nx.DiGraph:
    """The part of the graph a channel's connections can use: on rail r, no other rail's NICs."""
    if rails is None or channel == 0:
        return topology.graph
    others = [nic for nic, rail in rails.nic_rail.items() if rail != channel - 1]
    return nx.restricted_view(topology.graph, others, [])


def route(topology: Topology, src_node: str, dst_node: str, rails: Rails | None = None, channel: int = 0) -> tuple[str, ...] | None:
    """The unique fewest-hop path from ``src_node`` to ``dst_node`` on ``channel``, or None
    when there is none or more than one (the network could take either)."""
    graph = _channel_graph(topology, rails, channel)
    try:
        paths = list(islice(nx.all_shortest_paths(graph, src_node, dst_node), 2))
    except nx.NetworkXNoPath:
        return None
    return tuple(paths[0]) if len(paths) == 1 else None


def _channels(rails: Rails | None) -> tuple[int, ...]:
    return tuple(range(1, rails.count + 1)) if rails is not None else (0,)


def plan_experiments(topology: Topology, rank_nodes: Sequence[str], rails: Rails | None = None) -> tuple[tuple[Experiment, ...], tuple[str, ...]]:
    """The experiments to run between one rank per host, and notes on pairs left out.

    Parameters
    ----------
    topology : Topology
    rank_nodes : sequence of str
        The node of every rank.
    rails : Rails, optional
        The cluster's rails; each rail is probed on its own channel.

    Returns
    -------
    (tuple of Experiment, tuple of str)
        In a fixed order (the same on every rank).
    """
    probed = probe_ranks(topology, rank_nodes)
    experiments: list[Experiment] = []
    notes: list[str] = []
    for channel in _channels(rails):
        flows: dict[tuple[int, int], Flow] = {}
        for a in probed:
            for b in probed:
                if a == b:
                    continue
                path = route(topology, rank_nodes[a], rank_nodes[b], rails, channel)
                if path is None:
                    notes.append(f"ranks {a}->{b} (channel {channel}): no unique route, not probed")
                    continue
                flows[(a, b)] = Flow(a, b, channel, path)
        experiments += [Experiment("pair", (flow,)) for flow in flows.values()]
        for host in probed:
            # the two nearest peers (fewest hops): their flows are the least likely to be held
            # back on the way, so together they fill this host's NIC link
            into = sorted((f for (a, b), f in flows.items() if b == host), key=lambda f: (len(f.path), f.src))[:2]
            out = sorted((f for (a, b), f in flows.items() if a == host), key=lambda f: (len(f.path), f.dst))[:2]
            if len(into) == 2:
                experiments.append(Experiment("incast", tuple(into)))
            if len(out) == 2:
                experiments.append(Experiment("outcast", tuple(out)))
        experiments += _shared(topology, flows)
    unique: dict[tuple, Experiment] = {}
    for experiment in experiments:
        unique.setdefault(tuple((f.src, f.dst, f.channel) for f in experiment.flows), experiment)
    return tuple(unique.values()), tuple(notes)


def _shared(topology: Topology, flows: Mapping[tuple[int, int], Flow]) -> list[Experiment]:
    """For every network link no host's NIC ends, flows with distinct ends that all cross it."""
    host_nics = {n.id for n in topology.nodes_of(NodeKind.NIC)}
    crossing: dict[tuple[str, str], list[Flow]] = defaultdict(list)
    for flow in flows.values():
        for link in flow.links:
            record = topology.link(*link)
            if record.kind is LinkKind.NET and not (link[0] in host_nics or link[1] in host_nics):
                crossing[link].append(flow)
            elif topology.node(link[0]).rank is not None and link[0] != flow.path[0]:
                crossing[link].append(flow)  # a host forwarding for others
    experiments = []
    for link in sorted(crossing):
        chosen: list[Flow] = []
        for flow in crossing[link]:
            if all(flow.src != c.src and flow.dst != c.dst and flow.src != c.dst and flow.dst != c.src for c in chosen):
                chosen.append(flow)
            if len(chosen) == MAX_SHARED_FLOWS:
                break
        if len(chosen) >= 2:
            experiments.append(Experiment("shared", tuple(chosen)))
    return experiments


def calibrate(
    topology: Topology,
    measurements: Sequence[Measurement],
    latencies_s: Mapping[tuple[int, int], float] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
) -> Calibration:
    """The topology with the capacities the measurements identify (module documentation).

    Parameters
    ----------
    topology : Topology
        The nominal topology the flows' paths run through.
    measurements : sequence of Measurement
    latencies_s : mapping of (int, int) to float, optional
        Measured one-way latency between ranks (half a round trip). Spread over the network
        links of the pair's pair-experiment path, after the nominal latency of its other links,
        and averaged per link over the pairs crossing it.
    tolerance : float
        See :data:`DEFAULT_TOLERANCE`.

    Returns
    -------
    Calibration
    """
    if not 0 < tolerance < 1:
        raise TopologyError(f"tolerance must be in (0, 1), got {tolerance}")
    # every flow instance, and which links it crosses
    instances = [(m_index, f_index) for m_index, m in enumerate(measurements) for f_index in range(len(m.experiment.flows))]
    signature: dict[tuple[str, str], set[tuple[int, int]]] = defaultdict(set)
    for m_index, f_index in instances:
        for link in measurements[m_index].experiment.flows[f_index].links:
            topology.link(*link)  # a path that leaves the topology is an error
            signature[link].add((m_index, f_index))
    classes: dict[frozenset, list[tuple[str, str]]] = defaultdict(list)
    for link, flows in signature.items():
        classes[frozenset(flows)].append(link)
    class_of = {link: key for key, links in classes.items() for link in links}

    def load(key: frozenset, m_index: int) -> float:
        measurement = measurements[m_index]
        mine = [f for m, f in key if m == m_index]
        concurrent = sum(measurement.rates_bytes_per_s[f] for f in mine)
        if measurement.durations_s is None:
            return concurrent
        return max(concurrent, sum(measurement.flow_bytes(f) for f in mine) / max(measurement.durations_s[f] for f in mine))

    largest = {key: max(load(key, m) for m, _ in key) for key in classes}
    identified: set[frozenset] = set()
    for m_index, measurement in enumerate(measurements):
        for flow in measurement.experiment.flows:
            near = {class_of[link] for link in flow.links if load(class_of[link], m_index) >= (1 - tolerance) * largest[class_of[link]]}
            if len(near) == 1:
                identified |= near
    new_bw: dict[tuple[str, str], float] = {}
    notes: list[str] = [f"calibrated from {len(measurements)} probe experiment(s)"]
    for key in sorted(classes, key=lambda k: sorted(classes[k])):
        links = sorted(classes[key])
        capacity = largest[key]
        shown = ", ".join(f"{a}->{b}" for a, b in links)
        if key in identified:
            narrowest = min(links, key=lambda l: (topology.link(*l).bw_bytes_per_s, l))
            new_bw[narrowest] = capacity
            for link in links:
                if link != narrowest and topology.link(*link).bw_bytes_per_s < capacity:
                    new_bw[link] = capacity
            notes.append(f"measured {capacity / 1e6:.3g} MB/s on {shown} (set on {narrowest[0]}->{narrowest[1]})")
        else:
            low = [l for l in links if topology.link(*l).bw_bytes_per_s < capacity]
            for link in low:  # the measurements prove at least this much
                new_bw[link] = capacity
            notes.append(f"not identified (never the only link near its limit; carried up to {capacity / 1e6:.3g} MB/s): {shown} keep their nominal bandwidth")
    latency = _latencies(topology, measurements, latencies_s or {})
    links = []
    for link in topology.links:
        key = (link.src, link.dst)
        links.append(
            Link(link.src, link.dst, link.kind, new_bw.get(key, link.bw_bytes_per_s), latency.get(key, link.latency_s), link.count)
        )
    calibrated = Topology(topology.nodes, links, name=topology.name, notes=(*topology.notes, *notes))
    return Calibration(calibrated, dict(new_bw), tuple(notes))


def _latencies(
    topology: Topology, measurements: Sequence[Measurement], latencies_s: Mapping[tuple[int, int], float]
) -> dict[tuple[str, str], float]:
    if not latencies_s:
        return {}
    paths = {(f.src, f.dst): f for m in measurements if m.experiment.kind == "pair" for f in m.experiment.flows}
    samples: dict[tuple[str, str], list[float]] = defaultdict(list)
    for pair, one_way_s in sorted(latencies_s.items()):
        flow = paths.get(pair)
        if flow is None:
            continue
        net = [link for link in flow.links if topology.link(*link).kind is LinkKind.NET]
        rest = sum(topology.link(*link).latency_s for link in flow.links if topology.link(*link).kind is not LinkKind.NET)
        if net:
            share = max(0.0, one_way_s - rest) / len(net)
            for link in net:
                samples[link].append(share)
    return {link: sum(values) / len(values) for link, values in samples.items()}
