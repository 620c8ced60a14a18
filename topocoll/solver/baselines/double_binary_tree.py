"""NCCL's double binary tree as a baseline."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from topocoll.solver.baselines._common import (
    _depths,
    _even_chunks,
    _heights,
    _pieces,
    _plan,
    _reroot,
    _root_of,
    _tree_broadcast,
    _tree_reduce,
    _trivial,
)
from topocoll.solver.baselines.ordering import ring_order
from topocoll.solver.baselines.ring import ring
from topocoll.solver.routing import RouteTable
from topocoll.solver.schedule import Collective, Schedule
from topocoll.topo.model import Topology

log = logging.getLogger(__name__)


def _btree_parent(p: int, n: int) -> int | None:
    """NCCL's binary tree over positions 0..n-1 (``ncclGetBtree``): the parent of ``p``."""
    if p == 0:
        return None
    bit = p & -p
    up = (p ^ bit) | (bit << 1)
    return up if up < n else p ^ bit


def _double_binary_trees(n: int) -> tuple[dict[int, int | None], dict[int, int | None]]:
    """NCCL's two complementary trees over positions (``ncclGetDtree``): mirror or shift."""
    first = {p: _btree_parent(p, n) for p in range(n)}
    if n % 2:
        second = {}
        for p in range(n):
            up = _btree_parent((p - 1) % n, n)
            second[p] = None if up is None else (up + 1) % n
    else:
        second = {}
        for p in range(n):
            up = _btree_parent(n - 1 - p, n)
            second[p] = None if up is None else n - 1 - up
    return first, second


def _relabel(parent: dict[int, int | None], order: Sequence[int]) -> dict[int, int | None]:
    """Positions -> rank indices."""
    return {order[v]: (None if p is None else order[p]) for v, p in parent.items()}


def double_binary_tree(
    topology: Topology,
    collective: Collective | str,
    ranks: Sequence[str] | None = None,
    root: int | None = None,
    nchunks: int | None = None,
    routes: RouteTable | None = None,
) -> Schedule:
    """NCCL-style double binary tree.

    Two binary trees over the ring positions (NCCL's ``ncclGetDtree``: the second tree is
    the first mirrored for even N or shifted by one for odd N, so that a leaf of one is an
    inner node of the other) each carry half of the buffer, split into ``nchunks`` pieces.

    - allreduce: pipelined reduce up both trees, then broadcast down from their roots;
    - broadcast / reduce: both trees re-rooted at the root, a pipelined broadcast down
      (reduce up) each;
    - allgather / reduce-scatter: a tree moves each shard through every rank's links many
      times, so (like NCCL, which runs these collectives on rings only) this returns
      :func:`ring`'s schedule, named ``"ring"``.

    Parameters
    ----------
    topology, collective, ranks, root, routes
        As for :func:`ring`.
    nchunks : int, optional
        Pieces per tree (default: the deeper tree's depth).

    Returns
    -------
    Schedule
    """
    plan = _plan(topology, collective, ranks, root, routes)
    c = plan.collective
    if c in (Collective.ALLGATHER, Collective.REDUCE_SCATTER):
        log.info("double binary tree: %s runs on a ring", c.value)
        return ring(topology, c, plan.ranks, routes=plan.routes)
    n = len(plan.ranks)
    name = "double_binary_tree"
    if n == 1:
        return _trivial(plan, name)
    order = ring_order(topology, plan.ranks, plan.routes)
    trees = [_relabel(t, order) for t in _double_binary_trees(n)]
    if c.is_rooted:
        trees = [_reroot(t, plan.root) for t in trees]
    depth = max(max(_depths(t).values()) for t in trees)
    k = _pieces(nchunks, depth)
    halves = [_even_chunks(k, 0, 0.0, 0.5), _even_chunks(k, k, 0.5, 1.0)]
    for tree, half in zip(trees, halves):
        ids = [ch.id for ch in half]
        if c is Collective.ALLREDUCE:
            height = _heights(tree)[_root_of(tree)]
            _tree_reduce(plan, tree, ids, 0)
            _tree_broadcast(plan, tree, ids, height)
        elif c is Collective.REDUCE:
            _tree_reduce(plan, tree, ids, 0)
        else:
            _tree_broadcast(plan, tree, ids, 0)
    return plan.build(name, halves[0] + halves[1])
