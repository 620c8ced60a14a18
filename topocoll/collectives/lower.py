"""Lowering: from a :class:`~topocoll.solver.schedule.Schedule` to one program per rank.

A schedule speaks in fractions of a buffer and in transfers between ranks. A
:class:`RankProgram` speaks in element ranges ``[start, stop)`` of a flat buffer of ``count``
elements and in the sends and receives one rank posts, step by step. Lowering is pure: the
same schedule, rank and count always give the same program, and nothing is mutated.

Rules that both ends of every message derive the same way (so they always agree):

- Element boundaries of a chunk are ``round(offset * count)`` (contract 2). A chunk that
  covers no element (tiny buffers, zero elements) produces no message at all.
- Within one step, the transfers from rank ``a`` to rank ``b`` are sorted by element start and
  merged when they are contiguous and have the same op, so one message carries them.
- A merged message longer than ``max_message_elements`` is cut into equal segments (each a
  message of its own), so that the receiver can reduce one segment while the next is still on
  the wire.
- Every message between an ordered pair carries a tag equal to its sequence number among the
  messages of that pair in the whole program, plus :data:`FIRST_TAG`.
- Given the cluster's rails (:class:`~topocoll.topo.rails.Rails`), every message carries the
  channel of the rail its transfer's path leaves by (``Rails.channel_of``: 0 for the group's
  own transport, r + 1 for rail r): the executor sends it on the inner group bound to that
  rail's NICs. Transfers on different channels are never merged.

Transfers in one step read the values from before the step (contract 2). A receive whose range
this rank also sends in the same step, or that shares its range with another receive of the
step (unless both reduce: reductions commute), lands in a scratch area and is applied only after
every message of the step completed (``after_step``). Other receives are *isolated*: a ``COPY``
goes straight into the buffer, a ``REDUCE`` lands in scratch and is combined as soon as it
arrived.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from topocoll.errors import ScheduleError
from topocoll.solver.schedule import Collective, Op, Schedule, Transfer
from topocoll.topo.rails import Rails

__all__ = ["FIRST_TAG", "Send", "Recv", "ProgramStep", "RankProgram", "lower", "lower_all"]

FIRST_TAG = 1
"""Tag of the first message between a pair; tag 0 is left to the executor's own header messages."""


@dataclass(frozen=True, slots=True)
class Send:
    """Send elements ``[start, stop)`` of the buffer to rank ``peer`` with message tag ``tag``,
    on inner channel ``channel`` (0: the group's own transport; r + 1: the group of rail r)."""

    peer: int
    start: int
    stop: int
    tag: int
    channel: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.stop:
            raise ScheduleError(f"send to rank {self.peer}: empty or negative range [{self.start}, {self.stop})")

    @property
    def numel(self) -> int:
        """Number of elements sent."""
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class Recv:
    """Receive elements ``[start, stop)`` from rank ``peer`` with tag ``tag``.

    Parameters
    ----------
    peer, start, stop, tag
        As for :class:`Send`.
    op : Op
        ``COPY`` overwrites the range, ``REDUCE`` combines the received values into it.
    scratch_start : int or None
        Where the message lands in the step's scratch area, or None when it is received straight
        into the buffer (isolated copies only).
    after_step : bool
        Apply it only once every message of the step completed (its range is also read or
        written by another message of this rank in the step).
    channel : int
        The inner channel (rail) the message arrives on, as for :class:`Send`.
    """

    peer: int
    start: int
    stop: int
    tag: int
    op: Op
    scratch_start: int | None
    after_step: bool = False
    channel: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.stop:
            raise ScheduleError(f"receive from rank {self.peer}: empty or negative range [{self.start}, {self.stop})")
        if self.scratch_start is None and (self.op is Op.REDUCE or self.after_step):
            raise ScheduleError(f"receive from rank {self.peer}: a reduce or deferred copy must land in scratch space")

    @property
    def numel(self) -> int:
        """Number of elements received."""
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class ProgramStep:
    """The messages one rank posts in one schedule step, all concurrent."""

    sends: tuple[Send, ...]
    recvs: tuple[Recv, ...]

    @property
    def scratch_elements(self) -> int:
        """Scratch space this step needs, in elements."""
        return sum(r.numel for r in self.recvs if r.scratch_start is not None)


