"""The event simulator: a schedule's messages as flows that share links, started by their data.

The α-β model (:mod:`topocoll.solver.alpha_beta`) runs a schedule's steps in lock step. Real
executors do not: a rank sends a chunk as soon as that chunk has arrived, so the pieces of a
pipelined schedule overlap. This module simulates that.

The model
---------
- **Dependencies are rank-local.** A message that sends chunk ``c`` from rank ``r`` waits for
  every earlier message that wrote ``c`` on ``r`` (read after write). One that writes ``c`` on
  ``r`` waits for the earlier messages that read ``c`` there (write after read), and a copy
  also for the earlier writes (write after write). "Earlier" is the schedule's step order;
  messages of one step never wait for each other.
- **A message per connection and step.** The transfers of one step from one rank to another
  over the same path travel as one message, as executors send them. A connection sends its
  messages one at a time in step order, each once its data is there and the one before it has
  left (as a thread block works through its steps). So a pipelined schedule's pieces overlap:
  the first is on its next hop while the second is sent. Nothing else orders messages: there
  are no global steps.
- **A message is a flow over its path.** It enters the network ``per_message_overhead_s``
  after its connection took it up, then sends its bytes at the rate the network gives it. Flows
  that share a link share its bandwidth max-min fairly (progressive filling; every flow weighs
  the same), and rates are recomputed whenever a flow starts or ends.
- **Its data arrives** the path's summed link latency after its last byte left (cut-through:
  one latency per path, not per hop). Then the messages waiting for it may start.

For large messages the time tends to the schedule's bandwidth time T_bw when its pieces are
pipelined deeply enough; for tiny ones a chain of dependent messages costs one latency and one
overhead per link of the chain, as in the α-β model. What it leaves out: protocol efficiency,
congestion collapse, finite buffers, reduction arithmetic and memory bandwidth.

The cost is one pass over the transfers to build the dependency graph, then one rate
computation per distinct event time, each linear in the hops of the flows then active.
Symmetric schedules finish many flows at one instant, so the number of event times is far
below the number of transfers.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from topocoll.errors import ScheduleError
from topocoll.solver.alpha_beta import resolve_path
from topocoll.solver.metrics import algbw_bytes_per_s, bus_factor
from topocoll.solver.schedule import Op, Schedule
from topocoll.topo.model import Topology

__all__ = ["EventProgram", "EventResult", "LinkUse", "compile_events", "event_sweep", "message_count", "simulate_events"]

#: Two events closer than this fraction of the current time are one event: symmetric schedules
#: end many flows at the same instant up to floating-point rounding.
SAME_TIME_REL = 1e-9

#: A flow with fewer bytes left than this fraction of its size has finished (rounding).
DONE_REL = 1e-9


@dataclass(frozen=True, slots=True)
class EventProgram:
    """A schedule compiled for the event simulator; independent of the message size.

    Build it with :func:`compile_events` once and run it at many sizes.

    Attributes
    ----------
    links : tuple of (str, str)
        The links the schedule uses, in index order.
    bw_bytes_per_s : numpy.ndarray
        Their bandwidths.
    fraction : numpy.ndarray
        Per task, the share of S it moves (0 for the joins that gather dependencies).
    latency_s : numpy.ndarray
        Per task, the summed latency of its path (0 for joins).
    is_message : numpy.ndarray
        Per task, True for a message, False for a join.
    hop_start, hop_count : numpy.ndarray
        Per task, where its link indices start in ``hops`` and how many there are.
    hops : numpy.ndarray
        Link indices of every task's path, task after task.
    connection : numpy.ndarray
        Per task, the index of its connection (-1 for joins).
    dep_count : numpy.ndarray
        Per task, how many tasks it waits for.
    dependents : tuple of tuple of int
        Per task, the tasks that wait for it.
    messages : int
        Number of messages (tasks that are not joins).
    """

    links: tuple[tuple[str, str], ...]
    bw_bytes_per_s: np.ndarray
    fraction: np.ndarray
    latency_s: np.ndarray
    is_message: np.ndarray
    hop_start: np.ndarray
    hop_count: np.ndarray
    hops: np.ndarray
    connection: np.ndarray
    dep_count: np.ndarray
    dependents: tuple[tuple[int, ...], ...]
    messages: int


@dataclass(frozen=True, slots=True)
class LinkUse:
    """What one link carried in a simulated run."""

    src: str
    dst: str
    bytes: float
    bw_bytes_per_s: float
    utilisation: float  # bytes / (bandwidth x completion time), in [0, 1]


@dataclass(frozen=True, slots=True)
class EventResult:
    """One simulated operation.

    Attributes
    ----------
    size_bytes : float
        S, as nccl-tests counts it.
    time_s : float
        Completion: the last message's data arrived.
    algbw_bytes_per_s, busbw_bytes_per_s : float
        As nccl-tests defines them (0 for a schedule without transfers).
    links : tuple of LinkUse
        Every link the schedule uses, busiest first.
    events : int
        Distinct event times the simulation stepped through.
    """

    size_bytes: float
    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    links: tuple[LinkUse, ...]
    events: int

    def bottlenecks(self, tolerance: float = 0.01) -> tuple[LinkUse, ...]:
        """The links within ``tolerance`` (relative) of the highest utilisation."""
        if not self.links:
            return ()
        top = self.links[0].utilisation
        return tuple(use for use in self.links if use.utilisation >= top * (1 - tolerance))


class _Dependencies:
    """Builds the task graph: messages plus the joins that keep it linear in size."""

    def __init__(self) -> None:
        self.deps: list[list[int]] = []  # per task, the tasks it waits for

    def task(self, deps: Iterable[int]) -> int:
        self.deps.append(sorted(set(deps)))
        return len(self.deps) - 1

    def joined(self, tasks: list[int]) -> list[int]:
        """``tasks`` as one task: a join when there are several (so many readers cost one edge each)."""
        if len(tasks) <= 1:
            return tasks
        return [self.task(tasks)]


def compile_events(schedule: Schedule, topology: Topology) -> EventProgram:
    """The dependency graph and paths of ``schedule`` on ``topology``, for :func:`simulate_events`.

    Parameters
    ----------
    schedule : Schedule
        Any verified schedule (the simulator does not check its postcondition).
    topology : Topology
        The topology its paths run over.

    Returns
    -------
    EventProgram

    Raises
    ------
    ScheduleError
        A path is not a route of the topology.
    """
    fractions = schedule.chunk_fractions()
    graph = _Dependencies()
    writes: dict[tuple[int, int], list[int]] = {}  # (rank, chunk) -> tasks whose value it holds
    reads: dict[tuple[int, int], list[int]] = {}  # (rank, chunk) -> tasks reading that value
    connections: dict[tuple[int, int, tuple[str, ...]], int] = {}
    message_of_task: dict[int, tuple[float, tuple[str, ...], int]] = {}
    for step in schedule.steps:
        messages: dict[tuple[int, int, tuple[str, ...]], list] = {}
        for t in step:
            messages.setdefault((t.src, t.dst, t.path), []).append(t)
        started = []
        for connection, transfers in messages.items():  # each sees the values from before the step
            deps: list[int] = []
            for t in transfers:
                deps += writes.get((t.src, t.chunk), ())
                deps += reads.get((t.dst, t.chunk), ())
                if t.op is Op.COPY:
                    deps += writes.get((t.dst, t.chunk), ())
            task = graph.task(deps)
            share = sum(fractions[t.chunk] for t in transfers)
            message_of_task[task] = (share, connection[2], connections.setdefault(connection, len(connections)))
            started.append((task, transfers))
        touched = set()
        for task, transfers in started:
            for t in transfers:
                target = (t.dst, t.chunk)
                reads[target] = []
                if t.op is Op.COPY:
                    writes[target] = [task]
                else:
                    writes.setdefault(target, []).append(task)
                touched.add(target)
        for task, transfers in started:
            for t in transfers:
                reads.setdefault((t.src, t.chunk), []).append(task)
                touched.add((t.src, t.chunk))
        # Collapse what later messages will read or wait on, so each of them adds one
        # dependency however many messages wrote or read before.
        for key in touched:
            for table in (writes, reads):
                if key in table:
                    table[key] = graph.joined(table[key])
    return _program(graph, message_of_task, topology)


def _program(graph: _Dependencies, message_of_task: dict, topology: Topology) -> EventProgram:
    count = len(graph.deps)
    link_index: dict[tuple[str, str], int] = {}
    resolved: dict[tuple[str, ...], tuple[list[int], float]] = {}
    fraction = np.zeros(count)
    latency = np.zeros(count)
    is_message = np.zeros(count, dtype=bool)
    hop_count = np.zeros(count, dtype=np.int64)
    hops: list[int] = []
    hop_start = np.zeros(count, dtype=np.int64)
    connection = np.full(count, -1, dtype=np.int64)
    for task in range(count):
        hop_start[task] = len(hops)
        if task not in message_of_task:
            continue
        share, path, connection[task] = message_of_task[task]
        entry = resolved.get(path)
        if entry is None:
            try:
                links, lat = resolve_path(topology, path)
            except ScheduleError as exc:
                raise ScheduleError(f"message on path {'->'.join(path)}: {exc}") from None
            entry = ([link_index.setdefault(link, len(link_index)) for link in links], lat)
            resolved[path] = entry
        indices, lat = entry
        fraction[task], latency[task], is_message[task] = share, lat, True
        hop_count[task] = len(indices)
        hops.extend(indices)
    dependents: list[list[int]] = [[] for _ in range(count)]
    for task, deps in enumerate(graph.deps):
        for dep in deps:
            dependents[dep].append(task)
    links = tuple(link_index)
    return EventProgram(
        links=links,
        bw_bytes_per_s=np.array([topology.capacity(a, b) for a, b in links], dtype=float),
        fraction=fraction,
        latency_s=latency,
        is_message=is_message,
        hop_start=hop_start,
        hop_count=hop_count,
        hops=np.array(hops, dtype=np.int64),
        connection=connection,
        dep_count=np.array([len(d) for d in graph.deps], dtype=np.int64),
        dependents=tuple(tuple(d) for d in dependents),
        messages=len(message_of_task),
    )


def max_min_rates(flow_links: np.ndarray, flow_of_hop: np.ndarray, flows: int, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates of ``flows`` flows by progressive filling.

    Parameters
    ----------
    flow_links : numpy.ndarray
        The link index of every hop of every flow.
    flow_of_hop : numpy.ndarray
        The flow (0 .. flows-1) each hop belongs to.
    flows : int
        Number of flows.
    capacity : numpy.ndarray
        Bandwidth of every link.

    Returns
    -------
    numpy.ndarray
        One rate per flow; a flow without hops gets ``inf``.
    """
    rates = np.full(flows, np.inf)
    left = capacity.astype(float).copy()
    links = len(capacity)
    hop_links, hop_flows = flow_links, flow_of_hop  # the hops of flows not fixed yet
    while hop_links.size:
        crossing = np.bincount(hop_links, minlength=links)
        used = crossing > 0
        share = np.full(links, np.inf)
        share[used] = np.maximum(left[used], 0.0) / crossing[used]
        level = share.min()
        fixed = np.zeros(flows, dtype=bool)
        fixed[hop_flows[share[hop_links] <= level * (1 + 1e-12)]] = True
        rates[fixed] = level
        fixed_hops = fixed[hop_flows]
        left -= level * np.bincount(hop_links[fixed_hops], minlength=links)
        hop_links, hop_flows = hop_links[~fixed_hops], hop_flows[~fixed_hops]
    return rates


