"""The symbolic verifier: proves that a schedule implements its collective on a topology.

It replays the schedule on symbols instead of data. The value a rank holds for a chunk is the
*set of ranks whose contribution it contains*, kept as a Python integer bitmask (bit r = rank
r's contribution), so a replay costs a few integer operations per transfer at any world size.

Initial state (contract 2 of the design):

- allreduce, reduce-scatter, reduce: every rank holds its own contribution ``{r}`` to every
  chunk;
- allgather: rank r holds ``{r}`` for the chunks inside its shard ``[r/N, (r+1)/N)`` and
  nothing elsewhere;
- broadcast: the root holds ``{root}`` for every chunk, the others nothing.

For allgather and broadcast the "contribution" is the owner's (root's) data: holding ``{o}``
means holding the right bytes.

Transfers of a step read the state as it was before the step, then their writes are applied:

- the sender must hold something for the chunk (else: "sends a chunk it does not hold");
- ``REDUCE`` adds the sender's set to the receiver's. The two sets must be disjoint (else a
  contribution is counted twice). A receiver that holds nothing simply gets the sender's set,
  as when it reduces into a zero-initialised buffer. Several reduces into one (rank, chunk) in
  one step are fine when their sets are pairwise disjoint and disjoint from the receiver's;
- ``COPY`` replaces the receiver's set by the sender's. A copy and any other write to the same
  (rank, chunk) in one step is an error (the result would depend on arrival order).

Postconditions: allreduce — every rank holds every chunk reduced over all ranks; allgather —
every rank holds every chunk from its owner; reduce-scatter — each rank holds the chunks of
its own shard reduced over all ranks; broadcast — every rank holds every chunk from the root;
reduce — the root holds every chunk reduced over all ranks.

An all-to-all is replayed on copies alone: chunk c of pair (i, j) starts at rank i, any rank
holding it may forward it (relays), and rank j must receive it exactly once; reduces are
errors. Its link loads weigh each chunk by its pair's bytes (:meth:`Schedule.chunk_fractions`).

Structure: the topology digest must match (unless the schedule's is empty; files read by the
command-line tools must have one, see :func:`require_topology_digest`), every rank must be
a compute node of the topology, the chunks must tile [0, 1) (and, for allgather and
reduce-scatter, stay inside one shard each), every path must run from the sender's node to the
receiver's along links of the topology without visiting a node twice.

Measures: ``link_load[e]`` is the sum of the chunk fractions routed over link e over the whole
schedule, and ``T_bw = S × max_e link_load[e] / bw(e)`` is the time of an ideally pipelined
run for buffer size S (the design's "bandwidth time"). The α-β time comes from
:mod:`topocoll.solver.alpha_beta`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from topocoll.errors import ScheduleError
from topocoll.solver.alpha_beta import alpha_beta_time_s as _alpha_beta_time_s
from topocoll.solver.alpha_beta import resolve_path
from topocoll.solver.schedule import Collective, Op, Schedule, Transfer, without_cycle_collection
from topocoll.topo.model import Topology

log = logging.getLogger(__name__)

#: Tolerance on chunk boundaries, the same as the schedule records use.
_TOL = 1e-9


@dataclass(frozen=True, slots=True)
class Verification:
    """What :func:`verify` found.

    Parameters
    ----------
    ok : bool
        True when there is no error.
    errors : tuple of str
        The first errors (up to ``max_errors``), each naming step, transfer, rank and chunk.
    error_count : int
        How many errors there were in all.
    t_bw_s_per_byte : float
        Bandwidth time per byte of buffer: ``max_e link_load[e] / bw(e)``.
    t_bw_s : float or None
        ``size_bytes × t_bw_s_per_byte`` when a size was given.
    alpha_beta_time_s : float or None
        The α-β time at ``size_bytes`` when a size was given and every path is valid.
    link_load : mapping of (src, dst) to float
        Sum of the chunk fractions carried by each used link (only links of the topology).
    bottleneck_link : (str, str) or None
        The link that sets ``T_bw`` (None without transfers).
    """

    ok: bool
    errors: tuple[str, ...]
    error_count: int
    t_bw_s_per_byte: float
    t_bw_s: float | None
    alpha_beta_time_s: float | None
    link_load: Mapping[tuple[str, str], float] = field(compare=False)
    bottleneck_link: tuple[str, str] | None

    def raise_if_failed(self, what: str = "schedule") -> None:
        """Raise :class:`ScheduleError` with the first error unless ``ok``."""
        if not self.ok:
            more = f" (and {self.error_count - 1} more)" if self.error_count > 1 else ""
            raise ScheduleError(f"{what} is not valid: {self.errors[0]}{more}")


class _Errors:
    """Collects the first ``limit`` messages and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.messages: list[str] = []
        self.count = 0

    def add(self, message: str) -> None:
        self.count += 1
        if len(self.messages) < self.limit:
            self.messages.append(message)


