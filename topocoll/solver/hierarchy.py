"""Hierarchical tree packing for multi-node clusters: rails between hosts, trees inside hosts.

Packing trees over all ranks at once grows quickly with the rank count. On a cluster of
identical hosts the optimum has a simple shape when the network is the bottleneck: rank ``i``
of every host forms a *rail group*; a rank's shard first travels to the rank with the same
local index on every other host (trees packed over the rail group, through NICs and network
switches), then every receiver spreads it inside its host (trees packed over the host's ranks,
through NVLink/NVSwitch/PCIe). The composition of a rail tree and an intra-host tree is a tree
over all ranks, so the ordinary layout applies. The packing is reported with its true
bandwidth time, so its distance to the cut bound stays visible (the intra-host phase is free
only when the network cut binds).

Intra-host packings are solved once per host *shape* (hosts whose node ids, links and
bandwidths agree once the ``<host_id>.`` prefix is removed) and renamed for the other hosts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from topocoll.solver.packing import Packing, Tree, pack_trees
from topocoll.topo.model import Topology

log = logging.getLogger(__name__)


def host_groups(topology: Topology, ranks: Sequence[str]) -> list[list[int]] | None:
    """Rank indices grouped by host, or None when the ranks are not a regular multi-host set.

    Regular means: every rank node has a ``host_id``, there are at least two hosts, and every
    host holds the same number of ranks (at least two).
    """
    groups: dict[str, list[int]] = {}
    for index, node_id in enumerate(ranks):
        host = topology.node(node_id).host_id
        if host is None:
            return None
        groups.setdefault(host, []).append(index)
    sizes = {len(g) for g in groups.values()}
    if len(groups) < 2 or len(sizes) != 1 or sizes.pop() < 2:
        return None
    return list(groups.values())


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


def pack_hierarchical(
    topology: Topology,
    ranks: Sequence[str],
    groups: list[list[int]],
    *,
    reverse: bool = False,
    solver: str = "highs",
    time_limit_s: float = 60.0,
    gap: float = 1e-4,
    rail_trees_per_root: int = 1,
    host_trees_per_root: int = 2,
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
        Passed to the sub-packings (the time limit is split between them).
    rail_trees_per_root, host_trees_per_root : int
        Trees kept per root in each sub-packing: the composed count per root is their
        product, and the chunk count grows with it.

    Returns
    -------
    Packing
        Trees over all ranks; ``time_per_unit_s`` is not filled in (0) — verify the schedule.
    """
    n_local = len(groups[0])
    hosts = [topology.node(ranks[g[0]]).host_id for g in groups]
    budget = time_limit_s / (n_local + 1)
    # Rail trees: over the hosts' rank with local index i.
    rails: list[Packing] = []
    for i in range(n_local):
        members = [ranks[g[i]] for g in groups]
        rails.append(
            pack_trees(
                topology,
                members,
                range(len(members)),
                reverse=reverse,
                solver=solver,
                time_limit_s=budget,
                gap=gap,
                max_trees_per_root=rail_trees_per_root,
                seed_orders=[list(range(len(members)))],
            )
        )
    # Host trees: once per host shape.
    solved: dict[tuple, tuple[str, Packing]] = {}
    per_host: list[Packing] = []
    for host, group in zip(hosts, groups):
        shape = _host_shape(topology, host)
        if shape is not None and shape in solved:
            first_host, packing = solved[shape]
            per_host.append(replace(packing, trees=tuple(_rename(t, first_host, host) for t in packing.trees)))
            continue
        packing = pack_trees(
            topology,
            [ranks[k] for k in group],
            range(n_local),
            reverse=reverse,
            solver=solver,
            time_limit_s=budget,
            gap=gap,
            max_trees_per_root=host_trees_per_root,
            seed_orders=[list(range(n_local))],
        )
        if shape is not None:
            solved[shape] = (host, packing)
        per_host.append(packing)
    composed: list[Tree] = []
    for h, group in enumerate(groups):
        for i in range(n_local):
            root = group[i]
            for rail_tree in (t for t in rails[i].trees if t.root == h):
                for host_tree in (t for t in per_host[h].trees if t.root == i):
                    arcs = [(groups[p][i], groups[c][i], path) for p, c, path in rail_tree.arcs]
                    # Every host spreads the shard once its rail member has it.
                    for other, other_group in enumerate(groups):
                        local = per_host[other].trees if other != h else None
                        tree = host_tree if local is None else _matching(per_host[other].trees, host_tree)
                        arcs.extend((other_group[p], other_group[c], path) for p, c, path in tree.arcs)
                    composed.append(Tree(root, _bfs(root, arcs), rail_tree.weight * host_tree.weight))
    log.info("hierarchical packing: %d hosts x %d ranks, %d composed trees", len(groups), n_local, len(composed))
    return Packing(
        tuple(composed),
        0.0,
        all(p.optimal for p in rails) and all(p.optimal for p in per_host),
        sum(p.iterations for p in rails) + sum(p.iterations for p in per_host),
        rails[0].solver,
    )


def _matching(trees: Sequence[Tree], like: Tree) -> Tree:
    """The tree of another host with the same root and position as ``like`` in its host."""
    same_root = [t for t in trees if t.root == like.root]
    for tree in same_root:
        if [(p, c) for p, c, _ in tree.arcs] == [(p, c) for p, c, _ in like.arcs]:
            return tree
    return same_root[0]


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
