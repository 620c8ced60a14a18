"""MSCCL's XML algorithm format: a schedule written for NCCL runtimes that carry the MSCCL
executor, and such a file read back into a schedule the verifier can replay.

The format, as the two executors' parsers read it (Azure's ``msccl-executor-nccl``, the
maintained one, and Microsoft's original ``msccl``; the facts below are theirs):

- ``<algo name proto nchannels nchunksperloop ngpus coll inplace outofplace minBytes maxBytes>``;
  the buffer is cut into ``nchunksperloop`` equal chunks. Azure's executor requires
  ``outofplace``, ``minBytes`` and ``maxBytes``; Microsoft's names reduce-scatter
  ``reduce_scatter`` (Azure's ``reducescatter``) and picks an algorithm for sizes in
  ``[minBytes, maxBytes)``, so ``maxBytes`` is written out (0 would mean "never" there).
- ``<gpu id i_chunks o_chunks s_chunks>``: the input, output and scratch buffers in chunks.
- ``<tb id send recv chan>``: a thread block, with at most one peer it sends to and one it
  receives from (-1: none) on a channel; ids run from 0 without gaps.
- ``<step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep>``: ``s`` sends ``cnt``
  chunks from ``srcbuf[srcoff]``, ``r`` receives them into ``dstbuf[dstoff]``, ``rrc`` receives
  and adds ``srcbuf[srcoff]``, writing ``dstbuf[dstoff]``; ``nop`` only waits. A step waits for
  step ``deps`` of thread block ``depid`` of its GPU (one such wait a step: more go on ``nop``
  steps before it), and a step others wait for says ``hasdep="1"``. Sends and receives pair up
  in order on each (sender, receiver, channel).
- Limits: ``cnt`` below 72 (``MSCCL_MAX_COUNT``), 32 channels, at most 32 sending and 32
  receiving thread blocks a channel, 64 steps a thread block in Azure's default build (256 in
  Microsoft's), 216 thread blocks a GPU in Microsoft's; no XML declaration and no tabs.

:func:`to_msccl` writes a verified schedule in place (allgather in the output buffer, the
others in the input buffer, as the MSCCL tools write in-place programs). The buffer is cut into
``nchunksperloop`` equal chunks, so each of the schedule's chunk boundaries moves to the nearest
chunk edge (a chunk narrower than half a grid chunk disappears and its neighbours take its
elements: still correct, slightly less balanced; :attr:`MscclProgram.max_shift` says by how
much). Every transfer becomes a send on one GPU and a receive on the other; the transfers
between two GPUs are spread over channels, and each GPU waits where the schedule's order
requires it: a send for the receives into its chunks of earlier steps, a receive for the sends of
its chunks up to its step and the receives into them before it.

:func:`from_msccl` runs a program's thread blocks round by round, each send meeting its receive,
and records each pair as a transfer of that round: a program that stops before its end is
reported, and the schedule it gives is checked by :func:`topocoll.solver.verify.verify` like any
other.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from xml.etree import ElementTree

from topocoll.errors import FormatError, ScheduleError
from topocoll.solver.routing import route_table
from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer
from topocoll.topo.model import Topology
from topocoll.topo.safe_xml import XmlElement, read_xml

__all__ = ["DIALECTS", "MscclProgram", "from_msccl", "to_msccl"]

MAX_COUNT = 71
"""Most chunks one step moves (``cnt`` < ``MSCCL_MAX_COUNT`` = 72 in both executors)."""

MAX_CHANNELS = 32
"""Channels of a program (``MAXCHANNELS``)."""

MAX_TBS_PER_CHANNEL = 32
"""Sending (and, apart, receiving) thread blocks a channel (``MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL``)."""

DIALECTS = {
    # name: (reduce-scatter's name, most steps a thread block, most thread blocks a GPU)
    "azure": ("reducescatter", 64, 1024),
    "microsoft": ("reduce_scatter", 256, 216),
}
"""The two executors' differences: Azure's ``msccl-executor-nccl`` (default build) and Microsoft's ``msccl``."""

