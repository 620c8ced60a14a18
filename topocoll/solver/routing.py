"""Routes between ranks: the widest path through the topology.

The route rule, in one place
----------------------------
A route from ``src`` to ``dst`` is chosen by, in order:

1. the largest bottleneck bandwidth (the minimum ``bw_bytes_per_s`` over its links);
2. the fewest hops;
3. the fewest *compute relays*: intermediate GPU or host nodes;
4. the smallest summed ``latency_s``.

Switches, CPUs and NICs forward freely. A compute node (GPU, host process) that is one of the
route table's nodes (a rank) may forward as well, as NCCL's NVB paths forward through an
intermediate GPU's NVLinks; rule 3 makes a route through a switch win over an otherwise equal
one through a GPU. Compute nodes that are not ranks never forward: no program runs there (the
cut bound leaves them out for the same reason). :func:`widest_path` takes the compute nodes
allowed to forward as an argument (all of them by default). A route only uses nodes and
links of the topology, and never visits a node twice. Remaining ties go to the route found
first, which follows the canonical (natural id) order of the topology's nodes, so routes are
deterministic.

Rule 1 is a bottleneck (max-min) criterion, which does not compose lexicographically with the
additive criteria 2-4 in a single Dijkstra pass. Routing therefore runs two passes per source:
a max-min Dijkstra gives the widest bottleneck ``B(src, v)`` to every node; then, for each
distinct bottleneck value ``tau`` among the requested destinations, a Dijkstra over the links
with ``bw >= tau`` minimises ``(hops, relays, latency)``. Both passes are exact. Links are kept
sorted by bandwidth so that the second pass reads a prefix of each adjacency list.

:class:`RouteTable` shares the first pass between all sources: it computes, once per
bandwidth floor, the strongly connected components of the links at or above that floor, and
reads ``B(s, t)`` off them by bisection over the distinct bandwidths. The second pass is per
source: the first destination asked of a source is searched with early termination (cheap
between neighbours on one switch); from its second destination on, one full shortest-path
tree per bottleneck value is kept, so further destinations cost a path read-out. That is
about one Dijkstra pass per source (the trees of the higher floors span only the fast
islands of the graph). :func:`widest_path` alone runs both passes for its one pair.
"""

from __future__ import annotations

import heapq
import logging
import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import networkx as nx

from topocoll.errors import SolverError, TopologyError
from topocoll.topo.model import Topology

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Route:
    """A chosen route and its figures.

    Parameters
    ----------
    path : tuple of str
        Node ids from source to destination.
    bw_bytes_per_s : float
        Bottleneck bandwidth (minimum over the links).
    latency_s : float
        Summed link latency.
    """

    path: tuple[str, ...]
    bw_bytes_per_s: float
    latency_s: float

    @property
    def hops(self) -> int:
        """Number of links."""
        return len(self.path) - 1


