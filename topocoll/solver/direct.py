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
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from topocoll.errors import SolverError
from topocoll.solver.request import check_request
from topocoll.solver.routing import route_table
from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer
from topocoll.solver.traffic import route_lp
from topocoll.topo.model import Topology

__all__ = ["direct"]

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
    if collective not in (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCE_SCATTER):
        raise SolverError(f"no direct schedule for {collective.value} (the root's links would carry everything)")
    nodes = check_request(topology, collective, topology.compute_nodes() if ranks is None else ranks, None)
    n = len(nodes)
    matrix = np.ones((n, n))
    np.fill_diagonal(matrix, 0.0)
    return _all_pairs(topology, collective, nodes, _path_shares(topology, nodes, matrix))


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


def _cuts(split: list[tuple[tuple[str, ...], float]]) -> list[float]:
    """Where a pair's split cuts a shard (fractions of it, the ends excluded)."""
    return [float(x) for x in np.cumsum([share for _, share in split])[:-1]]


def _path_at(split: list[tuple[tuple[str, ...], float]], point: float) -> tuple[str, ...]:
    """The path of the pair's split that carries the piece of the shard at ``point``."""
    end = 0.0
    for path, share in split:
        end += share
        if point < end:
            return path
    return split[-1][0]


def _all_pairs(topology: Topology, collective: Collective, nodes: tuple[str, ...], shares) -> Schedule:
    """Each shard cut at every point where a pair that moves it changes path, so that each piece
    travels whole on one path of every pair."""
    n = len(nodes)
    reduces = collective in (Collective.REDUCE_SCATTER, Collective.ALLREDUCE)
    gathers = collective in (Collective.ALLGATHER, Collective.ALLREDUCE)
    chunks: list[Chunk] = []
    reduce_step: list[Transfer] = []
    gather_step: list[Transfer] = []
    for shard in range(n):
        movers = [(i, shard) for i in range(n) if i != shard and reduces] + [(shard, j) for j in range(n) if j != shard and gathers]
        points = sorted({0.0, 1.0, *(x for pair in movers for x in _cuts(shares[pair]))})
        kept = [points[0]]
        for point in points[1:]:
            if point - kept[-1] > MIN_PIECE:
                kept.append(point)
        kept[-1] = 1.0
        points = kept
        for lo, hi in zip(points, points[1:]):
            chunk = Chunk(len(chunks), (shard + lo) / n, (hi - lo) / n)
            chunks.append(chunk)
            middle = (lo + hi) / 2
            for i, j in movers:
                path = _path_at(shares[(i, j)], middle)
                if j == shard and reduces:  # i adds its copy of the piece into the owner's
                    reduce_step.append(Transfer(i, j, chunk.id, Op.REDUCE, path))
                else:  # the owner sends the reduced piece to j
                    gather_step.append(Transfer(i, j, chunk.id, Op.COPY, path))
    steps = tuple(tuple(step) for step in (reduce_step, gather_step) if step)
    return Schedule(collective, nodes, None, topology.digest(), tuple(chunks), steps, "direct")
