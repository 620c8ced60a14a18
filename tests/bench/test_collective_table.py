"""The table of collectives: element counts, names and bus factors (no torch needed)."""

from __future__ import annotations

import pytest

from topocoll.bench.collective_table import (
    COLLECTIVES,
    BenchArgumentError,
    RedOp,
    canonical_dtype_name,
    check_op_dtype,
    parse_collective,
)
from topocoll.solver.schedule import Collective


@pytest.mark.parametrize(
    ("collective", "size", "n", "counts"),
    [
        # nccl-tests: allreduce count = S / sizeof(type)
        (Collective.ALLREDUCE, 1024, 4, (1024, 256, 256, 256)),
        # allgather: S is the total output, count column is the per-rank count
        (Collective.ALLGATHER, 1024, 4, (1024, 64, 64, 256)),
        # 1000 B = 250 floats, rounded down to 248 = 3 x 83 ... for n = 3: 83 per rank
        (Collective.ALLGATHER, 1000, 3, (996, 83, 83, 249)),
        (Collective.REDUCE_SCATTER, 1024, 4, (1024, 64, 256, 64)),
        (Collective.BROADCAST, 4096, 8, (4096, 1024, 1024, 1024)),
        (Collective.REDUCE, 8, 2, (8, 2, 2, 2)),
    ],
)
def test_counts(collective, size, n, counts):
    c = COLLECTIVES[collective].counts(size, 4, n)
    assert (c.size_bytes, c.count, c.in_count, c.out_count) == counts


def test_names():
    assert parse_collective("all_reduce").collective is Collective.ALLREDUCE
    assert parse_collective("reducescatter").collective is Collective.REDUCE_SCATTER
    assert canonical_dtype_name("fp16") == "half"
    assert RedOp.parse("MAX") is RedOp.MAX
    with pytest.raises(BenchArgumentError, match="unknown collective 'alltoall'"):
        parse_collective("alltoall")
    with pytest.raises(BenchArgumentError, match="unknown datatype 'uint32'"):
        canonical_dtype_name("uint32")
    with pytest.raises(BenchArgumentError, match="unknown reduction op 'mulsum'"):
        RedOp.parse("mulsum")
    with pytest.raises(BenchArgumentError, match="avg needs a floating-point"):
        check_op_dtype(RedOp.AVG, "int32")


@pytest.mark.parametrize(
    ("collective", "n", "factor"),
    [
        # nccl-tests doc/PERFORMANCE.md: 2(n-1)/n, (n-1)/n, (n-1)/n, 1, 1
        (Collective.ALLREDUCE, 8, 1.75),
        (Collective.ALLGATHER, 4, 0.75),
        (Collective.REDUCE_SCATTER, 2, 0.5),
        (Collective.BROADCAST, 16, 1.0),
        (Collective.REDUCE, 3, 1.0),
    ],
)
def test_bus_factor_of_each_collective(collective, n, factor):
    assert COLLECTIVES[collective].bus_factor(n) == pytest.approx(factor)
