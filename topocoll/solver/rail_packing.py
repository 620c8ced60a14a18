"""Tree packing for clusters of identical hosts by rails: rail chains between hosts, trees inside hosts.

Packing trees over all ranks at once grows quickly with the rank count. On a cluster of
identical hosts the optimum has a simple shape when the network is the bottleneck: rank ``i``
of every host forms a *rail group*; a rank's shard first travels to the rank with the same
local index on every other host (a chain along the hosts, out through each rank's own NIC),
then every receiver spreads it inside its host (trees packed by LP over the host's ranks and
the host's own links: NVLink/NVSwitch/PCIe). The composition of a rail tree and an intra-host tree is a tree
over all ranks, so the ordinary layout applies. The packing is reported with its true
bandwidth time, so its distance to the cut bound stays visible (the intra-host phase is free
only when the network cut binds).

Intra-host packings are solved once per host *shape* (hosts whose node ids, links and
bandwidths agree once the ``<host_id>.`` prefix is removed) and renamed for the other hosts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import networkx as nx
import numpy as np

from topocoll.errors import SolverError, TopocollError
from topocoll.solver.bound import cut_bound
from topocoll.solver.packing import Packing, Tree, RankNetwork, pack_trees
from topocoll.solver.schedule import Collective
from topocoll.topo.model import Link, Node, NodeKind, Topology

log = logging.getLogger(__name__)

#: Pieces each host deals out per rank and root group: the intra-host load mix is rounded to
#: multiples of 1/64 of the LP weights (off by at most one piece per tree).
MIN_SLOTS_PER_HOST = 64


def host_groups(topology: Topology, ranks: Sequence[str]) -> list[list[int]] | None:
    """Rank indices grouped by host, or None when the ranks are not a regular multi-host set.

    Regular means: every rank node has a ``host_id``, there are at least two hosts, and every
    host holds the same number of ranks (at least two).
    """
    if any(topology.node(node_id).host_id is None for node_id in ranks):
        return None
    groups = topology.ranks_by_host(ranks)
    sizes = {len(g) for g in groups}
    if len(groups) < 2 or len(sizes) != 1 or sizes.pop() < 2:
        return None
    return groups


def _strip(node_id: str, host: str) -> str:
    prefix = host + "."
    return node_id[len(prefix):] if node_id.startswith(prefix) else node_id


def _by_host(topology: Topology) -> dict[str, tuple[list[Node], list[Link]]]:
    """Every host's nodes and the links among them, in one pass over the topology."""
    parts: dict[str, tuple[list[Node], list[Link]]] = {}
    for node in topology.nodes:
        if node.host_id is not None:
            parts.setdefault(node.host_id, ([], []))[0].append(node)
    for link in topology.links:
        host = topology.node(link.src).host_id
        if host is not None and topology.node(link.dst).host_id == host:
            parts[host][1].append(link)
    return parts


def _host_shape(host: str, nodes: Sequence[Node], links: Sequence[Link]) -> tuple | None:
    """Links among a host's nodes with the host prefix removed (None if ids lack the prefix)."""
    if not all(n.id.startswith(host + ".") for n in nodes):
        return None
    return tuple(sorted((_strip(l.src, host), _strip(l.dst, host), l.kind.value, l.bw_bytes_per_s) for l in links))


def _rename(tree: Tree, old: str, new: str) -> Tree:
    def move(node_id: str) -> str:
        return new + "." + node_id[len(old) + 1 :] if node_id.startswith(old + ".") else node_id

    return replace(tree, arcs=tuple((p, c, tuple(move(x) for x in path)) for p, c, path in tree.arcs))


#: How a rank's data travels along its rail, from machine to machine (see :func:`rail_tree`).
RAIL_TREES = ("chain", "binomial")


def rail_tree(kind: str, n_hosts: int) -> tuple[tuple[int, int], ...]:
    """The tree every rail's data follows over machine positions ``0 .. n_hosts - 1``, root 0.

    Rotated to start at each machine in turn, every position plays every role once, so each
    rank's NIC sends and receives ``n_hosts - 1`` shards whatever the tree: all of them are
    bandwidth-optimal where the network carries them. They differ in depth and in reach:

    - ``"chain"``: 0 -> 1 -> ... -> n_hosts - 1, depth ``n_hosts - 1``; each hop joins
      neighbours, which share a leaf switch where the network is cabled in machine order (the
      choice for oversubscribed networks);
    - ``"binomial"``: position ``v``'s parent is ``v`` less its highest set bit, so its depth is
      its number of set bits, at most ``ceil(log2 n_hosts)``; hops of ``2^k`` positions cross
      the spines (the choice for non-blocking networks at scale, where the chain's depth costs
      latency).

    Returns
    -------
    tuple of (int, int)
        ``(parent, child)`` positions, parents before children.
    """
    if kind == "chain":
        return tuple((p, p + 1) for p in range(n_hosts - 1))
    if kind == "binomial":
        children = sorted(range(1, n_hosts), key=lambda v: (bin(v).count("1"), v))
        return tuple((v - (1 << (v.bit_length() - 1)), v) for v in children)
    raise SolverError(f"rail tree must be one of {', '.join(RAIL_TREES)}, got {kind!r}")


