"""The benchmark's table of collectives: names, sizes and element counts, reductions, types.

One :class:`CollectiveSpec` per collective says how nccl-tests' ``size`` S becomes element
counts and which options apply to it; :mod:`topocoll.bench.operations` issues and checks the
collectives with torch. This module does not import torch, so that ``topocoll simulate`` (which
predicts the benchmark's table for machines one does not have) runs without it.

The metric definitions themselves (``algbw``, ``busbw``, the bus-bandwidth factor) live in
:mod:`topocoll.solver.metrics`, the one place both the simulator and the benchmark read them from.

Sizes follow nccl-tests: S is the buffer each rank passes for allreduce, broadcast and reduce,
the **total output** for allgather and the **total input** for reduce-scatter; the element
count of those two is rounded down to a multiple of the number of ranks, and the ``count``
column shows the per-rank count (nccl-tests' ``paramcount``).

For all-to-all S is each rank's send buffer, split over the destinations by a :class:`Traffic`:
``uniform`` is nccl-tests' ``alltoall_perf`` (S/n to every rank, itself included, ``count`` the
elements per peer); the skewed patterns give every rank S to send, spread by Zipf(s) or with a
hot expert over the other ranks, and a matrix file is scaled so that its busiest sender sends S
(``count`` is then S / n elements, the mean block).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from topocoll.errors import TopocollError, UsageError
from topocoll.solver import metrics
from topocoll.solver.schedule import Collective

__all__ = [
    "COLLECTIVES",
    "DTYPE_ITEMSIZES",
    "FLOATING_DTYPES",
    "BenchArgumentError",
    "CollectiveSpec",
    "Counts",
    "RedOp",
    "TRAFFIC_PATTERNS",
    "Traffic",
    "alltoall_counts",
    "canonical_dtype_name",
    "check_op_dtype",
    "parse_collective",
]


class BenchArgumentError(UsageError):
    """A benchmark argument is invalid (unknown name, root out of range, ...)."""


# ------------------------------------------------------------------------------ dtypes
DTYPE_ITEMSIZES: dict[str, int] = {
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "int64": 8,
    "half": 2,
    "float": 4,
    "double": 8,
    "bfloat16": 2,
}
"""nccl-tests' type names (``-d``) of the dtypes torch.distributed's CPU backend can reduce, with
their sizes in bytes. nccl-tests' ``uint32`` and ``uint64`` are missing because gloo refuses them."""

FLOATING_DTYPES = frozenset({"half", "float", "double", "bfloat16"})
"""The floating-point names of :data:`DTYPE_ITEMSIZES` (the ones ``avg`` accepts)."""

_DTYPE_ALIASES = {
    "char": "int8",
    "int": "int32",
    "long": "int64",
    "float16": "half",
    "fp16": "half",
    "float32": "float",
    "fp32": "float",
    "float64": "double",
    "fp64": "double",
    "bf16": "bfloat16",
}


def canonical_dtype_name(name: str) -> str:
    """The nccl-tests name of ``-d NAME`` (aliases such as ``fp32`` or ``bf16`` accepted).

    Raises
    ------
    BenchArgumentError
        Unknown name.

    Examples
    --------
    >>> canonical_dtype_name("FP32"), canonical_dtype_name("bf16")
    ('float', 'bfloat16')
    """
    key = _DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in DTYPE_ITEMSIZES:
        raise BenchArgumentError(f"unknown datatype {name!r}; expected one of {', '.join(DTYPE_ITEMSIZES)}")
    return key


# ---------------------------------------------------------------------------- reductions
class RedOp(str, enum.Enum):
    """The reduction operations of ``-o`` (nccl-tests' names)."""

    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"

    @classmethod
    def parse(cls, text: str) -> "RedOp":
        """``-o NAME`` as a member; raises BenchArgumentError for other names."""
        try:
            return cls(text.lower())
        except ValueError:
            raise BenchArgumentError(f"unknown reduction op {text!r}; expected one of {', '.join(m.value for m in cls)}") from None


def check_op_dtype(op: RedOp, dtype_name: str) -> None:
    """Refuse combinations no backend computes (average of integers).

    Raises
    ------
    BenchArgumentError
    """
    if op is RedOp.AVG and dtype_name not in FLOATING_DTYPES:
        raise BenchArgumentError(f"reduction op avg needs a floating-point datatype, got {dtype_name}")


