"""The hierarchical baseline: rings inside each host, a ring of hosts between them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from topocoll.solver.baselines._common import (
    _Plan,
    _depths,
    _even_chunks,
    _pieces,
    _plan,
    _ring_allgather,
    _ring_reduce_scatter,
    _rotate,
    _shards,
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


def hierarchical(
    topology: Topology,
    collective: Collective | str,
    ranks: Sequence[str] | None = None,
    root: int | None = None,
    nchunks: int | None = None,
    routes: RouteTable | None = None,
) -> Schedule:
    """Two-level schedules: rings inside each host, rings across hosts.

    Ranks are grouped by the ``host_id`` of their nodes (a node without one is a host of
    its own). With G hosts of L ranks each, rank (g, j) being the j-th rank of host g in
    its intra-host ring order:

    - allreduce: intra-host ring reduce-scatter (segment j = the pieces of ranks (·, j)),
      then for each j a ring allreduce of segment j among the ranks (·, j), then an
      intra-host ring allgather: ``2(L−1) + 2(G−1)`` steps, the inter-host links carrying
      ``2(G−1)/(G·L)`` of the buffer per rank;
    - reduce-scatter: intra-host ring reduce-scatter, then inter-host ring reduce-scatter;
    - allgather: inter-host ring allgather, then intra-host ring allgather;
    - broadcast / reduce: a tree made of a chain through one leader per host (the root
      leads its own host) and a chain inside each host, pipelined over ``nchunks`` pieces
      (default: the tree's depth).

    When hosts hold different numbers of ranks, or there is a single host, or every host
    holds one rank, the non-rooted collectives return :func:`ring`'s schedule.

    Parameters
    ----------
    topology, collective, ranks, root, routes
        As for :func:`ring`.
    nchunks : int, optional
        Pipeline pieces for broadcast / reduce.

    Returns
    -------
    Schedule
    """
    plan = _plan(topology, collective, ranks, root, routes)
    n = len(plan.ranks)
    name = "hierarchical"
    if n == 1:
        return _trivial(plan, name)
    c = plan.collective
    # local[g]: the ranks of host g in their intra-host ring order; hosts in ring order too
    local = [
        [group[i] for i in ring_order(topology, [plan.ranks[r] for r in group], plan.routes)]
        for group in topology.ranks_by_host(plan.ranks)
    ]
    host_order = ring_order(topology, [plan.ranks[members[0]] for members in local], plan.routes)
    local = [local[g] for g in host_order]

    if c.is_rooted:
        return _hierarchical_rooted(plan, local, nchunks, name)

    sizes = {len(g) for g in local}
    if len(sizes) != 1 or len(local) == 1 or sizes == {1}:
        log.info("hierarchical %s: %d hosts of sizes %s, using a ring", c.value, len(local), sorted(sizes))
        return ring(topology, c, plan.ranks, routes=plan.routes)
    n_hosts, per_host = len(local), len(local[0])
    if c is Collective.ALLREDUCE:
        chunks = _even_chunks(n)
        piece = [[g * per_host + j for j in range(per_host)] for g in range(n_hosts)]
    else:
        chunks = _shards(n)
        piece = [[local[g][j] for j in range(per_host)] for g in range(n_hosts)]
    intra_segments = [[piece[g][j] for g in range(n_hosts)] for j in range(per_host)]
    Phase = Callable[[_Plan, Sequence[int], Sequence[Sequence[int]], int], int]

    def intra(phase: Phase, start: int) -> int:
        """One ring per host, concurrently; segment j = the pieces of ranks (., j)."""
        for g in range(n_hosts):
            end = phase(plan, local[g], intra_segments, start)
        return end

    def inter(phase: Phase, start: int) -> int:
        """One ring per local index j across the hosts, concurrently."""
        for j in range(per_host):
            column = [local[g][j] for g in range(n_hosts)]
            end = phase(plan, column, [[piece[g][j]] for g in range(n_hosts)], start)
        return end

    step = 0
    if c in (Collective.ALLREDUCE, Collective.REDUCE_SCATTER):
        step = inter(_ring_reduce_scatter, intra(_ring_reduce_scatter, step))
    if c in (Collective.ALLREDUCE, Collective.ALLGATHER):
        step = intra(_ring_allgather, inter(_ring_allgather, step))
    return plan.build(name, chunks)


def _hierarchical_rooted(plan: _Plan, local: list[list[int]], nchunks: int | None, name: str) -> Schedule:
    root = plan.root
    host_of_root = next(g for g, members in enumerate(local) if root in members)
    hosts = _rotate(range(len(local)), host_of_root)
    parent: dict[int, int | None] = {}
    previous_leader: int | None = None
    for g in hosts:
        members = local[g]
        leader = root if g == host_of_root else members[0]
        chain = _rotate(members, leader)
        parent[leader] = previous_leader
        for a, b in zip(chain, chain[1:]):
            parent[b] = a
        previous_leader = leader
    depth = max(_depths(parent).values())
    k = _pieces(nchunks, depth)
    chunks = _even_chunks(k)
    ids = [ch.id for ch in chunks]
    if plan.collective is Collective.BROADCAST:
        _tree_broadcast(plan, parent, ids, 0)
    else:
        _tree_reduce(plan, parent, ids, 0)
    return plan.build(name, chunks)