@dataclass(frozen=True, slots=True)
class RankProgram:
    """Everything one rank does to run a schedule on a buffer of ``count`` elements.

    Parameters
    ----------
    rank : int
        The rank (index into the schedule's ``ranks``) this program is for.
    world_size : int
        Number of ranks of the schedule.
    count : int
        Number of elements of the flat buffer (for allgather / reduce-scatter the large one).
    collective : Collective
        The collective of the schedule, for messages and checks.
    steps : tuple of ProgramStep
        Steps in order; steps where this rank has nothing to do are dropped.
    scratch_elements : int
        Scratch space the largest step needs, in elements.
    """

    rank: int
    world_size: int
    count: int
    collective: Collective
    steps: tuple[ProgramStep, ...]
    scratch_elements: int

    @property
    def message_count(self) -> int:
        """Number of sends plus receives in the program."""
        return sum(len(s.sends) + len(s.recvs) for s in self.steps)


@dataclass(frozen=True, slots=True)
class _Message:
    src: int
    dst: int
    start: int
    stop: int
    op: Op
    tag: int
    channel: int


def _merge_pair(ranges: list[tuple[int, int, Op]]) -> list[tuple[int, int, Op]]:
    """Sort ``(start, stop, op)`` ranges by start and merge contiguous ones with equal op."""
    merged: list[tuple[int, int, Op]] = []
    for start, stop, op in sorted(ranges, key=lambda r: (r[0], r[1], r[2].value)):
        if merged and merged[-1][1] == start and merged[-1][2] is op:
            merged[-1] = (merged[-1][0], stop, op)
        else:
            merged.append((start, stop, op))
    return merged


