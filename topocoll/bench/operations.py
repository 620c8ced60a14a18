"""The benchmark's collectives with torch: fill the buffers, issue the operation, check the output.

For one :class:`~topocoll.bench.collective_table.CollectiveSpec` and its element counts, every
rank fills its buffers from a known per-rank pattern, issues the collective with
torch.distributed, and computes the exact expected output on its own (no communication), so
that ``#wrong`` counts every element that differs from an independent reference.

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

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from topocoll.bench.collective_table import CollectiveSpec, Counts, RedOp, canonical_dtype_name
from topocoll.solver.schedule import Collective

__all__ = [
    "DTYPES",
    "Buffers",
    "count_wrong",
    "dtype_by_name",
    "expected_output",
    "fill",
    "issue",
    "make_buffers",
    "reference",
    "torch_op",
]

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
"""The torch dtype of each name of :data:`~topocoll.bench.collective_table.DTYPE_ITEMSIZES`
(the same names, in the same order: a test checks names, sizes and floating point agree)."""


def dtype_by_name(name: str) -> tuple[str, torch.dtype]:
    """The canonical nccl-tests name and torch dtype of ``-d NAME``.

    Raises
    ------
    BenchArgumentError
        Unknown name.
    """
    key = canonical_dtype_name(name)
    return key, DTYPES[key]


def torch_op(op: RedOp) -> dist.ReduceOp:
    """The torch.distributed reduce op of ``-o``."""
    return {
        RedOp.SUM: dist.ReduceOp.SUM,
        RedOp.PROD: dist.ReduceOp.PRODUCT,
        RedOp.MIN: dist.ReduceOp.MIN,
        RedOp.MAX: dist.ReduceOp.MAX,
        RedOp.AVG: dist.ReduceOp.AVG,
    }[op]


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


@dataclass(frozen=True, slots=True)
class Buffers:
    """One rank's buffers for one operation (``input`` is ``output``, or a part of it, or holds
    it, for in-place ones); an all-to-all's elements to and from each rank in ``in_splits`` and
    ``out_splits``."""

    input: torch.Tensor
    output: torch.Tensor
    in_splits: tuple[int, ...] = ()
    out_splits: tuple[int, ...] = ()


def make_buffers(
    spec: CollectiveSpec, counts: Counts, op: RedOp, dtype: torch.dtype, rank: int, root: int, device: torch.device, in_place: bool | None = None
) -> Buffers:
    """This rank's freshly filled buffers (outputs that are not inputs are zeroed).

    ``in_place`` places them as nccl-tests does: the input is the output (allreduce,
    broadcast, reduce), this rank's shard of the output (allgather), or the output is this
    rank's shard of the input (reduce-scatter). None: torch.distributed's own form
    (:attr:`CollectiveSpec.in_place`).
    """
    in_place = spec.in_place if in_place is None else in_place
    if spec.collective is Collective.ALLTOALL:  # rank r's send buffer holds fill(r) at its own indices
        sends = counts.pairs[rank]
        receives = tuple(row[rank] for row in counts.pairs)
        data = fill(op, dtype, rank, 0, sum(sends)).to(device)
        return Buffers(data, torch.zeros(sum(receives), dtype=dtype, device=device), tuple(sends), receives)
    if spec.collective is Collective.ALLGATHER:
        shard = counts.in_count
        mine = fill(op, dtype, rank, rank * shard, shard).to(device)
        output = torch.zeros(counts.out_count, dtype=dtype, device=device)
        if in_place:
            output[rank * shard : (rank + 1) * shard] = mine
            return Buffers(output[rank * shard : (rank + 1) * shard], output)
        return Buffers(mine, output)
    if spec.collective is Collective.REDUCE_SCATTER:
        whole = fill(op, dtype, rank, 0, counts.in_count).to(device)
        shard = counts.out_count
        if in_place:
            return Buffers(whole, whole[rank * shard : (rank + 1) * shard])
        return Buffers(whole, torch.zeros(shard, dtype=dtype, device=device))
    if spec.collective is Collective.BROADCAST and rank != root:
        data = torch.zeros(counts.in_count, dtype=dtype, device=device)
    else:
        data = fill(op, dtype, rank, 0, counts.in_count).to(device)
    if in_place:
        return Buffers(data, data)
    return Buffers(data, torch.zeros(counts.out_count, dtype=dtype, device=device))

def issue(spec: CollectiveSpec, buffers: Buffers, group: "dist.ProcessGroup", op: RedOp, root: int, async_op: bool = False) -> Any:
    """Issue the collective once on ``group``; its Work when ``async_op``, else None.

    torch.distributed's all-reduce, broadcast and reduce work in place: out of place, the
    input is first copied into the output (as a torch program does), then the output is
    reduced or broadcast in place.
    """
    c = spec.collective
    if c in (Collective.ALLREDUCE, Collective.BROADCAST, Collective.REDUCE) and buffers.input is not buffers.output:
        if c is not Collective.BROADCAST or dist.get_rank(group) == root:
            buffers.output.copy_(buffers.input)
    if c is Collective.ALLTOALL:
        return dist.all_to_all_single(
            buffers.output, buffers.input, list(buffers.out_splits), list(buffers.in_splits), group=group, async_op=async_op
        )
    if c is Collective.ALLREDUCE:
        return dist.all_reduce(buffers.output, op=torch_op(op), group=group, async_op=async_op)
    if c is Collective.ALLGATHER:
        return _all_gather_single(buffers.output, buffers.input, group, async_op)
    if c is Collective.REDUCE_SCATTER:
        return _reduce_scatter_single(buffers.output, buffers.input, torch_op(op), group, async_op)
    if c is Collective.BROADCAST:
        return dist.broadcast(buffers.output, src=root, group=group, async_op=async_op)
    return dist.reduce(buffers.output, dst=root, op=torch_op(op), group=group, async_op=async_op)

def expected_output(spec: CollectiveSpec, counts: Counts, op: RedOp, dtype: torch.dtype, rank: int, root: int, world_size: int) -> torch.Tensor | None:
    """What this rank's output must hold, or None when it is unspecified (reduce off root)."""
    c = spec.collective
    if c is Collective.ALLTOALL:  # rank r's block for this rank starts after its blocks for lower ranks
        return torch.cat([fill(op, dtype, r, sum(row[:rank]), row[rank]) for r, row in enumerate(counts.pairs)])
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