# ----------------------------------------------------------------------------- counts
@dataclass(frozen=True, slots=True)
class Counts:
    """Element counts of one row of the sweep.

    Attributes
    ----------
    size_bytes : int
        nccl-tests' ``size`` column after rounding (S).
    count : int
        nccl-tests' ``count`` column: elements per rank argument (shard for allgather /
        reduce-scatter).
    in_count, out_count : int
        Elements of each rank's input and output buffer (all-to-all: of the largest ones).
    pairs : tuple of tuple of int, optional
        All-to-all: ``pairs[i][j]`` elements go from rank i to rank j.
    """

    size_bytes: int
    count: int
    in_count: int
    out_count: int
    pairs: tuple[tuple[int, ...], ...] | None = None


# ----------------------------------------------------------------------------- traffic
TRAFFIC_PATTERNS = ("uniform", "zipf", "hot")
"""``--skew`` names; anything else is a matrix file."""


@dataclass(frozen=True, slots=True)
class Traffic:
    """How an all-to-all's send buffer is split over the destinations (``--skew``).

    Attributes
    ----------
    pattern : str
        ``uniform``, ``zipf``, ``hot`` or ``file``.
    zipf_s : float
        Exponent of ``zipf``.
    hot_rank : int
        The hot expert of ``hot``.
    seed : int
        Order of ``zipf``'s destinations per rank.
    weights : tuple of tuple of float, optional
        ``file``: the matrix read, any scale.
    source : str
        ``file``: the file's name, for the report.
    """

    pattern: str = "uniform"
    zipf_s: float = 1.2
    hot_rank: int = 0
    seed: int = 0
    weights: tuple[tuple[float, ...], ...] | None = None
    source: str = ""

    @property
    def label(self) -> str:
        """Words for the report's header."""
        if self.pattern == "uniform":
            return "uniform (S/n to every rank, as alltoall_perf)"
        if self.pattern == "zipf":
            return f"Zipf({self.zipf_s:g}) over the other ranks, seed {self.seed}"
        if self.pattern == "hot":
            return f"hot expert: rank {self.hot_rank} gets half of every other rank's bytes"
        return f"matrix {self.source}, scaled so that its busiest sender sends S"

    def shares(self, world_size: int) -> np.ndarray:
        """``world_size x world_size`` fractions of S, row i for rank i's send buffer (the busiest
        row sums to 1).

        Raises
        ------
        BenchArgumentError
            A matrix of another size, or one without bytes.
        """
        n = world_size
        if self.pattern == "uniform":
            return np.full((n, n), 1.0 / n)
        if self.pattern in ("zipf", "hot"):
            from topocoll.solver.traffic import traffic_matrix  # scipy and networkx, only for skew

            if n < 2:
                return np.zeros((n, n))
            return traffic_matrix(self.pattern, n, 1.0, zipf_s=self.zipf_s, hot_rank=min(self.hot_rank, n - 1), seed=self.seed)
        matrix = np.asarray(self.weights, dtype=float)
        if matrix.shape != (n, n):
            raise BenchArgumentError(f"--skew {self.source}: a {matrix.shape[0]} x {matrix.shape[1] if matrix.ndim == 2 else 0} matrix for {n} ranks")
        busiest = matrix.sum(axis=1).max()
        if not busiest > 0:
            raise BenchArgumentError(f"--skew {self.source}: the matrix moves no bytes")
        return matrix / busiest


def alltoall_counts(traffic: Traffic, size_bytes: int, itemsize: int, world_size: int) -> Counts:
    """Element counts of an all-to-all of send buffer S = ``size_bytes`` (module docstring).

    Examples
    --------
    >>> c = alltoall_counts(Traffic(), 1000, 4, 3)  # nccl-tests: 250 floats, 83 to each rank
    >>> c.size_bytes, c.count, c.pairs[0]
    (996, 83, (83, 83, 83))
    """
    n = world_size
    elements = size_bytes // itemsize
    if traffic.pattern == "uniform":  # in integers, exactly as nccl-tests rounds
        per_peer = elements // n
        pairs = np.full((n, n), per_peer, dtype=np.int64)
    else:
        pairs = np.floor(traffic.shares(n) * elements + 1e-9).astype(np.int64)
    rows, columns = pairs.sum(axis=1), pairs.sum(axis=0)
    largest = int(rows.max()) if n else 0
    return Counts(
        size_bytes=largest * itemsize,
        count=largest // n if n else 0,
        in_count=largest,
        out_count=int(columns.max()) if n else 0,
        pairs=tuple(tuple(int(v) for v in row) for row in pairs),
    )


