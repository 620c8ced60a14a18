"""Schedules written by hand for the collectives tests (independent of the solver).

Textbook algorithms over ``n`` ranks, every shard cut into ``pieces`` chunks so that lowering
has contiguous transfers to merge. Paths run through one hub node, as in the flat topology.
"""

from __future__ import annotations

from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer


def _chunks(n: int, pieces: int) -> tuple[Chunk, ...]:
    total = n * pieces
    return tuple(Chunk(c, c / total, 1 / total) for c in range(total))


def _transfer(nodes: tuple[str, ...], hub: str, src: int, dst: int, chunk: int, op: Op) -> Transfer:
    return Transfer(src, dst, chunk, op, (nodes[src], hub, nodes[dst]))


def ring(
    collective: Collective,
    nodes: tuple[str, ...],
    *,
    pieces: int = 2,
    hub: str = "hub",
    digest: str = "",
) -> Schedule:
    """Ring reduce-scatter, allgather or both (allreduce) over ``nodes``.

    Reduce-scatter: in step ``t`` rank ``r`` adds shard ``r - 1 - t`` into rank ``r + 1``, so rank
    ``r`` ends with shard ``r`` complete. Allgather: in step ``t`` rank ``r`` copies shard
    ``r - t`` to rank ``r + 1``.
    """
    n = len(nodes)
    steps: list[tuple[Transfer, ...]] = []
    if collective in (Collective.REDUCE_SCATTER, Collective.ALLREDUCE):
        for t in range(n - 1):
            steps.append(
                tuple(
                    _transfer(nodes, hub, r, (r + 1) % n, ((r - 1 - t) % n) * pieces + p, Op.REDUCE)
                    for r in range(n)
                    for p in range(pieces)
                )
            )
    if collective in (Collective.ALLGATHER, Collective.ALLREDUCE):
        for t in range(n - 1):
            steps.append(
                tuple(
                    _transfer(nodes, hub, r, (r + 1) % n, ((r - t) % n) * pieces + p, Op.COPY)
                    for r in range(n)
                    for p in range(pieces)
                )
            )
    return Schedule(collective, tuple(nodes), None, digest, _chunks(n, pieces), tuple(steps), name="hand-ring")


def chain(
    collective: Collective,
    nodes: tuple[str, ...],
    root: int,
    *,
    pieces: int = 3,
    hub: str = "hub",
    digest: str = "",
) -> Schedule:
    """Pipelined chain broadcast from ``root`` or reduce into ``root``.

    Broadcast: order ``root, root+1, ...``; chunk ``j`` moves from position ``s - j`` to the next
    in step ``s``. Reduce: order ``root+1, ..., root-1, root``, the same pipeline with adds.
    """
    n = len(nodes)
    if collective is Collective.BROADCAST:
        order = [(root + i) % n for i in range(n)]
        op = Op.COPY
    else:
        order = [(root + 1 + i) % n for i in range(n)]
        op = Op.REDUCE
    total = n * pieces
    steps = []
    for s in range(total + n - 2):
        step = tuple(
            _transfer(nodes, hub, order[s - j], order[s - j + 1], j, op)
            for j in range(total)
            if 0 <= s - j < n - 1
        )
        if step:
            steps.append(step)
    return Schedule(collective, tuple(nodes), root, digest, _chunks(n, pieces), tuple(steps), name="hand-chain")


def hub_of(topology, nodes) -> str:
    """The node that every one of ``nodes`` has a link to: the hub of a flat topology, the CPU of
    a discovered one-socket machine. The hand-made schedules route every transfer through it."""
    common = None
    for node in nodes:
        neighbours = {link.dst for link in topology.links if link.src == node}
        common = neighbours if common is None else common & neighbours
    if not common:
        raise ValueError(f"no node of {topology.name!r} links to every one of {list(nodes)}")
    return sorted(common)[0]


def hand_planner(topology, collective, ranks, root, size_bytes) -> Schedule:
    """A planner for :class:`TopoProcessGroup` that uses the schedules above."""
    nodes = tuple(ranks)
    digest = topology.digest()
    hub = hub_of(topology, nodes)
    if collective in (Collective.BROADCAST, Collective.REDUCE):
        return chain(collective, nodes, root, hub=hub, digest=digest)
    return ring(collective, nodes, hub=hub, digest=digest)


def direct(collective: Collective, nodes: tuple[str, ...], *, hub: str = "hub", digest: str = "") -> Schedule:
    """Reduce-scatter / allgather / allreduce in one step each: every rank exchanges with every
    other rank directly (shard ``r`` is reduced at and sent from rank ``r``)."""
    n = len(nodes)
    steps: list[tuple[Transfer, ...]] = []
    if collective in (Collective.REDUCE_SCATTER, Collective.ALLREDUCE):
        steps.append(tuple(_transfer(nodes, hub, r, s, s, Op.REDUCE) for r in range(n) for s in range(n) if r != s))
    if collective in (Collective.ALLGATHER, Collective.ALLREDUCE):
        steps.append(tuple(_transfer(nodes, hub, r, s, r, Op.COPY) for r in range(n) for s in range(n) if r != s))
    return Schedule(collective, tuple(nodes), None, digest, _chunks(n, 1), tuple(steps), name="hand-direct")


def two_rail_broadcast(first: float = 0.5):
    """A broadcast from ``a`` to ``b`` in two chunks (the first ``first`` of the buffer), one
    over each rail of a two-rail cluster, and those rails: ``(rails, schedule)``."""
    from topocoll.topo.rails import Rails

    rails = Rails(count=2, nic_rail={"a.eth0": 0, "a.eth1": 1, "b.eth0": 0, "b.eth1": 1},
                  interfaces={"a": ("eth0", "eth1"), "b": ("eth0", "eth1")})
    steps = ((
        Transfer(0, 1, 0, Op.COPY, ("a", "a.eth0", "rail0", "b.eth0", "b")),
        Transfer(0, 1, 1, Op.COPY, ("a", "a.eth1", "rail1", "b.eth1", "b")),
    ),)
    return rails, Schedule(Collective.BROADCAST, ("a", "b"), 0, "", (Chunk(0, 0.0, first), Chunk(1, first, 1 - first)), steps)
