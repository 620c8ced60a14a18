"""Routing a traffic matrix (all-to-all with uneven splits) over several paths per pair.

An all-to-all moves ``matrix[i][j]`` bytes from rank i to rank j for every ordered pair. Sent on
one path per pair (what NCCL does), a hot pair saturates its link while parallel links idle.
Here each pair's bytes are split over paths (the direct route, other NICs and rails, relays
through other ranks) so that the busiest link finishes first: the *bandwidth time* of a
routing is ``max over links e of load(e) / bw(e)``, as for schedules (DESIGN's measures).

Four routings, each a :class:`Routing`:

- :func:`route_lp`: the optimum. A path-flow linear program solved by column generation
  through the one LP module (:func:`topocoll.solver.lp.solve_packing`, whose "trees" are paths
  here): the master weighs each pair's paths, the link duals price a new path per pair by a
  shortest-path search, and it stops when no path prices below its pair's dual.
- :func:`route_fast`: good enough to run per training step. Over a fixed set of candidate
  paths per pair (:func:`candidate_paths`, made once per topology and ranks), Frank-Wolfe
  steps on a smoothed busiest-link time move traffic towards each pair's least loaded path;
  numpy only, no LP.
- :func:`route_single_path`: every pair on the one widest path of the route rule
  (:mod:`topocoll.solver.routing`), relays through other ranks allowed.
- :func:`route_direct`: every pair on the widest path that relays through no other rank.

:func:`route_two_hop` routes an allgather's (or, reversed, a reduce-scatter's) shards the same
way, each part straight or forwarded once by a rank that got it straight (the two-hop direct
schedule, :func:`topocoll.solver.direct.two_hop`).

:func:`routing_schedule` writes a routing as an all-to-all schedule (contract 2), which the
verifier checks like any other. :func:`traffic_bound` is a lower bound of every routing: over a family of cuts (ranks, hosts,
the parts a forwarding node separates), the bytes that must cross a cut over the cut's
bandwidth. The LP optimum is at least that bound, and equal to it when one of those cuts binds.

Everything here is pure: values in, values out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np
from scipy.sparse import csc_matrix, csr_matrix, hstack
from scipy.sparse.csgraph import dijkstra

from topocoll.errors import SolverError
from topocoll.solver import lp
from topocoll.solver.link_arrays import LinkArrays, link_arrays
from topocoll.solver.routing import route_table, widest_path
from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer
from topocoll.topo.model import NodeKind, Topology

__all__ = [
    "PathSets",
    "PathSplit",
    "Routing",
    "ShardRoute",
    "TrafficBound",
    "TwoHopRouting",
    "candidate_paths",
    "check_matrix",
    "route_direct",
    "route_fast",
    "route_lp",
    "route_single_path",
    "route_two_hop",
    "routing_schedule",
    "traffic_bound",
    "traffic_matrix",
    "PATTERNS",
]

HOP_COST = 1e-6
"""Added to every link's price when searching paths: among equally priced paths the shorter one
wins (and the search's weights stay positive)."""

FAST_ITERATIONS = 60
"""Most steps of :func:`route_fast`. On the presets (``benchmarks/traffic_bench.py``) it ends
within 3.2 % of the LP optimum (most cases within 0.2 %), where the Frank-Wolfe steps it
replaced took 150 steps and stayed up to 6.9 % away on the MI300X's full mesh."""

REFRESH_AT = (0, 4, 10, 20, 35)
"""Steps of :func:`route_fast` at which a shortest-path search under the current prices adds each
pair's cheapest path to the candidates (a search costs about as much as a few steps). A step that
cannot lower the function over the known paths also triggers one, up to :data:`MAX_SEARCHES`."""

MAX_SEARCHES = 8
"""Most path searches of one :func:`route_fast` call (bounds its time on large groups)."""

SMOOTHING = 64.0
"""Sharpness k of the smoothed maximum ``log Σ exp(k u_e) / k`` over link utilisations ``u_e``
(normalised by the busiest link every :data:`RESCALE_EVERY` steps) at the first step: large
enough that the busiest links dominate the gradient, small enough that the others still pull
traffic off them."""

SHARPEN_PER_STEP = 2 ** (1 / 30)
"""Factor by which :func:`route_fast` sharpens k each step (doubling every 30 steps). The optimum
of a smoothed maximum over E links may sit up to ``log(E) / k`` above the true one (7 % for the
96 links of a DGX A100 at k = 64), so k grows as the routing settles; growing it faster (doubling
every 15 steps) stalled the steps on the DGX A100 (30 % away)."""

RESCALE_EVERY = 5
"""Steps between re-normalisations of the utilisations by the busiest link, so that the
sharpness keeps its meaning as the busiest link's load falls."""

RELAYS_UP_TO = 8
"""Paths of a pair that the search rounds of :func:`candidate_paths` leave short (a full mesh,
where the direct link stays every rank's cheapest): a heavy pair of a full mesh of 8 needs its
direct link and all 6 relays to reach the bound. Measured on the MI300X over 20 Zipf and hot
matrices: with 4 paths the fast routing ended up to 15.6 % above the optimum, with 8 up to 5 %."""

SETTLED_STEPS, SETTLED_GAIN = 10, 1e-3
""":func:`route_fast` stops (after its last scheduled path search) once the last 10 steps lowered
the busiest link's time by less than 0.1 %."""

NEWTON_STEPS = 2
"""Newton steps of :func:`route_fast`'s line search along each step's move (each kept only where
it lowers the smoothed maximum)."""


FORWARD_LEAST_SLACK = 1e-6
""":func:`route_two_hop`'s second stage keeps the first stage's bandwidth time up to this
fraction (rounding of the LP solver)."""

FORWARD_HOPS = 1.0
"""What :func:`route_two_hop`'s second stage charges a forwarded part beyond its links: among
the routings of least bandwidth time it takes the one of fewest link crossings per unit, a
forward counting one more (a store and a new message). The LP's first optimum is one of many:
on the MI300X preset it forwarded over xGMI what the PCIe links could carry straight. Run by the
event simulator without per-message cost (64 MiB; allgather, reduce-scatter, allreduce against
115, 115 and 230 us of bandwidth time): the first optimum 217, 173 and 358 us; the fewest
crossings 149, 186 and 327 us; the least forwarded 129, 129 and 259 us; the fewest crossings
with a forward charged one more 119, 125 and 246 us."""


@dataclass(frozen=True, slots=True)
class PathSplit:
    """``bytes`` of pair ``src -> dst`` (rank indices) sent along ``path`` (topology node ids)."""

    src: int
    dst: int
    path: tuple[str, ...]
    bytes: float


@dataclass(frozen=True, slots=True)
class Routing:
    """A routing of a traffic matrix.

    Attributes
    ----------
    method : str
        ``"lp"``, ``"fast"``, ``"single_path"`` or ``"direct"``.
    ranks : tuple of str
    splits : tuple of PathSplit
        Every pair's bytes, split over its paths (pairs without traffic have none).
    time_s : float
        Bandwidth time: the busiest link's load over its bandwidth.
    bottleneck : tuple of str
        The busiest link (its two ends).
    optimal : bool
        For ``"lp"``: column generation finished (no path prices below its pair's dual).
    """

    method: str
    ranks: tuple[str, ...]
    splits: tuple[PathSplit, ...]
    time_s: float
    bottleneck: tuple[str, ...]
    optimal: bool = False

    def paths_per_pair(self) -> float:
        """Mean number of paths a pair with traffic uses."""
        pairs = {(s.src, s.dst) for s in self.splits}
        return len(self.splits) / len(pairs) if pairs else 0.0


@dataclass(frozen=True, slots=True)
class TrafficBound:
    """``time_s``: no routing of the matrix finishes its bandwidth time sooner; ``cut`` is the
    node set whose boundary binds, ``outbound`` whether the bytes leave it (else enter it)."""

    time_s: float
    cut: tuple[str, ...]
    outbound: bool


def check_matrix(matrix: Sequence[Sequence[float]], n: int) -> np.ndarray:
    """The traffic matrix as an ``n x n`` float array, its diagonal zeroed (a rank's bytes to itself
    move nowhere).

    Raises
    ------
    SolverError
        Not ``n x n``, or an entry that is negative or not finite (naming it).
    """
    array = np.asarray(matrix, dtype=float)
    if array.shape != (n, n):
        raise SolverError(f"traffic matrix must be {n} x {n} (one row and column per rank), got shape {array.shape}")
    bad = np.argwhere(~np.isfinite(array) | (array < 0))
    if len(bad):
        i, j = (int(v) for v in bad[0])
        raise SolverError(f"traffic matrix entry [{i}][{j}] = {float(array[i, j])!r}: bytes must be finite and >= 0")
    array = array.copy()
    np.fill_diagonal(array, 0.0)
    return array


PATTERNS = ("uniform", "zipf", "hot")
"""Synthetic traffic of :func:`traffic_matrix`."""


def traffic_matrix(pattern: str, n: int, bytes_per_rank: float, *, zipf_s: float = 1.2, hot_rank: int = 0, seed: int = 0) -> np.ndarray:
    """A synthetic all-to-all traffic matrix in which every rank sends ``bytes_per_rank``.

    Parameters
    ----------
    pattern : {"uniform", "zipf", "hot"}
        ``uniform``: every other rank gets the same share. ``zipf``: rank i's bytes follow
        Zipf(``zipf_s``) over the other ranks, in a random order per rank (``seed``): a few
        destinations take most (mixture-of-experts routing). ``hot``: one hot expert, every rank
        but ``hot_rank`` sends it half its bytes and spreads the rest evenly.
    n : int
        Ranks (at least 2).
    bytes_per_rank : float

    Raises
    ------
    SolverError
        Unknown pattern, fewer than 2 ranks, a negative size or ``zipf_s``, a hot rank outside.

    Examples
    --------
    >>> traffic_matrix("hot", 3, 4.0).tolist()
    [[0.0, 2.0, 2.0], [2.0, 0.0, 2.0], [2.0, 2.0, 0.0]]
    """
    if pattern not in PATTERNS:
        raise SolverError(f"unknown traffic pattern {pattern!r}; expected one of {', '.join(PATTERNS)}")
    if n < 2 or not bytes_per_rank >= 0 or not zipf_s >= 0 or not 0 <= hot_rank < n:
        raise SolverError(f"traffic pattern {pattern}: need n >= 2, bytes >= 0, s >= 0 and a hot rank in 0..{n - 1}")
    matrix = np.zeros((n, n))
    rng = np.random.default_rng(seed)
    for i in range(n):
        others = [j for j in range(n) if j != i]
        if pattern == "uniform" or (pattern == "hot" and (i == hot_rank or n == 2)):
            weights = np.ones(n - 1)
        elif pattern == "zipf":
            weights = 1.0 / np.arange(1, n) ** zipf_s
            rng.shuffle(weights)
        else:  # hot: half to the hot rank, the rest evenly over the others
            weights = np.array([(n - 2) if j == hot_rank else 1.0 for j in others])
        matrix[i, others] = weights / weights.sum() * bytes_per_rank
    return matrix


# ------------------------------------------------------------------------------ the network
class _Network:
    """The topology restricted to ranks and forwarding nodes, with path search and link loads."""

    def __init__(self, topology: Topology, ranks: Sequence[str], reverse: bool = False) -> None:
        self.ranks = tuple(ranks)
        self.arrays: LinkArrays = link_arrays(topology, self.ranks, reverse)
        self.edge_of = {(int(a), int(b)): e for e, (a, b) in enumerate(zip(self.arrays.src, self.arrays.dst))}
        self._names: dict[tuple[int, ...], tuple[str, ...]] = {}
        a = self.arrays
        self._edge_index = np.full((a.n, a.n), -1, dtype=np.int64)  # link of each (tail, head)
        self._edge_index[a.src, a.dst] = np.arange(len(a.src))

    def shortest(self, weights: np.ndarray, sources: Sequence[int], relays: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Distances and predecessors from each rank in ``sources`` under link ``weights``;
        without ``relays``, paths leave no rank but their source."""
        a = self.arrays
        if relays:
            graph = csr_matrix((weights, (a.src, a.dst)), shape=(a.n, a.n))
            return dijkstra(graph, directed=True, indices=[int(a.ranks[s]) for s in sources], return_predecessors=True)
        from_rank = np.isin(a.src, a.ranks)
        rows = []
        for s in sources:
            keep = ~from_rank | (a.src == a.ranks[s])
            graph = csr_matrix((weights[keep], (a.src[keep], a.dst[keep])), shape=(a.n, a.n))
            rows.append(dijkstra(graph, directed=True, indices=[int(a.ranks[s])], return_predecessors=True))
        return np.vstack([d for d, _ in rows]), np.vstack([p for _, p in rows])

    def path_edges(self, pred_row: np.ndarray, src: int, dst: int) -> tuple[int, ...] | None:
        """Link indices of the path from rank ``src`` to rank ``dst`` in a predecessor row."""
        a = self.arrays
        node, start = int(a.ranks[dst]), int(a.ranks[src])
        edges = []
        while node != start:
            parent = int(pred_row[node])
            if parent < 0:
                return None
            edges.append(self.edge_of[(parent, node)])
            node = parent
        return tuple(reversed(edges))

    def paths_to(self, pred_row: np.ndarray, src: int, dsts: Sequence[int]) -> list[tuple[int, ...] | None]:
        """:meth:`path_edges` for many destinations at once (walks every tree path in step)."""
        a = self.arrays
        start = int(a.ranks[src])
        current = a.ranks[np.asarray(dsts, dtype=np.int64)].copy()
        done = current == start
        columns = []
        while not done.all():
            parent = pred_row[current]
            broken = (parent < 0) & ~done
            if broken.any():  # unreachable destinations: mark them and stop walking them
                done |= broken
                current = np.where(broken, start, current)
                parent = np.where(broken, start, parent)
            step = np.where(done, -1, self._edge_index[np.where(done, start, parent), current])
            columns.append(step)
            current = np.where(done, current, parent)
            done |= current == start
        reachable = ~((pred_row[a.ranks[np.asarray(dsts, dtype=np.int64)]] < 0) & (a.ranks[np.asarray(dsts, dtype=np.int64)] != start))
        if not columns:
            return [() if ok else None for ok in reachable]
        table = np.stack(columns[::-1], axis=1)  # a shorter path's row starts with -1s
        starts = (table < 0).sum(axis=1).tolist()
        return [tuple(row[start:]) if ok else None for row, start, ok in zip(table.tolist(), starts, reachable)]

    def names(self, edges: tuple[int, ...], src: int) -> tuple[str, ...]:
        """The node ids along link list ``edges`` from rank ``src`` (cached: routings of many
        matrices over one network name the same paths)."""
        found = self._names.get(edges)
        if found is None:
            a = self.arrays
            found = (a.names[int(a.ranks[src])], *(a.names[int(a.dst[e])] for e in edges))
            self._names[edges] = found
        return found

    def edges_of_path(self, path: Sequence[str]) -> tuple[int, ...]:
        index = self.arrays.index
        return tuple(self.edge_of[(index[u], index[v])] for u, v in zip(path, path[1:]))


def _finish(method: str, net: _Network, pairs: Sequence[tuple[int, int]], paths: Sequence[tuple[int, ...]], flows: np.ndarray, optimal: bool = False) -> Routing:
    """A :class:`Routing` of ``flows[k]`` bytes of pair ``pairs[k]`` along link list ``paths[k]``."""
    a = net.arrays
    loads = np.zeros(len(a.cap))
    splits = []
    for (src, dst), edges, amount in zip(pairs, paths, flows):
        if amount > 0:
            splits.append(PathSplit(src, dst, net.names(edges, src), float(amount)))
    used = [k for k, amount in enumerate(flows) if amount > 0]
    if used:
        lengths = [len(paths[k]) for k in used]
        hops = np.fromiter(itertools.chain.from_iterable(paths[k] for k in used), dtype=np.int64, count=sum(lengths))
        loads = np.bincount(hops, weights=np.repeat(np.asarray(flows, dtype=float)[used], lengths), minlength=len(a.cap))
    utilisation = loads / a.cap
    busiest = int(np.argmax(utilisation)) if len(utilisation) else 0
    time_s = float(utilisation[busiest]) if len(utilisation) else 0.0
    bottleneck = (a.names[int(a.src[busiest])], a.names[int(a.dst[busiest])]) if time_s > 0 else ()
    return Routing(method, net.ranks, tuple(splits), time_s, bottleneck, optimal)


def _pairs(matrix: np.ndarray) -> list[tuple[int, int]]:
    return [(int(i), int(j)) for i, j in zip(*np.nonzero(matrix))]


# ------------------------------------------------------------------------------ one path a pair
def route_single_path(topology: Topology, ranks: Sequence[str], matrix: Sequence[Sequence[float]]) -> Routing:
    """Every pair's bytes on its one widest route (relays through other ranks allowed): NCCL's
    one path per pair."""
    return _route_one_path("single_path", topology, ranks, matrix, relays=ranks)


def route_direct(topology: Topology, ranks: Sequence[str], matrix: Sequence[Sequence[float]]) -> Routing:
    """Every pair's bytes on its widest route through forwarding nodes only (no other rank)."""
    return _route_one_path("direct", topology, ranks, matrix, relays=())


def _route_one_path(method: str, topology: Topology, ranks: Sequence[str], matrix, relays: Sequence[str]) -> Routing:
    net = _Network(topology, ranks)
    demand = check_matrix(matrix, len(net.ranks))
    pairs = _pairs(demand)
    paths = [net.edges_of_path(widest_path(topology, net.ranks[i], net.ranks[j], relays=relays)) for i, j in pairs]
    return _finish(method, net, pairs, paths, np.array([demand[p] for p in pairs]))


# ------------------------------------------------------------------------------ the optimum
def route_lp(
    topology: Topology,
    ranks: Sequence[str],
    matrix: Sequence[Sequence[float]],
    *,
    solver: str = "highs",
    time_limit_s: float = 60.0,
    gap: float = 1e-4,
    relays: bool = True,
) -> Routing:
    """The routing with the least bandwidth time (multi-path), by column generation.

    Parameters
    ----------
    topology : Topology
    ranks : sequence of str
        Rank nodes, in rank order.
    matrix : sequence of sequences of float
        ``matrix[i][j]``: bytes rank i sends to rank j.
    solver : {"highs", "cbc"}
    time_limit_s : float
        Budget; the best routing so far is returned when it runs out (``optimal`` False).
    gap : float
        Stop when the time is within this fraction of :func:`traffic_bound`.
    relays : bool
        Let paths pass through other ranks (default); False keeps every path free of them (the
        optimum over such paths, which the bound need not reach).

    Returns
    -------
    Routing

    Raises
    ------
    SolverError
        A bad matrix, or a pair with traffic that has no path.

    See Also
    --------
    route_fast : close to this, fast enough for every step.
    traffic_bound : the lower bound it is compared with.
    """
    net = _Network(topology, ranks)
    demand = check_matrix(matrix, len(net.ranks))
    pairs = _pairs(demand)
    if not pairs:
        return _finish("lp", net, [], [], np.zeros(0), optimal=True)
    total = float(demand.sum())
    scale_cap = float(net.arrays.cap.max())
    capacities = net.arrays.cap / scale_cap
    share = [demand[p] / total for p in pairs]
    by_source: dict[int, list[int]] = {}
    for k, (i, _) in enumerate(pairs):
        by_source.setdefault(i, []).append(k)
    target = traffic_bound(topology, ranks, demand).time_s
    columns: list[lp.PackingColumn] = []
    paths: list[tuple[int, ...]] = []
    present: set[tuple[int, tuple[int, ...]]] = set()

    def add_paths(weights: np.ndarray, duals: Sequence[float] | None) -> int:
        added = 0
        sources = sorted(by_source)
        _, pred = net.shortest(weights, sources, relays)
        for row, i in enumerate(sources):
            for k in by_source[i]:
                edges = net.path_edges(pred[row], i, pairs[k][1])
                if edges is None:
                    raise SolverError(f"rank {i} ({net.ranks[i]}) cannot reach rank {pairs[k][1]} ({net.ranks[pairs[k][1]]})")
                if (k, edges) in present:
                    continue
                if duals is not None:
                    price = share[k] * float(sum(weights[e] - HOP_COST for e in edges))
                    if price >= duals[k] - 1e-9 * max(1.0, abs(duals[k])):
                        continue
                columns.append(lp.PackingColumn(k, tuple((e, share[k]) for e in edges)))
                paths.append(edges)
                present.add((k, edges))
                added += 1
        return added

    add_paths(np.full(len(capacities), HOP_COST) + 1.0 / capacities, None)  # the widest-ish first paths
    optimal = False
    best: lp.PackingSolution | None = None
    best_paths: list[tuple[int, ...]] = []
    best_columns: list[lp.PackingColumn] = []
    while True:
        solution = lp.solve_packing(len(pairs), capacities, columns, solver=solver, time_limit_s=time_limit_s)
        if solution.status is not lp.LPStatus.OPTIMAL:
            break
        best, best_paths, best_columns = solution, list(paths), list(columns)
        time_s = solution.tau * total / scale_cap
        if target > 0 and time_s <= target * (1 + gap):
            optimal = True
            break
        if add_paths(np.asarray(solution.edge_duals) + HOP_COST, solution.group_duals) == 0:
            optimal = True
            break
    if best is None:
        raise SolverError(f"traffic routing LP failed ({solution.status.value})")
    flows = np.array([w * demand[pairs[c.group]] for w, c in zip(best.weights, best_columns)])
    return _finish("lp", net, [pairs[c.group] for c in best_columns], best_paths, flows, optimal)


# ------------------------------------------------------------------------------ shards, forwarded once
@dataclass(frozen=True, slots=True)
class ShardRoute:
    """A part of shard ``owner``'s traffic with rank ``member``, on one path.

    For an allgather, ``fraction`` of the shard goes from the owner to the member, straight
    (``via`` None: ``path`` runs owner -> member) or forwarded by rank ``via``, which got that
    part straight from the owner (``path`` runs via -> member). Reversed (reduce-scatter), the
    member's copy goes to the owner (``path`` member -> owner) or to ``via`` (``path`` member ->
    via), which adds it into its own copy before sending that to the owner.
    """

    owner: int
    member: int
    via: int | None
    path: tuple[str, ...]
    fraction: float


@dataclass(frozen=True, slots=True)
class TwoHopRouting:
    """Every shard to every rank, straight or forwarded once (:func:`route_two_hop`).

    Attributes
    ----------
    ranks : tuple of str
    routes : tuple of ShardRoute
        Per (owner, member), fractions summing to 1.
    time_per_shard_byte_s : float
        Bandwidth time per byte of one shard: the busiest link's load over its bandwidth.
    reverse : bool
        Routed for a reduce-scatter (paths towards the owners).
    optimal : bool
        Column generation finished: no column prices below its group's dual.
    """

    ranks: tuple[str, ...]
    routes: tuple[ShardRoute, ...]
    time_per_shard_byte_s: float
    reverse: bool
    optimal: bool


def route_two_hop(
    topology: Topology,
    ranks: Sequence[str],
    *,
    reverse: bool = False,
    solver: str = "highs",
    time_limit_s: float = 60.0,
) -> TwoHopRouting:
    """Send every rank's shard to every other rank, each part straight or forwarded once.

    An allgather's height-two trees as a path-flow linear program. Every rank ``m`` gets each
    shard ``o`` either from ``o`` or, for a part ``P_m`` of it, from ranks ``k`` that got
    ``P_m`` straight from ``o``; every path passes through no rank but its ends. Made real by
    placing the parts ``P_m`` of one shard side by side: each rank gets all but its own part
    straight, so it holds every other rank's part to forward. That needs the parts to fit in
    the shard, ``sum_m |P_m| <= 1``: one budget row per shard (:mod:`topocoll.solver.lp`).
    Where each rank's own links bind and ranks are joined unevenly (a full mesh next to a PCIe
    tree), forwarding lets every link work; relay-free routing alone leaves the slower ones idle.
    Of the routings of least bandwidth time it returns one of fewest link crossings, a forward
    counting :data:`FORWARD_HOPS` more (a second stage of column generation).

    Parameters
    ----------
    topology : Topology
    ranks : sequence of str
        Rank nodes, in rank order.
    reverse : bool
        Route the reduce-scatter: the same problem on the reversed links.
    solver : {"highs", "cbc"}
    time_limit_s : float
        Budget of one LP solve.

    Returns
    -------
    TwoHopRouting

    Raises
    ------
    SolverError
        A pair of ranks joined only through other ranks, or the LP failed.
    """
    net = _Network(topology, ranks, reverse)
    n = len(net.ranks)
    groups = [(o, m) for o in range(n) for m in range(n) if o != m]
    scale_cap = float(net.arrays.cap.max())
    capacities = net.arrays.cap / scale_cap
    columns: list[lp.PackingColumn] = []
    found: list[tuple[int, int | None, tuple[int, ...]]] = []  # group, via, links
    present: set[tuple[int, int | None, tuple[int, ...]]] = set()

    def add_columns(weights: np.ndarray, solution: lp.PackingSolution | None, forward_cost: float) -> int:
        """Each group's cheapest column under the duals (the widest straight path without them)."""
        dist, pred = net.shortest(weights, range(n), relays=False)
        at_rank = dist[:, net.arrays.ranks]  # [source rank, destination rank]
        added = 0
        for g, (o, m) in enumerate(groups):
            if not math.isfinite(at_rank[o, m]):
                raise SolverError(f"rank {o} ({net.ranks[o]}) reaches rank {m} ({net.ranks[m]}) only through other ranks")
            best, via = at_rank[o, m], None
            if solution is not None:
                extra = solution.budget_duals[o] + forward_cost
                for k in range(n):
                    if k not in (o, m) and at_rank[k, m] + extra < best:
                        best, via = at_rank[k, m] + extra, k
                if best >= solution.group_duals[g] - 1e-9 * max(1.0, abs(solution.group_duals[g])):
                    continue
            src = o if via is None else via
            edges = net.path_edges(pred[src], src, m)
            if (g, via, edges) in present:
                continue
            present.add((g, via, edges))
            columns.append(lp.PackingColumn(g, tuple((e, 1.0) for e in edges), () if via is None else ((o, 1.0),)))
            found.append((g, via, edges))
            added += 1
        return added

    def solve(tau_limit: float | None) -> lp.PackingSolution:
        costs = None if tau_limit is None else [len(edges) + (0.0 if via is None else FORWARD_HOPS) for _, via, edges in found]
        return lp.solve_packing(
            len(groups), capacities, columns, solver=solver, time_limit_s=time_limit_s, budgets=[1.0] * n, depths=costs, tau_limit=tau_limit
        )

    add_columns(np.full(len(capacities), HOP_COST) + 1.0 / capacities, None, 0.0)
    best: tuple[lp.PackingSolution, int] | None = None
    optimal = False
    while True:  # first stage: the least bandwidth time
        solution = solve(None)
        if solution.status is not lp.LPStatus.OPTIMAL:
            break
        best = (solution, len(columns))
        if add_columns(np.asarray(solution.edge_duals) + HOP_COST, solution, 0.0) == 0:
            optimal = True
            break
    if best is None:
        raise SolverError(f"two-hop routing LP failed ({solution.status.value})")
    tau_limit = best[0].tau * (1 + FORWARD_LEAST_SLACK)
    while True:  # second stage: at that time, the fewest link crossings, a forward counting one more
        solution = solve(tau_limit)
        if solution.status is not lp.LPStatus.OPTIMAL:
            break
        best = (solution, len(columns))
        if add_columns(np.asarray(solution.edge_duals) + 1.0 + HOP_COST, solution, FORWARD_HOPS) == 0:
            break
    solution, used = best
    routes = []
    for (g, via, edges), weight in zip(found[:used], solution.weights):
        if weight > 0:
            o, m = groups[g]
            src = o if via is None else via
            path = net.names(edges, src)
            routes.append(ShardRoute(o, m, via, path[::-1] if reverse else path, float(weight)))
    return TwoHopRouting(net.ranks, tuple(routes), solution.tau / scale_cap, reverse, optimal)


# ------------------------------------------------------------------------------ the fast path
def _add_relays(net: _Network, found: dict[int, list[tuple[int, ...]]], per_pair: int) -> None:
    """Fill each pair with fewer than ``per_pair`` paths up to :data:`RELAYS_UP_TO` with relays
    ``i -> k -> j`` over the first paths of ``(i, k)`` and ``(k, j)``, widest bottleneck first,
    where the two legs share no node but k (a tree offers none: every relay would pass its switch
    twice)."""
    n = len(net.ranks)
    cap = net.arrays.cap
    heads = net.arrays.dst
    width = np.zeros((n, n))
    for pair, paths in found.items():
        width[divmod(pair, n)] = cap[list(paths[0])].min()
    for pair, paths in found.items():
        if len(paths) >= per_pair:
            continue
        i, j = divmod(pair, n)
        score = np.minimum(width[i], width[:, j])
        score[[i, j]] = -1.0
        for k in np.argsort(-score, kind="stable")[: n - 2]:
            if len(paths) >= RELAYS_UP_TO:
                break
            first, second = found[i * n + int(k)][0], found[int(k) * n + j][0]
            after_k = set(heads[list(second)].tolist())
            if after_k.isdisjoint(heads[list(first)].tolist()) and int(net.arrays.ranks[i]) not in after_k:
                paths.append(first + second)  # no node twice


@dataclass(frozen=True, slots=True, eq=False)
class PathSets:
    """Candidate paths of every ordered pair of ranks, as a link-by-path incidence matrix.

    Made once per topology and ranks by :func:`candidate_paths`; :func:`route_fast` routes any
    matrix over them.
    """

    ranks: tuple[str, ...]
    pair_of_path: np.ndarray  # pair index src * n + dst of each path, sorted
    first_path: np.ndarray  # index of each pair's first path (n * n + 1 entries)
    edges: tuple[tuple[int, ...], ...]  # link indices of each path
    incidence: csr_matrix  # links x paths, 1 where a path uses a link
    cap: np.ndarray  # bytes/s of each link
    network: _Network


def candidate_paths(topology: Topology, ranks: Sequence[str], per_pair: int = 4) -> PathSets:
    """Up to ``per_pair`` paths for every ordered pair of ranks, different where the topology
    offers different ones.

    Round r searches, from every rank, the cheapest paths under link prices ``1/bw`` raised on
    the links this rank's paths of earlier rounds used, so that later rounds take other NICs,
    rails and relays. The widest route of the route rule is always among them. Where a pair is
    left with fewer paths (a full mesh, where the direct link stays the cheapest from every
    rank), relays through the ranks with the widest two legs fill it up.

    Raises
    ------
    SolverError
        A pair of ranks that cannot reach each other.
    """
    net = _Network(topology, ranks)
    n = len(net.ranks)
    cap = net.arrays.cap
    base = cap.max() / cap  # 1 on the widest links
    found: dict[int, list[tuple[int, ...]]] = {}
    routes = route_table(topology, net.ranks)
    for i in range(n):
        for j in range(n):
            if i != j:
                found[i * n + j] = [net.edges_of_path(routes.path(net.ranks[i], net.ranks[j]))]
    used = np.zeros((n, len(cap)))
    for i in range(n):
        for j in range(n):
            if i != j:
                used[i, list(found[i * n + j][0])] += 1
    for _ in range(per_pair - 1):
        for i in range(n):
            _, pred = net.shortest(base * (1.0 + used[i]) + HOP_COST, [i])
            for j in range(n):
                if i == j:
                    continue
                edges = net.path_edges(pred[0], i, j)
                if edges is None:
                    raise SolverError(f"rank {i} ({net.ranks[i]}) cannot reach rank {j} ({net.ranks[j]})")
                if edges not in found[i * n + j]:
                    found[i * n + j].append(edges)
                used[i, list(edges)] += 1
    _add_relays(net, found, per_pair)
    pair_of_path, edges_list = [], []
    first = np.zeros(n * n + 1, dtype=np.int64)
    for pair in range(n * n):
        first[pair] = len(edges_list)
        for edges in found.get(pair, ()):
            pair_of_path.append(pair)
            edges_list.append(edges)
    first[n * n] = len(edges_list)
    rows = [e for edges in edges_list for e in edges]
    cols = [p for p, edges in enumerate(edges_list) for _ in edges]
    incidence = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(cap), len(edges_list)))
    return PathSets(net.ranks, np.asarray(pair_of_path, dtype=np.int64), first, tuple(edges_list), incidence, cap, net)