@dataclass(frozen=True, slots=True)
class CollectiveSpec:
    """How the benchmark sizes, runs and checks one collective.

    Attributes
    ----------
    collective : Collective
    reduces : bool
        Whether ``-o`` applies (nccl-tests prints ``none`` in the redop column otherwise).
    rooted : bool
        Whether ``-r`` applies (nccl-tests prints ``-1`` in the root column otherwise).
    sharded : bool
        Allgather / reduce-scatter: S is N shards.
    in_place : bool
        Whether torch.distributed's own form is in place (allreduce, broadcast, reduce) or out
        of place (the ``*_into_tensor`` forms). The benchmark runs both forms, as nccl-tests
        does; speedup and percent of the bound are those of this form.
    has_in_place : bool
        Whether torch.distributed has an in-place form at all. All-to-all has none: gloo's
        ``all_to_all_single`` with one tensor as input and output returns wrong blocks (measured
        on 3 ranks), so its in-place columns stay empty.
    traffic : Traffic, optional
        All-to-all: how the send buffer is split (``--skew``).

    See Also
    --------
    topocoll.bench.operations.make_buffers, topocoll.bench.operations.issue,
    topocoll.bench.operations.expected_output : the torch side of one collective.
    """

    collective: Collective
    reduces: bool
    rooted: bool
    sharded: bool
    in_place: bool
    has_in_place: bool = True
    traffic: Traffic | None = None

    def bus_factor(self, world_size: int) -> float:
        """nccl-tests' busbw / algbw factor (defined once, in :func:`topocoll.solver.metrics.bus_factor`)."""
        return metrics.bus_factor(self.collective, world_size)

    def counts(self, size_bytes: int, itemsize: int, world_size: int) -> Counts:
        """Element counts for nccl-tests size ``size_bytes`` (see the module docstring)."""
        if self.traffic is not None:
            return alltoall_counts(self.traffic, size_bytes, itemsize, world_size)
        elements = size_bytes // itemsize
        if not self.sharded:
            return Counts(elements * itemsize, elements, elements, elements)
        shard = elements // world_size
        total = shard * world_size
        if self.collective is Collective.ALLGATHER:
            return Counts(total * itemsize, shard, shard, total)
        return Counts(total * itemsize, shard, total, shard)


COLLECTIVES: dict[Collective, CollectiveSpec] = {
    Collective.ALLREDUCE: CollectiveSpec(Collective.ALLREDUCE, reduces=True, rooted=False, sharded=False, in_place=True),
    Collective.ALLGATHER: CollectiveSpec(Collective.ALLGATHER, reduces=False, rooted=False, sharded=True, in_place=False),
    Collective.REDUCE_SCATTER: CollectiveSpec(Collective.REDUCE_SCATTER, reduces=True, rooted=False, sharded=True, in_place=False),
    Collective.BROADCAST: CollectiveSpec(Collective.BROADCAST, reduces=False, rooted=True, sharded=False, in_place=True),
    Collective.REDUCE: CollectiveSpec(Collective.REDUCE, reduces=True, rooted=True, sharded=False, in_place=True),
    Collective.ALLTOALL: CollectiveSpec(
        Collective.ALLTOALL, reduces=False, rooted=False, sharded=False, in_place=False, has_in_place=False, traffic=Traffic()
    ),
}
"""The benchmark's one table of collectives."""


def parse_collective(text: str) -> CollectiveSpec:
    """The spec of a collective named as on the command line (``allreduce``, ``all_reduce``, ...).

    Raises
    ------
    BenchArgumentError
    """
    try:
        return COLLECTIVES[Collective.parse(text)]
    except TopocollError:
        allowed = ", ".join(c.value for c in COLLECTIVES)
        raise BenchArgumentError(f"unknown collective {text!r}; expected one of {allowed}") from None
