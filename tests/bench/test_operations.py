"""The torch side of the benchmark's collectives: fill pattern, references, expected outputs and
the wrong-element count."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from topocoll.bench.collective_table import COLLECTIVES, DTYPE_ITEMSIZES, FLOATING_DTYPES, RedOp, Traffic
from topocoll.bench.operations import DTYPES, count_wrong, dtype_by_name, expected_output, fill, make_buffers, reference
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


def test_expected_outputs_per_collective():
    n, op, dtype = 4, RedOp.SUM, torch.float64
    spec = COLLECTIVES[Collective.ALLGATHER]
    counts = spec.counts(4 * 8 * n, 8, n)  # 4 elements per rank
    gathered = expected_output(spec, counts, op, dtype, 2, 0, n).tolist()
    assert gathered == [float(_pattern(op, i // 4, i)) for i in range(16)]
    spec = COLLECTIVES[Collective.REDUCE_SCATTER]
    counts = spec.counts(4 * 8 * n, 8, n)
    mine = expected_output(spec, counts, op, dtype, 2, 0, n).tolist()
    assert mine == [float(sum(_pattern(op, r, i) for r in range(n))) for i in range(8, 12)]
    spec = COLLECTIVES[Collective.BROADCAST]
    counts = spec.counts(40, 8, n)
    assert expected_output(spec, counts, op, dtype, 0, 3, n).tolist() == [float(_pattern(op, 3, i)) for i in range(5)]
    spec = COLLECTIVES[Collective.REDUCE]
    assert expected_output(spec, counts, op, dtype, 1, 3, n) is None
    assert expected_output(spec, counts, op, dtype, 3, 3, n) is not None


def test_broadcast_buffers_off_root_start_empty():
    spec = COLLECTIVES[Collective.BROADCAST]
    counts = spec.counts(64, 4, 2)
    off_root = make_buffers(spec, counts, RedOp.SUM, torch.float32, 1, 0, torch.device("cpu"))
    assert off_root.input is off_root.output and not off_root.output.any()
    expected = expected_output(spec, counts, RedOp.SUM, torch.float32, 1, 0, 2)
    assert count_wrong(off_root.output, expected, RedOp.SUM) == 16


def test_one_list_of_types_with_their_sizes():
    assert tuple(DTYPES) == tuple(DTYPE_ITEMSIZES)
    for name, dtype in DTYPES.items():
        assert torch.empty((), dtype=dtype).element_size() == DTYPE_ITEMSIZES[name], name
        assert dtype.is_floating_point == (name in FLOATING_DTYPES), name
    assert dtype_by_name("fp16") == ("half", torch.float16)


@pytest.mark.parametrize("traffic", [Traffic(), Traffic("zipf", seed=1), Traffic("hot", hot_rank=1)], ids=lambda t: t.pattern)
def test_alltoall_buffers_exchanged_by_hand_give_the_expected_outputs(traffic):
    """Cut every rank's send buffer into its blocks and hand block j to rank j: each rank's
    output is what expected_output says."""
    n, op, dtype = 3, RedOp.SUM, torch.int32
    spec = dataclasses.replace(COLLECTIVES[Collective.ALLTOALL], traffic=traffic)
    counts = spec.counts(3000, 4, n)
    sent = [make_buffers(spec, counts, op, dtype, r, 0, torch.device("cpu")) for r in range(n)]
    blocks = [list(torch.split(b.input, list(b.in_splits))) for b in sent]
    for rank in range(n):
        received = torch.cat([blocks[src][rank] for src in range(n)])
        assert sent[rank].output.numel() == received.numel() == sum(sent[rank].out_splits)
        assert torch.equal(expected_output(spec, counts, op, dtype, rank, 0, n), received)
