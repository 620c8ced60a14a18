"""The benchmark metrics, defined once for the benchmark, the simulator and the reports.

Metrics (nccl-tests semantics, ``doc/PERFORMANCE.md`` of NVIDIA/nccl-tests)
---------------------------------------------------------------------------
``size`` is the size S in bytes that nccl-tests prints in its first column:

- allreduce, broadcast, reduce: the buffer each rank passes in (and gets back);
- allgather: the **total output** buffer (N shards of S/N bytes; each rank contributes one);
- reduce-scatter: the **total input** buffer (each rank keeps one shard of S/N bytes).

This is also the buffer whose fractions a schedule's chunks describe, so a schedule's
bandwidth time for size S is ``S × (its per-byte time)``. Given the time t of one operation:

- ``algbw = S / t``;
- ``busbw = algbw × factor`` with factor ``2(n−1)/n`` for allreduce, ``(n−1)/n`` for allgather
  and reduce-scatter, and 1 for broadcast and reduce. busbw is comparable with the hardware's
  link bandwidth whatever the number of ranks.

GB/s means 1e9 bytes per second (``topocoll.units.GB``).
"""

from __future__ import annotations

from dataclasses import dataclass

from topocoll.errors import ScheduleError
from topocoll.solver.schedule import Collective



def bus_factor(collective: Collective, world_size: int) -> float:
    """nccl-tests' bus-bandwidth factor: ``busbw = algbw × bus_factor``.

    Parameters
    ----------
    collective : Collective
    world_size : int
        Number of ranks n >= 1.

    Returns
    -------
    float
        ``2(n−1)/n`` for allreduce, ``(n−1)/n`` for allgather, reduce-scatter and all-to-all
        (of a rank's buffer, the 1/n it sends itself stays put), 1 for broadcast and reduce.

    Examples
    --------
    >>> bus_factor(Collective.ALLREDUCE, 8)
    1.75
    """
    if world_size < 1:
        raise ScheduleError(f"world size must be >= 1, got {world_size}")
    n = world_size
    if collective is Collective.ALLREDUCE:
        return 2.0 * (n - 1) / n
    if collective in (Collective.ALLGATHER, Collective.REDUCE_SCATTER, Collective.ALLTOALL):
        return (n - 1) / n
    return 1.0


def algbw_bytes_per_s(size_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth ``S / t`` in bytes per second (S as nccl-tests' ``size``)."""
    if time_s <= 0:
        raise ScheduleError(f"time must be > 0 to compute a bandwidth, got {time_s}")
    return size_bytes / time_s


def busbw_bytes_per_s(collective: Collective, size_bytes: float, time_s: float, world_size: int) -> float:
    """Bus bandwidth ``algbw × bus_factor`` in bytes per second."""
    return algbw_bytes_per_s(size_bytes, time_s) * bus_factor(collective, world_size)


@dataclass(frozen=True, slots=True)
class BufferBytes:
    """Per-rank buffer sizes of one operation of nccl-tests ``size`` S.

    Parameters
    ----------
    input_bytes : int
        What each rank passes in.
    output_bytes : int
        What each rank gets back.
    """

    input_bytes: int
    output_bytes: int


def collective_bytes(collective: Collective, size_bytes: int, world_size: int) -> BufferBytes:
    """Per-rank input and output sizes for nccl-tests ``size`` ``size_bytes``.

    A shard is ``size_bytes // world_size`` bytes (nccl-tests also rounds the count down to a
    multiple of the number of ranks).

    Parameters
    ----------
    collective : Collective
    size_bytes : int
        S as nccl-tests prints it (total buffer for allgather / reduce-scatter).
    world_size : int

    Returns
    -------
    BufferBytes

    Examples
    --------
    >>> collective_bytes(Collective.ALLGATHER, 1024, 4)
    BufferBytes(input_bytes=256, output_bytes=1024)
    """
    if world_size < 1:
        raise ScheduleError(f"world size must be >= 1, got {world_size}")
    if size_bytes < 0:
        raise ScheduleError(f"size must be >= 0 bytes, got {size_bytes}")
    shard = size_bytes // world_size
    if collective is Collective.ALLGATHER:
        return BufferBytes(shard, shard * world_size)
    if collective is Collective.REDUCE_SCATTER:
        return BufferBytes(shard * world_size, shard)
    return BufferBytes(size_bytes, size_bytes)
