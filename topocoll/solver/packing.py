"""Tree packing by column generation: the bandwidth-optimal core of synthesis.

Every rank's data travels down trees (for allgather: one set of trees per rank, each tree
spanning all ranks and carrying a fraction of that rank's shard). A tree's arcs join ranks;
each arc is routed on a physical path through nodes that only forward (switches, NICs, CPUs,
PCIe switches); ranks themselves relay by being inner nodes of a tree. Compute nodes that are
not ranks are left out: no program runs there.

The master LP (:mod:`topocoll.solver.lp`) weighs the known trees to minimise the time of the
busiest link. Its edge duals price links; the cheapest new tree for a root is a minimum-cost
arborescence over the complete graph of ranks whose arc costs
are shortest dual-weighted paths (scipy's Dijkstra; the arborescence itself by a numpy
Chu-Liu/Edmonds, see :func:`min_arborescence`). A tree whose price is below the root's
dual improves the master; when none does, the packing is optimal over all such trees. On
Eulerian topologies (full-duplex links) the optimum equals the cut bound (ForestColl), which
also gives a stopping rule: stop as soon as the packing is within ``gap`` of the bound.

All functions are pure except for reading a monotonic clock to honour the time limit.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from topocoll.errors import SolverError
from topocoll.solver import lp
from topocoll.solver.link_arrays import link_arrays
from topocoll.topo.model import Topology

log = logging.getLogger(__name__)

#: Rounds an unused tree stays in the master before it is dropped.
_KEEP_UNUSED_ROUNDS = 3
#: Relative bandwidth time the second stage may give up for shallower trees (0.01 %).
_SHALLOW_SLACK = 1e-4


@dataclass(frozen=True, slots=True)
class Tree:
    """A spanning tree over the ranks, rooted at ``root``.

    Attributes
    ----------
    root : int
        Rank index.
    arcs : tuple of (int, int, tuple of str)
        ``(parent, child, path)`` in breadth-first order; ``path`` runs parent -> child.
    weight : float
        Fraction of the root's data this tree carries (the weights of a root sum to 1).
    """

    root: int
    arcs: tuple[tuple[int, int, tuple[str, ...]], ...]
    weight: float

    def depths(self) -> dict[int, int]:
        """Depth of every rank (root 0)."""
        depth = {self.root: 0}
        for parent, child, _ in self.arcs:
            depth[child] = depth[parent] + 1
        return depth

    @property
    def height(self) -> int:
        """Number of arc levels."""
        return max(self.depths().values())

    def reversed_paths(self) -> "Tree":
        """The same tree with every path reversed (child -> parent routes)."""
        return Tree(self.root, tuple((p, c, tuple(reversed(path))) for p, c, path in self.arcs), self.weight)


@dataclass(frozen=True, slots=True)
class Packing:
    """Result of :func:`pack_trees`.

    Attributes
    ----------
    trees : tuple of Tree
        Trees with positive weight, grouped by root.
    time_per_unit_s : float
        Bandwidth time to move one byte of every root's data through its trees.
    optimal : bool
        Column generation finished (no improving tree) or reached the target.
    iterations : int
    solver : str
    """

    trees: tuple[Tree, ...]
    time_per_unit_s: float
    optimal: bool
    iterations: int
    solver: str


class RankNetwork:
    """Restricted topology as index arrays, with each rank split into an out- and in-copy.

    The packing LP has one capacity row per link (``row_of_edge`` the identity), or, with
    ``both_directions``, one per pair of opposite links, which then carries the trees' load in
    either direction (see :func:`pack_trees`).
    """

    def __init__(self, topology: Topology, ranks: Sequence[str], reverse: bool, both_directions: bool = False) -> None:
        arrays = link_arrays(topology, ranks, reverse)
        self.names = arrays.names
        self.n = arrays.n
        self.rank_index = arrays.ranks
        # In-copy of rank i: node n + i. Arcs into a rank land on its in-copy, which has no
        # outgoing arcs, so routes never pass through a rank.
        in_copy = np.arange(self.n, dtype=np.int64)
        in_copy[arrays.ranks] = self.n + np.arange(len(ranks), dtype=np.int64)
        self.src = arrays.src
        self.dst = in_copy[arrays.dst]
        self.cap = arrays.cap
        self.max_cap = float(self.cap.max()) if len(self.cap) else 1.0
        self.norm_cap = self.cap / self.max_cap
        self.edge_of = {(int(self.src[e]), int(self.dst[e])): e for e in range(len(self.src))}
        self.reverse = reverse
        self.size = self.n + len(ranks)
        self.row_of_edge = np.arange(len(self.src), dtype=np.int64)
        if both_directions:
            pair = {}
            for e, (a, b) in enumerate(zip(arrays.src.tolist(), arrays.dst.tolist())):
                self.row_of_edge[e] = pair.setdefault((min(a, b), max(a, b)), len(pair))
        rows = int(self.row_of_edge.max()) + 1 if len(self.src) else 0
        # a pair's row holds the narrower direction's capacity (the same where links are full duplex)
        self.row_cap = np.full(rows, np.inf)
        np.minimum.at(self.row_cap, self.row_of_edge, self.norm_cap)

    def row_loads(self, edges: Sequence[int] | np.ndarray, loads: dict[int, float] | None = None) -> dict[int, float]:
        """Add one unit of load on each of ``edges`` to ``loads`` (by LP row); return it."""
        loads = {} if loads is None else loads
        for e in edges:
            row = int(self.row_of_edge[e])
            loads[row] = loads.get(row, 0.0) + 1.0
        return loads

    def edge_prices(self, row_duals: Sequence[float]) -> np.ndarray:
        """Each link's price: the dual of its LP row."""
        return np.asarray(row_duals, dtype=float)[self.row_of_edge]

    def routes(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shortest ``weights``-paths from every rank to every rank's in-copy.

        Returns the cost matrix ``cost[i, j]`` (inf on the diagonal) and the predecessor
        matrix of the Dijkstra runs.
        """
        graph = csr_matrix((weights, (self.src, self.dst)), shape=(self.size, self.size))
        dist, pred = dijkstra(graph, directed=True, indices=self.rank_index, return_predecessors=True)
        n_ranks = len(self.rank_index)
        cost = dist[:, self.n : self.n + n_ranks].copy()
        np.fill_diagonal(cost, np.inf)
        return cost, pred

    def path(self, pred: np.ndarray, i: int, j: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Edge indices and node names of the route from rank ``i`` to rank ``j``."""
        return self._trace(pred[i], int(self.rank_index[i]), self.n + j)

    def _trace(self, row: np.ndarray, start: int, target: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
        nodes = [target]
        while nodes[-1] != start:
            prev = row[nodes[-1]]
            if prev < 0:
                raise SolverError("internal: broken route")
            nodes.append(int(prev))
        nodes.reverse()
        edges = tuple(self.edge_of[(a, b)] for a, b in zip(nodes, nodes[1:]))
        names = [self.names[k] if k < self.n else self.names[self.rank_index[k - self.n]] for k in nodes]
        return edges, tuple(names)

    def stars(self, root: int, weights: np.ndarray) -> list[list[tuple[int, int, tuple[int, ...], tuple[str, ...]]]]:
        """One star tree per forwarding neighbour ``w`` of rank ``root``.

        Every other rank is reached directly from the root on a shortest path whose first hop
        is ``w`` (e.g. one star per NVSwitch plane). Stars that miss a rank are left out.
        """
        r = int(self.rank_index[root])
        first_hops = np.flatnonzero((self.src == r) & (self.dst < self.n))
        if len(first_hops) == 0:
            return []
        graph = csr_matrix((weights, (self.src, self.dst)), shape=(self.size, self.size))
        neighbours = self.dst[first_hops]
        dist, pred = dijkstra(graph, directed=True, indices=neighbours, return_predecessors=True)
        others = [j for j in range(len(self.rank_index)) if j != root]
        stars = []
        for k, edge in enumerate(first_hops):
            if not all(np.isfinite(dist[k, self.n + j]) for j in others):
                continue
            arcs = []
            for j in others:
                edges, names = self._trace(pred[k], int(neighbours[k]), self.n + j)
                arcs.append((root, j, (int(edge),) + edges, (self.names[r],) + names))
            stars.append(arcs)
        return stars


def min_arborescence(cost: np.ndarray, root: int) -> np.ndarray | None:
    """Minimum-cost spanning arborescence of a dense cost matrix (Chu-Liu/Edmonds).

    networkx implements the same algorithm over graph objects, which costs a quarter of a
    second at 32 nodes; pricing calls this once per root and round, so it works on the matrix
    with numpy instead (contracting all cycles of the cheapest in-arcs at once).

    Parameters
    ----------
    cost : ndarray, shape (n, n)
        ``cost[u, v]`` of arc u -> v; ``inf`` where there is no arc.
    root : int

    Returns
    -------
    ndarray of int or None
        ``parent[v]`` for every node (``-1`` for the root), or None when some node cannot be
        reached from the root.
    """
    n = cost.shape[0]
    cost = cost.astype(float, copy=True)
    cost[:, root] = np.inf
    np.fill_diagonal(cost, np.inf)
    pred = np.argmin(cost, axis=0)
    best = cost[pred, np.arange(n)]
    pred[root] = -1
    best[root] = 0.0
    if not np.all(np.isfinite(best)):
        return None
    # The cheapest in-arcs form a functional graph. Following parents 2^k >= n times lands on
    # a cycle (or the root), so the image of that jump is the set of cycle nodes; a cycle is
    # named by its smallest node, found by the same pointer doubling.
    parent = pred.copy()
    parent[root] = root
    rounds = max(1, int(np.ceil(np.log2(n))) + 1)
    jump = parent
    for _ in range(rounds):
        jump = jump[jump]
    in_cycle = np.zeros(n, dtype=bool)
    in_cycle[jump] = True
    in_cycle[root] = False
    if not in_cycle.any():
        return pred
    low = np.where(in_cycle, np.arange(n), n)
    step = parent
    for _ in range(rounds):
        low = np.where(in_cycle, np.minimum(low, low[step]), low)
        step = step[step]
    _, label = np.unique(np.where(in_cycle, low, n + np.arange(n)), return_inverse=True)
    label = label.reshape(-1)
    # Entering a cycle at v replaces v's cycle arc: charge the difference.
    adjusted = cost - np.where(in_cycle, best, 0.0)[None, :]
    adjusted[label[:, None] == label[None, :]] = np.inf
    order = np.argsort(label, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(label[order]) != 0])
    sizes = np.diff(np.r_[starts, n])
    permuted = adjusted[order][:, order]
    column_min = np.minimum.reduceat(permuted, starts, axis=0)  # (component, node)
    contracted = np.minimum.reduceat(column_min, starts, axis=1)
    sub = min_arborescence(contracted, int(label[root]))
    if sub is None:
        return None
    # For every (component, node): the first row of the component reaching column_min.
    rows = np.broadcast_to(np.arange(n)[:, None], (n, n))
    hits = np.where(permuted == np.repeat(column_min, sizes, axis=0), rows, n)
    arg_row = np.minimum.reduceat(hits, starts, axis=0)
    result = pred.copy()
    chosen = np.flatnonzero(sub >= 0)
    single = chosen[sizes[chosen] == 1]
    v_single = starts[single]
    result[order[v_single]] = order[arg_row[sub[single], v_single]]
    for cv in chosen[sizes[chosen] > 1]:
        cu = int(sub[cv])
        lo, hi = starts[cv], starts[cv] + sizes[cv]
        v_perm = lo + int(np.argmin(column_min[cu, lo:hi]))
        result[order[v_perm]] = order[arg_row[cu, v_perm]]
    result[root] = -1
    return result


def _arborescence(cost: np.ndarray, root: int) -> list[tuple[int, int]] | None:
    """Minimum-cost spanning arborescence as (parent, child) pairs in breadth-first order."""
    parent = min_arborescence(cost, root)
    if parent is None:
        return None
    children: dict[int, list[int]] = {}
    for v, u in enumerate(parent):
        if u >= 0:
            children.setdefault(int(u), []).append(v)
    pairs, frontier = [], [root]
    while frontier:
        nxt = []
        for u in frontier:
            for v in children.get(u, ()):
                pairs.append((u, v))
                nxt.append(v)
        frontier = nxt
    return pairs


def pack_trees(
    topology: Topology,
    ranks: Sequence[str],
    roots: Sequence[int],
    *,
    reverse: bool = False,
    target_time_per_unit_s: float = 0.0,
    gap: float = 1e-4,
    solver: str = "highs",
    time_limit_s: float = 60.0,
    max_trees_per_root: int | None = None,
    seed_orders: Sequence[Sequence[int]] = (),
    both_directions: bool = False,
) -> Packing:
    """Pack spanning trees of the ranks, one family per root, minimising the busiest link.

    Parameters
    ----------
    topology : Topology
    ranks : sequence of str
        Rank nodes.
    roots : sequence of int
        Ranks whose data is spread (all ranks for allgather, one for broadcast).
    reverse : bool
        Pack on the reversed graph (for reduce-scatter and reduce); the returned paths are
        then in the reversed direction too (child -> parent in the original graph once
        reversed with :meth:`Tree.reversed_paths`).
    target_time_per_unit_s : float
        A known lower bound (the cut bound); column generation stops within ``gap`` of it.
    gap : float
        Relative optimality gap at which to stop.
    solver : str
        LP solver name (see :data:`topocoll.solver.lp.SOLVERS`).
    time_limit_s : float
        Wall-clock budget; the best packing so far is returned when it runs out.
    max_trees_per_root : int, optional
        Keep at most this many trees per root (the heaviest, renormalised) in the result.
    seed_orders : sequence of sequences of int
        Cyclic orders of all ranks (rings); for every root the chain along each ring starting
        at that root joins the first master problem.
    both_directions : bool
        Count the trees' load on a link against the pair of it and its opposite link: for
        allreduce on a full-duplex graph, whose reduce-scatter runs the same trees reversed, so
        that each link carries the trees' load on it and on its opposite. The busiest pair is
        then the allreduce's bandwidth time per unit; it may be below the reduce-scatter plus
        allgather time of the cut bound where ranks are unevenly connected (a rank with a narrow
        link sends and receives each byte once, where the two halves each count it).

    Returns
    -------
    Packing

    Raises
    ------
    SolverError
        Some rank cannot be reached from a root.

    See Also
    --------
    topocoll.solver.lp.solve_packing : the master problem.
    topocoll.solver.synthesize.synthesize : the schedule made of the trees.
    """
    deadline = time.monotonic() + time_limit_s
    net = RankNetwork(topology, ranks, reverse, both_directions)
    roots = list(roots)
    seeds = _seed_columns(net, ranks, roots, seed_orders)
    pool = _ColumnPool(seeds)
    iterations = 0
    optimal = False
    best: tuple[lp.PackingSolution, _ColumnPool] | None = None
    solver_used = solver
    last_tau = math.inf
    while True:
        iterations += 1
        remaining = max(1.0, deadline - time.monotonic())
        solution = lp.solve_packing(len(roots), net.row_cap, pool.columns, solver=solver_used, time_limit_s=remaining)
        if solution.status is lp.LPStatus.ERROR and solver_used == "highs":
            log.warning("HiGHS failed on the packing LP; retrying with CBC")
            solver_used = "cbc"
            continue
        if solution.status is not lp.LPStatus.OPTIMAL:
            break
        best = (solution, pool.copy())
        time_per_unit = solution.tau / net.max_cap
        if target_time_per_unit_s > 0 and time_per_unit <= target_time_per_unit_s * (1 + gap):
            optimal = True
            break
        if time.monotonic() > deadline:
            break
        # Only after a round that lowered tau: dropping during a degenerate stall lets pricing
        # bring the same trees back round after round without end.
        improved = solution.tau < last_tau * (1 - 1e-9)
        last_tau = min(last_tau, solution.tau)
        pool.drop_idle(solution.weights, improved)
        added = _price_trees(net, roots, solution, pool)
        log.info("column generation %d: time/unit %.4g, %d trees added", iterations, time_per_unit, added)
        if added == 0:
            optimal = True
            break

    if best is None:
        raise SolverError(f"tree packing LP failed ({solution.status.value})")
    solution, pool = best
    solution = _shallowest(net, roots, solution, pool, seeds, deadline)
    chosen = _normalise(pool.trees, solution.weights, roots, max_trees_per_root)
    return Packing(tuple(chosen), solution.tau / net.max_cap, optimal, iterations, solution.solver)


#: Per-hop cost added to every arc's price: among equally priced routes the shorter one wins,
#: and Dijkstra's weights stay strictly positive.
_HOP_COST = 1e-6


def _tree_column(
    net: RankNetwork, cost: np.ndarray, pred: np.ndarray, root: int, group: int, pairs: Sequence[tuple[int, int]] | None = None
) -> tuple[lp.PackingColumn, Tree, float] | None:
    """The column, tree and price of the tree over the routes ``pred`` with arcs ``pairs`` (by
    default the minimum arborescence of ``cost`` at ``root``); None when it spans not every rank."""
    if pairs is None:
        pairs = _arborescence(cost, root)
    if pairs is None or len(pairs) != len(net.rank_index) - 1 or not all(np.isfinite(cost[u, v]) for u, v in pairs):
        return None
    loads: dict[int, float] = {}
    arcs = []
    price = 0.0
    for parent, child in pairs:
        edges, names = net.path(pred, parent, child)
        price += cost[parent, child]
        net.row_loads(edges, loads)
        arcs.append((parent, child, names))
    return lp.PackingColumn(group, tuple(sorted(loads.items()))), Tree(root, tuple(arcs), 0.0), price


def _seed_columns(
    net: RankNetwork, ranks: Sequence[str], roots: Sequence[int], seed_orders: Sequence[Sequence[int]]
) -> list[tuple[lp.PackingColumn, Tree]]:
    """The first master problem's trees: per root the cheapest-route tree, the stars through the
    switch planes it touches, and the chains along the seed rings."""
    cost, pred = net.routes(np.full(len(net.cap), _HOP_COST))
    seeds: list[tuple[lp.PackingColumn, Tree]] = []
    for group, root in enumerate(roots):
        made = _tree_column(net, cost, pred, root, group)
        if made is None:
            unreachable = [ranks[j] for j in range(len(ranks)) if j != root and not np.isfinite(cost[:, j]).any()]
            who = unreachable[0] if unreachable else "some rank"
            raise SolverError(f"{who} cannot be reached from {ranks[root]} in this topology")
        column, tree, _ = made
        seeds.append((column, tree))
        # Stars through each switch plane the root touches: on NVSwitch machines their mix is
        # the optimum, which saves most of the pricing rounds.
        for star in net.stars(root, np.full(len(net.cap), _HOP_COST)):
            loads: dict[int, float] = {}
            for _, _, edges, _ in star:
                net.row_loads(edges, loads)
            star_column = lp.PackingColumn(group, tuple(sorted(loads.items())))
            if star_column.loads != column.loads:
                seeds.append((star_column, Tree(root, tuple((p, c, names) for p, c, _, names in star), 0.0)))
        # Chains along good rings: on switched and hierarchical graphs these are often optimal
        # already, which saves most of the pricing rounds.
        for order in seed_orders:
            at = list(order).index(root)
            chain = list(order[at:]) + list(order[:at])
            made = _tree_column(net, cost, pred, root, group, list(zip(chain, chain[1:])))
            if made is not None and made[0].loads != column.loads:
                seeds.append((made[0], made[1]))
    return seeds


class _ColumnPool:
    """The master problem's columns with their trees, each with the rounds it went unused."""

    def __init__(self, entries: Sequence[tuple[lp.PackingColumn, Tree]] = ()) -> None:
        self.columns = [column for column, _ in entries]
        self.trees = [tree for _, tree in entries]
        self.age = [0] * len(self.columns)

    def copy(self) -> "_ColumnPool":
        other = _ColumnPool()
        other.columns, other.trees, other.age = list(self.columns), list(self.trees), list(self.age)
        return other

    def keys(self) -> set[tuple[int, tuple[tuple[int, float], ...]]]:
        return {(c.group, c.loads) for c in self.columns}

    def add(self, column: lp.PackingColumn, tree: Tree) -> None:
        self.columns.append(column)
        self.trees.append(tree)
        self.age.append(0)

    def drop_idle(self, weights: Sequence[float], improved: bool) -> None:
        """Keep the master small (PuLP rebuilds it every round): drop trees that carried nothing
        for :data:`_KEEP_UNUSED_ROUNDS` rounds, after a round that ``improved`` the time only;
        pricing brings them back if they are needed again."""
        keep = [k for k in range(len(self.columns)) if weights[k] > 0 or self.age[k] < _KEEP_UNUSED_ROUNDS or not improved]
        self.columns = [self.columns[k] for k in keep]
        self.trees = [self.trees[k] for k in keep]
        self.age = [self.age[k] + 1 for k in keep]


def _price_trees(net: RankNetwork, roots: Sequence[int], solution: lp.PackingSolution, pool: _ColumnPool) -> int:
    """Add to ``pool`` each root's cheapest tree under the LP's edge duals when it prices below
    the root's group dual (it would lower the busiest-link time); the number added."""
    present = pool.keys()
    cost, pred = net.routes(net.edge_prices(solution.edge_duals) + _HOP_COST)
    added = 0
    for group, root in enumerate(roots):
        made = _tree_column(net, cost, pred, root, group)
        if made is None:
            continue
        column, tree, price = made
        true_price = price - _HOP_COST * sum(load for _, load in column.loads)
        mu = solution.group_duals[group]
        key = (column.group, column.loads)
        if true_price < mu - 1e-9 * max(1.0, abs(mu)) and key not in present:
            pool.add(column, tree)
            present.add(key)
            added += 1
    return added


def _shallowest(
    net: RankNetwork,
    roots: Sequence[int],
    solution: lp.PackingSolution,
    pool: _ColumnPool,
    seeds: Sequence[tuple[lp.PackingColumn, Tree]],
    deadline: float,
) -> lp.PackingSolution:
    """Second stage: the same busiest-link time (within :data:`_SHALLOW_SLACK`), least tree depth.

    Deep chains and shallow stars often tie on bandwidth; shallow trees need fewer steps. Shallow
    seeds dropped while pricing get another chance.
    """
    present = pool.keys()
    for column, tree in seeds:
        if (column.group, column.loads) not in present:
            pool.add(column, tree)
            present.add((column.group, column.loads))
    if len(pool.trees) <= len(roots):
        return solution
    shallow = lp.solve_packing(
        len(roots),
        net.row_cap,
        pool.columns,
        solver=solution.solver,
        time_limit_s=max(1.0, deadline - time.monotonic()),
        depths=[t.height for t in pool.trees],
        tau_limit=solution.tau * (1 + _SHALLOW_SLACK),
    )
    if shallow.status is not lp.LPStatus.OPTIMAL:
        return solution
    return lp.PackingSolution(shallow.status, shallow.tau, shallow.weights, solution.group_duals, solution.edge_duals, shallow.solver)


def _normalise(trees: Sequence[Tree], weights: Sequence[float], roots: Sequence[int], max_trees_per_root: int | None) -> list[Tree]:
    """Trees with positive weight, at most ``max_trees_per_root`` per root, weights summing to 1."""
    result: list[Tree] = []
    for root in roots:
        mine = sorted(
            ((w, t) for t, w in zip(trees, weights) if t.root == root and w > 1e-9),
            key=lambda item: -item[0],
        )
        if max_trees_per_root is not None:
            mine = mine[:max_trees_per_root]
        total = sum(w for w, _ in mine)
        if total <= 0:
            raise SolverError(f"no tree carries the data of rank {root}")
        result.extend(Tree(t.root, t.arcs, w / total) for w, t in mine)
    return result
