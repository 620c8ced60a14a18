"""The benchmark's table of collectives: sizes, how to run each one, and how to check it.

One :class:`CollectiveSpec` per collective says how nccl-tests' ``size`` S becomes element
counts, how the operation is issued with torch.distributed, and how every rank computes the
exact expected output on its own from the known per-rank fill pattern (no communication), so
that ``#wrong`` counts every element that differs from an independent reference.

The metric definitions themselves (``algbw``, ``busbw``, the bus-bandwidth factor) live in
:mod:`topocoll.solver.cost`, the one place both the simulator and the benchmark read them from.

Sizes follow nccl-tests: S is the buffer each rank passes for allreduce, broadcast and reduce,
the **total output** for allgather and the **total input** for reduce-scatter; the element
count of those two is rounded down to a multiple of the number of ranks, and the ``count``
column shows the per-rank count (nccl-tests' ``paramcount``).

Fill pattern
------------
Rank r holds at global element index i the value ``((7 i + 3 r) mod 5) + 1`` (1..5) for sum,
average, min and max, and ``2`` when ``(i + r) mod 4 == 0`` else ``1`` for product. These are
small integers, exact in every dtype, whose sums and products stay exact in floating point for
any realistic number of ranks (integers wrap the same way in the reference as in the
collective). The average is the exact sum divided by n once, so it is compared with a tolerance
of two units in the last place of the dtype.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from topocoll.errors import TopocollError, UsageError
from topocoll.solver import cost
from topocoll.solver.schedule import Collective

__all__ = [
    "DTYPES",
    "COLLECTIVES",
    "BenchArgumentError",
    "Buffers",
    "CollectiveSpec",
    "Counts",
    "RedOp",
    "check_op_dtype",
    "count_wrong",
    "dtype_by_name",
    "fill",
    "parse_collective",
    "reference",
]

log = logging.getLogger(__name__)


class BenchArgumentError(UsageError):
    """A benchmark argument is invalid (unknown name, root out of range, ...)."""


# ------------------------------------------------------------------------------ dtypes
DTYPES: dict[str, torch.dtype] = {
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "half": torch.float16,
    "float": torch.float32,
    "double": torch.float64,
    "bfloat16": torch.bfloat16,
}
"""nccl-tests' type names (``-d``) of the dtypes torch.distributed's CPU backend can reduce.
nccl-tests' ``uint32`` and ``uint64`` are missing because gloo refuses them."""

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


def dtype_by_name(name: str) -> tuple[str, torch.dtype]:
    """The canonical nccl-tests name and torch dtype of ``-d NAME``.

    Raises
    ------
    BenchArgumentError
        Unknown name.
    """
    key = _DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in DTYPES:
        raise BenchArgumentError(f"unknown datatype {name!r}; expected one of {', '.join(DTYPES)}")
    return key, DTYPES[key]


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

    @property
    def torch_op(self) -> dist.ReduceOp:
        """The torch.distributed reduce op."""
        return {
            RedOp.SUM: dist.ReduceOp.SUM,
            RedOp.PROD: dist.ReduceOp.PRODUCT,
            RedOp.MIN: dist.ReduceOp.MIN,
            RedOp.MAX: dist.ReduceOp.MAX,
            RedOp.AVG: dist.ReduceOp.AVG,
        }[self]


def check_op_dtype(op: RedOp, dtype: torch.dtype) -> None:
    """Refuse combinations no backend computes (average of integers).

    Raises
    ------
    BenchArgumentError
    """
    if op is RedOp.AVG and not dtype.is_floating_point:
        raise BenchArgumentError(f"reduction op avg needs a floating-point datatype, got {str(dtype).removeprefix('torch.')}")


# ------------------------------------------------------------------------------ pattern
_SUM_PATTERN = (7, 3, 5)
"""``((7 i + 3 r) mod 5) + 1``: consecutive ranks and elements differ, values stay 1..5."""

_PROD_PERIOD = 4
"""Product fill: a 2 at every fourth (element + rank), else 1, so products grow as 2^(n/4)."""


def fill(op: RedOp, dtype: torch.dtype, rank: int, start: int, count: int) -> torch.Tensor:
    """The values rank ``rank`` contributes at global element indices ``[start, start + count)``.

    Parameters
    ----------
    op : RedOp
        Selects the pattern (product has its own, so that products stay exact).
    dtype : torch.dtype
    rank : int
    start, count : int
        Global index range.

    Returns
    -------
    torch.Tensor
        A new 1-D CPU tensor of ``count`` elements.

    Examples
    --------
    >>> fill(RedOp.SUM, torch.int32, 1, 0, 4).tolist()
    [4, 1, 3, 5]
    """
    index = torch.arange(start, start + count, dtype=torch.int64)
    if op is RedOp.PROD:
        values = torch.where((index + rank) % _PROD_PERIOD == 0, 2, 1)
    else:
        a, b, m = _SUM_PATTERN
        values = (a * index + b * rank) % m + 1
    return values.to(dtype)


def reference(op: RedOp, dtype: torch.dtype, world_size: int, start: int, count: int) -> torch.Tensor:
    """The exact reduction over all ranks of :func:`fill` at ``[start, start + count)``.

    Computed rank by rank in ``dtype`` (integers wrap exactly as the collective's arithmetic
    does); the average divides the sum, accumulated in float64, once.
    """
    if op is RedOp.AVG:
        total = sum(fill(RedOp.SUM, torch.float64, r, start, count) for r in range(world_size))
        return (total / world_size).to(dtype)
    result = fill(op, dtype, 0, start, count)
    for r in range(1, world_size):
        other = fill(op, dtype, r, start, count)
        if op is RedOp.SUM:
            result.add_(other)
        elif op is RedOp.PROD:
            result.mul_(other)
        elif op is RedOp.MIN:
            torch.minimum(result, other, out=result)
        else:
            torch.maximum(result, other, out=result)
    return result


