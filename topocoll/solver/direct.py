"""Direct multi-path schedules: every rank sends straight to every other, each pair over several paths.

Trees reach the cut bound but take as many steps as they are deep, and every step costs a
message's overhead and latency; rings take ``N - 1`` steps per pass. Where every rank reaches
every other without relaying and what binds is each rank's own links (an NVSwitch machine),
one step can do: rank ``i`` sends its shard to every rank ``j`` at once, the bytes of each pair
split over the paths (NVSwitch planes, NVLinks, PCIe) that the traffic routing
(:mod:`topocoll.solver.traffic`) finds for the uniform all-to-all matrix, which then has the
same cut bound as allgather. Where links between groups of ranks bind (a PCIe tree, a network
between machines), sending each byte once per destination over them costs more than trees that
copy it on the far side, and the planner's other candidates win.

- allgather: one step of copies; reduce-scatter: one step of reduces (each rank's copy of shard
  ``j`` to rank ``j``); allreduce: the reduce-scatter step, then the allgather step.

(Broadcast and reduce have no direct form worth running: the root's own links carry everything.)

A shard is cut wherever one of the pairs that move it changes path (at most ``2(N-1)`` times
the paths a pair uses), so every piece travels whole on one path of each pair and the link
loads are exactly the routing's. The routing is the best over paths that pass through no other
rank (a relayed piece would be added into the relay's own shard in a reduce-scatter). Where
some pair is joined only through other ranks, the routing may relay; relayed paths are then
left out and their bytes spread over the pair's other paths, and a pair the routing sent only
through relays takes its widest route that no rank forwards. (Leaving relays out of a routing
made with them overloads the other paths: on the MI300X mesh it put 0.148 of the buffer on
PCIe links where the relay-free optimum needs at most 0.125, 157 us of bandwidth time at
64 MiB against the xGMI star's 131 us.)

Forwarded once (:func:`two_hop`)
--------------------------------
Relay-free paths cannot fill every link where ranks are joined unevenly: on the MI300X each GPU
takes in seven xGMI links and one PCIe link, and a GPU's PCIe link is reached straight only by
the three other GPUs of its socket. The bound needs all eight links, so each GPU must get parts
of the other socket's shards over PCIe from a GPU of its own socket that got them over xGMI:
height-two trees. :func:`topocoll.solver.traffic.route_two_hop` routes them by LP (at the least
bandwidth time, the routing of fewest link crossings); the parts ``P_m`` of a shard that rank
``m`` gets forwarded lie side by side, so every other rank got ``P_m`` straight and can forward
it. Each phase then takes up to three steps per slice of the shard:

- allgather: the owner's pieces to the ranks that forward them; its other pieces; the forwards.
- reduce-scatter, mirrored: members' copies to their forwarders, which add them in; the copies
  no one forwarded into, to the owner; the copies with forwarded parts added in.

On the MI300X preset at 64 MiB the allgather then reaches the bound (115 us of bandwidth time)
and takes 136 us by the event simulator, against 129 us and 142.5 us relay-free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from topocoll.errors import SolverError
from topocoll.solver.request import check_request
from topocoll.solver.routing import route_table
from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer
from topocoll.solver.traffic import ShardRoute, TwoHopRouting, route_lp, route_two_hop
from topocoll.topo.model import Topology

__all__ = ["direct", "two_hop", "two_hop_routings"]

#: Pieces of a shard narrower than this (a fraction of the shard) are merged into the one before:
#: cut points of different pairs that differ by floating-point rounding only.
MIN_PIECE = 1e-9


def direct(
    topology: Topology,
    collective: Collective | str,
    ranks: Sequence[str] | None = None,
    root: int | None = None,
) -> Schedule:
    """The direct multi-path schedule of ``collective`` (see the module documentation).

    Parameters
    ----------
    topology : Topology
    collective : Collective or str
        allreduce, allgather or reduce_scatter.
    ranks : sequence of str, optional
        Rank nodes (default: all compute nodes).
    root : int, optional
        Accepted for the common signature of the baselines; these collectives have no root.

    Returns
    -------
    Schedule
        Named ``"direct"``.

    Raises
    ------
    SolverError
        A rooted collective, or an invalid request.
    """
    collective = collective if isinstance(collective, Collective) else Collective.parse(collective)
    nodes = _direct_request(topology, collective, ranks)
    n = len(nodes)
    matrix = np.ones((n, n))
    np.fill_diagonal(matrix, 0.0)
    shares = _path_shares(topology, nodes, matrix)
    reduces, gathers = _phases(collective)
    return _layout(
        topology, collective, nodes,
        _straight(shares, reverse=True) if reduces else None,
        _straight(shares, reverse=False) if gathers else None,
        1, "direct",
    )


def two_hop(
    topology: Topology,
    collective: Collective | str,
    ranks: Sequence[str] | None = None,
    root: int | None = None,
    *,
    pipeline: int = 1,
    routings: tuple[TwoHopRouting | None, TwoHopRouting | None] | None = None,
) -> Schedule:
    """The direct schedule with forwarding: each shard goes straight to every rank, except a
    part of it that a rank gets from others that got that part straight.

    Height-two trees (:func:`topocoll.solver.traffic.route_two_hop`), laid out in ``pipeline``
    slices per shard so that forwarding overlaps the straight sends.

    Parameters
    ----------
    topology : Topology
    collective : Collective or str
        allreduce, allgather or reduce_scatter.
    ranks : sequence of str, optional
        Rank nodes (default: all compute nodes).
    root : int, optional
        Accepted for the common signature of the baselines.
    pipeline : int
        Slices per shard (>= 1).
    routings : (TwoHopRouting or None, TwoHopRouting or None), optional
        The reduce-scatter's and the allgather's routing, from :func:`two_hop_routings`
        (computed when left out; pass them to lay one routing out at several depths).

    Returns
    -------
    Schedule
        Named ``"two-hop"`` (``"two-hop-pipelineP"``).

    Raises
    ------
    SolverError
        A rooted collective, a pair joined only through other ranks, or the LP failed.
    """
    collective = collective if isinstance(collective, Collective) else Collective.parse(collective)
    nodes = _direct_request(topology, collective, ranks)
    if pipeline < 1:
        raise SolverError(f"pipeline depth must be >= 1, got {pipeline}")
    scatter, gather = routings if routings is not None else two_hop_routings(topology, collective, nodes)
    name = "two-hop" if pipeline == 1 else f"two-hop-pipeline{pipeline}"
    return _layout(
        topology, collective, nodes,
        _by_group(scatter) if scatter is not None else None,
        _by_group(gather) if gather is not None else None,
        pipeline, name,
    )


def two_hop_routings(
    topology: Topology, collective: Collective, ranks: Sequence[str]
) -> tuple[TwoHopRouting | None, TwoHopRouting | None]:
    """The reduce-scatter's and the allgather's two-hop routings ``collective`` needs (None for
    the phase it has not)."""
    reduces, gathers = _phases(collective)
    return (
        route_two_hop(topology, ranks, reverse=True) if reduces else None,
        route_two_hop(topology, ranks) if gathers else None,
    )


def _phases(collective: Collective) -> tuple[bool, bool]:
    """Whether ``collective`` has a reduce-scatter phase and an allgather phase."""
    return (
        collective in (Collective.REDUCE_SCATTER, Collective.ALLREDUCE),
        collective in (Collective.ALLGATHER, Collective.ALLREDUCE),
    )


def _direct_request(topology: Topology, collective: Collective, ranks: Sequence[str] | None) -> tuple[str, ...]:
    if collective not in (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCE_SCATTER):
        raise SolverError(f"no direct schedule for {collective.value} (the root's links would carry everything)")
    return check_request(topology, collective, topology.compute_nodes() if ranks is None else ranks, None)


def _path_shares(topology: Topology, nodes: tuple[str, ...], matrix: np.ndarray) -> dict[tuple[int, int], list[tuple[tuple[str, ...], float]]]:
    """Per ordered pair with traffic, its relay-free paths and the share of its bytes on each (summing to 1)."""
    try:
        routing = route_lp(topology, nodes, matrix, relays=False)
    except SolverError:  # some pair is joined only through other ranks: relays left out below
        routing = route_lp(topology, nodes, matrix)
    members = set(nodes)
    by_pair: dict[tuple[int, int], list[tuple[tuple[str, ...], float]]] = {}
    for split in routing.splits:
        if any(node in members for node in split.path[1:-1]):
            continue  # a relay (see the module documentation)
        by_pair.setdefault((split.src, split.dst), []).append((split.path, split.bytes))
    shares = {}
    routes = None
    for pair in zip(*np.nonzero(matrix)):
        pair = (int(pair[0]), int(pair[1]))
        found = by_pair.get(pair)
        if not found:
            routes = routes or route_table(topology, nodes)
            found = [(routes.path(nodes[pair[0]], nodes[pair[1]]), 1.0)]
        total = sum(b for _, b in found)
        shares[pair] = [(path, b / total) for path, b in found]
    return shares


def _straight(shares: dict[tuple[int, int], list[tuple[tuple[str, ...], float]]], reverse: bool) -> dict[tuple[int, int], list[ShardRoute]]:
    """The relay-free routing's path shares as every (owner, member)'s straight routes."""
    routes: dict[tuple[int, int], list[ShardRoute]] = {}
    for (i, j), split in shares.items():
        owner, member = (j, i) if reverse else (i, j)
        routes[(owner, member)] = [ShardRoute(owner, member, None, path, share) for path, share in split]
    return routes


def _by_group(routing: TwoHopRouting) -> dict[tuple[int, int], list[ShardRoute]]:
    """A two-hop routing's routes by (owner, member)."""
    routes: dict[tuple[int, int], list[ShardRoute]] = {}
    for route in routing.routes:
        routes.setdefault((route.owner, route.member), []).append(route)
    return routes