def require_topology_digest(schedule: Schedule, source: str) -> None:
    """Refuse a schedule that carries no topology digest.

    :func:`verify` compares a non-empty digest with the topology's, and skips the comparison
    for an empty one (schedules built in memory, tests). A schedule *file* about to be checked
    against a topology or run must say which topology it was made for, or a schedule for
    another machine with the same node names would pass; ``topocoll verify`` and
    ``topocoll-bench --schedule`` call this first. The file format keeps the field as it is.

    Raises
    ------
    ScheduleError
        ``"SOURCE: schedule has no topology_digest ..."``, saying how to make one that has.
    """
    if not schedule.topology_digest:
        raise ScheduleError(
            f"{source}: schedule has no topology_digest, so it cannot be checked against the topology; "
            "re-synthesize it with 'topocoll synthesize --topology FILE ...'"
        )


#: Memory the verifier may use: it replays a schedule with one set of ranks per (rank, chunk), a
#: Python integer of up to N bits, so its state grows as N^2 x chunks / N. 16 GB leaves room for
#: the rest of a planning process on a 24 GiB machine.
VERIFY_MEMORY_LIMIT_BYTES = 16e9

#: Bytes of one (rank, chunk) state beyond its bits: a Python integer's header, and its slot in
#: the per-rank list (CPython 3.11: ``sys.getsizeof(1 << 64)`` is 36, a list slot 8).
_STATE_OVERHEAD_BYTES = 44


def verify_memory_bytes(world_size: int, chunks: int) -> float:
    """Memory the verifier's replay needs for ``world_size`` ranks and ``chunks`` chunks (an
    estimate from its state: one integer of up to ``world_size`` bits per rank and chunk, half
    of them full on average)."""
    return float(world_size) * chunks * (_STATE_OVERHEAD_BYTES + world_size / 16)


def check_verify_memory(world_size: int, chunks: int, what: str = "the schedule") -> None:
    """Raise ScheduleError, before any work, when verifying would need more than
    :data:`VERIFY_MEMORY_LIMIT_BYTES`.

    Examples
    --------
    >>> check_verify_memory(1024, 1024)
    >>> check_verify_memory(8192, 8192)
    Traceback (most recent call last):
    ...
    topocoll.errors.ScheduleError: verifying the schedule (8192 ranks x 8192 chunks) needs about 37 GB of memory, more than the 16 GB this allows
    """
    need = verify_memory_bytes(world_size, chunks)
    if need > VERIFY_MEMORY_LIMIT_BYTES:
        raise ScheduleError(
            f"verifying {what} ({world_size} ranks x {chunks} chunks) needs about {need / 1e9:.0f} GB of memory, "
            f"more than the {VERIFY_MEMORY_LIMIT_BYTES / 1e9:.0f} GB this allows"
        )