def route_fast(
    paths: PathSets, matrix: Sequence[Sequence[float]], iterations: int = FAST_ITERATIONS, refresh_at: Sequence[int] = REFRESH_AT
) -> Routing:
    """A routing close to the optimum, by pairwise steps over a growing set of paths.

    Starts from every pair on its first (widest) candidate path and lowers a smoothed busiest-link
    time (:data:`SMOOTHING`). Each step prices every path by that function's gradient and, in
    every pair, moves bytes from its dearest used path to its cheapest one: all of them on even
    steps, on odd steps the amount a Newton step of the pair alone asks for (the price gap over
    the two paths' curvature). A line search (:data:`NEWTON_STEPS`) scales the move of all pairs
    together, so that every step lowers the function. At the steps in ``refresh_at``, and after a
    step that could not lower it over the known paths, a shortest-path search under the same
    prices adds each pair's cheapest path of the whole network to its candidates (column
    generation). The best routing seen is returned.

    This is the pairwise (away-step) Frank-Wolfe method, whose convergence does not slow down
    near the optimum as plain Frank-Wolfe's does, with a per-pair step as path-based traffic
    assignment takes.

    See Also
    --------
    candidate_paths : the paths it starts from (made once per topology and ranks).
    route_lp : the optimum over all paths, to measure this against.
    """
    n = len(paths.ranks)
    demand = check_matrix(matrix, n).reshape(-1)
    state = _FastState(paths, demand)
    if state.empty:
        return _finish("fast", paths.network, [], [], np.zeros(0))
    inv_cap = 1.0 / paths.cap
    loads = state.incidence @ state.flows
    best_time = float((loads * inv_cap).max())
    best = (state.flows.copy(), state.edges, state.pair_ids)
    refresh = set(refresh_at)
    searches, stalled = 0, False
    history: list[float] = []
    for t in range(iterations):
        if t % RESCALE_EVERY == 0:
            scale = max(float((loads * inv_cap).max()), 1e-30)
        u = loads * inv_cap / scale
        sharpness = SMOOTHING * SHARPEN_PER_STEP**t
        softmax = np.exp(sharpness * (u - u.max()))
        softmax /= softmax.sum()
        gradient = softmax * inv_cap / scale  # of the smoothed maximum, per byte on each link
        if t in refresh or (stalled and searches < MAX_SEARCHES):
            added = state.add_cheapest_paths(gradient + HOP_COST * gradient.max())
            searches += 1
            if stalled and not added:
                break  # no step helps over the known paths and the network offers no cheaper one: done
        price = state.incidence_t @ gradient
        cheapest = state.first_in_segments(price <= np.repeat(np.minimum.reduceat(price, state.starts), state.counts))
        used = state.flows > 0
        dearest_used = np.repeat(np.maximum.reduceat(np.where(used, price, -np.inf), state.starts), state.counts)
        away = state.first_in_segments(used & (price >= dearest_used))
        amount = np.where(away != cheapest, state.flows[away], 0.0)
        if t % 2:  # each pair's own Newton step: the price gap over the curvature of the two paths
            curvature_per_link = sharpness * softmax * (inv_cap / scale) ** 2
            curvature = state.incidence_t @ curvature_per_link
            bend = curvature[away] + curvature[cheapest]
            wanted = (price[away] - price[cheapest]) / np.maximum(bend, 1e-300)
            amount = np.clip(np.where(bend > 0, wanted, amount), 0.0, amount)
        move = np.zeros_like(state.flows)
        move[away] -= amount
        move[cheapest] += amount
        load_change = state.incidence @ move
        step = _line_search(u, load_change * inv_cap / scale, sharpness)
        stalled = step <= 0.0  # optimal over the paths known: search the network for more
        if stalled:
            continue
        state.flows = np.maximum(state.flows + step * move, 0.0)
        loads = loads + step * load_change
        time_s = float((loads * inv_cap).max())
        if time_s < best_time:
            best_time, best = time_s, (state.flows.copy(), state.edges, state.pair_ids)
        history.append(best_time)
        if t > max(refresh_at, default=0) and len(history) > SETTLED_STEPS and best_time > history[-1 - SETTLED_STEPS] * (1 - SETTLED_GAIN):
            break  # the last steps gained too little to be worth more
    flows, edges, pair_ids = best
    flows = _prune(flows, pair_ids, demand)
    kept = np.flatnonzero(flows > 0)
    pairs = [divmod(int(p), n) for p in pair_ids[kept]]
    return _finish("fast", paths.network, pairs, [edges[k] for k in kept], flows[kept])


