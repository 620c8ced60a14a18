"""The α-β cost model of a schedule (step by step) and its sweep over sizes.

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

The metrics it reports are :mod:`topocoll.solver.metrics`'.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from topocoll.errors import ScheduleError
from topocoll.solver.schedule import Schedule
from topocoll.solver.metrics import algbw_bytes_per_s, bus_factor
from topocoll.topo.model import Topology



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
    sizes = schedule.chunk_fractions()
    # Each distinct path is resolved once, to link numbers (cheap dictionary keys) and latency.
    resolved: dict[tuple[str, ...], tuple[tuple[int, ...], float]] = {}
    link_number: dict[tuple[str, str], int] = {}
    bw: list[float] = []
    costs = []
    for s, step in enumerate(schedule.steps):
        load: dict[int, float] = {}
        latency_s = 0.0
        for t in step:
            entry = resolved.get(t.path)
            if entry is None:
                try:
                    links, lat = resolve_path(topology, t.path)
                except ScheduleError as exc:
                    raise ScheduleError(f"step {s}: transfer {t.src}->{t.dst} chunk {t.chunk}: {exc}") from None
                for link in links:
                    if link not in link_number:
                        link_number[link] = len(bw)
                        bw.append(topology.capacity(*link))
                entry = resolved[t.path] = (tuple(link_number[link] for link in links), lat)
            numbers, lat = entry
            if lat > latency_s:
                latency_s = lat
            fraction = sizes[t.chunk]
            for i in numbers:
                load[i] = load.get(i, 0.0) + fraction
        s_per_byte = max((f / bw[i] for i, f in load.items()), default=0.0)
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
