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
from dataclasses import replace

import networkx as nx
import numpy as np

from topocoll.errors import SolverError, TopocollError
from topocoll.solver.bound import cut_bound
from topocoll.solver.packing import Packing, Tree, RankNetwork, pack_trees
from topocoll.solver.schedule import Collective
from topocoll.topo.model import NodeKind, Topology

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


def _host_shape(topology: Topology, host: str) -> tuple | None:
    """Links among a host's nodes with the host prefix removed (None if ids lack the prefix)."""
    members = {n.id for n in topology.nodes if n.host_id == host}
    if not all(m.startswith(host + ".") for m in members):
        return None
    return tuple(
        sorted(
            (_strip(l.src, host), _strip(l.dst, host), l.kind.value, l.bw_bytes_per_s)
            for l in topology.links
            if l.src in members and l.dst in members
        )
    )


def _rename(tree: Tree, old: str, new: str) -> Tree:
    def move(node_id: str) -> str:
        return new + "." + node_id[len(old) + 1 :] if node_id.startswith(old + ".") else node_id

    return replace(tree, arcs=tuple((p, c, tuple(move(x) for x in path)) for p, c, path in tree.arcs))


def pack_by_rails(
    topology: Topology,
    ranks: Sequence[str],
    groups: list[list[int]],
    *,
    reverse: bool = False,
    solver: str = "highs",
    time_limit_s: float = 60.0,
    gap: float = 1e-4,
    host_trees_per_root: int | None = None,
) -> Packing:
    """Pack composed rail x host trees for every rank (see the module docstring).

    Parameters
    ----------
    topology : Topology
    ranks : sequence of str
    groups : list of list of int
        Rank indices per host, from :func:`host_groups`.
    reverse : bool
        Pack on the reversed graph (reduce-scatter), as :func:`pack_trees` does.
    solver, time_limit_s, gap
        Passed to the intra-host packings.
    host_trees_per_root : int, optional
        Intra-host trees kept per root (default: all the LP uses).

    Returns
    -------
    Packing
        Trees over all ranks; ``time_per_unit_s`` is not filled in (0) — verify the schedule.
    """
    n_local = len(groups[0])
    kind = Collective.REDUCE_SCATTER if reverse else Collective.ALLGATHER

    hosts = [topology.node(ranks[g[0]]).host_id for g in groups]
    budget = time_limit_s
    # Rail trees: a chain along the hosts in order, for every member of every rail, each hop on
    # the fewest-hop route (out through the member's own NIC). Packing rails separately by LP
    # would let each rail borrow the other rails' NICs through the host's PCIe tree.
    n_hosts = len(groups)
    copies = max(1, math.ceil(MIN_SLOTS_PER_HOST / n_hosts))
    rails = _rail_chains(topology, [[ranks[g[i]] for g in groups] for i in range(n_local)], reverse, copies)
    rail_links = {hop for rail in rails for tree in rail.trees for _, _, path in tree.arcs for hop in zip(path, path[1:])}
    # Host trees: packed inside the host's own subgraph, once per host shape.
    solved: dict[tuple, tuple[str, Packing]] = {}
    per_host: list[Packing] = []
    for host, group in zip(hosts, groups):
        shape = _host_shape(topology, host)
        if shape is not None and shape in solved:
            first_host, packing = solved[shape]
            per_host.append(replace(packing, trees=tuple(_rename(t, first_host, host) for t in packing.trees)))
            continue
        inside = _host_subgraph(topology, host, rail_links)
        members = [ranks[k] for k in group]
        packing = pack_trees(
            inside,
            members,
            range(n_local),
            reverse=reverse,
            solver=solver,
            time_limit_s=budget,
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
    slots = n_hosts * copies
    dealt = [[_deal([t for t in per_host[o].trees if t.root == i], slots) for i in range(n_local)] for o in range(n_hosts)]
    composed: list[Tree] = []
    for h, group in enumerate(groups):
        for i in range(n_local):
            root = group[i]
            for j in range(copies):
                rail_tree = rails[i].trees[h * copies + j]
                arcs = [(groups[p][i], groups[c][i], path) for p, c, path in rail_tree.arcs]
                for other, other_group in enumerate(groups):
                    tree = dealt[other][i][h * copies + j]
                    arcs.extend((other_group[p], other_group[c], path) for p, c, path in tree.arcs)
                composed.append(Tree(root, _bfs(root, arcs), 1.0 / copies))
    log.info("hierarchical packing: %d hosts x %d ranks, %d composed trees", len(groups), n_local, len(composed))
    return Packing(
        tuple(composed),
        0.0,
        all(p.optimal for p in per_host),
        sum(p.iterations for p in per_host),
        per_host[0].solver,
    )


def _host_subgraph(topology: Topology, host: str, rail_links: set[tuple[str, str]]) -> Topology:
    """The nodes of ``host`` and the links among them, less the links the rails use.

    The rails' traffic crosses the links from each rank to its NIC; leaving them to the rails
    keeps the intra-host trees off them. When the host falls apart without them (a PCIe-only
    host), they stay.
    """
    members = {n.id for n in topology.nodes if n.host_id == host}
    nodes = [n for n in topology.nodes if n.id in members]
    inside = [l for l in topology.links if l.src in members and l.dst in members]
    spare = [l for l in inside if (l.src, l.dst) not in rail_links and (l.dst, l.src) not in rail_links]
    try:
        return Topology(nodes, spare, name=f"{topology.name}:{host}")
    except TopocollError:
        return Topology(nodes, inside, name=f"{topology.name}:{host}")


def _rail_chains(topology: Topology, rails: Sequence[Sequence[str]], reverse: bool, copies: int) -> list[Packing]:
    """Per rail, for every member ``copies`` chains through the others in order (a ring rotated to start there).

    Each hop takes a fewest-hop route. Where the network offers several equally short ones (a
    hop between leaves may cross any spine of a fat tree), the chains that cross a hop take them
    in turn, and the turn goes on from hop to hop and rail to rail between the same two
    switches, so that every route between them carries the same number of chains, give or take
    one, instead of all piling onto the one a shortest-path search happens to return. A rail's
    chains are listed by root, then copy.
    """
    spread = _SwitchRoutes(topology, reverse)
    turn: dict[tuple[str, ...], int] = {}
    packings = []
    for members in rails:
        net = RankNetwork(topology, members, reverse)
        cost, pred = net.routes(np.ones(len(net.cap)))
        n = len(members)
        # route[a][t]: the route of hop a -> a + 1 for the t-th chain crossing it (every root
        # but a + 1, `copies` times each).
        route: list[list[tuple[str, ...]]] = []
        for a in range(n if n > 1 else 0):
            b = (a + 1) % n
            if not np.isfinite(cost[a, b]):
                raise SolverError(f"{members[b]} cannot be reached from {members[a]} across the network")
            key, choices = spread.alternatives(net.path(pred, a, b)[1])
            start, crossings = turn.get(key, 0), (n - 1) * copies
            route.append([choices[(start + t) % len(choices)] for t in range(crossings)])
            turn[key] = (start + crossings) % len(choices)
        crossed = [0] * n
        trees = []
        for root in range(n):
            order = [(root + k) % n for k in range(n)]
            for _ in range(copies):
                arcs = []
                for a, b in zip(order, order[1:]):
                    arcs.append((a, b, route[a][crossed[a]]))
                    crossed[a] += 1
                trees.append(Tree(root, tuple(arcs), 1.0 / copies))
        packings.append(Packing(tuple(trees), 0.0, True, 0, ""))
    return packings


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


def _deal(trees: Sequence[Tree], slots: int) -> list[Tree]:
    """``slots`` picks from ``trees`` in proportion to their weights (stratified rounding)."""
    picks, cumulative, t = [], 0.0, 0
    bounds = []
    for tree in trees:
        cumulative += tree.weight
        bounds.append(cumulative)
    for s in range(slots):
        point = (s + 0.5) / slots * cumulative
        while t < len(trees) - 1 and bounds[t] <= point:
            t += 1
        picks.append(trees[t])
    return picks


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
