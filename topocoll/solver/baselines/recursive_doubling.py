"""Recursive doubling (halving for reduce-scatter): the latency-optimal baseline."""

from __future__ import annotations

from collections.abc import Sequence

from topocoll.errors import ScheduleError
from topocoll.solver.baselines._common import _even_chunks, _plan, _rotate, _shards, _trivial
from topocoll.solver.baselines.ordering import ring_order
from topocoll.solver.routing import RouteTable
from topocoll.solver.schedule import Collective, Op, Schedule
from topocoll.topo.model import Topology


def recursive_doubling(
    topology: Topology,
    collective: Collective | str,
    ranks: Sequence[str] | None = None,
    root: int | None = None,
    nchunks: int | None = None,
    routes: RouteTable | None = None,
) -> Schedule:
    """Latency-optimal butterfly schedules: ``⌈log2 N⌉`` (+2) steps, whole buffers per message.

    Positions follow the ring order. Let p be the largest power of two not above N and
    ``rem = N − p``; position ``p + i`` (i < rem) is paired with position i.

    - allreduce: the extra positions reduce into their partners, the first p positions run
      recursive doubling (exchange everything with the partner at distance 1, 2, 4, ...
      and add), the partners copy the result back;
    - allgather: the extras hand their shard to their partners, recursive doubling copies
      every shard held to the partner, the partners copy everything back;
    - reduce-scatter: the extras reduce everything into their partners, recursive halving
      (distance p/2, p/4, ... 1; send the half of the shards the partner will own) among
      the first p, then the partners copy the extras' shards back;
    - broadcast / reduce: binomial trees rooted at the root.

    Parameters
    ----------
    topology, collective, ranks, root, routes
        As for :func:`ring`.
    nchunks : None
        Accepted for the common signature of :data:`BASELINES`; every message of these
        schedules is a whole buffer or a set of whole shards, so it must be None or 1.

    Returns
    -------
    Schedule
    """
    if nchunks not in (None, 1):
        raise ScheduleError(f"recursive doubling sends whole buffers; nchunks must be None or 1, got {nchunks!r}")
    plan = _plan(topology, collective, ranks, root, routes)
    n = len(plan.ranks)
    name = "recursive_doubling"
    if n == 1:
        return _trivial(plan, name)
    c = plan.collective
    order = list(ring_order(topology, plan.ranks, plan.routes))
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    if c.is_rooted:
        chain = _rotate(order, plan.root)
        op = Op.COPY if c is Collective.BROADCAST else Op.REDUCE
        rounds = (n - 1).bit_length()
        for s in range(rounds):
            dist = 1 << s
            for j in range(n):
                if c is Collective.BROADCAST and j < dist and j + dist < n:
                    plan.send(s, chain[j], chain[j + dist], 0, op)
                if c is Collective.REDUCE and j % (2 * dist) == dist:
                    plan.send(s, chain[j], chain[j - dist], 0, op)
        return plan.build(name, _even_chunks(1))

    step = 0
    if c is Collective.ALLREDUCE:
        if rem:
            for i in range(rem):
                plan.send(step, order[p + i], order[i], 0, Op.REDUCE)
            step += 1
        dist = 1
        while dist < p:
            for q in range(p):
                plan.send(step, order[q], order[q ^ dist], 0, Op.REDUCE)
            step += 1
            dist <<= 1
        for i in range(rem):
            plan.send(step, order[i], order[p + i], 0, Op.COPY)
        return plan.build(name, _even_chunks(1))

    if c is Collective.ALLGATHER:
        held = [{order[q]} for q in range(n)]  # shard (= chunk id) = rank index
        if rem:
            for i in range(rem):
                plan.send(step, order[p + i], order[i], order[p + i], Op.COPY)
                held[i].add(order[p + i])
            step += 1
        dist = 1
        while dist < p:
            for q in range(p):
                for chunk in sorted(held[q]):
                    plan.send(step, order[q], order[q ^ dist], chunk, Op.COPY)
            held[:p] = [held[q] | held[q ^ dist] for q in range(p)]
            step += 1
            dist <<= 1
        for i in range(rem):
            for chunk in sorted(held[i] - held[p + i]):
                plan.send(step, order[i], order[p + i], chunk, Op.COPY)
        return plan.build(name, _shards(n))

    # reduce-scatter by recursive halving
    def owned(t: int) -> list[int]:
        return [order[t]] + ([order[p + t]] if t < rem else [])

    if rem:
        for i in range(rem):
            for chunk in range(n):
                plan.send(step, order[p + i], order[i], chunk, Op.REDUCE)
        step += 1
    dist = p >> 1
    while dist:
        for q in range(p):
            partner = q ^ dist
            high = ~(2 * dist - 1)
            for t in range(p):
                if (t & high) == (q & high) and (t & dist) == (partner & dist):
                    for chunk in owned(t):
                        plan.send(step, order[q], order[partner], chunk, Op.REDUCE)
        step += 1
        dist >>= 1
    for i in range(rem):
        plan.send(step, order[i], order[p + i], order[p + i], Op.COPY)
    return plan.build(name, _shards(n))