def _line_search(u: np.ndarray, du: np.ndarray, sharpness: float) -> float:
    """The step ``g`` in [0, 1] along utilisation change ``du`` that lowers the smoothed maximum
    (of that ``sharpness``) of ``u + g du`` most, by guarded Newton steps (0 when no step lowers it)."""

    def smoothed(g: float) -> float:
        z = sharpness * (u + g * du)
        top = z.max()
        return (top + math.log(np.exp(z - top).sum())) / sharpness

    step, value = 0.0, smoothed(0.0)
    for _ in range(NEWTON_STEPS):
        z = sharpness * (u + step * du)
        weights = np.exp(z - z.max())
        weights /= weights.sum()
        slope = float(weights @ du)
        bend = sharpness * float(weights @ (du * du) - slope * slope)
        trial = min(1.0, max(0.0, step - slope / bend)) if bend > 0 else (1.0 if slope < 0 else 0.0)
        for _ in range(20):  # halve towards the last point until the function drops
            found = smoothed(trial)
            if found < value:
                break
            trial = step + (trial - step) / 2
        else:
            break
        step, value = trial, found
    return step


class _FastState:
    """The paths of the pairs with bytes, their flows, and the segment structure of
    :func:`route_fast` (paths sorted by pair: each pair's paths are one segment)."""

    def __init__(self, paths: PathSets, demand: np.ndarray) -> None:
        self.n = len(paths.ranks)
        self.network = paths.network
        active = demand[paths.pair_of_path] > 0
        self.empty = not active.any()
        keep = np.flatnonzero(active)
        self.pair_ids = paths.pair_of_path[keep]
        self.edges = [paths.edges[k] for k in keep]
        self.incidence = csc_matrix(paths.incidence)[:, keep]
        self.by_source: dict[int, list[int]] = {}
        for pair in np.flatnonzero(demand > 0):
            self.by_source.setdefault(int(pair) // self.n, []).append(int(pair) % self.n)
        self._segments()
        self.flows = np.zeros(len(self.pair_ids))
        if not self.empty:
            self.flows[self.starts] = demand[self.pair_ids[self.starts]]  # each pair's widest path first

    def _segments(self) -> None:
        self.incidence_t = self.incidence.T.tocsr()
        self.starts = np.flatnonzero(np.concatenate(([True], self.pair_ids[1:] != self.pair_ids[:-1])))
        self.counts = np.diff(np.append(self.starts, len(self.pair_ids)))
        self.segment = np.repeat(np.arange(len(self.starts)), self.counts)

    def first_in_segments(self, mask: np.ndarray) -> np.ndarray:
        """In every segment, the first path where ``mask`` holds (every segment has one)."""
        where = np.flatnonzero(mask)
        segment = self.segment[where]
        return where[np.concatenate(([True], segment[1:] != segment[:-1]))]

    def add_cheapest_paths(self, weights: np.ndarray) -> bool:
        """Add each pair's cheapest path of the network under link ``weights`` where it beats
        the pair's candidates (the exact Frank-Wolfe step, which fixed candidates approximate);
        whether any was added."""
        n, net = self.n, self.network
        price = self.incidence_t @ weights
        cheapest = np.full(n * n, np.inf)
        cheapest[self.pair_ids[self.starts]] = np.minimum.reduceat(price, self.starts)
        sources = sorted(self.by_source)
        dist, pred = net.shortest(weights, sources)
        new_pairs, new_edges = [], []
        for row, i in enumerate(sources):
            targets = np.asarray(self.by_source[i])
            dsts = targets[dist[row, net.arrays.ranks[targets]] < cheapest[i * n + targets] * (1 - 1e-9)].tolist()
            for j, found in zip(dsts, net.paths_to(pred[row], i, dsts) if dsts else ()):
                if found is not None:  # cheaper than every candidate of its pair, so not one of them
                    new_pairs.append(i * n + j)
                    new_edges.append(found)
        if not new_edges:
            return False
        rows = [e for path in new_edges for e in path]
        cols = [c for c, path in enumerate(new_edges) for _ in path]
        extra = csc_matrix((np.ones(len(rows)), (rows, cols)), shape=(self.incidence.shape[0], len(new_edges)))
        pair_ids = np.concatenate([self.pair_ids, np.asarray(new_pairs, dtype=np.int64)])
        order = np.argsort(pair_ids, kind="stable")
        self.incidence = hstack([self.incidence, extra], format="csc")[:, order]
        self.flows = np.concatenate([self.flows, np.zeros(len(new_edges))])[order]
        self.pair_ids = pair_ids[order]
        edges = self.edges + new_edges
        self.edges = [edges[k] for k in order]
        self._segments()
        return True


PRUNE_SHARE = 1e-3
"""Paths that carry less than this share of their pair's bytes are dropped from a fast routing and
their bytes spread over the pair's other paths: Frank-Wolfe leaves a trace on every path it
visited, and each path is a message to send."""


def _prune(flows: np.ndarray, pair_ids: np.ndarray, demand: np.ndarray) -> np.ndarray:
    """``flows`` without the paths under :data:`PRUNE_SHARE` of their pair, each pair rescaled
    to its demand (``pair_ids`` sorted)."""
    share = flows / np.maximum(demand[pair_ids], 1e-300)
    kept = np.where(share >= PRUNE_SHARE, flows, 0.0)
    starts = np.flatnonzero(np.r_[True, pair_ids[1:] != pair_ids[:-1]])
    totals = np.add.reduceat(kept, starts)
    counts = np.diff(np.r_[starts, len(pair_ids)])
    per_path_total = np.repeat(totals, counts)
    return np.where(per_path_total > 0, kept * demand[pair_ids] / np.maximum(per_path_total, 1e-300), flows)


# ------------------------------------------------------------------------------ as a schedule
def routing_schedule(routing: Routing, topology: Topology, matrix: Sequence[Sequence[float]]) -> Schedule:
    """``routing`` as an all-to-all schedule (contract 2, collective ``alltoall``).

    Each split becomes one chunk of its pair's block (a pair's chunks in split order tile the
    block); a split whose path meets other ranks is relayed by them, one transfer per leg, leg k
    in step k. The schedule carries ``matrix`` as its ``matrix_bytes``, so that
    :func:`topocoll.solver.verify.verify` weighs each chunk by its pair's bytes.

    Examples
    --------
    >>> from topocoll.topo.discover import flat_topology
    >>> topo = flat_topology(2)
    >>> matrix = [[0, 4e6], [2e6, 0]]
    >>> schedule = routing_schedule(route_direct(topo, topo.compute_nodes(), matrix), topo, matrix)
    >>> [(c.src, c.dst, c.size) for c in schedule.chunks], len(schedule.steps)
    ([(0, 1, 1.0), (1, 0, 1.0)], 1)
    """
    n = len(routing.ranks)
    demand = check_matrix(matrix, n)
    index = {node: r for r, node in enumerate(routing.ranks)}
    by_pair: dict[tuple[int, int], list[PathSplit]] = {}
    for split in routing.splits:
        by_pair.setdefault((split.src, split.dst), []).append(split)
    chunks: list[Chunk] = []
    steps: list[list[Transfer]] = []
    for (src, dst), splits in sorted(by_pair.items()):
        offset = 0.0
        for k, split in enumerate(splits):
            size = 1.0 - offset if k == len(splits) - 1 else split.bytes / demand[src, dst]  # the last closes the block exactly
            chunk = Chunk(len(chunks), offset, size, src, dst)
            chunks.append(chunk)
            offset += size
            meets = [k for k, node in enumerate(split.path) if node in index]  # where the path meets a rank
            for leg, (a, b) in enumerate(zip(meets, meets[1:])):
                if leg == len(steps):
                    steps.append([])
                steps[leg].append(Transfer(index[split.path[a]], index[split.path[b]], chunk.id, Op.COPY, split.path[a : b + 1]))
    return Schedule(
        collective=Collective.ALLTOALL,
        ranks=tuple(routing.ranks),
        root=None,
        topology_digest=topology.digest(),
        chunks=tuple(chunks),
        steps=tuple(tuple(step) for step in steps),
        name=routing.method,
        matrix_bytes=tuple(tuple(float(v) for v in row) for row in demand),
    )


# ------------------------------------------------------------------------------ the bound
def traffic_bound(topology: Topology, ranks: Sequence[str], matrix: Sequence[Sequence[float]]) -> TrafficBound:
    """A lower bound of the bandwidth time of any routing of ``matrix``.

    For each cut S in a family, the bytes from ranks inside S to ranks outside must leave S over
    the links leaving it (and likewise entering), so no routing beats ``bytes / bandwidth`` of
    any S. The family: every rank alone; every host's ranks with the host's forwarding nodes;
    and, for every forwarding node x (switch, CPU, NIC, PCIe bridge), each connected part of the
    network without x (which finds sockets behind their inter-socket link, PCIe subtrees behind
    their switch, racks behind their uplink). Compute nodes that are not ranks forward nothing
    and are left out.

    Examples
    --------
    >>> from topocoll.topo.discover import flat_topology
    >>> topo = flat_topology(3)
    >>> bound = traffic_bound(topo, topo.compute_nodes(), [[0, 8e9, 0], [0, 0, 0], [0, 0, 0]])
    >>> bound.cut, bound.outbound, round(bound.time_s / (8e9 / topo.capacity("host0", "hub")), 6)
    (('host0',), True, 1.0)
    """
    ranks = tuple(ranks)
    demand = check_matrix(matrix, len(ranks))
    index = {r: i for i, r in enumerate(ranks)}
    kept = set(link_arrays(topology, ranks).names)
    links = [link for link in topology.links if link.src in kept and link.dst in kept]
    cuts: set[frozenset[str]] = {frozenset((r,)) for r in ranks}
    for group in topology.ranks_by_host(ranks):
        host = topology.node(ranks[group[0]]).host_id
        if host is not None and 1 < len(group) < len(ranks):
            cuts.add(frozenset(ranks[i] for i in group) | {n.id for n in topology.nodes if n.id in kept and not n.kind.is_compute and n.host_id == host})
    graph = nx.Graph()
    graph.add_nodes_from(kept)
    graph.add_edges_from((link.src, link.dst) for link in links)
    for r in ranks:  # each rank's machine: what it reaches before a network switch or another rank
        inside = {r}
        frontier = [r]
        while frontier:
            for v in graph.neighbors(frontier.pop()):
                kind = topology.node(v).kind
                if v not in inside and v not in index and kind is not NodeKind.NET_SWITCH:
                    inside.add(v)
                    frontier.append(v)
        if len(inside) > 1:
            cuts.add(frozenset(inside))
    for x in kept:
        if not topology.node(x).kind.is_compute:
            rest = graph.subgraph(kept - {x})
            for part in nx.connected_components(rest):
                if 0 < sum(1 for v in part if v in index) < len(ranks):
                    cuts.add(frozenset(part))
    best = TrafficBound(0.0, (), True)
    for cut in sorted(cuts, key=lambda c: sorted(c)):
        members = [index[v] for v in cut if v in index]
        outside = [i for i in range(len(ranks)) if ranks[i] not in cut]
        out_bytes = float(demand[np.ix_(members, outside)].sum())
        in_bytes = float(demand[np.ix_(outside, members)].sum())
        out_bw = sum(link.bw_bytes_per_s for link in links if link.src in cut and link.dst not in cut)
        in_bw = sum(link.bw_bytes_per_s for link in links if link.dst in cut and link.src not in cut)
        for moved, bw, outbound in ((out_bytes, out_bw, True), (in_bytes, in_bw, False)):
            if moved > 0:
                time_s = moved / bw if bw > 0 else math.inf
                if time_s > best.time_s:
                    best = TrafficBound(time_s, tuple(sorted((v for v in cut if v in index), key=index.get)), outbound)
    return best
