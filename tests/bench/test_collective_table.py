"""The table of collectives: element counts, names and bus factors (no torch needed)."""

from __future__ import annotations

import numpy as np
import pytest

from topocoll.bench.collective_table import (
    COLLECTIVES,
    BenchArgumentError,
    RedOp,
    Traffic,
    alltoall_counts,
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
    assert parse_collective("all_to_all").collective is Collective.ALLTOALL
    with pytest.raises(BenchArgumentError, match="unknown collective 'gather'"):
        parse_collective("gather")
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
        (Collective.ALLTOALL, 8, 0.875),
    ],
)
def test_bus_factor_of_each_collective(collective, n, factor):
    assert COLLECTIVES[collective].bus_factor(n) == pytest.approx(factor)


def test_uniform_alltoall_counts_are_nccl_tests():
    # alltoall_perf: count = S / sizeof(type) / n per peer, size = that x n x sizeof(type)
    c = COLLECTIVES[Collective.ALLTOALL].counts(1 << 20, 4, 3)
    per_peer = (1 << 20) // 4 // 3
    assert (c.size_bytes, c.count, c.in_count, c.out_count) == (per_peer * 3 * 4, per_peer, per_peer * 3, per_peer * 3)
    assert c.pairs == ((per_peer,) * 3,) * 3


def test_hot_alltoall_sends_half_to_the_hot_rank():
    # 4 ranks, hot rank 2: the others send it half of S, a quarter to each of the two left
    c = alltoall_counts(Traffic("hot", hot_rank=2), 4096, 1, 4)
    assert c.pairs[0] == (0, 1024, 2048, 1024)
    assert c.pairs[2] == (1365, 1365, 0, 1365)  # the hot rank itself sends evenly
    assert c.out_count == 3 * 2048 and c.size_bytes == 4096


def test_matrix_traffic_is_scaled_to_its_busiest_sender():
    weights = ((0.0, 3.0, 1.0), (2.0, 0.0, 0.0), (0.0, 0.0, 0.0))  # rank 0 sends the most: 4 parts
    c = alltoall_counts(Traffic("file", weights=weights, source="m.csv"), 400, 4, 3)
    assert c.pairs == ((0, 75, 25), (50, 0, 0), (0, 0, 0))
    assert c.size_bytes == 400 and c.count == 100 // 3
    with pytest.raises(BenchArgumentError, match="a 3 x 3 matrix for 2 ranks"):
        Traffic("file", weights=weights, source="m.csv").shares(2)
    with pytest.raises(BenchArgumentError, match="moves no bytes"):
        Traffic("file", weights=((0.0, 0.0), (0.0, 0.0)), source="z.csv").shares(2)


def test_zipf_alltoall_rows_follow_the_law():
    c = alltoall_counts(Traffic("zipf", zipf_s=1.0, seed=3), 1 << 16, 1, 4)
    for i, row in enumerate(c.pairs):
        assert row[i] == 0
        # the three destinations get 1/1 : 1/2 : 1/3 of the row, in some order
        assert sorted(v for j, v in enumerate(row) if j != i) == pytest.approx(np.array([1 / 3, 1 / 2, 1.0]) / (11 / 6) * (1 << 16), abs=1)