def simulate_events(
    program: EventProgram,
    schedule: Schedule,
    size_bytes: float,
    per_message_overhead_s: float = 0.0,
) -> EventResult:
    """Run ``program`` (compiled from ``schedule``) for a buffer of ``size_bytes``.

    Parameters
    ----------
    program : EventProgram
        From :func:`compile_events`.
    schedule : Schedule
        The schedule it was compiled from (for the collective and the world size).
    size_bytes : float
        S, as nccl-tests counts it.
    per_message_overhead_s : float
        Software cost of starting one message.

    Returns
    -------
    EventResult
    """
    if not size_bytes >= 0 or not math.isfinite(size_bytes):
        raise ScheduleError(f"size must be a finite number >= 0 bytes, got {size_bytes}")
    if not per_message_overhead_s >= 0:
        raise ScheduleError(f"per-message overhead must be >= 0 s, got {per_message_overhead_s}")
    run = _Run(program, size_bytes, per_message_overhead_s)
    time_s = run.finish()
    carried = np.zeros(len(program.links))
    np.add.at(carried, program.hops, np.repeat(program.fraction * size_bytes, program.hop_count))
    uses = [
        LinkUse(a, b, float(carried[i]), float(program.bw_bytes_per_s[i]),
                float(carried[i] / (program.bw_bytes_per_s[i] * time_s)) if time_s > 0 else 0.0)
        for i, (a, b) in enumerate(program.links)
    ]
    uses.sort(key=lambda use: (-use.utilisation, use.src, use.dst))
    if time_s > 0:
        alg = algbw_bytes_per_s(size_bytes, time_s)
        bus = alg * bus_factor(schedule.collective, schedule.world_size)
    else:
        alg = bus = 0.0
    return EventResult(float(size_bytes), time_s, alg, bus, tuple(uses), run.events)