@dataclass(frozen=True)
class RailRoutes:
    """How one rail's hops between machines are routed.

    Attributes
    ----------
    hops : dict of (int, int) to (int, tuple of path)
        ``hops[a, b]``: for the hop from machine ``a`` to machine ``b``, from the rail member of
        one to that of the other, the turn of its first crossing and its routes; the trees
        crossing the hop take the routes in turn.
    """

    hops: dict[tuple[int, int], tuple[int, tuple[tuple[str, ...], ...]]]


@dataclass(frozen=True, slots=True)
class RailPacking:
    """A hierarchical packing kept by its parts, in size linear in the ranks.

    Composed tree ``(h, i, j)`` (host ``h``, local index ``i``, copy ``j < copies``) is rooted
    at rank ``hosts[h][i]`` and carries ``1 / copies`` of its data:

    - rail arcs: for the ``e``-th arc ``(p, c)`` of ``tree``, the hop from ``hosts[a][i]`` to
      ``hosts[b][i]``, ``a = (h + p) mod H``, ``b = (h + c) mod H``, by route ``routes[(turn + t)
      % R]`` of ``rails[i].hops[a, b] = (turn, routes)``, where ``t = k * copies + j`` and ``k``
      counts the arcs of ``tree`` before ``e`` that span as many positions, ``(c - p) mod H``;
    - host arcs: in every host ``o``, slot ``s = h * copies + j`` of local root ``i``: the trees
      of ``host_trees[o][i]`` take consecutive slots, as many as their counts.

    Attributes
    ----------
    hosts : tuple of tuple of int
        Rank indices per host, the same count on each.
    copies : int
    tree : tuple of (int, int)
        The rail tree over host positions (:func:`rail_tree`), root 0, parents before children.
    rails : tuple of RailRoutes
        One per local index.
    host_trees : tuple of tuple of tuple of (Tree, int)
        ``host_trees[o][i]``: trees over host ``o``'s ranks (local indices) rooted at ``i``,
        with the number of slots each takes (they sum to ``H * copies``).
    """

    hosts: tuple[tuple[int, ...], ...]
    copies: int
    tree: tuple[tuple[int, int], ...]
    rails: tuple[RailRoutes, ...]
    host_trees: tuple[tuple[tuple[tuple[Tree, int], ...], ...], ...]

    @property
    def tree_count(self) -> int:
        """Composed trees: one per rank and copy."""
        return len(self.hosts) * len(self.hosts[0]) * self.copies

    def spans(self) -> dict[int, int]:
        """How many arcs of ``tree`` span each distance (positions, mod the host count)."""
        return _spans(self.tree, len(self.hosts))

    def rail_arcs(self, rail: int, root_host: int, copy: int) -> list[tuple[int, int, tuple[str, ...]]]:
        """The rail arcs ``(rank, rank, route)`` of composed tree ``(root_host, rail, copy)``."""
        n_hosts, hosts, hops = len(self.hosts), self.hosts, self.rails[rail].hops
        before: dict[int, int] = {}
        arcs = []
        for p, c in self.tree:
            span = (c - p) % n_hosts
            k = before.get(span, 0)
            before[span] = k + 1
            a, b = (root_host + p) % n_hosts, (root_host + c) % n_hosts
            turn, routes = hops[a, b]
            arcs.append((hosts[a][rail], hosts[b][rail], routes[(turn + k * self.copies + copy) % len(routes)]))
        return arcs

    def host_tree(self, host: int, local_root: int, slot: int) -> Tree:
        """The host tree slot ``slot`` of ``local_root`` takes in ``host``."""
        for tree, count in self.host_trees[host][local_root]:
            if slot < count:
                return tree
            slot -= count
        raise SolverError(f"internal: slot beyond the host trees of host {host}")


