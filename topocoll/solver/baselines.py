"""Baseline schedules in topocoll's IR: ring, double binary tree, hierarchical, recursive doubling.

Each builder takes a topology, a collective, the ranks (topology node ids; rank i runs on
``ranks[i]``) and, for broadcast and reduce, the root rank; it returns a
:class:`~topocoll.solver.schedule.Schedule` stamped with the topology's digest, every hop routed
by :func:`topocoll.solver.routing.widest_path`'s rule. All five collectives are supported by
every builder, over any subset of ranks of any topology; where an algorithm has no natural
form for a collective, the builder says which schedule it returns instead.

Rank placement. The algorithms place ranks on *positions* (ring positions, tree positions,
butterfly positions). All of them use the best ring order (:func:`ring_order`) as the
position order, so that neighbouring positions are close in the topology, as NCCL lays its
trees and rings over the same intra-node chains.

Pipelining. ``nchunks`` splits the data a chain or tree moves into that many pieces, sent one
step apart. Under the α-β model a pipeline of depth D with k pieces takes ``(D + k − 1)``
steps of ``1/k`` of the data; the default ``k = D`` keeps the fill/drain overhead below a
factor 2 of the bandwidth term while keeping the number of transfers at ``O(N·D)``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from topocoll.errors import ScheduleError
from topocoll.solver.request import check_request
from topocoll.solver.routing import RouteTable, route_table
from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer
from topocoll.topo.model import Topology

log = logging.getLogger(__name__)

#: Up to this many ranks the ring order is found by trying every ring ((N-1)! orders: 5040).
EXHAUSTIVE_RING_MAX_RANKS = 8
#: Up to this many ranks a nearest-neighbour tour is tried too (needs all N^2 routes).
GREEDY_RING_MAX_RANKS = 64


# ------------------------------------------------------------------------ plumbing
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


# ----------------------------------------------------------------------- ring order
def ring_order(topology: Topology, ranks: Sequence[str], routes: RouteTable | None = None) -> tuple[int, ...]:
    """A ring through all ranks that loads the topology's links as little as possible.

    The score of a ring (every hop routed by the widest-path rule, each carrying the same
    data) is ``max over links e of (hops using e) / bw(e)``, i.e. its bandwidth time per
    byte, then its summed hop latency. Up to :data:`EXHAUSTIVE_RING_MAX_RANKS` ranks every
    ring is scored; above, the best of the rank order, the rank order grouped by
    ``host_id``, and (up to :data:`GREEDY_RING_MAX_RANKS`) a nearest-neighbour tour over the
    widest routes.

    Parameters
    ----------
    topology : Topology
    ranks : sequence of str
        Node ids.
    routes : RouteTable, optional
        A table covering ``ranks`` (built when omitted).

    Returns
    -------
    tuple of int
        Rank indices in ring order, starting with rank 0.
    """
    nodes = tuple(ranks)
    n = len(nodes)
    if n <= 2:
        return tuple(range(n))
    routes = routes or route_table(topology, nodes)
    hop_links: dict[tuple[int, int], tuple[tuple[tuple[str, str], ...], float]] = {}

    def hop(a: int, b: int) -> tuple[tuple[tuple[str, str], ...], float]:
        entry = hop_links.get((a, b))
        if entry is None:
            path = routes.path(nodes[a], nodes[b])
            entry = (tuple(zip(path, path[1:])), topology.path_latency_s(path))
            hop_links[(a, b)] = entry
        return entry

    bw = {(link.src, link.dst): link.bw_bytes_per_s for link in topology.links}

    def score(order: Sequence[int]) -> tuple[float, float]:
        count: dict[tuple[str, str], int] = {}
        latency_s = 0.0
        for i in range(n):
            links, lat = hop(order[i], order[(i + 1) % n])
            latency_s += lat
            for link in links:
                count[link] = count.get(link, 0) + 1
        return max(c / bw[link] for link, c in count.items()), latency_s

    if n <= EXHAUSTIVE_RING_MAX_RANKS:
        candidates = ((0, *rest) for rest in itertools.permutations(range(1, n)))
    else:
        candidates = [tuple(range(n)), _host_grouped(topology, nodes)]
        if n <= GREEDY_RING_MAX_RANKS:
            candidates.append(_nearest_neighbour(routes, nodes))
    best = min(candidates, key=score)
    return tuple(best)


def _host_grouped(topology: Topology, nodes: tuple[str, ...]) -> tuple[int, ...]:
    groups = topology.ranks_by_host(nodes)
    return tuple(r for group in groups for r in group)


def _nearest_neighbour(routes: RouteTable, nodes: tuple[str, ...]) -> tuple[int, ...]:
    order = [0]
    left = set(range(1, len(nodes)))
    while left:
        here = nodes[order[-1]]

        def key(r: int) -> tuple[float, int, float, int]:
            route = routes.route(here, nodes[r])
            return (-route.bw_bytes_per_s, route.hops, route.latency_s, r)

        nxt = min(left, key=key)
        order.append(nxt)
        left.discard(nxt)
    return tuple(order)


def _rotate(order: Sequence[int], first: int) -> list[int]:
    i = list(order).index(first)
    return list(order[i:]) + list(order[:i])


# ----------------------------------------------------------------- ring pieces
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


# ------------------------------------------------------------------ tree pieces
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


def _trivial(plan: _Plan, name: str) -> Schedule:
    """One rank: nothing to move."""
    chunks = _shards(1)
    return plan.build(name, chunks)


# ------------------------------------------------------------------------- ring
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


def _pieces(nchunks: int | None, depth: int) -> int:
    if nchunks is None:
        return max(1, depth)
    if isinstance(nchunks, bool) or not isinstance(nchunks, int) or nchunks < 1:
        raise ScheduleError(f"nchunks must be an integer >= 1, got {nchunks!r}")
    return nchunks


# ------------------------------------------------------------ double binary tree
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


# ------------------------------------------------------------------ hierarchical
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


# ------------------------------------------------------------ recursive doubling
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


#: The baselines by name, for the CLI and the benchmark; all share the signature
#: ``(topology, collective, ranks=None, root=None, nchunks=None, routes=None) -> Schedule``.
BASELINES: dict[str, Callable[..., Schedule]] = {
    "ring": ring,
    "double_binary_tree": double_binary_tree,
    "hierarchical": hierarchical,
    "recursive_doubling": recursive_doubling,
}
