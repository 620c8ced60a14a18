"""The ring baseline (and the topology-blind ring in rank order)."""

from __future__ import annotations

from collections.abc import Sequence

from topocoll.errors import ScheduleError
from topocoll.solver.baselines._common import (
    _chain,
    _even_chunks,
    _pieces,
    _plan,
    _ring_allgather,
    _ring_reduce_scatter,
    _rotate,
    _shards,
    _trivial,
)
from topocoll.solver.baselines.ordering import ring_order
from topocoll.solver.routing import RouteTable
from topocoll.solver.schedule import Collective, Op, Schedule
from topocoll.topo.model import Topology


def ring(
    topology: Topology,
    collective: Collective | str,
    ranks: Sequence[str] | None = None,
    root: int | None = None,
    nchunks: int | None = None,
    routes: RouteTable | None = None,
    order: Sequence[int] | None = None,
) -> Schedule:
    """Ring schedules over the best ring order (:func:`ring_order`), or over ``order``.

    - allreduce: ring reduce-scatter then ring allgather, N segments, ``2(N−1)`` steps;
    - reduce-scatter / allgather: one ring pass, ``N−1`` steps, one chunk per shard;
    - broadcast: a pipelined chain along the ring starting at the root;
    - reduce: a pipelined chain along the ring ending at the root.

    Parameters
    ----------
    topology : Topology
    collective : Collective or str
    ranks : sequence of str, optional
        Node ids, rank i on ``ranks[i]``; all compute nodes in rank order when omitted.
    root : int, optional
        Root rank for broadcast / reduce (default 0); ignored otherwise.
    nchunks : int, optional
        Pipeline pieces of the broadcast / reduce chain (default: its number of hops).
        Not used by the other collectives.
    routes : RouteTable, optional
        Routes to reuse (must cover ``ranks``).
    order : sequence of int, optional
        The ring as rank indices, each once (default: :func:`ring_order`).

    Returns
    -------
    Schedule

    Raises
    ------
    ScheduleError
        Invalid ranks, root, ``nchunks`` or ``order``.
    SolverError
        Two ranks cannot reach each other.
    """
    plan = _plan(topology, collective, ranks, root, routes)
    n = len(plan.ranks)
    name = "ring"
    if n == 1:
        return _trivial(plan, name)
    if order is None:
        order = ring_order(topology, plan.ranks, plan.routes)
    elif sorted(order) != list(range(n)):
        raise ScheduleError(f"ring order {list(order)} must hold every rank 0..{n - 1} once")
    else:
        order, name = tuple(order), "rank_order_ring"
    c = plan.collective
    if c is Collective.ALLREDUCE:
        chunks = _even_chunks(n)
        segments = [[q] for q in range(n)]
        step = _ring_reduce_scatter(plan, order, segments, 0)
        _ring_allgather(plan, order, segments, step)
        return plan.build(name, chunks)
    if c is Collective.REDUCE_SCATTER:
        # position p ends with segment p: make it the shard of the rank there
        _ring_reduce_scatter(plan, order, [[order[p]] for p in range(n)], 0)
        return plan.build(name, _shards(n))
    if c is Collective.ALLGATHER:
        _ring_allgather(plan, order, [[order[p]] for p in range(n)], 0)
        return plan.build(name, _shards(n))
    k = _pieces(nchunks, n - 1)
    chunks = _even_chunks(k)
    if c is Collective.BROADCAST:
        chain = _rotate(order, plan.root)
    else:
        chain = _rotate(order, plan.root)[1:] + [plan.root]
    _chain(plan, chain, [ch.id for ch in chunks], Op.COPY if c is Collective.BROADCAST else Op.REDUCE)
    return plan.build(name, chunks)


def rank_order_ring(
    topology: Topology,
    collective: Collective | str,
    ranks: Sequence[str] | None = None,
    root: int | None = None,
    nchunks: int | None = None,
    routes: RouteTable | None = None,
) -> Schedule:
    """The ring in rank order 0, 1, ..., N-1, one route per hop: what a collective library
    that knows nothing of the topology runs (the control that separates the schedule's effect
    from the executor's). Same parameters as :func:`ring`."""
    plan_ranks = list(ranks) if ranks is not None else list(topology.compute_nodes())
    return ring(topology, collective, ranks, root, nchunks, routes, order=range(len(plan_ranks)))