MAX_BYTES = 1 << 40
"""``maxBytes`` written: the algorithm applies to every size up to 1 TiB in both executors."""

_NAMES = {
    Collective.ALLREDUCE: "allreduce",
    Collective.ALLGATHER: "allgather",
    Collective.BROADCAST: "broadcast",
    Collective.REDUCE: "reduce",
}


@dataclass(frozen=True, slots=True)
class MscclProgram:
    """An exported program.

    Attributes
    ----------
    text : str
        The XML.
    chunks_per_loop : int
        ``nchunksperloop``: the grid the schedule's chunks were moved onto.
    channels : int
    thread_blocks : int
        The most thread blocks of one GPU.
    steps : int
        The most steps of one thread block (``nop`` steps included).
    elements : int
        XML elements in the file.
    max_shift : float
        The farthest a chunk boundary moved onto the grid, as a fraction of the buffer.
    """

    text: str
    chunks_per_loop: int
    channels: int
    thread_blocks: int
    steps: int
    elements: int
    max_shift: float


@dataclass(slots=True)
class _Piece:
    """Up to :data:`MAX_COUNT` grid chunks ``[start, start + count)`` that move ``src -> dst`` in ``step``."""

    step: int
    src: int
    dst: int
    start: int
    count: int
    op: Op
    channel: int = 0


MAX_ELEMENTS = 4096
"""XML elements both executors' readers keep (``MAX_NODES`` of their XML parsers)."""