def verify(
    schedule: Schedule,
    topology: Topology,
    size_bytes: float | None = None,
    per_message_overhead_s: float = 0.0,
    max_errors: int = 10,
) -> Verification:
    """Check that ``schedule`` implements its collective on ``topology`` and measure it.

    Parameters
    ----------
    schedule : Schedule
    topology : Topology
    size_bytes : float, optional
        Buffer size S (nccl-tests ``size``: the total buffer for allgather / reduce-scatter);
        when given, ``t_bw_s`` and ``alpha_beta_time_s`` are filled in.
    per_message_overhead_s : float
        Software overhead per step for the α-β time.
    max_errors : int
        How many error messages to keep.

    Returns
    -------
    Verification
        Never raises for an incorrect schedule; see :meth:`Verification.raise_if_failed`.

    See Also
    --------
    topocoll.solver.bound.cut_bound : the limit a verified schedule is measured against.
    topocoll.collectives.lower.lower : what runs a verified schedule.
    """
    with without_cycle_collection():  # the replay builds a container per transfer
        return _verify(schedule, topology, size_bytes, per_message_overhead_s, max_errors)


def _verify(
    schedule: Schedule, topology: Topology, size_bytes: float | None, per_message_overhead_s: float, max_errors: int
) -> Verification:
    """:func:`verify` with the cycle collector paused."""
    errors = _Errors(max_errors)
    graph = topology.graph

    if schedule.topology_digest and schedule.topology_digest != topology.digest():
        errors.add(
            f"topology digest {schedule.topology_digest} does not match the topology's {topology.digest()}"
        )
    for r, node in enumerate(schedule.ranks):
        if node not in graph:
            errors.add(f"rank {r}: node {node!r} is not in the topology")
        elif not graph.nodes[node]["record"].kind.is_compute:
            errors.add(f"rank {r}: node {node} is a {graph.nodes[node]['record'].kind.value}, not a gpu/host")

    check_verify_memory(schedule.world_size, len(schedule.chunks), f"schedule {schedule.name or '(unnamed)'}")
    chunks = sorted(schedule.chunks, key=lambda c: c.offset)
    if not schedule.collective.is_routed:  # an all-to-all's pair blocks were tiled when it was built
        _check_chunks(schedule, chunks, errors)
    index = {c.id: i for i, c in enumerate(chunks)}
    fractions = schedule.chunk_fractions()
    fraction = [fractions[c.id] for c in chunks]

    # ---------------------------------------------------------------- paths and load
    # A Schedule's paths already run between its ranks' nodes (Schedule checks that); here each
    # distinct path is resolved against the topology once, weighted by the chunks it carries.
    weight: dict[tuple[str, ...], float] = {}
    for step in schedule.steps:
        for t in step:
            weight[t.path] = weight.get(t.path, 0.0) + fraction[index[t.chunk]]
    link_ids: dict[tuple[str, str], int] = {}
    link_keys: list[tuple[str, str]] = []
    load: list[float] = []
    bad_paths: dict[tuple[str, ...], str] = {}
    for path, carried in weight.items():
        try:
            hops, _latency_s = resolve_path(topology, path)
        except ScheduleError as exc:
            bad_paths[path] = str(exc)
            continue
        for hop in hops:
            load[_link_id(hop, link_ids, link_keys, load)] += carried
    paths_ok = not bad_paths
    if bad_paths:  # name every transfer that takes a bad path
        for s, step in enumerate(schedule.steps):
            for k, t in enumerate(step):
                if t.path in bad_paths:
                    errors.add(f"{_where(s, k, t)}: path {'-'.join(t.path)}: {bad_paths[t.path]}")

    # ------------------------------------------------------------------ replay
    if schedule.collective.is_routed:
        _replay_alltoall(schedule, chunks, index, errors)
    else:
        _replay(schedule, chunks, index, errors)

    # ----------------------------------------------------------------- measures
    bw = [graph.edges[key]["record"].bw_bytes_per_s for key in link_keys]
    t_bw_s_per_byte = 0.0
    bottleneck = None
    for i, key in enumerate(link_keys):
        per_byte = load[i] / bw[i]
        if per_byte > t_bw_s_per_byte:
            t_bw_s_per_byte, bottleneck = per_byte, key
    t_bw_s = None if size_bytes is None else size_bytes * t_bw_s_per_byte
    ab_time_s = None
    if size_bytes is not None and paths_ok:
        ab_time_s = _alpha_beta_time_s(schedule, topology, size_bytes, per_message_overhead_s)
    link_load = MappingProxyType({key: load[i] for i, key in enumerate(link_keys)})
    if errors.count:
        log.debug("schedule %s: %d errors, first: %s", schedule.name, errors.count, errors.messages[0])
    return Verification(
        ok=errors.count == 0,
        errors=tuple(errors.messages),
        error_count=errors.count,
        t_bw_s_per_byte=t_bw_s_per_byte,
        t_bw_s=t_bw_s,
        alpha_beta_time_s=ab_time_s,
        link_load=link_load,
        bottleneck_link=bottleneck,
    )