class _Everything:
    """A target set that is never exhausted (run a search to the end)."""

    def discard(self, _item: int) -> None:
        pass

    def __bool__(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class _IndexedGraph:
    """Integer-indexed adjacency of a topology, links sorted by bandwidth (widest first)."""

    ids: tuple[str, ...]
    index: dict[str, int]
    is_compute: tuple[bool, ...]
    # out[u] = ((neg_bw, v, latency_s), ...) sorted ascending, i.e. widest first
    out: tuple[tuple[tuple[float, int, float], ...], ...]
    neg_bws: tuple[tuple[float, ...], ...]

    @classmethod
    def of(cls, topology: Topology, members: Iterable[str] = ()) -> "_IndexedGraph":
        """Index ``topology``; compute nodes outside ``members`` lose their links."""
        ids = tuple(n.id for n in topology.nodes)
        index = {node_id: i for i, node_id in enumerate(ids)}
        is_compute = tuple(n.kind.is_compute for n in topology.nodes)
        keep = set(members)
        idle = {n.id for n in topology.nodes if n.kind.is_compute and n.id not in keep}
        out: list[list[tuple[float, int, float]]] = [[] for _ in ids]
        for link in topology.links:
            if link.src in idle or link.dst in idle:
                continue
            out[index[link.src]].append((-float(link.bw_bytes_per_s), index[link.dst], float(link.latency_s)))
        for adjacency in out:
            adjacency.sort(key=lambda item: (item[0], item[1]))
        return cls(
            ids=ids,
            index=index,
            is_compute=is_compute,
            out=tuple(tuple(a) for a in out),
            neg_bws=tuple(tuple(item[0] for item in a) for a in out),
        )

    def node_index(self, node_id: str) -> int:
        try:
            return self.index[node_id]
        except KeyError:
            raise TopologyError(f"no node {node_id!r} in the topology") from None

    # ------------------------------------------------------------------ pass 1: max-min
    def widest(self, src: int, targets: Iterable[int] | None = None) -> dict[int, float]:
        """Bottleneck bandwidth of the widest route from ``src`` to every reachable node.

        Stops early once every node of ``targets`` is settled.
        """
        pending = None if targets is None else set(targets) - {src}
        best = [0.0] * len(self.ids)
        best[src] = math.inf
        settled = bytearray(len(self.ids))
        order: list[int] = []
        heap: list[tuple[float, int]] = [(-math.inf, src)]
        out = self.out
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            neg_b, u = pop(heap)
            if settled[u]:
                continue
            settled[u] = 1
            order.append(u)
            if pending is not None:
                pending.discard(u)
                if not pending:
                    break
            for neg_bw, v, _lat in out[u]:
                if settled[v]:
                    continue
                cand = -max(neg_b, neg_bw)  # min(b, bw)
                if cand > best[v]:
                    best[v] = cand
                    push(heap, (-cand, v))
        return {v: best[v] for v in order}

    # ----------------------------------------------- pass 2: shortest within a bw floor
    def shortest_above(self, src: int, floor_bw: float, targets: set[int] | None) -> list[int]:
        """Predecessors of the (hops, relays, latency)-shortest routes over links ``>= floor_bw``.

        Stops once every node of ``targets`` is settled (runs to the end when None); returns
        the predecessor list (-1 where unset). A settled node's predecessor never changes,
        so stopping early gives the same routes as running to the end.
        """
        limit = -floor_bw
        pending = _Everything() if targets is None else set(targets) - {src}
        size = len(self.ids)
        dist: list[tuple[int, int, float] | None] = [None] * size
        dist[src] = (0, 0, 0.0)
        pred = [-1] * size
        settled = bytearray(size)
        heap: list[tuple[int, int, float, int]] = [(0, 0, 0.0, src)]
        out, neg_bws, is_compute = self.out, self.neg_bws, self.is_compute
        pop, push = heapq.heappop, heapq.heappush
        while heap and pending:
            hops, relays, lat, u = pop(heap)
            if settled[u]:
                continue
            settled[u] = 1
            pending.discard(u)
            relay_here = relays + 1 if (u != src and is_compute[u]) else relays
            # neg_bws is ascending: the links with bw >= floor_bw form a prefix
            adjacency = out[u]
            stop = bisect_right(neg_bws[u], limit)
            next_hops = hops + 1
            for i in range(stop):
                _neg_bw, v, link_lat = adjacency[i]
                if settled[v]:
                    continue
                cand = (next_hops, relay_here, lat + link_lat)
                old = dist[v]
                if old is None or cand < old:
                    dist[v] = cand
                    pred[v] = u
                    push(heap, (next_hops, relay_here, lat + link_lat, v))
        return pred

    def path_from(self, pred: list[int], src: int, dst: int) -> tuple[str, ...]:
        nodes = [dst]
        while nodes[-1] != src:
            nodes.append(pred[nodes[-1]])
        return tuple(self.ids[i] for i in reversed(nodes))

    def routes_from(self, src: int, dsts: Sequence[int]) -> dict[int, tuple[str, ...]]:
        """Routes from ``src`` to each of ``dsts`` by the module's rule."""
        wanted = [d for d in dsts if d != src]
        if not wanted:
            return {}
        bottleneck = self.widest(src, wanted)
        missing = [d for d in wanted if d not in bottleneck]
        if missing:
            raise SolverError(f"no route from {self.ids[src]} to {self.ids[missing[0]]} in the topology")
        by_floor: dict[float, set[int]] = {}
        for d in wanted:
            by_floor.setdefault(bottleneck[d], set()).add(d)
        routes: dict[int, tuple[str, ...]] = {}
        for floor_bw in sorted(by_floor, reverse=True):
            group = by_floor[floor_bw]
            pred = self.shortest_above(src, floor_bw, group)
            for d in group:
                routes[d] = self.path_from(pred, src, d)
        return routes


class _Bottlenecks:
    """Widest bottlenecks between any two nodes, from the components of each bandwidth floor.

    ``B(s, t)`` is the largest link bandwidth ``tau`` such that ``t`` is reachable from ``s``
    over links of at least ``tau``. Reachability only grows as ``tau`` falls, so ``B`` is
    found by bisection over the distinct bandwidths; each floor's strongly connected
    components and their condensation are computed once (networkx) and shared by every
    source, which replaces one Dijkstra pass per source.
    """

    def __init__(self, graph: _IndexedGraph) -> None:
        self._graph = graph
        self.floors = sorted({-neg for bws in graph.neg_bws for neg in bws}, reverse=True)
        self._levels: dict[float, tuple[dict[int, int], nx.DiGraph]] = {}
        self._reach: dict[tuple[float, int], set[int]] = {}

    def _level(self, floor_bw: float) -> tuple[dict[int, int], nx.DiGraph]:
        level = self._levels.get(floor_bw)
        if level is None:
            g = nx.DiGraph()
            g.add_nodes_from(range(len(self._graph.ids)))
            limit = -floor_bw
            for u, adjacency in enumerate(self._graph.out):
                stop = bisect_right(self._graph.neg_bws[u], limit)
                g.add_edges_from((u, v) for _neg, v, _lat in adjacency[:stop])
            dag = nx.condensation(g)
            level = self._levels[floor_bw] = (dag.graph["mapping"], dag)
        return level

    def reaches(self, floor_bw: float, s: int, t: int) -> bool:
        comp_of, dag = self._level(floor_bw)
        cs, ct = comp_of[s], comp_of[t]
        if cs == ct:
            return True
        key = (floor_bw, cs)
        below = self._reach.get(key)
        if below is None:
            below = self._reach[key] = nx.descendants(dag, cs)
        return ct in below

    def bottleneck(self, s: int, t: int) -> float | None:
        """``B(s, t)``, or None when ``t`` cannot be reached from ``s``."""
        floors = self.floors
        if not floors or not self.reaches(floors[-1], s, t):
            return None
        lo, hi = 0, len(floors) - 1  # floors[hi] reaches; find the first that does
        while lo < hi:
            mid = (lo + hi) // 2
            if self.reaches(floors[mid], s, t):
                hi = mid
            else:
                lo = mid + 1
        return floors[lo]


def widest_path(topology: Topology, src: str, dst: str, relays: Iterable[str] | None = None) -> tuple[str, ...]:
    """The route from ``src`` to ``dst`` by the module's rule (widest, then fewest hops, ...).

    For many pairs build a :class:`RouteTable` instead: it indexes the graph once.

    Parameters
    ----------
    topology : Topology
    src, dst : str
        Node ids.
    relays : iterable of str, optional
        Compute nodes allowed to forward (default: every compute node).

    Returns
    -------
    tuple of str
        Node ids from ``src`` to ``dst`` (just ``(src,)`` when they are equal).

    Raises
    ------
    TopologyError
        An endpoint is not a node of the topology.
    SolverError
        ``dst`` cannot be reached from ``src``.

    Examples
    --------
    >>> from topocoll.topo.model import TopologyBuilder, Node, NodeKind, LinkKind
    >>> b = TopologyBuilder()
    >>> for i in range(3):
    ...     _ = b.add_node(Node(f"gpu{i}", NodeKind.GPU))
    >>> _ = b.add_node(Node("sw", NodeKind.PCIE_SWITCH))
    >>> b.add_link("gpu0", "gpu1", LinkKind.NVLINK, 50e9)
    >>> b.add_link("gpu1", "gpu2", LinkKind.NVLINK, 50e9)
    >>> for i in range(3):
    ...     b.add_link(f"gpu{i}", "sw", LinkKind.PCIE, 16e9)
    >>> widest_path(b.build(), "gpu0", "gpu2")
    ('gpu0', 'gpu1', 'gpu2')
    """
    members = [n.id for n in topology.nodes if n.kind.is_compute] if relays is None else [src, dst, *relays]
    graph = _IndexedGraph.of(topology, members)
    s, d = graph.node_index(src), graph.node_index(dst)
    if s == d:
        return (src,)
    return graph.routes_from(s, [d])[d]


@dataclass(frozen=True)
class RouteTable:
    """Routes between a set of nodes (normally the ranks' nodes), computed on demand and kept.

    Build it with :func:`route_table`. Routes are computed when first asked for (see the
    module docstring for what is shared); the cache is private to the table, and the
    table's answers never change nor depend on the order of the questions.

    Parameters
    ----------
    topology : Topology
    nodes : tuple of str
        The endpoints the table serves.
    """

    topology: Topology
    nodes: tuple[str, ...]
    _graph: _IndexedGraph = field(init=False, repr=False, compare=False)
    _members: frozenset[str] = field(init=False, repr=False, compare=False)
    _bottlenecks: _Bottlenecks = field(init=False, repr=False, compare=False)
    _trees: dict[int, dict[float, list[int]]] = field(init=False, repr=False, compare=False)
    _pairs: dict[tuple[str, str], tuple[str, ...]] = field(init=False, repr=False, compare=False)
    _asked: set[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        graph = _IndexedGraph.of(self.topology, self.nodes)
        object.__setattr__(self, "_graph", graph)
        for node in self.nodes:
            graph.node_index(node)  # raises TopologyError for an unknown node
        object.__setattr__(self, "_members", frozenset(self.nodes))
        object.__setattr__(self, "_bottlenecks", _Bottlenecks(graph))
        object.__setattr__(self, "_trees", {})
        object.__setattr__(self, "_pairs", {})
        object.__setattr__(self, "_asked", set())

    def paths_from(self, src: str) -> dict[str, tuple[str, ...]]:
        """Routes from ``src`` to every other node of the table."""
        return {dst: self.path(src, dst) for dst in self.nodes if dst != src}

    def path(self, src: str, dst: str) -> tuple[str, ...]:
        """The route from ``src`` to ``dst`` (both must be among :attr:`nodes`).

        The first destination asked of a source is searched with early termination; from
        the second on, one shortest-path tree per bottleneck value is kept, so further
        destinations cost only the path read-out. Either way the route is the same.
        """
        if src == dst:
            return (src,)
        if dst not in self._members:
            raise SolverError(f"{dst!r} is not one of the route table's nodes")
        key = (src, dst)
        path = self._pairs.get(key)
        if path is not None:
            return path
        graph = self._graph
        s, d = graph.node_index(src), graph.node_index(dst)
        floor_bw = self._bottlenecks.bottleneck(s, d)
        if floor_bw is None:
            raise SolverError(f"no route from {src} to {dst} in the topology")
        trees = self._trees.get(s)
        if trees is None and s not in self._asked:
            self._asked.add(s)
            pred = graph.shortest_above(s, floor_bw, {d})
        else:
            if trees is None:
                trees = self._trees[s] = {}
            pred = trees.get(floor_bw)
            if pred is None:
                pred = trees[floor_bw] = graph.shortest_above(s, floor_bw, None)
        path = graph.path_from(pred, s, d)
        self._pairs[key] = path
        return path

    def route(self, src: str, dst: str) -> Route:
        """The route from ``src`` to ``dst`` with its bottleneck bandwidth and latency."""
        path = self.path(src, dst)
        if len(path) < 2:
            return Route(path, math.inf, 0.0)
        return Route(path, self.topology.path_bw_bytes_per_s(path), self.topology.path_latency_s(path))

    def bw_bytes_per_s(self, src: str, dst: str) -> float:
        """Bottleneck bandwidth of the route from ``src`` to ``dst``."""
        return self.route(src, dst).bw_bytes_per_s

    def all_pairs(self) -> dict[tuple[str, str], tuple[str, ...]]:
        """Every route between two distinct nodes of the table (computes what is missing)."""
        return {(a, b): p for a in self.nodes for b, p in self.paths_from(a).items()}


def route_table(topology: Topology, ranks: Sequence[str]) -> RouteTable:
    """A :class:`RouteTable` for the routes between the nodes of ``ranks``.

    Parameters
    ----------
    topology : Topology
    ranks : sequence of str
        Node ids of the ranks.

    Returns
    -------
    RouteTable

    Raises
    ------
    TopologyError
        A node is not in the topology.
    """
    nodes = tuple(dict.fromkeys(ranks))
    return RouteTable(topology, nodes)