def to_msccl(schedule: Schedule, chunks_per_loop: int | None = None, *, dialect: str = "azure", proto: str = "Simple") -> MscclProgram:
    """``schedule`` as an MSCCL XML algorithm (module docstring).

    Parameters
    ----------
    schedule : Schedule
        A verified schedule (:func:`topocoll.solver.verify.verify`) of allreduce, allgather,
        reduce-scatter, broadcast or reduce.
    chunks_per_loop : int, optional
        The grid (``nchunksperloop``); a multiple of the ranks for allgather and reduce-scatter.
        Default: the schedule's chunk count rounded up to a multiple of the ranks, halved
        (staying a multiple of the ranks) until the file has at most :data:`MAX_ELEMENTS`
        elements, if it can.
    dialect : {"azure", "microsoft"}
        Which executor reads it (:data:`DIALECTS`).
    proto : {"Simple", "LL", "LL128"}
        NCCL's protocol for the program.

    Returns
    -------
    MscclProgram

    Raises
    ------
    ScheduleError
        An all-to-all (MSCCL moves equal blocks, topocoll's carry a matrix), a grid that does not
        fit the collective, or a program beyond the executor's limits even on 32 channels.
    """
    if dialect not in DIALECTS:
        raise ScheduleError(f"unknown MSCCL dialect {dialect!r}; expected {' or '.join(DIALECTS)}")
    if proto not in ("Simple", "LL", "LL128"):
        raise ScheduleError(f"unknown NCCL protocol {proto!r}; expected Simple, LL or LL128")
    collective = schedule.collective
    if collective.is_routed:
        raise ScheduleError("an all-to-all schedule carries a traffic matrix; MSCCL's alltoall moves equal blocks")
    n = schedule.world_size
    if chunks_per_loop is None:
        grid = max(n, math.ceil(len(schedule.chunks) / n) * n)
        while True:
            program = to_msccl(schedule, grid, dialect=dialect, proto=proto)
            smaller = max(n, grid // 2 // n * n)
            if program.elements <= MAX_ELEMENTS or smaller == grid:
                return program
            grid = smaller
    sharded = collective in (Collective.ALLGATHER, Collective.REDUCE_SCATTER)
    if chunks_per_loop < 1 or (sharded and chunks_per_loop % n):
        raise ScheduleError(f"chunks per loop must be >= 1{' and a multiple of the ranks (' + str(n) + ')' if sharded else ''}, got {chunks_per_loop}")
    grid, shift = _grid(schedule, chunks_per_loop)
    pieces = _pieces(schedule, grid)
    reduce_scatter_name, max_steps, max_tbs = DIALECTS[dialect]
    for channels in range(1, MAX_CHANNELS + 1):
        _spread(pieces, channels)
        gpus = _thread_blocks(pieces, n)
        if any(len(tbs) > max_tbs for tbs in gpus):
            break  # more channels only add thread blocks
        if _fits(gpus, max_steps):
            break
    else:
        channels = MAX_CHANNELS
    worst_steps = max((len(tb.steps) for tbs in gpus for tb in tbs), default=0)
    worst_tbs = max((len(tbs) for tbs in gpus), default=0)
    if worst_steps > max_steps or worst_tbs > max_tbs:
        raise ScheduleError(
            f"the program needs {worst_tbs} thread blocks on one GPU and {worst_steps} steps in one thread block, "
            f"beyond the {dialect} executor's {max_tbs} and {max_steps}: export with fewer chunks per loop"
        )
    buffer = "o" if collective is Collective.ALLGATHER else "i"
    name = reduce_scatter_name if collective is Collective.REDUCE_SCATTER else _NAMES[collective]
    algo = ElementTree.Element("algo", {
        "name": schedule.name or "topocoll", "proto": proto, "nchannels": str(channels), "nchunksperloop": str(chunks_per_loop),
        "ngpus": str(n), "coll": name, "inplace": "1", "outofplace": "0", "minBytes": "0", "maxBytes": str(MAX_BYTES),
    })
    elements = 1
    for rank, tbs in enumerate(gpus):
        gpu = ElementTree.SubElement(algo, "gpu", {
            "id": str(rank),
            "i_chunks": "0" if buffer == "o" else str(chunks_per_loop),
            "o_chunks": str(chunks_per_loop) if buffer == "o" else "0",
            "s_chunks": "0",
        })
        elements += 1
        for tb in tbs:
            block = ElementTree.SubElement(gpu, "tb", {"id": str(tb.id), "send": str(tb.send), "recv": str(tb.recv), "chan": str(tb.channel)})
            elements += 1
            for s, entry in enumerate(tb.steps):
                ElementTree.SubElement(block, "step", _step_attrs(s, entry, buffer))
                elements += 1
    ElementTree.indent(algo, space="  ")
    text = ElementTree.tostring(algo, encoding="unicode").replace(" />", "/>") + "\n"  # as NCCL writes empty elements
    return MscclProgram(text, chunks_per_loop, channels, worst_tbs, worst_steps, elements, shift)


def _grid(schedule: Schedule, units: int) -> tuple[dict[int, tuple[int, int]], float]:
    """Each chunk's grid range (empty ranges left out) and the farthest a boundary moved."""
    grid: dict[int, tuple[int, int]] = {}
    shift = 0.0
    for chunk in schedule.chunks:
        start, stop = round(chunk.offset * units), round(chunk.end * units)
        shift = max(shift, abs(start / units - chunk.offset), abs(stop / units - chunk.end))
        if stop > start:
            grid[chunk.id] = (start, stop)
    return grid, shift


def _pieces(schedule: Schedule, grid: dict[int, tuple[int, int]]) -> list[_Piece]:
    """The transfers on the grid: neighbours of one step, pair and op merged, then cut to :data:`MAX_COUNT`."""
    pieces: list[_Piece] = []
    for s, step in enumerate(schedule.steps):
        moved = sorted((t.src, t.dst, t.op.value, *grid[t.chunk]) for t in step if t.chunk in grid)
        merged: list[list] = []
        for src, dst, op, start, stop in moved:
            last = merged[-1] if merged else None
            if last is not None and (last[0], last[1], last[2], last[4]) == (src, dst, op, start):
                last[4] = stop
            else:
                merged.append([src, dst, op, start, stop])
        for src, dst, op, start, stop in merged:
            for first in range(start, stop, MAX_COUNT):
                pieces.append(_Piece(s, src, dst, first, min(MAX_COUNT, stop - first), Op(op)))
    return pieces


def _spread(pieces: list[_Piece], channels: int) -> None:
    """The k-th piece between two GPUs goes on channel ``k mod channels`` (the same rule at both ends)."""
    seen: dict[tuple[int, int], int] = defaultdict(int)
    for piece in pieces:
        piece.channel = seen[piece.src, piece.dst] % channels
        seen[piece.src, piece.dst] += 1


@dataclass(slots=True)
class _Tb:
    id: int
    send: int
    recv: int
    channel: int
    pieces: list[int]  # indices into the pieces, in order
    steps: list[tuple] = field(default_factory=list)  # (type, piece or None, (tb, step) waited for or None, waited for by others)


def _thread_blocks(pieces: list[_Piece], n: int) -> list[list[_Tb]]:
    """Per GPU: one sending thread block per (peer, channel) and one receiving, their steps in
    the schedule's order, with the waits the order needs (module docstring)."""
    gpus: list[list[_Tb]] = []
    owner: dict[tuple[int, int], tuple[int, int]] = {}  # (gpu, piece) -> (tb id, position among its pieces)
    for rank in range(n):
        sends = sorted({(p.dst, p.channel) for p in pieces if p.src == rank})
        receives = sorted({(p.src, p.channel) for p in pieces if p.dst == rank})
        tbs = [_Tb(i, peer, -1, ch, []) for i, (peer, ch) in enumerate(sends)]
        tbs += [_Tb(len(sends) + i, -1, peer, ch, []) for i, (peer, ch) in enumerate(receives)]
        by_key = {("s", tb.send, tb.channel) if tb.send >= 0 else ("r", tb.recv, tb.channel): tb for tb in tbs}
        for k, p in enumerate(pieces):
            for key in (("s", p.dst, p.channel) if p.src == rank else None, ("r", p.src, p.channel) if p.dst == rank else None):
                if key is not None:
                    tb = by_key[key]
                    owner[rank, k] = (tb.id, len(tb.pieces))
                    tb.pieces.append(k)
        gpus.append(tbs)
    for rank, tbs in enumerate(gpus):
        waits = _waits(pieces, rank)
        last_of: dict[int, dict[int, int]] = {tb.id: {} for tb in tbs}  # tb -> piece position -> step index
        for tb in tbs:
            for position, k in enumerate(tb.pieces):
                deps = sorted({owner[rank, w] for w in waits.get(k, ()) if owner[rank, w][0] != tb.id})
                latest: dict[int, int] = {}
                for dep_tb, dep_position in deps:  # of one thread block only its latest step matters
                    latest[dep_tb] = max(latest.get(dep_tb, -1), dep_position)
                deps = sorted(latest.items())
                for dep in deps[:-1]:
                    tb.steps.append(("nop", None, dep))
                last_of[tb.id][position] = len(tb.steps)
                tb.steps.append(("s" if pieces[k].src == rank else ("rrc" if pieces[k].op is Op.REDUCE else "r"), k, deps[-1] if deps else None))
        needed: set[tuple[int, int]] = set()
        resolved = []
        for tb in tbs:
            steps = []
            for kind, k, dep in tb.steps:
                target = None if dep is None else (dep[0], last_of[dep[0]][dep[1]])
                if target is not None:
                    needed.add(target)
                steps.append((kind, k, target))
            resolved.append(steps)
        for tb, steps in zip(tbs, resolved):
            tb.steps = [(kind, None if k is None else pieces[k], target, (tb.id, s) in needed) for s, (kind, k, target) in enumerate(steps)]
    return gpus


def _waits(pieces: list[_Piece], rank: int) -> dict[int, list[int]]:
    """For each piece of ``rank``, the pieces of ``rank`` it must wait for: a send for the earlier
    steps' receives into its chunks; a receive for the sends of its chunks up to its step and
    the receives into them before it (reduces into one chunk never overlap)."""
    mine = [k for k, p in enumerate(pieces) if p.src == rank or p.dst == rank]
    order = sorted(mine, key=lambda k: (pieces[k].step, pieces[k].dst == rank, k))  # a step's sends read before its receives write
    last_write: dict[int, int] = {}
    last_read: dict[int, list[int]] = defaultdict(list)
    waits: dict[int, list[int]] = {}
    for k in order:
        p = pieces[k]
        units = range(p.start, p.start + p.count)
        if p.src == rank:
            waits[k] = sorted({last_write[u] for u in units if u in last_write})  # of earlier steps: this step's come after
            for u in units:
                last_read[u].append(k)
        else:
            found = {last_write[u] for u in units if u in last_write}
            found |= {r for u in units for r in last_read.get(u, ())}
            waits[k] = sorted(found)
            for u in units:
                last_write[u] = k
                last_read[u] = []  # the reads before this write are waited for; later writes wait for this one
    return waits


def _fits(gpus: list[list[_Tb]], max_steps: int) -> bool:
    channel_sides: dict[tuple[int, int, str], int] = defaultdict(int)
    for rank, tbs in enumerate(gpus):
        for tb in tbs:
            channel_sides[rank, tb.channel, "s" if tb.send >= 0 else "r"] += 1
            if len(tb.steps) > max_steps:
                return False
    return all(count <= MAX_TBS_PER_CHANNEL for count in channel_sides.values())


def _step_attrs(s: int, entry: tuple, buffer: str) -> dict[str, str]:
    kind, piece, target, needed = entry
    if piece is None:
        start, count = -1, 0
    else:
        start, count = piece.start, piece.count
    depid, deps = target if target is not None else (-1, -1)
    return {
        "s": str(s), "type": kind, "srcbuf": buffer, "srcoff": str(start), "dstbuf": buffer, "dstoff": str(start),
        "cnt": str(count), "depid": str(depid), "deps": str(deps), "hasdep": "1" if needed else "0",
    }


# ------------------------------------------------------------------------------ reading back
def from_msccl(text: str, topology: Topology, ranks: Sequence[str], root: int | None = None, source: str = "<msccl>") -> Schedule:
    """The schedule an MSCCL XML program carries out, by running its thread blocks.

    Parameters
    ----------
    text : str
        The XML (steps of type ``s``, ``r``, ``rrc`` and ``nop``, every GPU in one buffer).
    topology : Topology
    ranks : sequence of str
        The topology nodes of GPUs 0, 1, ...: transfers take the route table's path between them.
    root : int, optional
        The root of a broadcast or reduce (the XML does not say).

    Returns
    -------
    Schedule
        One chunk per grid chunk; round r of the run is step r. Not verified: see
        :func:`topocoll.solver.verify.verify`.

    Raises
    ------
    FormatError
        Not an MSCCL algorithm, a missing or malformed attribute, a step type or buffer use
        outside what is listed above, a receive that does not match its send, or a program
        that stops before its end; each names the GPU, thread block and step.
    """
    root_element = read_xml(text, source).root
    if root_element.tag != "algo":
        raise FormatError(f"{source}: the root element is <{root_element.tag}>, expected <algo>")
    collective = _collective(_attr(root_element, "coll", source), source)
    n = _int_attr(root_element, "ngpus", source)
    units = _int_attr(root_element, "nchunksperloop", source)
    if n != len(ranks):
        raise FormatError(f"{source}: ngpus {n}, but {len(ranks)} ranks were given")
    programs = _programs(root_element, n, source)
    routes = route_table(topology, ranks)
    paths = {(a, b): routes.path(ranks[a], ranks[b]) for a in range(n) for b in range(n) if a != b}
    steps = _run(programs, n, source)
    transfers = [
        [Transfer(src, dst, u, op, paths[src, dst]) for src, dst, start, count, op in moves for u in range(start, start + count)]
        for moves in steps
    ]
    chunks = tuple(Chunk(u, u / units, 1.0 / units) for u in range(units))
    return Schedule(
        collective=collective,
        ranks=tuple(ranks),
        root=root if collective.is_rooted else None,
        topology_digest=topology.digest(),
        chunks=chunks,
        steps=tuple(tuple(step) for step in transfers if step),
        name=root_element.attrs.get("name", "msccl"),
    )


def _collective(name: str, source: str) -> Collective:
    for collective, known in _NAMES.items():
        if name == known:
            return collective
    if name in ("reducescatter", "reduce_scatter"):
        return Collective.REDUCE_SCATTER
    raise FormatError(f"{source}: collective {name!r} is not one topocoll replays ({', '.join(_NAMES.values())}, reducescatter)")


def _attr(element: XmlElement, name: str, source: str) -> str:
    value = element.attrs.get(name)
    if value is None:
        raise FormatError(f"{source}: line {element.line}: <{element.tag}> has no {name}")
    return value


def _int_attr(element: XmlElement, name: str, source: str) -> int:
    value = _attr(element, name, source)
    try:
        return int(value)
    except ValueError:
        raise FormatError(f"{source}: line {element.line}: <{element.tag}> {name}={value!r} is not an integer") from None


@dataclass(slots=True)
class _Step:
    kind: str
    start: int
    count: int
    depid: int
    deps: int
    where: str


@dataclass(slots=True)
class _Block:
    gpu: int
    id: int
    send: int
    recv: int
    channel: int
    steps: list[_Step]
    pc: int = 0


def _programs(algo: XmlElement, n: int, source: str) -> list[dict[int, _Block]]:
    programs: list[dict[int, _Block]] = [{} for _ in range(n)]
    for gpu in algo.find_all("gpu"):
        g = _int_attr(gpu, "id", source)
        if not 0 <= g < n or programs[g]:
            raise FormatError(f"{source}: line {gpu.line}: gpu id {g} is repeated or not in 0..{n - 1}")
        for tb in gpu.find_all("tb"):
            block = _Block(g, _int_attr(tb, "id", source), _int_attr(tb, "send", source), _int_attr(tb, "recv", source), _int_attr(tb, "chan", source), [])
            for step in tb.find_all("step"):
                where = f"gpu {g} tb {block.id} step {_attr(step, 's', source)}"
                kind = _attr(step, "type", source)
                if kind not in ("s", "r", "rrc", "nop"):
                    raise FormatError(f"{source}: line {step.line}: {where}: step type {kind!r} is not one topocoll replays (s, r, rrc, nop)")
                start, dst_start = _int_attr(step, "srcoff", source), _int_attr(step, "dstoff", source)
                if kind != "nop" and start != dst_start:
                    raise FormatError(f"{source}: line {step.line}: {where}: moves chunks from offset {start} to {dst_start}, which topocoll's schedules do not express")
                block.steps.append(_Step(kind, start, _int_attr(step, "cnt", source), _int_attr(step, "depid", source), _int_attr(step, "deps", source), where))
            programs[g][block.id] = block
    return programs


def _run(programs: list[dict[int, _Block]], n: int, source: str) -> list[list[tuple]]:
    """Rounds of the program, each round's moves ``(src, dst, start, count, op)``.

    A send and its receive happen together (as a rendezvous, which the programs :func:`to_msccl`
    writes never need to avoid): in each round, after every ``nop`` whose wait is done, every
    link whose sending block is at a send and whose receiving block is at a receive, both with
    their waits done as the round began, moves. So the moves of a round read what the GPUs held
    before it, as a schedule's steps do."""
    done: set[tuple[int, int, int]] = set()  # (gpu, tb, step)
    trace: list[tuple[_Block, int]] = []  # every step run, in order
    blocks = [block for program in programs for block in program.values()]
    senders: dict[tuple[int, int, int], _Block] = {}
    receivers: dict[tuple[int, int, int], _Block] = {}
    for block in blocks:
        for peer, table, key in ((block.send, senders, (block.gpu, block.send, block.channel)), (block.recv, receivers, (block.recv, block.gpu, block.channel))):
            if peer >= 0:
                if not 0 <= peer < n or peer == block.gpu:
                    raise FormatError(f"{source}: gpu {block.gpu} tb {block.id}: peer {peer} is not another gpu of 0..{n - 1}")
                if key in table:
                    raise FormatError(f"{source}: gpu {block.gpu} tb {block.id}: a second thread block on link gpu {key[0]} -> gpu {key[1]} channel {key[2]}")
                table[key] = block
    rounds: list[list[tuple]] = []

    def ready(block: _Block) -> bool:
        step = block.steps[block.pc]
        return step.depid < 0 or (block.gpu, step.depid, step.deps) in done

    while any(block.pc < len(block.steps) for block in blocks):
        waited = True
        while waited:
            waited = False
            for block in blocks:
                while block.pc < len(block.steps) and block.steps[block.pc].kind == "nop" and ready(block):
                    trace.append((block, block.pc))
                    done.add((block.gpu, block.id, block.pc))
                    block.pc += 1
                    waited = True
        matched = []
        for key, sender in senders.items():
            receiver = receivers.get(key)
            if receiver is None or sender.pc >= len(sender.steps) or receiver.pc >= len(receiver.steps):
                continue
            send, receive = sender.steps[sender.pc], receiver.steps[receiver.pc]
            if send.kind == "s" and receive.kind in ("r", "rrc") and ready(sender) and ready(receiver):
                if (send.start, send.count) != (receive.start, receive.count):
                    raise FormatError(
                        f"{source}: {receive.where}: receives {receive.count} chunks at {receive.start} from gpu {key[0]}, "
                        f"whose next send on channel {key[2]} ({send.where}) is {send.count} chunks at {send.start}"
                    )
                matched.append((sender, receiver, send, receive))
        if not matched:
            stuck = next(block for block in blocks if block.pc < len(block.steps))
            raise FormatError(f"{source}: the program stops: {stuck.steps[stuck.pc].where} waits for ever")
        moves = []
        for sender, receiver, send, receive in matched:
            moves.append((sender.gpu, receiver.gpu, send.start, send.count, Op.REDUCE if receive.kind == "rrc" else Op.COPY))
            for block in (sender, receiver):
                trace.append((block, block.pc))
                done.add((block.gpu, block.id, block.pc))
                block.pc += 1
        rounds.append(moves)
    _check_races(programs, trace, source)
    return rounds


def _check_races(programs: list[dict[int, _Block]], trace: list[tuple[_Block, int]], source: str) -> None:
    """Refuse two steps of one GPU that touch a chunk (one of them writing it) unless the GPU
    itself orders them, by a block's order and its waits: a run that happened to go right
    would go wrong on GPUs whose blocks run at other speeds.

    Each step gets a vector clock over its GPU's blocks (its block's previous step and the step
    it waits for, joined); step a comes before step b when a's clock entry for its own block is
    at most b's entry for it."""
    clocks: dict[tuple[int, int, int], list[int]] = {}
    last_write: dict[tuple[int, int], tuple[int, int, int]] = {}
    reads: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)

    def before(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
        return clocks[a][a[1]] <= clocks[b][a[1]]

    for block, s in trace:
        width = max(programs[block.gpu]) + 1
        clock = list(clocks[block.gpu, block.id, s - 1]) if s > 0 else [0] * width
        step = block.steps[s]
        if step.depid >= 0:
            clock = [max(a, b) for a, b in zip(clock, clocks[block.gpu, step.depid, step.deps])]
        clock[block.id] += 1
        me = (block.gpu, block.id, s)
        clocks[me] = clock
        writes, touches = step.kind in ("r", "rrc"), step.kind in ("s", "rrc")
        for u in range(step.start, step.start + step.count) if step.kind != "nop" else ():
            key = (block.gpu, u)
            earlier = [last_write[key]] if key in last_write else []
            if writes:
                earlier += reads[key]
            for other in earlier:
                if other[1] != block.id and not before(other, me):
                    raise FormatError(
                        f"{source}: gpu {block.gpu}: tb {other[1]} step {other[2]} and tb {block.id} step {s} touch chunk {u} "
                        "with no wait between them (a race)"
                    )
            if writes:
                last_write[key] = me
                reads[key] = []
            elif touches:
                reads[key].append(me)