def _link_id(hop: tuple[str, str], link_ids: dict, link_keys: list, load: list) -> int:
    i = link_ids.get(hop)
    if i is None:
        i = link_ids[hop] = len(link_keys)
        link_keys.append(hop)
        load.append(0.0)
    return i


def _check_chunks(schedule: Schedule, chunks: list, errors: _Errors) -> None:
    if not chunks:
        errors.add("the schedule has no chunks")
        return
    position = 0.0
    for c in chunks:
        if not math.isclose(c.offset, position, abs_tol=_TOL):
            errors.add(f"chunk {c.id} starts at {c.offset}, expected {position}: chunks must tile [0, 1)")
        position = c.end
    if not math.isclose(position, 1.0, abs_tol=_TOL):
        errors.add(f"chunks end at {position}, expected 1")
    if schedule.collective in (Collective.ALLGATHER, Collective.REDUCE_SCATTER):
        n = schedule.world_size
        for c in chunks:
            owner = schedule.owner(c)
            if c.end > (owner + 1) / n + _TOL:
                errors.add(
                    f"chunk {c.id} [{c.offset}, {c.end}) straddles the boundary of rank {owner}'s shard "
                    f"[{owner / n}, {(owner + 1) / n})"
                )


def _initial_state(schedule: Schedule, chunks: list) -> list[list[int]]:
    n = schedule.world_size
    nc = len(chunks)
    c = schedule.collective
    if c in (Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.REDUCE):
        return [[1 << r] * nc for r in range(n)]
    if c is Collective.ALLGATHER:
        owners = [schedule.owner(ch) for ch in chunks]
        return [[(1 << r) if owners[i] == r else 0 for i in range(nc)] for r in range(n)]
    root = schedule.root
    return [[(1 << root) if r == root else 0] * nc for r in range(n)]


def _replay(schedule: Schedule, chunks: list, index: dict[int, int], errors: _Errors) -> None:
    state = _initial_state(schedule, chunks)
    copy = Op.COPY
    for s, step in enumerate(schedule.steps):
        # key (dst, chunk index) -> [op, mask, transfer number]
        writes: dict[tuple[int, int], list] = {}
        for k, t in enumerate(step):
            ci = index[t.chunk]
            mask = state[t.src][ci]
            if not mask:
                errors.add(f"{_where(s, k, t)}: rank {t.src} sends chunk {t.chunk} but holds nothing for it")
                continue
            key = (t.dst, ci)
            w = writes.get(key)
            if w is None:
                writes[key] = [t.op, mask, k]
            elif t.op is copy or w[0] is copy:
                errors.add(
                    f"{_where(s, k, t)}: rank {t.dst} chunk {t.chunk} is also written by transfer {w[2]} of this step "
                    "and one of them is a copy"
                )
            elif w[1] & mask:
                errors.add(
                    f"{_where(s, k, t)}: reduce into rank {t.dst} chunk {t.chunk} adds contributions of ranks "
                    f"{_ranks(w[1] & mask)} that transfer {w[2]} of this step also adds"
                )
            else:
                w[1] |= mask
        for (dst, ci), (op, mask, k) in writes.items():
            if op is copy:
                state[dst][ci] = mask
                continue
            old = state[dst][ci]
            if old & mask:
                errors.add(
                    f"{_where(s, k, step[k])}: reduce counts the contributions of "
                    f"ranks {_ranks(old & mask)} twice at rank {dst}"
                )
            state[dst][ci] = old | mask
    _check_post(schedule, chunks, state, errors)


