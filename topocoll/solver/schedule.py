"""The schedule IR (contract 2 of the design, ``topocoll.schedule/1``; all-to-all and the compact
``topocoll.schedule/2`` as the README extends it).

A :class:`Schedule` names the collective, the topology nodes its ranks run on, how the buffer is
cut into chunks, and a list of steps. Transfers inside one step run concurrently and read the
values as they were before the step; ``REDUCE`` adds the sender's chunk into the receiver's,
``COPY`` overwrites it. ``path`` spells out the physical route through the topology.

This module defines the records, their two JSON forms and :func:`load_schedule`, the one reader of
schedule files; :mod:`topocoll.solver.verify` checks that a schedule is correct.

The compact form (``topocoll.schedule/2``) holds the same schedule without spelling out each
transfer: every distinct path is written once, as node numbers (``0 .. N-1`` are the ranks,
``N + i`` is ``nodes[i]``). A step is a list of runs ``{"op", "chunks"}`` of consecutive
transfers with one op, and a run lists ``[chunk id, path number, ...]`` for each run of
consecutive transfers of one chunk. A transfer's sender and receiver are its path's first and
last node. A transfer then costs a path number (about six bytes) instead of a record (about a
hundred). Both forms read back to equal :class:`Schedule` objects, transfer order included.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topocoll import fileio
from topocoll.errors import ScheduleError

FORMAT = "topocoll.schedule/1"
#: The compact form: paths written once, transfers grouped by chunk (see the module docstring).
FORMAT_COMPACT = "topocoll.schedule/2"
#: The ``format`` of a schedule described by a rule (:mod:`topocoll.solver.rule_schedule`), which
#: every reader of schedules spells out into a :class:`Schedule`.
FORMAT_RULE = "topocoll.schedule/3"
#: The format versions :meth:`Schedule.to_json` writes, by number.
FORMAT_VERSIONS = {1: FORMAT, 2: FORMAT_COMPACT}


class Collective(str, enum.Enum):
    """The collectives topocoll synthesizes."""

    ALLREDUCE = "allreduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALLTOALL = "alltoall"

    @property
    def is_rooted(self) -> bool:
        """Broadcast and reduce have a root rank."""
        return self in (Collective.BROADCAST, Collective.REDUCE)

    @property
    def is_routed(self) -> bool:
        """All-to-all moves a traffic matrix, pair by pair: it is routed
        (:mod:`topocoll.solver.traffic`), not synthesized from the cut bound."""
        return self is Collective.ALLTOALL

    @classmethod
    def parse(cls, text: str) -> "Collective":
        """Accept ``allreduce``, ``all_reduce``, ``all-reduce``, ``reducescatter``, ``all_to_all`` and friends."""
        if isinstance(text, cls):
            return text
        key = str(text).lower().replace("-", "").replace("_", "")
        for member in cls:
            if member.value.replace("_", "") == key:
                return member
        allowed = ", ".join(m.value for m in cls)
        raise ScheduleError(f"unknown collective {text!r}; expected one of {allowed}")


SYNTHESIZED = tuple(c for c in Collective if not c.is_routed)
"""The collectives the cut bound, synthesis, the planner and the baselines handle."""

#: The name of a schedule that a runtime may run with its inner backend's own collective
#: instead of step by step: the schedule is what that collective does (gloo's allreduce and
#: allgather: the ring in rank order), kept for verification and prediction, or it has no
#: steps at all (:func:`native_schedule`).
NATIVE = "native"


class Op(str, enum.Enum):
    """What a transfer does at the receiver."""

    COPY = "copy"
    REDUCE = "reduce"


@dataclass(frozen=True, slots=True)
class Chunk:
    """A contiguous fraction ``[offset, offset + size)`` of the buffer (fractions in [0, 1]).

    In an all-to-all the buffer is one pair's block: ``src`` and ``dst`` name the pair whose
    block (the bytes rank ``src`` sends rank ``dst``) the fraction is of. Other collectives
    leave them None.
    """

    id: int
    offset: float
    size: float
    src: int | None = None
    dst: int | None = None

    def __post_init__(self) -> None:
        if not (0.0 <= self.offset <= 1.0 and 0.0 < self.size <= 1.0 + 1e-12):
            raise ScheduleError(f"chunk {self.id}: offset {self.offset} / size {self.size} outside [0, 1]")
        if (self.src is None) != (self.dst is None) or (self.src is not None and self.src == self.dst):
            raise ScheduleError(f"chunk {self.id}: src {self.src} and dst {self.dst} must both be given and differ, or neither")

    @property
    def end(self) -> float:
        """``offset + size``."""
        return self.offset + self.size

    def bounds(self, count: int) -> tuple[int, int]:
        """Element range ``[start, stop)`` of this chunk in a buffer of ``count`` elements."""
        return round(self.offset * count), round(self.end * count)


@dataclass(frozen=True, slots=True)
class Transfer:
    """Send chunk ``chunk`` from rank ``src`` to rank ``dst`` along ``path``."""

    src: int
    dst: int
    chunk: int
    op: Op
    path: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.src == self.dst:
            raise ScheduleError(f"transfer of chunk {self.chunk}: source and destination are both rank {self.src}")
        if len(self.path) < 2:
            raise ScheduleError(f"transfer {self.src}->{self.dst} chunk {self.chunk}: path needs at least two nodes")


@dataclass(frozen=True, slots=True)
class Schedule:
    """A complete schedule for one collective over a set of ranks.

    Parameters
    ----------
    collective : Collective
    ranks : tuple of str
        ``ranks[i]`` is the topology node rank ``i`` runs on.
    root : int or None
        Root rank for broadcast and reduce, else None.
    topology_digest : str
        :meth:`topocoll.topo.model.Topology.digest` of the topology it was made for.
    chunks : tuple of Chunk
        Cover ``[0, 1)`` exactly once, sorted by offset.
    steps : tuple of tuple of Transfer
    name : str
        Which algorithm produced it (``"lp"``, ``"ring"``, ...), for reports.
    matrix_bytes : tuple of tuple of float, optional
        All-to-all only: the traffic it was routed for, ``matrix_bytes[i][j]`` bytes from rank i
        to rank j. Its chunks carry their pair, and each pair with bytes has chunks tiling its
        block; the schedule's buffer size S is the largest row sum (the most a rank sends).
    """

    collective: Collective
    ranks: tuple[str, ...]
    root: int | None
    topology_digest: str
    chunks: tuple[Chunk, ...]
    steps: tuple[tuple[Transfer, ...], ...]
    name: str = ""
    matrix_bytes: tuple[tuple[float, ...], ...] | None = None

    def __post_init__(self) -> None:
        n = len(self.ranks)
        if len(set(self.ranks)) != n:
            raise ScheduleError("schedule ranks must be distinct topology nodes")
        if self.collective.is_rooted:
            if self.root is None or not (0 <= self.root < n):
                raise ScheduleError(f"{self.collective.value}: root must be a rank in 0..{n - 1}, got {self.root}")
        ids = [c.id for c in self.chunks]
        if len(set(ids)) != len(ids):
            raise ScheduleError("chunk ids must be unique")
        if self.collective.is_routed:
            self._check_pair_chunks()
        else:
            if self.matrix_bytes is not None:
                raise ScheduleError(f"{self.collective.value}: only an all-to-all carries a traffic matrix")
            if any(c.src is not None for c in self.chunks):
                raise ScheduleError(f"{self.collective.value}: chunks name no pair (src/dst), only an all-to-all's do")
            _check_tiling(self.chunks, "")
        known = set(ids)
        for s, step in enumerate(self.steps):
            for t in step:
                if t.chunk not in known:
                    raise ScheduleError(f"step {s}: transfer {t.src}->{t.dst} names unknown chunk {t.chunk}")
                if not (0 <= t.src < n and 0 <= t.dst < n):
                    raise ScheduleError(f"step {s}: transfer {t.src}->{t.dst} names a rank outside 0..{n - 1}")
                if t.path[0] != self.ranks[t.src] or t.path[-1] != self.ranks[t.dst]:
                    raise ScheduleError(
                        f"step {s}: transfer {t.src}->{t.dst} path {'-'.join(t.path)} must run "
                        f"from {self.ranks[t.src]} to {self.ranks[t.dst]}"
                    )

    def _check_pair_chunks(self) -> None:
        """An all-to-all's matrix is n x n bytes, and each pair with bytes has chunks tiling its block."""
        n = len(self.ranks)
        matrix = self.matrix_bytes
        if matrix is None or len(matrix) != n or any(len(row) != n for row in matrix):
            raise ScheduleError(f"alltoall: matrix_bytes must be {n} x {n} (bytes from rank i to rank j)")
        for i, row in enumerate(matrix):
            for j, value in enumerate(row):
                if not (math.isfinite(value) and value >= 0):
                    raise ScheduleError(f"alltoall: matrix_bytes[{i}][{j}] = {value} is not a byte count")
        by_pair: dict[tuple[int, int], list[Chunk]] = {}
        for c in self.chunks:
            if c.src is None or c.dst is None or not (0 <= c.src < n and 0 <= c.dst < n):
                raise ScheduleError(f"alltoall: chunk {c.id} must name its pair (src, dst), ranks in 0..{n - 1}")
            by_pair.setdefault((c.src, c.dst), []).append(c)
        for i, row in enumerate(matrix):
            for j, value in enumerate(row):
                if i != j and value > 0 and (i, j) not in by_pair:
                    raise ScheduleError(f"alltoall: rank {i} -> rank {j} has {value:g} bytes and no chunks")
        for (i, j), chunks in by_pair.items():
            if matrix[i][j] <= 0:
                raise ScheduleError(f"alltoall: chunk {chunks[0].id} is of rank {i} -> rank {j}, which has no bytes")
            _check_tiling(chunks, f"rank {i} -> rank {j}: ")

    @property
    def reference_bytes(self) -> float | None:
        """All-to-all: the buffer size S its matrix stands for, the largest row sum; else None."""
        if self.matrix_bytes is None:
            return None
        return max((sum(row) for row in self.matrix_bytes), default=0.0)

    def chunk_fractions(self) -> dict[int, float]:
        """Each chunk's size as a fraction of the buffer S: its ``size``, or in an all-to-all its
        share of its pair's block scaled by the block's bytes over :attr:`reference_bytes`."""
        if self.matrix_bytes is None:
            return {c.id: c.size for c in self.chunks}
        scale = self.reference_bytes or 1.0
        return {c.id: c.size * self.matrix_bytes[c.src][c.dst] / scale for c in self.chunks}

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self.ranks)

    def chunk_map(self) -> dict[int, Chunk]:
        """Chunks by id."""
        return {c.id: c for c in self.chunks}

    def owner(self, chunk: Chunk) -> int:
        """For allgather / reduce-scatter: the rank whose shard contains ``chunk``."""
        n = len(self.ranks)
        return min(n - 1, int(math.floor(chunk.offset * n + 1e-9)))

    def transfer_count(self) -> int:
        """Total number of transfers."""
        return sum(len(step) for step in self.steps)

    # ------------------------------------------------------------------------------ JSON
    def to_json_dict(self, version: int = 1) -> dict[str, Any]:
        """JSON data of contract 2: ``version`` 1 spells out every transfer, 2 is the compact form.

        Raises
        ------
        ScheduleError
            ``version`` is not one of :data:`FORMAT_VERSIONS`.
        """
        if version not in FORMAT_VERSIONS:
            raise ScheduleError(f"schedule format version must be one of {sorted(FORMAT_VERSIONS)}, got {version!r}")
        data: dict[str, Any] = {
            "format": FORMAT_VERSIONS[version],
            "collective": self.collective.value,
            "name": self.name,
            "ranks": list(self.ranks),
            "root": self.root,
            "topology_digest": self.topology_digest,
        }
        if version == 1:
            data["chunks"] = [_chunk_json(c) for c in self.chunks]
            data["steps"] = [
                [{"src": t.src, "dst": t.dst, "chunk": t.chunk, "op": t.op.value, "path": list(t.path)} for t in step]
                for step in self.steps
            ]
        else:
            data.update(self._compact_body())
        if self.matrix_bytes is not None:
            data["matrix_bytes"] = [list(row) for row in self.matrix_bytes]
        return data

    def _compact_body(self) -> dict[str, Any]:
        """``nodes``, ``paths``, ``chunks`` and ``steps`` of the compact form."""
        number = {node: i for i, node in enumerate(self.ranks)}
        nodes: list[str] = []
        paths: list[list[int]] = []
        path_number: dict[tuple[str, ...], int] = {}
        steps = []
        for step in self.steps:
            runs: list[dict[str, Any]] = []  # one per run of transfers with one op
            run: dict[str, Any] = {}
            group: list[int] = []  # [chunk, path number, ...] for a run of transfers of one chunk
            for t in step:
                p = path_number.get(t.path)
                if p is None:
                    p = path_number[t.path] = len(paths)
                    for node in t.path:
                        if node not in number:
                            number[node] = len(number)
                            nodes.append(node)
                    paths.append([number[node] for node in t.path])
                if not run or run["op"] != t.op.value:
                    run = {"op": t.op.value, "chunks": []}
                    runs.append(run)
                    group = []
                if not group or group[0] != t.chunk:
                    group = [t.chunk]
                    run["chunks"].append(group)
                group.append(p)
            steps.append(runs)
        chunks = [[c.id, c.offset, c.size] + ([] if c.src is None else [c.src, c.dst]) for c in self.chunks]
        return {"nodes": nodes, "paths": paths, "chunks": chunks, "steps": steps}

    def to_json(self, version: int = 1) -> str:
        """Canonical JSON text of format ``version`` (1, or 2 for the compact form)."""
        return json.dumps(self.to_json_dict(version), sort_keys=True, separators=(",", ":")) + "\n"

    @classmethod
    def from_json_dict(cls, data: Any, source: str = "<schedule>") -> "Schedule":
        """Parse contract-2 data of either format; every error names ``source`` and the element."""
        with without_cycle_collection():
            return cls._from_json_dict(data, source)

    @classmethod
    def _from_json_dict(cls, data: Any, source: str) -> "Schedule":
        if not isinstance(data, Mapping):
            raise ScheduleError(f"{source}: expected a JSON object")
        fmt = data.get("format")
        if fmt == FORMAT_RULE:  # a schedule by rule: spelt out here, where that is affordable
            from topocoll.solver.rule_schedule import RuleSchedule  # it builds on this module

            return RuleSchedule.from_json_dict(data, source).expand(source)
        if fmt not in FORMAT_VERSIONS.values():
            known = " or ".join(repr(f) for f in (*FORMAT_VERSIONS.values(), FORMAT_RULE))
            raise ScheduleError(f"{source}: format must be {known}, got {fmt!r} (written by a newer topocoll?)")
        try:
            collective = Collective.parse(data["collective"])
            ranks = tuple(_strings(data["ranks"], "ranks"))
            root = data.get("root")
            if root is not None and (isinstance(root, bool) or not isinstance(root, int)):
                raise ScheduleError(f"root must be an integer, got {root!r}")
            if fmt == FORMAT:
                chunks = tuple(_chunk(c, f"chunks[{i}]") for i, c in enumerate(_list(data["chunks"], "chunks")))
                steps = tuple(
                    tuple(_transfer(t, f"steps[{s}][{k}]") for k, t in enumerate(_list(step, f"steps[{s}]")))
                    for s, step in enumerate(_list(data["steps"], "steps"))
                )
            else:
                chunks, steps = _compact_chunks(data["chunks"]), _compact_steps(data, ranks)
            matrix = data.get("matrix_bytes")
            if matrix is not None:
                matrix = tuple(
                    tuple(_num(v, f"matrix_bytes[{i}][{j}]") for j, v in enumerate(_list(row, f"matrix_bytes[{i}]")))
                    for i, row in enumerate(_list(matrix, "matrix_bytes"))
                )
            return cls(
                collective=collective,
                ranks=ranks,
                root=root if collective.is_rooted else None,
                topology_digest=str(data.get("topology_digest", "")),
                chunks=chunks,
                steps=steps,
                name=str(data.get("name", "")),
                matrix_bytes=matrix,
            )
        except KeyError as exc:
            raise ScheduleError(f"{source}: missing field {exc.args[0]!r}") from None
        except (TypeError, ScheduleError) as exc:
            raise ScheduleError(f"{source}: {exc}") from None

    @classmethod
    def from_json(cls, text: str, source: str = "<schedule>") -> "Schedule":
        """Parse contract-2 JSON text of either format.

        Raises
        ------
        ScheduleError
            Malformed JSON (with its line) or any error of :meth:`from_json_dict`.
        FormatError
            JSON nested too deeply to parse (:func:`topocoll.fileio.loads_json`).
        """
        try:
            with without_cycle_collection():
                data = fileio.loads_json(text, source)
        except json.JSONDecodeError as exc:
            raise ScheduleError(f"{source}: line {exc.lineno}: malformed JSON: {exc.msg}") from None
        return cls.from_json_dict(data, source)