def rail_packing(
    topology: Topology,
    ranks: Sequence[str],
    groups: Sequence[Sequence[int]],
    *,
    reverse: bool = False,
    solver: str = "highs",
    time_limit_s: float = 60.0,
    gap: float = 1e-4,
    host_trees_per_root: int | None = None,
    tree: str = "chain",
) -> RailPacking:
    """Pack rail x host trees for every rank (see the module docstring), kept by their parts.

    Parameters
    ----------
    topology : Topology
    ranks : sequence of str
    groups : sequence of sequence of int
        Rank indices per host, from :func:`host_groups`.
    reverse : bool
        Pack on the reversed graph (reduce-scatter), as :func:`pack_trees` does.
    solver, time_limit_s, gap
        Passed to the intra-host packings.
    host_trees_per_root : int, optional
        Intra-host trees kept per root (default: all the LP uses).
    tree : str
        The rail tree every rank's data follows between machines (:func:`rail_tree`).

    Returns
    -------
    RailPacking
        :func:`compose` gives its trees over all ranks.
    """
    n_local = len(groups[0])
    kind = Collective.REDUCE_SCATTER if reverse else Collective.ALLGATHER
    n_hosts = len(groups)
    copies = max(1, math.ceil(MIN_SLOTS_PER_HOST / n_hosts))
    slots = n_hosts * copies

    hosts = [topology.node(ranks[g[0]]).host_id for g in groups]
    # Rail trees: a chain along the hosts in order, for every member of every rail, each hop on
    # the fewest-hop route (out through the member's own NIC). Packing rails separately by LP
    # would let each rail borrow the other rails' NICs through the host's PCIe tree.
    between = rail_tree(tree, n_hosts)
    rails = _rail_routes(topology, [[ranks[g[i]] for g in groups] for i in range(n_local)], reverse, copies, between)
    rail_links = {hop for rail in rails for _, routes in rail.hops.values() for path in routes for hop in zip(path, path[1:])}
    # Host trees: packed inside the host's own subgraph, once per host shape.
    solved: dict[tuple, tuple[str, Packing]] = {}
    per_host: list[Packing] = []
    by_host = _by_host(topology)
    for host, group in zip(hosts, groups):
        host_nodes, host_links = by_host[host]
        shape = _host_shape(host, host_nodes, host_links)
        if shape is not None and shape in solved:
            first_host, packing = solved[shape]
            per_host.append(replace(packing, trees=tuple(_rename(t, first_host, host) for t in packing.trees)))
            continue
        inside = _host_subgraph(topology, host, host_nodes, host_links, rail_links)
        members = [ranks[k] for k in group]
        packing = pack_trees(
            inside,
            members,
            range(n_local),
            reverse=reverse,
            solver=solver,
            time_limit_s=time_limit_s,
            gap=gap,
            max_trees_per_root=host_trees_per_root,
            seed_orders=[list(range(n_local))],
            target_time_per_unit_s=cut_bound(inside, kind, members).time_per_byte_s * n_local,
        )
        if shape is not None:
            solved[shape] = (host, packing)
        per_host.append(packing)
    # Each root's shard is cut into `copies` pieces. A host spreads the k * copies pieces that
    # arrive on its rail member i with its own intra-host trees of root i, dealt out in
    # proportion to their LP weights, so the host's links carry the LP's load mix without
    # multiplying the chunk count by the number of intra-host trees.
    host_trees = tuple(
        tuple(_deal([t for t in packing.trees if t.root == i], slots) for i in range(n_local)) for packing in per_host
    )
    log.info("hierarchical packing: %d hosts x %d ranks, %d composed trees", n_hosts, n_local, n_hosts * n_local * copies)
    return RailPacking(tuple(tuple(g) for g in groups), copies, between, tuple(rails), host_trees)


def compose(parts: RailPacking) -> Packing:
    """The trees over all ranks that ``parts`` describes, by root, local index, then copy.

    Their count is the rank count times ``copies`` and each has an arc per rank but one, so
    this is quadratic in the ranks: keep ``parts`` where that is too many.
    """
    groups, copies = parts.hosts, parts.copies
    composed: list[Tree] = []
    for h, group in enumerate(groups):
        for i in range(len(group)):
            root = group[i]
            for j in range(copies):
                arcs = parts.rail_arcs(i, h, j)
                for other, other_group in enumerate(groups):
                    tree = parts.host_tree(other, i, h * copies + j)
                    arcs.extend((other_group[p], other_group[c], path) for p, c, path in tree.arcs)
                composed.append(Tree(root, _bfs(root, arcs), 1.0 / copies))
    return Packing(tuple(composed), 0.0, True, 0, "")


def _host_subgraph(topology: Topology, host: str, nodes: list[Node], inside: list[Link], rail_links: set[tuple[str, str]]) -> Topology:
    """The nodes of ``host`` and the links among them (``inside``), less the links the rails use.

    The rails' traffic crosses the links from each rank to its NIC; leaving them to the rails
    keeps the intra-host trees off them. When the host falls apart without them (a PCIe-only
    host), they stay.
    """
    spare = [l for l in inside if (l.src, l.dst) not in rail_links and (l.dst, l.src) not in rail_links]
    try:
        return Topology(nodes, spare, name=f"{topology.name}:{host}")
    except TopocollError:
        return Topology(nodes, inside, name=f"{topology.name}:{host}")