def _segments(routes: dict[tuple[int, int], list[ShardRoute]], n: int) -> dict[tuple[int, int], list[tuple[float, float, ShardRoute]]]:
    """Where in its shard each (owner, member)'s routes carry it: ``(lo, hi, route)`` in [0, 1].

    The forwarded parts ``P_m`` of one shard lie side by side from 0 in member order, each
    filled by its forwarders' routes; every member's straight routes fill the rest of the
    shard, so a forwarder always got the part it forwards straight from the owner.
    """
    segments: dict[tuple[int, int], list[tuple[float, float, ShardRoute]]] = {}
    for owner in range(n):
        offset = 0.0
        for member in range(n):
            if member == owner:
                continue
            group = routes[(owner, member)]
            total = sum(r.fraction for r in group)
            forwarded = [r for r in group if r.via is not None]
            straight = [r for r in group if r.via is None]
            width = sum(r.fraction for r in forwarded) / total
            own = []
            at = offset
            for r in forwarded:
                own.append((at, at + r.fraction / total, r))
                at += r.fraction / total
            gap_lo, gap_hi = offset, min(1.0, offset + width)
            at = 0.0
            for r in straight:  # [0, gap_lo) then [gap_hi, 1), a route split across the gap
                left = r.fraction / total
                while left > MIN_PIECE:
                    if gap_lo - MIN_PIECE < at < gap_hi:
                        at = gap_hi
                    end = min(at + left, gap_lo) if at < gap_lo else at + left
                    own.append((at, end, r))
                    left -= end - at
                    at = end
            own.sort(key=lambda seg: seg[0])
            segments[(owner, member)] = own
            offset = gap_hi
    return segments


