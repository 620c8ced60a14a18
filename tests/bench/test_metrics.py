"""The table of collectives: counts, fill pattern, references and the wrong-element count."""

from __future__ import annotations

import pytest
import torch

from topocoll.bench.metrics import (
    COLLECTIVES,
    BenchArgumentError,
    RedOp,
    check_op_dtype,
    count_wrong,
    dtype_by_name,
    fill,
    parse_collective,
    reference,
)
from topocoll.solver.schedule import Collective


def _pattern(op: RedOp, rank: int, index: int) -> int:
    """The documented fill pattern, written out independently of the implementation."""
    if op is RedOp.PROD:
        return 2 if (index + rank) % 4 == 0 else 1
    return (7 * index + 3 * rank) % 5 + 1


@pytest.mark.parametrize("op", list(RedOp))
def test_fill_follows_the_documented_pattern(op):
    values = fill(op, torch.int64, 3, 10, 20).tolist()
    assert values == [_pattern(op, 3, i) for i in range(10, 30)]


@pytest.mark.parametrize(
    ("op", "combine"),
    [(RedOp.SUM, sum), (RedOp.MIN, min), (RedOp.MAX, max), (RedOp.PROD, lambda xs: __import__("math").prod(xs))],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.float64])
def test_reference_matches_plain_python(op, combine, dtype):
    n, start, count = 5, 7, 40
    expected = [combine([_pattern(op, r, i) for r in range(n)]) for i in range(start, start + count)]
    got = reference(op, dtype, n, start, count)
    assert got.dtype == dtype
    assert got.double().tolist() == [float(v) for v in expected]


def test_reference_avg_is_sum_over_n():
    n = 3
    got = reference(RedOp.AVG, torch.float64, n, 0, 10).tolist()
    assert got == pytest.approx([sum(_pattern(RedOp.SUM, r, i) for r in range(n)) / n for i in range(10)])


def test_int8_sum_wraps_like_twos_complement():
    n = 60  # sums up to 300 overflow int8
    got = reference(RedOp.SUM, torch.int8, n, 0, 16).tolist()
    for i, value in enumerate(got):
        total = sum(_pattern(RedOp.SUM, r, i) for r in range(n))
        assert value == (total + 128) % 256 - 128


def test_count_wrong_finds_each_corrupted_element():
    expected = reference(RedOp.SUM, torch.float32, 4, 0, 100)
    got = expected.clone()
    assert count_wrong(got, expected, RedOp.SUM) == 0
    got[[3, 50, 99]] += 1
    assert count_wrong(got, expected, RedOp.SUM) == 3


def test_count_wrong_avg_tolerates_rounding_only():
    expected = reference(RedOp.AVG, torch.float32, 3, 0, 10)
    nudged = torch.nextafter(expected, torch.full_like(expected, 100.0))
    assert count_wrong(nudged, expected, RedOp.AVG) == 0
    assert count_wrong(expected + 0.01, expected, RedOp.AVG) == 10


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


def test_expected_outputs_per_collective():
    n, op, dtype = 4, RedOp.SUM, torch.float64
    spec = COLLECTIVES[Collective.ALLGATHER]
    counts = spec.counts(4 * 8 * n, 8, n)  # 4 elements per rank
    gathered = spec.expected(counts, op, dtype, 2, 0, n).tolist()
    assert gathered == [float(_pattern(op, i // 4, i)) for i in range(16)]
    spec = COLLECTIVES[Collective.REDUCE_SCATTER]
    counts = spec.counts(4 * 8 * n, 8, n)
    mine = spec.expected(counts, op, dtype, 2, 0, n).tolist()
    assert mine == [float(sum(_pattern(op, r, i) for r in range(n))) for i in range(8, 12)]
    spec = COLLECTIVES[Collective.BROADCAST]
    counts = spec.counts(40, 8, n)
    assert spec.expected(counts, op, dtype, 0, 3, n).tolist() == [float(_pattern(op, 3, i)) for i in range(5)]
    spec = COLLECTIVES[Collective.REDUCE]
    assert spec.expected(counts, op, dtype, 1, 3, n) is None
    assert spec.expected(counts, op, dtype, 3, 3, n) is not None


def test_broadcast_buffers_off_root_start_empty():
    spec = COLLECTIVES[Collective.BROADCAST]
    counts = spec.counts(64, 4, 2)
    off_root = spec.buffers(counts, RedOp.SUM, torch.float32, 1, 0, torch.device("cpu"))
    assert off_root.input is off_root.output and not off_root.output.any()
    expected = spec.expected(counts, RedOp.SUM, torch.float32, 1, 0, 2)
    assert count_wrong(off_root.output, expected, RedOp.SUM) == 16


def test_names():
    assert parse_collective("all_reduce").collective is Collective.ALLREDUCE
    assert parse_collective("reducescatter").collective is Collective.REDUCE_SCATTER
    assert dtype_by_name("fp16") == ("half", torch.float16)
    assert RedOp.parse("MAX") is RedOp.MAX
    with pytest.raises(BenchArgumentError, match="unknown collective 'alltoall'"):
        parse_collective("alltoall")
    with pytest.raises(BenchArgumentError, match="unknown datatype 'uint32'"):
        dtype_by_name("uint32")
    with pytest.raises(BenchArgumentError, match="unknown reduction op 'mulsum'"):
        RedOp.parse("mulsum")
    with pytest.raises(BenchArgumentError, match="avg needs a floating-point"):
        check_op_dtype(RedOp.AVG, torch.int32)


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