def _segments(start: int, stop: int, max_elements: int | None) -> list[tuple[int, int]]:
    """``[start, stop)`` cut into the fewest near-equal pieces of at most ``max_elements``."""
    length = stop - start
    if max_elements is None or length <= max_elements:
        return [(start, stop)]
    pieces = -(-length // max_elements)
    cuts = [start + (length * i) // pieces for i in range(pieces + 1)]
    return list(zip(cuts, cuts[1:]))


def _step_messages(
    step: tuple[Transfer, ...],
    bounds: dict[int, tuple[int, int]],
    counters: dict[tuple[int, int], int],
    max_message_elements: int | None,
    rails: Rails | None,
) -> list[_Message]:
    """Merged, segmented, tagged messages of one step (the same list on every rank)."""
    by_lane: dict[tuple[int, int, int], list[tuple[int, int, Op]]] = defaultdict(list)
    for transfer in step:
        start, stop = bounds[transfer.chunk]
        if stop > start:
            channel = rails.channel_of(transfer.path) if rails is not None else 0
            by_lane[(transfer.src, transfer.dst, channel)].append((start, stop, transfer.op))
    messages = []
    for src, dst, channel in sorted(by_lane):
        for merged_start, merged_stop, op in _merge_pair(by_lane[(src, dst, channel)]):
            for start, stop in _segments(merged_start, merged_stop, max_message_elements):
                tag = FIRST_TAG + counters[(src, dst)]
                counters[(src, dst)] += 1
                messages.append(_Message(src, dst, start, stop, op, tag, channel))
    return messages


def _overlaps(start: int, stop: int, others: list[tuple[int, int]]) -> bool:
    return any(start < o_stop and o_start < stop for o_start, o_stop in others)


def _lower_step(messages: list[_Message], rank: int) -> ProgramStep:
    outgoing = [m for m in messages if m.src == rank]
    incoming = [m for m in messages if m.dst == rank]
    sent_ranges = [(m.start, m.stop) for m in outgoing]
    sends = tuple(Send(m.dst, m.start, m.stop, m.tag, m.channel) for m in outgoing)
    recvs = []
    scratch = 0
    for i, m in enumerate(incoming):
        # Reductions commute, so two reduces into one range may land in any order; anything
        # else sharing the range (a send, a copy) must see it as it was before the step.
        others = [(o.start, o.stop) for j, o in enumerate(incoming) if j != i and not (o.op is Op.REDUCE and m.op is Op.REDUCE)]
        isolated = not _overlaps(m.start, m.stop, sent_ranges + others)
        if isolated and m.op is Op.COPY:
            recvs.append(Recv(m.src, m.start, m.stop, m.tag, m.op, None, channel=m.channel))
        else:
            recvs.append(Recv(m.src, m.start, m.stop, m.tag, m.op, scratch, after_step=not isolated, channel=m.channel))
            scratch += m.stop - m.start
    return ProgramStep(sends, tuple(recvs))


def _chunk_bounds(schedule: Schedule, count: int) -> dict[int, tuple[int, int]]:
    return {chunk.id: chunk.bounds(count) for chunk in schedule.chunks}


def _check(schedule: Schedule, count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ScheduleError(f"element count must be an integer >= 0, got {count!r}")


def lower(
    schedule: Schedule, rank: int, count: int, max_message_elements: int | None = None, rails: Rails | None = None
) -> RankProgram:
    """Lower ``schedule`` to the program of rank ``rank`` on a buffer of ``count`` elements.

    Parameters
    ----------
    schedule : Schedule
        A (verified) schedule.
    rank : int
        Index into ``schedule.ranks``.
    count : int
        Elements of the flat buffer. For allgather and reduce-scatter this is the large buffer
        (``world_size`` shards).
    max_message_elements : int, optional
        Cut longer messages into segments of at most this many elements (default: never).
    rails : Rails, optional
        The cluster's rails: each message then carries the rail its path leaves by.

    Returns
    -------
    RankProgram
        The ordered steps of sends and receives of that rank.

    Raises
    ------
    ScheduleError
        ``rank`` is outside the schedule or ``count`` is negative.

    See Also
    --------
    lower_all : every rank's program at once.
    topocoll.solver.verify.verify : what a schedule must pass before it is lowered.

    Examples
    --------
    >>> from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer
    >>> s = Schedule(Collective.BROADCAST, ("a", "b"), 0, "", (Chunk(0, 0.0, 1.0),),
    ...              ((Transfer(0, 1, 0, Op.COPY, ("a", "b")),),))
    >>> lower(s, 1, 8).steps[0].recvs[0].stop
    8
    """
    return lower_all(schedule, count, ranks=(rank,), max_message_elements=max_message_elements, rails=rails)[0]


def lower_all(
    schedule: Schedule,
    count: int,
    ranks: tuple[int, ...] | None = None,
    max_message_elements: int | None = None,
    rails: Rails | None = None,
) -> tuple[RankProgram, ...]:
    """Lower ``schedule`` for several ranks at once (all of them by default).

    Parameters
    ----------
    schedule : Schedule
    count : int
        Elements of the flat buffer.
    ranks : tuple of int, optional
        Which ranks to lower for; default every rank in order.
    max_message_elements, rails : optional
        As for :func:`lower`.

    Returns
    -------
    tuple of RankProgram
        One program per requested rank, in the order requested.

    See Also
    --------
    lower : one rank's program.
    """
    _check(schedule, count)
    if max_message_elements is not None and (
        isinstance(max_message_elements, bool) or not isinstance(max_message_elements, int) or max_message_elements < 1
    ):
        raise ScheduleError(f"max_message_elements must be an integer >= 1, got {max_message_elements!r}")
    n = schedule.world_size
    wanted = tuple(range(n)) if ranks is None else tuple(ranks)
    for rank in wanted:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
            raise ScheduleError(f"rank {rank!r} is not a rank of this {n}-rank schedule")
    bounds = _chunk_bounds(schedule, count)
    counters: dict[tuple[int, int], int] = defaultdict(int)
    per_rank: dict[int, list[ProgramStep]] = {r: [] for r in wanted}
    for step in schedule.steps:
        messages = _step_messages(step, bounds, counters, max_message_elements, rails)
        for rank in wanted:
            lowered = _lower_step(messages, rank)
            if lowered.sends or lowered.recvs:
                per_rank[rank].append(lowered)
    programs = []
    for rank in wanted:
        steps = tuple(per_rank[rank])
        programs.append(
            RankProgram(
                rank=rank,
                world_size=n,
                count=count,
                collective=schedule.collective,
                steps=steps,
                scratch_elements=max((s.scratch_elements for s in steps), default=0),
            )
        )
    return tuple(programs)
