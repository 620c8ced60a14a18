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
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

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
        Elements of each rank's input and output buffer.
    """

    size_bytes: int
    count: int
    in_count: int
    out_count: int


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

    def bus_factor(self, world_size: int) -> float:
        """nccl-tests' busbw / algbw factor (defined once, in :func:`topocoll.solver.metrics.bus_factor`)."""
        return metrics.bus_factor(self.collective, world_size)

    def counts(self, size_bytes: int, itemsize: int, world_size: int) -> Counts:
        """Element counts for nccl-tests size ``size_bytes`` (see the module docstring)."""
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