def _where(s: int, k: int, t: Transfer) -> str:
    """How an error names transfer ``k`` of step ``s``."""
    return f"step {s} transfer {k} ({t.src}->{t.dst} chunk {t.chunk})"


def _replay_alltoall(schedule: Schedule, chunks: list, index: dict[int, int], errors: _Errors) -> None:
    """An all-to-all moves copies: chunk c starts at rank ``c.src`` only, a rank may forward a
    chunk it holds (a relay keeps a copy aside), and ``c.dst`` must receive it exactly once."""
    holders = [1 << c.src for c in chunks]  # bitmask of the ranks holding each chunk
    delivered = [0] * len(chunks)
    for s, step in enumerate(schedule.steps):
        written: dict[tuple[int, int], int] = {}
        for k, t in enumerate(step):
            ci = index[t.chunk]
            chunk = chunks[ci]
            where = f"step {s} transfer {k} ({t.src}->{t.dst} chunk {t.chunk} of rank {chunk.src} -> rank {chunk.dst})"
            if t.op is not Op.COPY:
                errors.add(f"{where}: an all-to-all only copies, it never reduces")
            elif not holders[ci] >> t.src & 1:
                errors.add(f"{where}: rank {t.src} sends chunk {t.chunk} but holds nothing for it")
            elif (t.dst, ci) in written:
                errors.add(f"{where}: rank {t.dst} chunk {t.chunk} is also written by transfer {written[t.dst, ci]} of this step")
            else:
                written[t.dst, ci] = k
        for dst, ci in written:  # applied after the step: its transfers read the state before it
            holders[ci] |= 1 << dst
            delivered[ci] += dst == chunks[ci].dst
    for ci, chunk in enumerate(chunks):
        if delivered[ci] != 1:
            what = "never receives" if not delivered[ci] else f"receives {delivered[ci]} times"
            errors.add(f"rank {chunk.dst} {what} chunk {chunk.id} (of rank {chunk.src} -> rank {chunk.dst}); it must arrive exactly once")


def _check_post(schedule: Schedule, chunks: list, state: list[list[int]], errors: _Errors) -> None:
    n = schedule.world_size
    full = (1 << n) - 1
    c = schedule.collective
    if c is Collective.ALLREDUCE:
        wanted = [(r, i, full) for r in range(n) for i in range(len(chunks))]
    elif c is Collective.REDUCE:
        wanted = [(schedule.root, i, full) for i in range(len(chunks))]
    elif c is Collective.REDUCE_SCATTER:
        wanted = [(schedule.owner(ch), i, full) for i, ch in enumerate(chunks)]
    elif c is Collective.ALLGATHER:
        owners = [schedule.owner(ch) for ch in chunks]
        wanted = [(r, i, 1 << owners[i]) for r in range(n) for i in range(len(chunks))]
    else:
        wanted = [(r, i, 1 << schedule.root) for r in range(n) for i in range(len(chunks))]
    for r, i, target in wanted:
        have = state[r][i]
        if have == target:
            continue
        chunk = chunks[i].id
        if not have:
            errors.add(f"rank {r} never receives chunk {chunk}")
        elif target == full:
            errors.add(f"rank {r} chunk {chunk} lacks the contributions of ranks {_ranks(full & ~have)}")
        else:
            errors.add(f"rank {r} chunk {chunk} holds the data of rank(s) {_ranks(have)} instead of rank {_ranks(target)}")


def _ranks(mask: int, shown: int = 6) -> str:
    """``"1, 4, 7"`` for a bitmask (first few ranks, then ``...``)."""
    out = []
    r = 0
    while mask and len(out) <= shown:
        low = mask & -mask
        r = low.bit_length() - 1
        out.append(str(r))
        mask ^= low
    text = ", ".join(out[:shown])
    return text + (", ..." if len(out) > shown or mask else "")
