"""The α-β cost model, the schedule simulator, and the benchmark metrics.

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

The α-β model
-------------
A schedule's steps run one after the other. Step k takes

    ``T_k = max over links e of (S × f_k(e)) / bw(e)  +  max over transfers of (latency(path) + o)``

where ``f_k(e)`` is the sum of the chunk fractions the transfers of step k route over link e,
``latency(path)`` the summed link latencies and ``o`` the per-message software overhead. The
time of the schedule is the sum over its non-empty steps.

What it leaves out: steps are barriers (no overlap between steps, so it overestimates pipelined
executions, whose ideal is the verifier's ``T_bw``); links are shared as a fluid at full
bandwidth (no protocol efficiency, no congestion collapse, switches are non-blocking); routes
are cut-through (one latency per path, no store-and-forward); concurrent messages of one step
pay the overhead once; reduction arithmetic and memory bandwidth are free.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from topocoll.errors import ScheduleError
from topocoll.solver.schedule import Collective, Schedule
from topocoll.topo.model import Topology

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- metrics
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
        ``2(n−1)/n`` for allreduce, ``(n−1)/n`` for allgather and reduce-scatter, 1 for
        broadcast and reduce.

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
    if collective in (Collective.ALLGATHER, Collective.REDUCE_SCATTER):
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


# ---------------------------------------------------------------------------- paths
def resolve_path(topology: Topology, path: tuple[str, ...]) -> tuple[tuple[tuple[str, str], ...], float]:
    """The links of ``path`` and its summed latency.

    Raises
    ------
    ScheduleError
        A hop is not a link of the topology, or the path visits a node twice.
    """
    graph = topology.graph
    links = tuple(zip(path, path[1:]))
    latency_s = 0.0
    for a, b in links:
        data = graph.get_edge_data(a, b)
        if data is None:
            raise ScheduleError(f"hop {a}->{b} is not a link of the topology")
        latency_s += data["record"].latency_s
    if len(set(path)) != len(path):
        repeated = next(node for node in path if path.count(node) > 1)
        raise ScheduleError(f"path visits node {repeated} twice")
    return links, latency_s


# ------------------------------------------------------------------------ the model
@dataclass(frozen=True, slots=True)
class StepCost:
    """The size-independent figures of one step.

    Parameters
    ----------
    s_per_byte : float
        Bandwidth term per byte of S: ``max_e f(e) / bw(e)``.
    latency_s : float
        Largest path latency among the step's transfers (0 for an empty step).
    transfers : int
        Number of transfers.
    """

    s_per_byte: float
    latency_s: float
    transfers: int

    def time_s(self, size_bytes: float, per_message_overhead_s: float) -> float:
        """Time of the step for a buffer of ``size_bytes``."""
        if self.transfers == 0:
            return 0.0
        return size_bytes * self.s_per_byte + self.latency_s + per_message_overhead_s


def step_costs(schedule: Schedule, topology: Topology) -> tuple[StepCost, ...]:
    """Per-step figures of the α-β model (see the module docstring).

    Raises
    ------
    ScheduleError
        A path is not a route of the topology (run the verifier for a full report).
    """
    sizes = {c.id: c.size for c in schedule.chunks}
    resolved: dict[tuple[str, ...], tuple[tuple[tuple[str, str], ...], float]] = {}
    bw = {(link.src, link.dst): link.bw_bytes_per_s for link in topology.links}
    costs = []
    for s, step in enumerate(schedule.steps):
        load: dict[tuple[str, str], float] = {}
        latency_s = 0.0
        for t in step:
            entry = resolved.get(t.path)
            if entry is None:
                try:
                    entry = resolve_path(topology, t.path)
                except ScheduleError as exc:
                    raise ScheduleError(f"step {s}: transfer {t.src}->{t.dst} chunk {t.chunk}: {exc}") from None
                resolved[t.path] = entry
            links, lat = entry
            latency_s = max(latency_s, lat)
            fraction = sizes[t.chunk]
            for link in links:
                load[link] = load.get(link, 0.0) + fraction
        s_per_byte = max((f / bw[link] for link, f in load.items()), default=0.0)
        costs.append(StepCost(s_per_byte, latency_s, len(step)))
    return tuple(costs)


def alpha_beta_time_s(
    schedule: Schedule, topology: Topology, size_bytes: float, per_message_overhead_s: float = 0.0
) -> float:
    """Time of ``schedule`` for nccl-tests size ``size_bytes`` under the α-β model.

    Parameters
    ----------
    schedule : Schedule
    topology : Topology
    size_bytes : float
        S (the total buffer for allgather / reduce-scatter).
    per_message_overhead_s : float
        Software cost per step's messages (α beyond the links' latency).

    Returns
    -------
    float
        Seconds.
    """
    _check_size(size_bytes, per_message_overhead_s)
    return sum(c.time_s(size_bytes, per_message_overhead_s) for c in step_costs(schedule, topology))


@dataclass(frozen=True, slots=True)
class SimulatedPoint:
    """One simulated operation, reported as nccl-tests would."""

    size_bytes: float
    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float


def simulate(
    schedule: Schedule,
    topology: Topology,
    sizes_bytes: Iterable[float],
    per_message_overhead_s: float = 0.0,
) -> tuple[SimulatedPoint, ...]:
    """The α-β time, algbw and busbw of ``schedule`` at each size.

    The per-step figures are computed once, so a sweep over many sizes costs one pass over the
    schedule. A schedule without transfers (one rank) reports zero time and bandwidth.
    """
    costs = step_costs(schedule, topology)
    points = []
    for size in sizes_bytes:
        _check_size(size, per_message_overhead_s)
        time_s = sum(c.time_s(size, per_message_overhead_s) for c in costs)
        if time_s > 0:
            alg = algbw_bytes_per_s(size, time_s)
            bus = alg * bus_factor(schedule.collective, schedule.world_size)
        else:
            alg = bus = 0.0
        points.append(SimulatedPoint(float(size), time_s, alg, bus))
    return tuple(points)


def _check_size(size_bytes: float, per_message_overhead_s: float) -> None:
    if not size_bytes >= 0:
        raise ScheduleError(f"size must be >= 0 bytes, got {size_bytes}")
    if not per_message_overhead_s >= 0:
        raise ScheduleError(f"per-message overhead must be >= 0 s, got {per_message_overhead_s}")
