"""Synthesis: turn a tree packing into a verified, pipelined schedule.

``synthesize`` packs trees (:mod:`topocoll.solver.packing`) for the collective and lays them
out as chunks and steps:

- allgather: each rank's shard is split across its trees (by tree weight) and each tree's part
  into ``pipeline`` pieces; piece ``j`` crosses the tree arcs of depth ``d`` in step ``j + d``
  (copies).
- reduce-scatter: trees packed on the reversed graph, used as in-trees; piece ``j`` leaves a
  rank of depth ``d + 1`` towards its parent in step ``j + height - 1 - d`` (reduces), so a
  rank forwards only after all its children have delivered.
- allreduce: reduce-scatter then allgather per piece, the allgather of a piece starting the
  step after its reduction reached the root.
- broadcast / reduce: like allgather / reduce-scatter with the root's trees only.

Which schedule runs for a message size (this layout at several pipeline depths, or a baseline)
is the planner's choice: :func:`topocoll.solver.planner.plan_collective`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from topocoll.errors import SolverError
from topocoll.solver.bound import Bound, cut_bound
from topocoll.solver.packing import Packing, Tree, pack_trees
from topocoll.solver.rail_packing import RAIL_TREES, compose, host_groups, rail_packing
from topocoll.solver.request import check_request
from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer
from topocoll.topo.model import Topology

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SynthesisOptions:
    """Knobs of :func:`synthesize`.

    Attributes
    ----------
    pipeline : int
        Pieces each tree's data is cut into (pipelining depth).
    time_limit_s : float
        Budget for the column generation.
    gap : float
        Stop when within this relative distance of the cut bound (0.1 %: well inside the
        99.5 % goal, and column generation's last rounds each gain little).
    solver : str
        ``"highs"`` or ``"cbc"``.
    max_trees_per_root : int, optional
        Cap on trees kept per root (fewer chunks; the rounding loss shows in the ratio).
    flat_max_ranks : int
        Above this many ranks on a regular multi-host set, pack hierarchically
        (:mod:`topocoll.solver.rail_packing`): flat column generation over 64 ranks takes about a
        minute on two cores, the hierarchical one seconds.
    rail_tree : str
        When packing hierarchically, the tree each rank's data follows between machines
        (:func:`topocoll.solver.rail_packing.rail_tree`: ``"chain"`` or ``"binomial"``).
    """

    pipeline: int = 1
    time_limit_s: float = 60.0
    gap: float = 1e-3
    solver: str = "highs"
    max_trees_per_root: int | None = None
    flat_max_ranks: int = 32
    rail_tree: str = "chain"

    def __post_init__(self) -> None:
        if self.pipeline < 1:
            raise SolverError(f"pipeline must be >= 1, got {self.pipeline}")
        if not self.time_limit_s > 0:
            raise SolverError(f"time limit must be > 0 s, got {self.time_limit_s}")
        if self.rail_tree not in RAIL_TREES:
            raise SolverError(f"rail tree must be one of {', '.join(RAIL_TREES)}, got {self.rail_tree!r}")


def pack_for(
    topology: Topology, collective: Collective, ranks: Sequence[str], root: int | None, bound: Bound, options: SynthesisOptions
) -> tuple[Packing, Packing]:
    """The (gather, scatter) packings a collective needs; either may be the other reversed.

    The gather packing spreads data down out-trees; the scatter packing (for reduce-scatter,
    reduce and allreduce) is packed on the reversed graph and already reversed here, so its
    paths run child -> parent. Allreduce on a full-duplex graph whose machines hold different
    numbers of ranks packs both at once (the gather trees, reduce-scatter running them
    reversed; see ``both_directions`` of :func:`topocoll.solver.packing.pack_trees`).
    """
    n = len(ranks)
    roots = [root] if collective.is_rooted else list(range(n))
    per_unit_bound = bound.time_per_byte_s * (1 if collective.is_rooted else n)
    if collective is Collective.ALLREDUCE:
        per_unit_bound = cut_bound(topology, Collective.ALLGATHER, ranks).time_per_byte_s * n
    kwargs = dict(
        target_time_per_unit_s=per_unit_bound,
        gap=options.gap,
        solver=options.solver,
        time_limit_s=options.time_limit_s,
        max_trees_per_root=options.max_trees_per_root,
    )
    groups = host_groups(topology, ranks) if not collective.is_rooted and n > options.flat_max_ranks else None

    def pack(reverse: bool) -> Packing:
        if groups is not None:
            parts = rail_packing(
                topology, ranks, groups, reverse=reverse, solver=options.solver, time_limit_s=options.time_limit_s, gap=options.gap,
                tree=options.rail_tree,
            )
            return compose(parts)
        return pack_trees(topology, ranks, roots, reverse=reverse, seed_orders=[list(range(n))], **kwargs)

    if collective is Collective.ALLREDUCE and groups is None and topology.is_symmetric() and unevenly_hosted(topology, ranks):
        # Machines holding different numbers of ranks: a rank alone on its machine needs to
        # send and receive each byte only once, which the two halves packed apart each count
        # (measured: 1.78-1.88x the halves' bandwidth on 9-17 GPUs of DGX H100s). No cut bound
        # stops this packing early (the halves' bound is no bound for it): it runs to the end.
        both = dict(kwargs, target_time_per_unit_s=0.0)
        gather = pack_trees(topology, ranks, roots, seed_orders=[list(range(n))], both_directions=True, **both)
        return gather, reverse_packing(gather)
    needs_gather = collective in (Collective.ALLGATHER, Collective.BROADCAST, Collective.ALLREDUCE)
    needs_scatter = collective in (Collective.REDUCE_SCATTER, Collective.REDUCE, Collective.ALLREDUCE)
    gather = pack(reverse=False) if needs_gather else None
    scatter = None
    if needs_scatter:
        if gather is not None and topology.is_symmetric():
            scatter = reverse_packing(gather)
        else:
            if collective is Collective.ALLREDUCE:
                kwargs["target_time_per_unit_s"] = cut_bound(topology, Collective.REDUCE_SCATTER, ranks).time_per_byte_s * n
            scatter = reverse_packing(pack(reverse=True))
    return gather, scatter


def unevenly_hosted(topology: Topology, ranks: Sequence[str]) -> bool:
    """Whether the ranks' machines (their ``host_id``) hold different numbers of them, as
    schedulers' partial allocations do (8 GPUs of one machine, 1 of another)."""
    return len({len(group) for group in topology.ranks_by_host(ranks)}) > 1


def reverse_packing(packing: Packing) -> Packing:
    """``packing`` with every path reversed: trees packed on the reversed graph, read child -> parent."""
    return Packing(
        tuple(t.reversed_paths() for t in packing.trees),
        packing.time_per_unit_s,
        packing.optimal,
        packing.iterations,
        packing.solver,
    )


def _segments(
    trees: Sequence[Tree], start: float, length: float, pipeline: int, tallest: int
) -> list[tuple[float, float, Tree, int]]:
    """Cut ``[start, start + length)`` by tree weight, then each tree's part into pieces.

    A tree of height ``h`` gets ``pipeline + tallest - h`` pieces, so that every tree keeps its
    links busy until the same last step: a shallow star spreads over the steps the deep trees
    need anyway instead of crowding the first ones (steps run in lock step). Returns
    ``(offset, end, tree, piece)`` in order; ends come from cumulative fractions so that the
    pieces tile the range exactly.
    """
    pieces = []
    cumulative = 0.0
    for tree in trees:
        count = pipeline + tallest - tree.height
        for j in range(count):
            lo = cumulative + tree.weight * j / count
            hi = cumulative + tree.weight * (j + 1) / count
            pieces.append((lo, hi, tree, j))
        cumulative += tree.weight
    scale = length / cumulative
    return [(start + lo * scale, start + hi * scale, tree, j) for lo, hi, tree, j in pieces]


def _refine(
    a: list[tuple[float, float, Tree, int]], b: list[tuple[float, float, Tree, int]]
) -> list[tuple[float, float, tuple[Tree, int], tuple[Tree, int]]]:
    """Common refinement of two tilings of the same range (for allreduce on asymmetric graphs)."""
    cuts = sorted({x for lo, hi, _, _ in a for x in (lo, hi)} | {x for lo, hi, _, _ in b for x in (lo, hi)})
    merged = []
    for lo, hi in zip(cuts, cuts[1:]):
        if hi - lo <= 1e-15:
            continue
        mid = (lo + hi) / 2
        first = next((t, j) for s, e, t, j in a if s <= mid < e)
        second = next((t, j) for s, e, t, j in b if s <= mid < e)
        merged.append((lo, hi, first, second))
    return merged


def layout(
    collective: Collective,
    ranks: Sequence[str],
    root: int | None,
    gather: Packing | None,
    scatter: Packing | None,
    pipeline: int,
    topology_digest: str,
    name: str = "lp",
) -> Schedule:
    """Lay packed trees out as chunks and steps (see the module docstring)."""
    n = len(ranks)
    roots = [root] if collective.is_rooted else list(range(n))
    steps: dict[int, list[Transfer]] = {}
    chunks: list[Chunk] = []

    def add(step: int, transfer: Transfer) -> None:
        steps.setdefault(step, []).append(transfer)

    def trees_of(packing: Packing, r: int) -> list[Tree]:
        return [t for t in packing.trees if t.root == r]

    tallest = max(t.height for p in (gather, scatter) if p is not None for t in p.trees)

    for r in roots:
        start, length = (0.0, 1.0) if collective.is_rooted else (r / n, 1.0 / n)
        if collective is Collective.ALLREDUCE:
            pieces = _refine(
                _segments(trees_of(scatter, r), start, length, pipeline, tallest),
                _segments(trees_of(gather, r), start, length, pipeline, tallest),
            )
        else:
            packing = gather if gather is not None else scatter
            pieces = [
                (lo, hi, (t, j), (t, j)) for lo, hi, t, j in _segments(trees_of(packing, r), start, length, pipeline, tallest)
            ]
        for lo, hi, (down_tree, j), (up_tree, k) in pieces:
            chunk = Chunk(len(chunks), lo, hi - lo)
            chunks.append(chunk)
            finish = -1  # last step of the reduction phase for this piece
            if collective in (Collective.REDUCE_SCATTER, Collective.REDUCE, Collective.ALLREDUCE):
                depth = down_tree.depths()
                height = max(depth.values())
                for parent, child, path in down_tree.arcs:
                    step = j + height - depth[child]
                    add(step, Transfer(child, parent, chunk.id, Op.REDUCE, path))
                finish = j + height - 1
            if collective in (Collective.ALLGATHER, Collective.BROADCAST, Collective.ALLREDUCE):
                depth = up_tree.depths()
                begin = finish + 1 if collective is Collective.ALLREDUCE else k
                for parent, child, path in up_tree.arcs:
                    add(begin + depth[parent], Transfer(parent, child, chunk.id, Op.COPY, path))
    ordered = tuple(tuple(steps[s]) for s in sorted(steps))
    return Schedule(collective, tuple(ranks), root if collective.is_rooted else None, topology_digest, tuple(chunks), ordered, name)


@dataclass(frozen=True, slots=True)
class Synthesis:
    """A synthesized schedule with what was learned on the way.

    Attributes
    ----------
    schedule : Schedule
    bound : Bound
    optimal : bool
        Column generation reached the bound (within the gap) or proved no better tree exists.
    iterations : int
        Column-generation rounds (gather + scatter).
    solver : str
    """

    schedule: Schedule
    bound: Bound
    optimal: bool
    iterations: int
    solver: str


def synthesize(
    topology: Topology,
    collective: Collective,
    ranks: Sequence[str],
    root: int | None = None,
    options: SynthesisOptions = SynthesisOptions(),
) -> Synthesis:
    """Synthesize a bandwidth-optimal schedule by LP tree packing.

    Parameters
    ----------
    topology : Topology
    collective : Collective
    ranks : sequence of str
        Rank nodes, in rank order.
    root : int, optional
        Root rank for broadcast and reduce.
    options : SynthesisOptions

    Returns
    -------
    Synthesis
        The schedule is not yet verified; :func:`topocoll.solver.plan` verifies.

    Raises
    ------
    SolverError
        Invalid ranks or root, or ranks that cannot reach each other.

    See Also
    --------
    topocoll.solver.packing.pack_trees : the trees it lays out.
    topocoll.solver.planner.plan_collective : synthesis weighed against the baselines.
    """
    ranks = check_request(topology, collective, ranks, root)
    bound = cut_bound(topology, collective, ranks, root)
    gather, scatter = pack_for(topology, collective, ranks, root, bound, options)
    schedule = layout(collective, ranks, root, gather, scatter, options.pipeline, topology.digest())
    used = [p for p in (gather, scatter) if p is not None]
    return Synthesis(
        schedule,
        bound,
        all(p.optimal for p in used),
        sum(p.iterations for p in used),
        used[0].solver,
    )