def native_schedule(collective: Collective, ranks: Sequence[str], root: int | None, topology_digest: str) -> Schedule:
    """A :data:`NATIVE` schedule with no steps: the collective as the runtime's inner backend
    runs it, where no schedule of topocoll's own is weighed (see :class:`topocoll.errors.ScaleError`).

    It names the collective, the ranks, the root and the topology, and holds one chunk, the
    whole buffer, so that it reads and writes like any schedule; it cannot be verified or
    lowered, since the steps are the inner backend's.

    Examples
    --------
    >>> s = native_schedule(Collective.BROADCAST, ("gpu0", "gpu1"), 1, "sha256:0")
    >>> (s.name, len(s.chunks), s.steps)
    ('native', 1, ())
    """
    return Schedule(
        collective, tuple(ranks), root if collective.is_rooted else None, topology_digest, (Chunk(0, 0.0, 1.0),), (), name=NATIVE
    )


@contextlib.contextmanager
def without_cycle_collection() -> Iterator[None]:
    """Pause Python's cycle collector while millions of acyclic records are built.

    Each collection rescans every container built so far, so reading a 2-million-transfer
    schedule spent about 2 of its 4 s in the collector (measured on 2 cores); nothing built
    here forms a cycle, and reference counting still frees everything. Nests: only the
    outermost use turns the collector back on, and only if it was on.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_schedule(path: str | os.PathLike) -> Schedule:
    """Read a schedule file (contract-2 JSON).

    Parameters
    ----------
    path : path-like
        A regular file of at most :data:`~topocoll.fileio.SCHEDULE_LIMIT_BYTES`.

    Returns
    -------
    Schedule
        Parsed, not verified: see :func:`topocoll.solver.verify.verify`.

    Raises
    ------
    FormatError
        Not a regular file, too large, not UTF-8 or nested too deeply; the message names the file.
    ScheduleError
        Malformed JSON or not a schedule; the message names the file.
    OSError
        The file does not exist or cannot be opened (left to the caller).

    See Also
    --------
    topocoll.solver.verify.require_topology_digest, topocoll.solver.verify.verify : the checks a loaded schedule gets before it is used.
    """
    source = str(path)
    return Schedule.from_json(fileio.read_input(path, fileio.SCHEDULE_LIMIT_BYTES, "schedule file"), source=source)


def _check_tiling(chunks: Sequence[Chunk], where: str) -> None:
    """``chunks`` cover [0, 1) exactly once (``where`` prefixes the message: a pair's block)."""
    position = 0.0
    for chunk in sorted(chunks, key=lambda c: c.offset):
        if not math.isclose(chunk.offset, position, abs_tol=1e-9):
            raise ScheduleError(f"{where}chunk {chunk.id} starts at {chunk.offset}, expected {position}: chunks must tile [0, 1)")
        position = chunk.end
    if chunks and not math.isclose(position, 1.0, abs_tol=1e-9):
        raise ScheduleError(f"{where}chunks end at {position}, expected 1: chunks must tile [0, 1)")


def _chunk_json(c: Chunk) -> dict[str, Any]:
    data: dict[str, Any] = {"id": c.id, "offset": c.offset, "size": c.size}
    if c.src is not None:
        data["src"], data["dst"] = c.src, c.dst
    return data


def _chunk(entry: Any, where: str) -> Chunk:
    if not isinstance(entry, Mapping):
        raise ScheduleError(f"{where} must be an object")
    pair = [None if entry.get(k) is None else _int(entry[k], f"{where}.{k}") for k in ("src", "dst")]
    return Chunk(_int(entry["id"], f"{where}.id"), _num(entry["offset"], f"{where}.offset"), _num(entry["size"], f"{where}.size"), *pair)


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ScheduleError(f"{where} must be a list")
    return value


def _strings(value: Any, where: str) -> list[str]:
    items = _list(value, where)
    if not all(isinstance(v, str) for v in items):
        raise ScheduleError(f"{where} must be a list of strings")
    return items


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScheduleError(f"{where} must be an integer, got {value!r}")
    return value


def _num(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ScheduleError(f"{where} must be a finite number, got {value!r}")
    return float(value)


def _transfer(entry: Any, where: str) -> Transfer:
    if not isinstance(entry, Mapping):
        raise ScheduleError(f"{where} must be an object")
    try:
        op = Op(entry["op"])
    except ValueError:
        raise ScheduleError(f"{where}.op must be 'copy' or 'reduce', got {entry['op']!r}") from None
    try:
        return Transfer(
            _int(entry["src"], f"{where}.src"),
            _int(entry["dst"], f"{where}.dst"),
            _int(entry["chunk"], f"{where}.chunk"),
            op,
            tuple(_strings(entry["path"], f"{where}.path")),
        )
    except ScheduleError as exc:
        raise ScheduleError(f"{where}: {exc}") from None


def _compact_chunks(value: Any) -> tuple[Chunk, ...]:
    """``chunks`` of the compact form: ``[id, offset, size]``, or ``[id, offset, size, src, dst]``."""
    chunks = []
    for i, entry in enumerate(_list(value, "chunks")):
        where = f"chunks[{i}]"
        if not isinstance(entry, list) or len(entry) not in (3, 5):
            raise ScheduleError(f"{where} must be [id, offset, size] or [id, offset, size, src, dst]")
        pair = [_int(v, f"{where}[{k}]") for k, v in enumerate(entry[3:], start=3)] or [None, None]
        chunks.append(Chunk(_int(entry[0], f"{where}[0]"), _num(entry[1], f"{where}[1]"), _num(entry[2], f"{where}[2]"), *pair))
    return tuple(chunks)


def _compact_steps(data: Mapping, ranks: tuple[str, ...]) -> tuple[tuple[Transfer, ...], ...]:
    """``steps`` of the compact form, its paths looked up in ``paths`` and ``nodes``."""
    n = len(ranks)
    names = list(ranks) + _strings(data["nodes"], "nodes")
    if len(set(names)) != len(names):
        raise ScheduleError("nodes must be distinct and differ from the ranks' nodes")
    ends: list[tuple[int, int, tuple[str, ...]]] = []  # per path: sender, receiver, node names
    for p, path in enumerate(_list(data["paths"], "paths")):
        numbers = [_int(v, f"paths[{p}][{k}]") for k, v in enumerate(_list(path, f"paths[{p}]"))]
        if len(numbers) < 2 or not all(0 <= v < len(names) for v in numbers):
            raise ScheduleError(f"paths[{p}] must list at least two node numbers in 0..{len(names) - 1}")
        if not (numbers[0] < n and numbers[-1] < n) or numbers[0] == numbers[-1]:
            raise ScheduleError(f"paths[{p}] must run between two different ranks (node numbers below {n})")
        ends.append((numbers[0], numbers[-1], tuple(names[v] for v in numbers)))
    ops = {op.value: op for op in Op}
    steps = []
    for s, step in enumerate(_list(data["steps"], "steps")):
        transfers = []
        for r, run in enumerate(_list(step, f"steps[{s}]")):
            where = f"steps[{s}][{r}]"
            if not isinstance(run, Mapping):
                raise ScheduleError(f"{where} must be an object")
            op = ops.get(run["op"])
            if op is None:
                raise ScheduleError(f"{where}.op must be 'copy' or 'reduce', got {run['op']!r}")
            for g, group in enumerate(_list(run["chunks"], f"{where}.chunks")):
                if not isinstance(group, list) or len(group) < 2:
                    raise ScheduleError(f"{where}.chunks[{g}] must be [chunk id, path number, ...]")
                chunk = _int(group[0], f"{where}.chunks[{g}][0]")
                numbers = group[1:]
                if set(map(type, numbers)) != {int} or min(numbers) < 0 or max(numbers) >= len(ends):
                    k, p = next((k, p) for k, p in enumerate(numbers, 1) if type(p) is not int or not 0 <= p < len(ends))
                    raise ScheduleError(f"{where}.chunks[{g}][{k}] must be a path number in 0..{len(ends) - 1}, got {p!r}")
                transfers += [Transfer(src, dst, chunk, op, path) for src, dst, path in map(ends.__getitem__, numbers)]
        steps.append(tuple(transfers))
    return tuple(steps)