def count_wrong(got: torch.Tensor, expected: torch.Tensor, op: RedOp) -> int:
    """Number of elements of ``got`` that differ from ``expected`` (bit-exact except avg)."""
    got = got.detach().to("cpu")
    if op is RedOp.AVG:
        eps = torch.finfo(expected.dtype).eps
        ok = torch.isclose(got.double(), expected.double(), rtol=2 * eps, atol=0.0)
    else:
        ok = got == expected
    return int(ok.numel() - int(ok.sum()))


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
class Buffers:
    """One rank's buffers for one operation (``input`` is ``output``, or a part of it, or holds
    it, for in-place ones)."""

    input: torch.Tensor
    output: torch.Tensor


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
    """

    collective: Collective
    reduces: bool
    rooted: bool
    sharded: bool
    in_place: bool

    def bus_factor(self, world_size: int) -> float:
        """nccl-tests' busbw / algbw factor (defined once, in :func:`topocoll.solver.cost.bus_factor`)."""
        return cost.bus_factor(self.collective, world_size)

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

    def buffers(
        self, counts: Counts, op: RedOp, dtype: torch.dtype, rank: int, root: int, device: torch.device, in_place: bool | None = None
    ) -> Buffers:
        """This rank's freshly filled buffers (outputs that are not inputs are zeroed).

        ``in_place`` places them as nccl-tests does: the input is the output (allreduce,
        broadcast, reduce), this rank's shard of the output (allgather), or the output is this
        rank's shard of the input (reduce-scatter). None: torch.distributed's own form
        (:attr:`in_place`).
        """
        in_place = self.in_place if in_place is None else in_place
        if self.collective is Collective.ALLGATHER:
            shard = counts.in_count
            mine = fill(op, dtype, rank, rank * shard, shard).to(device)
            output = torch.zeros(counts.out_count, dtype=dtype, device=device)
            if in_place:
                output[rank * shard : (rank + 1) * shard] = mine
                return Buffers(output[rank * shard : (rank + 1) * shard], output)
            return Buffers(mine, output)
        if self.collective is Collective.REDUCE_SCATTER:
            whole = fill(op, dtype, rank, 0, counts.in_count).to(device)
            shard = counts.out_count
            if in_place:
                return Buffers(whole, whole[rank * shard : (rank + 1) * shard])
            return Buffers(whole, torch.zeros(shard, dtype=dtype, device=device))
        if self.collective is Collective.BROADCAST and rank != root:
            data = torch.zeros(counts.in_count, dtype=dtype, device=device)
        else:
            data = fill(op, dtype, rank, 0, counts.in_count).to(device)
        if in_place:
            return Buffers(data, data)
        return Buffers(data, torch.zeros(counts.out_count, dtype=dtype, device=device))

    def run(self, buffers: Buffers, group: "dist.ProcessGroup", op: RedOp, root: int, async_op: bool = False) -> Any:
        """Issue the collective once on ``group``; its Work when ``async_op``, else None.

        torch.distributed's all-reduce, broadcast and reduce work in place: out of place, the
        input is first copied into the output (as a torch program does), then the output is
        reduced or broadcast in place.
        """
        c = self.collective
        if c in (Collective.ALLREDUCE, Collective.BROADCAST, Collective.REDUCE) and buffers.input is not buffers.output:
            if c is not Collective.BROADCAST or dist.get_rank(group) == root:
                buffers.output.copy_(buffers.input)
        if c is Collective.ALLREDUCE:
            return dist.all_reduce(buffers.output, op=op.torch_op, group=group, async_op=async_op)
        if c is Collective.ALLGATHER:
            return _all_gather_single(buffers.output, buffers.input, group, async_op)
        if c is Collective.REDUCE_SCATTER:
            return _reduce_scatter_single(buffers.output, buffers.input, op.torch_op, group, async_op)
        if c is Collective.BROADCAST:
            return dist.broadcast(buffers.output, src=root, group=group, async_op=async_op)
        return dist.reduce(buffers.output, dst=root, op=op.torch_op, group=group, async_op=async_op)

    def expected(self, counts: Counts, op: RedOp, dtype: torch.dtype, rank: int, root: int, world_size: int) -> torch.Tensor | None:
        """What this rank's output must hold, or None when it is unspecified (reduce off root)."""
        c = self.collective
        if c is Collective.ALLGATHER:
            shard = counts.in_count
            return torch.cat([fill(op, dtype, r, r * shard, shard) for r in range(world_size)])
        if c is Collective.REDUCE_SCATTER:
            shard = counts.out_count
            return reference(op, dtype, world_size, rank * shard, shard)
        if c is Collective.BROADCAST:
            return fill(op, dtype, root, 0, counts.out_count)
        if c is Collective.REDUCE and rank != root:
            return None
        return reference(op, dtype, world_size, 0, counts.out_count)


def _all_gather_single(output: torch.Tensor, input_: torch.Tensor, group: "dist.ProcessGroup", async_op: bool) -> Any:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, input_, group=group, async_op=async_op)


def _reduce_scatter_single(output: torch.Tensor, input_: torch.Tensor, op: dist.ReduceOp, group: "dist.ProcessGroup", async_op: bool) -> Any:
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(output, input_, op=op, group=group, async_op=async_op)


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
