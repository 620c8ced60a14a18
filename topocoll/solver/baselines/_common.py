"""What the baselines share: the plan a schedule is built in, chunks, and the ring, chain and tree
steps they are made of (private to :mod:`topocoll.solver.baselines`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from topocoll.errors import ScheduleError
from topocoll.solver.request import check_request
from topocoll.solver.routing import RouteTable, route_table
from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer
from topocoll.topo.model import Topology


@dataclass
class _Plan:
    """Collects the transfers of a schedule under construction (private, short-lived)."""

    topology: Topology
    collective: Collective
    ranks: tuple[str, ...]
    root: int | None
    routes: RouteTable
    steps: dict[int, list[Transfer]] = field(default_factory=dict)

    def send(self, step: int, src: int, dst: int, chunk: int, op: Op) -> None:
        path = self.routes.path(self.ranks[src], self.ranks[dst])
        self.steps.setdefault(step, []).append(Transfer(src, dst, chunk, op, path))

    def build(self, name: str, chunks: Sequence[Chunk]) -> Schedule:
        last = max(self.steps, default=-1)
        steps = tuple(tuple(self.steps.get(s, ())) for s in range(last + 1))
        return Schedule(
            collective=self.collective,
            ranks=self.ranks,
            root=self.root,
            topology_digest=self.topology.digest(),
            chunks=tuple(chunks),
            steps=tuple(s for s in steps if s),
            name=name,
        )


def _plan(
    topology: Topology,
    collective: Collective | str,
    ranks: Sequence[str] | None,
    root: int | None,
    routes: RouteTable | None,
) -> _Plan:
    """Validate the common arguments (a world of one is allowed; broadcast and reduce default to root 0)."""
    collective = collective if isinstance(collective, Collective) else Collective.parse(collective)
    root = (0 if root is None else root) if collective.is_rooted else None
    nodes = check_request(topology, collective, topology.compute_nodes() if ranks is None else ranks, root, min_ranks=1)
    if routes is None:
        routes = route_table(topology, nodes)
    return _Plan(topology, collective, nodes, root, routes)


def _even_chunks(count: int, start_id: int = 0, lo: float = 0.0, hi: float = 1.0) -> list[Chunk]:
    """``count`` equal chunks tiling ``[lo, hi)``."""
    width = hi - lo
    return [Chunk(start_id + i, lo + width * i / count, width / count) for i in range(count)]


def _shards(n: int) -> list[Chunk]:
    """One chunk per rank's shard: chunk r is ``[r/n, (r+1)/n)``."""
    return _even_chunks(n)


def _rotate(order: Sequence[int], first: int) -> list[int]:
    i = list(order).index(first)
    return list(order[i:]) + list(order[:i])


def _ring_reduce_scatter(plan: _Plan, order: Sequence[int], pieces: Sequence[Sequence[int]], start: int) -> int:
    """Ring reduce-scatter: position p ends with ``pieces[p]`` reduced over the ring.

    ``pieces[q]`` lists the chunk ids of segment q. Returns the next free step.
    """
    n = len(order)
    for s in range(n - 1):
        for p in range(n):
            for chunk in pieces[(p - s - 1) % n]:
                plan.send(start + s, order[p], order[(p + 1) % n], chunk, Op.REDUCE)
    return start + n - 1


def _ring_allgather(plan: _Plan, order: Sequence[int], pieces: Sequence[Sequence[int]], start: int) -> int:
    """Ring allgather: position p starts with ``pieces[p]``; everyone ends with all."""
    n = len(order)
    for s in range(n - 1):
        for p in range(n):
            for chunk in pieces[(p - s) % n]:
                plan.send(start + s, order[p], order[(p + 1) % n], chunk, Op.COPY)
    return start + n - 1


def _chain(plan: _Plan, chain: Sequence[int], chunk_ids: Sequence[int], op: Op, start: int = 0) -> int:
    """Pipelined chain: ``chain[j]`` sends piece i to ``chain[j+1]`` at step ``start + i + j``."""
    for j in range(len(chain) - 1):
        for i, chunk in enumerate(chunk_ids):
            plan.send(start + i + j, chain[j], chain[j + 1], chunk, op)
    return start + len(chain) - 2 + len(chunk_ids)


def _children(parent: dict[int, int | None]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {v: [] for v in parent}
    for v, p in parent.items():
        if p is not None:
            kids[p].append(v)
    return kids


def _root_of(parent: dict[int, int | None]) -> int:
    return next(v for v, p in parent.items() if p is None)


def _depths(parent: dict[int, int | None]) -> dict[int, int]:
    kids = _children(parent)
    root = _root_of(parent)
    depth = {root: 0}
    stack = [root]
    while stack:
        v = stack.pop()
        for c in kids[v]:
            depth[c] = depth[v] + 1
            stack.append(c)
    return depth


def _heights(parent: dict[int, int | None]) -> dict[int, int]:
    depth = _depths(parent)
    kids = _children(parent)
    height: dict[int, int] = {}
    for v in sorted(depth, key=depth.__getitem__, reverse=True):
        height[v] = 1 + max((height[c] for c in kids[v]), default=-1)
    return height


def _reroot(parent: dict[int, int | None], new_root: int) -> dict[int, int | None]:
    """The same undirected tree, rooted at ``new_root``."""
    out = dict(parent)
    prev: int | None = None
    v: int | None = new_root
    while v is not None:
        up = parent[v]
        out[v] = prev
        prev, v = v, up
    return out


def _tree_reduce(plan: _Plan, parent: dict[int, int | None], chunk_ids: Sequence[int], start: int) -> int:
    """Pipelined reduce up the tree: a node of height h sends piece i at step ``start + h + i``.

    Returns the step after the root holds every piece; node ids are rank indices.
    """
    height = _heights(parent)
    for v, p in parent.items():
        if p is None:
            continue
        for i, chunk in enumerate(chunk_ids):
            plan.send(start + height[v] + i, v, p, chunk, Op.REDUCE)
    return start + height[_root_of(parent)] + len(chunk_ids) - 1


def _tree_broadcast(plan: _Plan, parent: dict[int, int | None], chunk_ids: Sequence[int], start: int) -> int:
    """Pipelined broadcast down the tree: depth-d node receives piece i at step ``start + d - 1 + i``."""
    depth = _depths(parent)
    for v, p in parent.items():
        if p is None:
            continue
        for i, chunk in enumerate(chunk_ids):
            plan.send(start + depth[v] - 1 + i, p, v, chunk, Op.COPY)
    return start + max(depth.values()) + len(chunk_ids) - 1


def _trivial(plan: _Plan, name: str) -> Schedule:
    """One rank: nothing to move."""
    chunks = _shards(1)
    return plan.build(name, chunks)


def _pieces(nchunks: int | None, depth: int) -> int:
    if nchunks is None:
        return max(1, depth)
    if isinstance(nchunks, bool) or not isinstance(nchunks, int) or nchunks < 1:
        raise ScheduleError(f"nchunks must be an integer >= 1, got {nchunks!r}")
    return nchunks