class _Run:
    """The state of one simulation: waiting, starting, sending and arriving tasks."""

    def __init__(self, program: EventProgram, size_bytes: float, overhead_s: float) -> None:
        self.p = program
        self.size = size_bytes
        self.overhead = overhead_s
        self.waiting = program.dep_count.copy()
        self.timers: list[tuple[float, int, int]] = []  # (time, kind, task): 0 start sending, 1 arrived
        self.sending = np.zeros(0, dtype=np.int64)  # tasks whose bytes are in flight
        self.left = np.zeros(0)  # their bytes left
        self.rate = np.zeros(0)
        self.now = 0.0
        self.done = 0
        self.events = 0
        self.last_arrival = 0.0
        connections = int(program.connection.max()) + 1 if len(program.connection) else 0
        self.order: list[list[int]] = [[] for _ in range(connections)]  # messages per connection, step order
        for task in np.flatnonzero(program.connection >= 0):
            self.order[int(program.connection[task])].append(int(task))
        self.next = [0] * connections  # position of each connection's next message
        self.is_ready = np.zeros(len(program.connection), dtype=bool)
        self.busy = np.zeros(connections, dtype=bool)

    def finish(self) -> float:
        """Run to the end; the time the last data arrived."""
        self.ready(int(task) for task in np.flatnonzero(self.waiting == 0))
        while self.timers or len(self.sending):
            self.events += 1
            dt = self.timers[0][0] - self.now if self.timers else math.inf
            to_end = self.left / self.rate if len(self.sending) else np.zeros(0)
            if len(to_end):
                dt = min(dt, float(to_end.min()))
            dt = max(dt, 0.0)
            self.now += dt
            tolerance = SAME_TIME_REL * self.now
            new: list[int] = []
            changed = False
            if len(self.sending):
                ending = to_end <= dt + tolerance
                self.left = self.left - self.rate * dt
                if ending.any():
                    changed = True
                    for task in self.sending[ending]:
                        self.arrive(int(task))
                        self.free(int(self.p.connection[task]))
                    keep = ~ending
                    self.sending, self.left, self.rate = self.sending[keep], self.left[keep], self.rate[keep]
            while self.timers and self.timers[0][0] <= self.now + tolerance:
                _, kind, task = heapq.heappop(self.timers)
                if kind == 1:
                    self.complete(task)
                elif self.p.fraction[task] * self.size > 0 and self.p.hop_count[task] > 0:
                    new.append(task)
                else:
                    self.arrive(task)
                    self.free(int(self.p.connection[task]))
            if new:
                changed = True
                self.sending = np.concatenate([self.sending, np.array(new, dtype=np.int64)])
                self.left = np.concatenate([self.left, self.p.fraction[new] * self.size])
            if changed:
                self.share()
        if self.done != len(self.waiting):
            raise ScheduleError("the schedule's dependencies form a cycle")  # impossible by construction
        return self.last_arrival

    def ready(self, tasks: Iterable[int]) -> None:
        """All inputs of ``tasks`` are there: messages start after the overhead, joins are done."""
        stack = list(tasks)
        while stack:
            task = stack.pop()
            if self.p.is_message[task]:
                self.is_ready[task] = True
                self.take(int(self.p.connection[task]))
                continue
            self.done += 1
            stack.extend(self.release(task))

    def release(self, task: int) -> list[int]:
        """The dependents of ``task`` that waited for nothing else."""
        freed = []
        for dependent in self.p.dependents[task]:
            self.waiting[dependent] -= 1
            if self.waiting[dependent] == 0:
                freed.append(dependent)
        return freed

    def complete(self, task: int) -> None:
        """The data of message ``task`` has arrived."""
        self.done += 1
        self.last_arrival = max(self.last_arrival, self.now)
        self.ready(self.release(task))

    def take(self, connection: int) -> None:
        """Start ``connection``'s next message if the connection is free and the message ready."""
        position = self.next[connection]
        if self.busy[connection] or position >= len(self.order[connection]):
            return
        task = self.order[connection][position]
        if self.is_ready[task]:
            self.busy[connection] = True
            heapq.heappush(self.timers, (self.now + self.overhead, 0, task))

    def free(self, connection: int) -> None:
        """The message on ``connection`` has left; the next one may go when ready."""
        self.busy[connection] = False
        self.next[connection] += 1
        self.take(connection)

    def arrive(self, task: int) -> None:
        heapq.heappush(self.timers, (self.now + self.p.latency_s[task], 1, task))

    def share(self) -> None:
        if not len(self.sending):
            self.rate = np.zeros(0)
            return
        counts = self.p.hop_count[self.sending]
        starts = self.p.hop_start[self.sending]
        flow_of_hop = np.repeat(np.arange(len(self.sending)), counts)
        offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        flow_links = self.p.hops[np.repeat(starts, counts) + offsets]
        self.rate = max_min_rates(flow_links, flow_of_hop, len(self.sending), self.p.bw_bytes_per_s)


def message_count(schedule: Schedule) -> int:
    """How many messages the simulator will move for ``schedule`` (its cost follows this number):
    the transfers of one step from one rank to another over one path are one message."""
    return sum(len({(t.src, t.dst, t.path) for t in step}) for step in schedule.steps)


def event_sweep(
    schedule: Schedule,
    topology: Topology,
    sizes_bytes: Iterable[float],
    per_message_overhead_s: float = 0.0,
) -> tuple[EventResult, ...]:
    """:func:`simulate_events` at each size, compiling the schedule once."""
    program = compile_events(schedule, topology)
    return tuple(simulate_events(program, schedule, size, per_message_overhead_s) for size in sizes_bytes)
