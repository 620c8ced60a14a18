"""The nccl-tests metrics (bus factors, bandwidths, buffer sizes), against hand-computed values."""

from __future__ import annotations


import pytest

from topocoll.errors import ScheduleError
from topocoll.solver.metrics import BufferBytes, algbw_bytes_per_s, bus_factor, busbw_bytes_per_s, collective_bytes
from topocoll.solver.schedule import Collective

N8 = 8


def test_bus_factors_follow_nccl_tests():
    assert bus_factor(Collective.ALLREDUCE, N8) == pytest.approx(2 * 7 / 8)
    assert bus_factor(Collective.ALLGATHER, N8) == pytest.approx(7 / 8)
    assert bus_factor(Collective.REDUCE_SCATTER, N8) == pytest.approx(7 / 8)
    assert bus_factor(Collective.BROADCAST, N8) == 1.0
    assert bus_factor(Collective.REDUCE, N8) == 1.0
    assert bus_factor(Collective.ALLREDUCE, 1) == 0.0
    with pytest.raises(ScheduleError):
        bus_factor(Collective.ALLREDUCE, 0)


def test_bandwidths():
    assert algbw_bytes_per_s(1e9, 0.5) == 2e9
    assert busbw_bytes_per_s(Collective.ALLREDUCE, 1e9, 0.5, 4) == pytest.approx(2e9 * 1.5)
    with pytest.raises(ScheduleError):
        algbw_bytes_per_s(1e9, 0.0)


def test_collective_bytes_size_is_the_total_buffer_for_gather_and_scatter():
    assert collective_bytes(Collective.ALLGATHER, 1000, 4) == BufferBytes(250, 1000)
    assert collective_bytes(Collective.REDUCE_SCATTER, 1000, 4) == BufferBytes(1000, 250)
    assert collective_bytes(Collective.ALLREDUCE, 1000, 4) == BufferBytes(1000, 1000)
    assert collective_bytes(Collective.BROADCAST, 1000, 4) == BufferBytes(1000, 1000)
    # rounded down to whole shards, as nccl-tests rounds the count
    assert collective_bytes(Collective.ALLGATHER, 1001, 4) == BufferBytes(250, 1000)