def _spans(tree: Sequence[tuple[int, int]], n_hosts: int) -> dict[int, int]:
    spans: dict[int, int] = {}
    for p, c in tree:
        spans[(c - p) % n_hosts] = spans.get((c - p) % n_hosts, 0) + 1
    return spans


def _rail_routes(
    topology: Topology, rails: Sequence[Sequence[str]], reverse: bool, copies: int, tree: Sequence[tuple[int, int]]
) -> list[RailRoutes]:
    """Per rail, the routes of the hops its rotated ``tree`` takes between members.

    Each hop takes a fewest-hop route. Where the network offers several equally short ones (a
    hop between leaves may cross any spine of a fat tree), the trees that cross a hop take them
    in turn, and the turn goes on from hop to hop and rail to rail between the same two
    switches, so that every route between them carries the same number of trees, give or take
    one, instead of all piling onto the one a shortest-path search happens to return.
    """
    spread = _SwitchRoutes(topology, reverse)
    turn: dict[tuple[str, ...], int] = {}
    result = []
    for members in rails:
        net = RankNetwork(topology, members, reverse)
        cost, pred = net.routes(np.ones(len(net.cap)))
        n = len(members)
        hops = {}
        for a in range(n):
            for span, count in sorted(_spans(tree, n).items()):
                b = (a + span) % n
                if not np.isfinite(cost[a, b]):
                    raise SolverError(f"{members[b]} cannot be reached from {members[a]} across the network")
                key, choices = spread.alternatives(net.path(pred, a, b)[1])
                start = turn.get(key, 0)
                hops[a, b] = (start, tuple(choices))
                turn[key] = (start + count * copies) % len(choices)
        result.append(RailRoutes(hops))
    return result


class _SwitchRoutes:
    """Equally short alternatives of a route's stretch through the network switches."""

    def __init__(self, topology: Topology, reverse: bool) -> None:
        switches = {node.id for node in topology.nodes_of(NodeKind.NET_SWITCH)}
        graph = topology.graph.subgraph(switches)
        self._graph = graph.reverse(copy=False) if reverse else graph
        self._topology = topology
        self._cache: dict[tuple[str, str], list[tuple[str, ...]]] = {}

    def alternatives(self, path: tuple[str, ...]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
        """The first and last network switch on ``path``, and ``path``'s variants between them.

        Only the stretch between those two switches changes; of the fewest-hop stretches, those
        as wide as the widest are kept, in a stable order. A path through fewer than three
        switches has no variant (the ends are then empty).
        """
        inside = [k for k, node_id in enumerate(path) if node_id in self._graph]
        if len(inside) < 3:  # no switch in between to choose
            return (), [path]
        first, last = inside[0], inside[-1]
        key = (path[first], path[last])
        if key not in self._cache:
            stretches = sorted(nx.all_shortest_paths(self._graph, *key))
            width = [self._topology.path_bw_bytes_per_s(s) for s in stretches]
            self._cache[key] = [tuple(s) for s, w in zip(stretches, width) if w >= max(width) * (1 - 1e-9)]
        stretches = self._cache[key]
        if len(path[first : last + 1]) != len(stretches[0]):  # the route was not fewest-hop inside
            return (), [path]
        return key, [path[:first] + s + path[last + 1 :] for s in stretches]


def _deal(trees: Sequence[Tree], slots: int) -> tuple[tuple[Tree, int], ...]:
    """``slots`` picks from ``trees`` in proportion to their weights (stratified rounding).

    Picks come in tree order, so they are given as ``(tree, count)``; trees never picked are left out.
    """
    total = sum(tree.weight for tree in trees)
    counts, cumulative, t = [0] * len(trees), trees[0].weight, 0
    for s in range(slots):
        point = (s + 0.5) / slots * total
        while t < len(trees) - 1 and cumulative <= point:
            t += 1
            cumulative += trees[t].weight
        counts[t] += 1
    return tuple((tree, count) for tree, count in zip(trees, counts) if count)


def _bfs(root: int, arcs: list[tuple[int, int, tuple[str, ...]]]) -> tuple[tuple[int, int, tuple[str, ...]], ...]:
    """Arcs reordered breadth-first from ``root`` (parents before children)."""
    children: dict[int, list[tuple[int, int, tuple[str, ...]]]] = {}
    for arc in arcs:
        children.setdefault(arc[0], []).append(arc)
    ordered, frontier = [], [root]
    while frontier:
        nxt = []
        for u in frontier:
            for arc in children.get(u, ()):
                ordered.append(arc)
                nxt.append(arc[1])
        frontier = nxt
    return tuple(ordered)
