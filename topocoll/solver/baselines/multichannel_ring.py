"""The multi-channel ring baseline: NCCL's ring algorithm as NCCL runs it, over several rings.

NCCL does not run one ring: it splits the buffer evenly over *channels*, and each channel runs
the ring algorithm on its share over a ring of its own, the rings chosen so that together they
use more of the machine's links (several NVLink rings through a DGX-1's hybrid cube-mesh; rings
that cross between machines at different GPUs, so through different NICs and rails). One
widest ring, :func:`topocoll.solver.baselines.ring`, sees only one of those routes, which makes
it a weak stand-in for NCCL on machines with many links per GPU.

Here channel ``c`` gets a ring order chosen, given the rings before it, to load the links as
little as possible (:func:`ring_order` with their load as ``base_load``), and each hop of it the
route, among the widest and the fewest-hop ones (at most :data:`ROUTE_CHOICES`), that the
channels so far load least: so channels spread over NVSwitch planes, NVLinks and NICs. Every
channel moves the same share of the buffer and all channels run in the same steps.

:func:`weighted_rings` is topocoll's own variant, not NCCL's: the same rings, the fewest of them
that reach the best split, each carrying the share of the buffer its links can take.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import networkx as nx

from topocoll.errors import ScheduleError, SolverError
from topocoll.solver.baselines._common import (
    _chain,
    _pieces,
    _Plan,
    _plan,
    _ring_allgather,
    _ring_reduce_scatter,
    _rotate,
    _trivial,
)
from topocoll.solver.baselines.ordering import ring_order
from topocoll.solver.lp import LPStatus, PackingColumn, PackingSolution, solve_packing
from topocoll.solver.routing import RouteTable
from topocoll.solver.schedule import Chunk, Collective, Op, Schedule
from topocoll.topo.model import Topology

#: Routes weighed for one hop of a channel: the widest and up to this many of the fewest hops.
ROUTE_CHOICES = 16

#: Most channels tried: NCCL's rings use up to 32 channels on NVSwitch systems; beyond 16 the
#: greedy rings here gained nothing on the presets (DGX H100 x2: 52.0 % of the bound at 16).
MAX_CHANNELS = 16

#: Fewer channels are tried when a schedule would hold more transfers than this (every channel
#: adds N(N-1) to 2N(N-1) of them): larger files cost more to verify than the ring gains.
MAX_TRANSFERS = 1_000_000


def multichannel_ring(
    topology: Topology,
    collective: Collective | str,
    ranks: Sequence[str] | None = None,
    root: int | None = None,
    nchunks: int | None = None,
    routes: RouteTable | None = None,
    channels: int | None = None,
) -> Schedule:
    """Ring schedules over ``channels`` rings, the buffer split evenly between them.

    Each channel runs what :func:`topocoll.solver.baselines.ring` runs on its share (allreduce:
    reduce-scatter then allgather, ``2(N-1)`` steps; allgather / reduce-scatter: one pass;
    broadcast / reduce: a pipelined chain), all channels in the same steps.

    Parameters
    ----------
    topology, collective, ranks, root, nchunks, routes
        As for :func:`topocoll.solver.baselines.ring` (``nchunks``: pieces per channel of the
        broadcast / reduce chain).
    channels : int, optional
        Number of rings. By default the count up to :data:`MAX_CHANNELS` (and
        :data:`MAX_TRANSFERS`) whose rings give the lowest bandwidth time, the fewest on a tie:
        the rings are chosen one after the other, so the first ``k`` of the longest list are
        the rings of ``k`` channels.

    Returns
    -------
    Schedule
        Named ``"multichannel_ring"``.

    Raises
    ------
    ScheduleError
        Invalid ranks, root, ``nchunks`` or ``channels``.
    """
    plan = _plan(topology, collective, ranks, root, routes)
    name = "multichannel_ring"
    n = len(plan.ranks)
    if n == 1:
        return _trivial(plan, name)
    if channels is not None and (isinstance(channels, bool) or not isinstance(channels, int) or channels < 1):
        raise ScheduleError(f"channels must be an integer >= 1, got {channels!r}")
    most = channels if channels is not None else max(1, min(MAX_CHANNELS, MAX_TRANSFERS // (2 * n * (n - 1))))
    orders, channel_routes, times = _channel_rings(topology, plan.ranks, plan.routes, most)
    if channels is None:
        best = min(times)
        channels = next(k for k in range(1, most + 1) if times[k - 1] <= best * (1 + 1e-9))
        orders, channel_routes = orders[:channels], channel_routes[:channels]
    return _build(plan, name, orders, channel_routes, (1.0 / channels,) * channels, nchunks)


def weighted_rings(
    topology: Topology,
    collective: Collective | str,
    ranks: Sequence[str] | None = None,
    root: int | None = None,
    nchunks: int | None = None,
    routes: RouteTable | None = None,
) -> Schedule:
    """Rings over several channels whose shares of the buffer follow their bandwidth.

    The channels' rings are :func:`multichannel_ring`'s, chosen one after the other on top of
    the load of the ones before; the shares, instead of equal, are those that load the busiest
    link least (the packing LP of :func:`topocoll.solver.lp.solve_packing` with one group and a
    column per ring), and the fewest leading channels that come within :data:`CHANNEL_SLACK` of
    the best split are kept. So
    two rails of 100 and 60 Mbit/s get one ring each carrying 5/8 and 3/8 of the data, where
    equal shares need 8 channels, 5 of them through one NIC at once. One transfer per link and
    step matters on networks whose flows do not share a link perfectly (TCP connections through
    one NIC: see :data:`topocoll.solver.planner.NEAR_TIE`).

    Parameters
    ----------
    topology, collective, ranks, root, nchunks, routes
        As for :func:`multichannel_ring`.

    Returns
    -------
    Schedule
        Named ``"weighted_rings"``; at the bound wherever a mix of these rings is.

    Raises
    ------
    ScheduleError
        Invalid ranks, root or ``nchunks``.
    SolverError
        The share LP failed.
    """
    plan = _plan(topology, collective, ranks, root, routes)
    name = "weighted_rings"
    n = len(plan.ranks)
    if n == 1:
        return _trivial(plan, name)
    most = max(1, min(MAX_CHANNELS, MAX_TRANSFERS // (2 * n * (n - 1))))
    orders, channel_routes, _ = _channel_rings(topology, plan.ranks, plan.routes, most)
    bw = {(link.src, link.dst): link.bw_bytes_per_s for link in topology.links}
    links = sorted({hop for routes_k in channel_routes for path in routes_k.paths.values() for hop in zip(path, path[1:])})
    index = {link: i for i, link in enumerate(links)}
    widest = max(bw[link] for link in links)
    capacities = [bw[link] / widest for link in links]
    columns = []
    for routes_k in channel_routes:
        load: dict[int, float] = {}
        for path in routes_k.paths.values():
            for hop in zip(path, path[1:]):
                load[index[hop]] = load.get(index[hop], 0.0) + 1.0
        columns.append(PackingColumn(0, tuple(sorted(load.items()))))
    best = _shares(capacities, columns).tau
    for k in range(1, most + 1):
        solution = _shares(capacities, columns[:k])
        if solution.tau <= best * (1 + CHANNEL_SLACK):
            break
    kept = [i for i, w in enumerate(solution.weights) if w > SHARE_TOLERANCE]
    total = math.fsum(solution.weights[i] for i in kept)
    shares = tuple(solution.weights[i] / total for i in kept)
    return _build(plan, name, [orders[i] for i in kept], [channel_routes[i] for i in kept], shares, nchunks)


#: Fewer channels are kept when their best split is within this fraction of the best split of
#: all of them: every channel more is one more connection through some NIC, and measured rates
#: of one rail's NICs differ by more than that (the probe on the emulated multi-rail cluster:
#: 0.5-4 %), where an exact split would add a third ring to make up a 0.1 % difference.
CHANNEL_SLACK = 0.01

#: Shares below this fraction count as none.
SHARE_TOLERANCE = 1e-6


def _shares(capacities: Sequence[float], columns: Sequence[PackingColumn]) -> PackingSolution:
    solution = solve_packing(1, capacities, columns)
    if solution.status is not LPStatus.OPTIMAL:
        raise SolverError(f"the ring share LP ended {solution.status.value}")
    return solution


def _build(
    plan: _Plan,
    name: str,
    orders: Sequence[Sequence[int]],
    channel_routes: Sequence[_ChannelRoutes],
    shares: Sequence[float],
    nchunks: int | None,
) -> Schedule:
    """Channel ``k`` runs the ring algorithm on the slice ``shares[k]`` of the buffer (of every
    rank's shard, for allgather and reduce-scatter), all channels in the same steps."""
    n = len(plan.ranks)
    channels = len(orders)
    starts = [math.fsum(shares[:k]) for k in range(channels)]
    plans = [dataclasses.replace(plan, routes=routes) for routes in channel_routes]  # one steps dict, shared
    c = plan.collective
    if c is Collective.ALLREDUCE:
        chunks = [Chunk(k * n + q, starts[k] + shares[k] * q / n, shares[k] / n) for k in range(channels) for q in range(n)]
        for k, order in enumerate(orders):
            segments = [[k * n + q] for q in range(n)]
            step = _ring_reduce_scatter(plans[k], order, segments, 0)
            _ring_allgather(plans[k], order, segments, step)
        return plan.build(name, chunks)
    if c in (Collective.ALLGATHER, Collective.REDUCE_SCATTER):
        # rank r's shard [r/n, (r+1)/n) split into one piece per channel: chunk r * channels + k
        chunks = [Chunk(r * channels + k, (r + starts[k]) / n, shares[k] / n) for r in range(n) for k in range(channels)]
        for k, order in enumerate(orders):
            mine = [[order[p] * channels + k] for p in range(n)]
            if c is Collective.ALLGATHER:  # position p starts with its rank's piece
                _ring_allgather(plans[k], order, mine, 0)
            else:  # position p ends with its rank's piece, fully reduced
                _ring_reduce_scatter(plans[k], order, mine, 0)
        return plan.build(name, chunks)
    pieces = _pieces(nchunks, n - 1)
    chunks = [Chunk(k * pieces + i, starts[k] + shares[k] * i / pieces, shares[k] / pieces) for k in range(channels) for i in range(pieces)]
    for k, order in enumerate(orders):
        chain = _rotate(order, plan.root)
        if c is Collective.REDUCE:
            chain = chain[1:] + [plan.root]
        ids = [k * pieces + i for i in range(pieces)]
        _chain(plans[k], chain, ids, Op.COPY if c is Collective.BROADCAST else Op.REDUCE)
    return plan.build(name, chunks)


class _ChannelRoutes:
    """The route of every hop of one channel's ring (the ``path`` lookup a plan sends with)."""

    def __init__(self, paths: dict[tuple[str, str], tuple[str, ...]]) -> None:
        self.paths = paths

    def path(self, src: str, dst: str) -> tuple[str, ...]:
        return self.paths[(src, dst)]


def _channel_rings(
    topology: Topology, nodes: tuple[str, ...], routes: RouteTable, channels: int
) -> tuple[list[tuple[int, ...]], list[_ChannelRoutes], list[float]]:
    """One ring order and one route per hop for each channel, each chosen on top of the load of
    the channels before it; and, for each count k, the bandwidth time per hop's data of the
    first k rings (the busiest link's hops / (k x its bandwidth))."""
    bw = {(link.src, link.dst): link.bw_bytes_per_s for link in topology.links}
    members = set(nodes)
    # other ranks' nodes do not forward a ring's hop (as in every baseline's routes)
    forwarding = topology.graph.subgraph(n for n in topology.graph if not topology.node(n).kind.is_compute or n in members)
    load: dict[tuple[str, str], float] = {}
    orders: list[tuple[int, ...]] = []
    channel_routes: list[_ChannelRoutes] = []
    choices: dict[tuple[str, str], list[tuple[str, ...]]] = {}
    times: list[float] = []
    for k in range(1, channels + 1):
        order = ring_order(topology, nodes, routes, base_load=load)
        paths: dict[tuple[str, str], tuple[str, ...]] = {}
        for i in range(len(order)):
            a, b = nodes[order[i]], nodes[order[(i + 1) % len(order)]]
            if (a, b) not in choices:
                choices[(a, b)] = _route_choices(forwarding, members, routes.path(a, b), a, b)
            path = min(choices[(a, b)], key=lambda p: (max((load.get(h, 0.0) + 1) / bw[h] for h in zip(p, p[1:])), len(p)))
            paths[(a, b)] = path
            for hop in zip(path, path[1:]):
                load[hop] = load.get(hop, 0.0) + 1.0
        orders.append(order)
        channel_routes.append(_ChannelRoutes(paths))
        times.append(max(hops / bw[link] for link, hops in load.items()) / k)
    return orders, channel_routes, times


def _route_choices(graph, members: set[str], widest: tuple[str, ...], a: str, b: str) -> list[tuple[str, ...]]:
    """The widest route and up to :data:`ROUTE_CHOICES` fewest-hop ones that no other rank forwards."""
    found = [widest]
    try:
        for path in itertools.islice(nx.all_shortest_paths(graph, a, b), ROUTE_CHOICES):
            if not any(node in members for node in path[1:-1]) and tuple(path) not in found:
                found.append(tuple(path))
    except nx.NetworkXNoPath:
        pass
    return found