def _route_at(segments: list[tuple[float, float, ShardRoute]], point: float) -> ShardRoute:
    """The route of an (owner, member) that carries the piece of the shard at ``point``."""
    for lo, hi, route in segments:
        if lo <= point < hi:
            return route
    return segments[-1][2]


def _layout(
    topology: Topology,
    collective: Collective,
    nodes: tuple[str, ...],
    scatter: dict[tuple[int, int], list[ShardRoute]] | None,
    gather: dict[tuple[int, int], list[ShardRoute]] | None,
    pipeline: int,
    name: str,
) -> Schedule:
    """The schedule of the routes: each shard cut into ``pipeline`` slices, every slice cut
    wherever a route of one of its (owner, member)s changes, so that each piece travels whole.

    Each phase takes three steps per slice (empty ones vanish). Reduce-scatter: the members'
    copies to their forwarders, which add them in; the straight copies into which nothing was
    forwarded, to the owner; then those into which something was. Allgather: the owner's pieces
    to the ranks that forward them; its other pieces; the forwarded copies. All reduce-scatter
    slices come before the allgather's.
    """
    n = len(nodes)
    phases = []
    if scatter is not None:
        phases.append(("scatter", _segments(scatter, n)))
    if gather is not None:
        phases.append(("gather", _segments(gather, n)))
    chunks: list[Chunk] = []
    steps: dict[int, list[Transfer]] = {}
    for owner in range(n):
        bounds = {0.0, 1.0}
        for _, segs in phases:
            for member in range(n):
                if member != owner:
                    bounds.update(x for lo, hi, _ in segs[(owner, member)] for x in (lo, hi))
        points = [0.0]
        for x in sorted(bounds)[1:]:
            if x - points[-1] > MIN_PIECE:
                points.append(x)
        points[-1] = 1.0
        for q in range(pipeline):
            for lo, hi in zip(points, points[1:]):
                chunk = Chunk(len(chunks), (owner + (q + lo) / pipeline) / n, (hi - lo) / pipeline / n)
                chunks.append(chunk)
                middle = (lo + hi) / 2
                for p, (phase, segs) in enumerate(phases):
                    base = 3 * (pipeline * p + q)
                    routes = [(member, _route_at(segs[(owner, member)], middle)) for member in range(n) if member != owner]
                    forwarders = {route.via for _, route in routes if route.via is not None}
                    for member, route in routes:
                        if phase == "scatter":
                            # the members' copies to their forwarders, which add them in; the
                            # straight copies to the owner, those without forwarded parts first
                            if route.via is not None:
                                step, src, dst = base, member, route.via
                            else:
                                step, src, dst = base + (2 if member in forwarders else 1), member, owner
                            steps.setdefault(step, []).append(Transfer(src, dst, chunk.id, Op.REDUCE, route.path))
                        else:
                            # the owner's piece straight, first to the ranks that forward it;
                            # then the forwarded copies
                            if route.via is not None:
                                step, src = base + 2, route.via
                            else:
                                step, src = base + (0 if member in forwarders else 1), owner
                            steps.setdefault(step, []).append(Transfer(src, member, chunk.id, Op.COPY, route.path))
    ordered = tuple(tuple(steps[s]) for s in sorted(steps))
    return Schedule(collective, nodes, None, topology.digest(), tuple(chunks), ordered, name)
