"""Choosing the schedule to run: synthesized trees or a baseline, for a given message size.

:func:`plan_collective` is the entry point of the solver. It checks the request, computes the cut bound,
packs trees by LP (:mod:`topocoll.solver.synthesize`), lays them out at several pipeline
depths, adds the direct multi-path schedule on small worlds (:mod:`topocoll.solver.direct`:
one step per phase, each pair over several paths; where that falls short of the bound, also
with parts of each shard forwarded once by another rank) and, on networks, rings weighted by their
bandwidth (:func:`topocoll.solver.baselines.weighted_rings`: at the bound of a multi-rail
network with one transfer per link), builds the baselines, verifies every
candidate, and keeps the one with the lowest predicted time at ``size_bytes`` when a size is given (so small messages get shallow,
low-latency schedules), else the bandwidth time (ties broken by the predicted time at
:data:`BANDWIDTH_REFERENCE_BYTES`). The prediction is the event simulator's
(:mod:`topocoll.solver.events`: pieces of a pipelined layout overlap, links are shared max-min
fairly) for the candidates the α-β model (steps in lock step) puts near the fastest, while they
hold at most :data:`EVENT_MODEL_MAX_MESSAGES` messages together (:func:`predict_times`), and
the α-β model's otherwise. Among candidates predicted within :data:`NEAR_TIE` of the
fastest, the one that puts the fewest concurrent transfers on a network link wins: the model prices
link sharing as perfect, real transports do not. When the LP fails or runs out of
time before it found anything, a verified baseline is returned with a warning: never nothing.

Where the runtime can hand a collective to its inner backend and a model of that backend's
own collectives is given (``native_model``: :class:`topocoll.solver.nccl_model.NcclNative`
for NCCL), the backend's collective is a candidate priced by that model, and every schedule
is held to that backend (timed on :func:`backend_topology`: the share of each link the
backend's point-to-point copies reach, its real latencies; and its host cost per call, a
floor under the time of calls issued back to back), so that the two are compared like with
like: a collective is handed to NCCL wherever NCCL is predicted faster.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import networkx as nx

from topocoll.errors import ScaleError, ScheduleError, SolverError
from topocoll.solver import baselines
from topocoll.solver.alpha_beta import alpha_beta_time_s
from topocoll.solver.bound import Bound, cut_bound
from topocoll.solver.direct import direct, two_hop, two_hop_routings
from topocoll.solver.rail_packing import host_groups
from topocoll.solver.events import compile_events, simulate_events
from topocoll.solver.request import check_request
from topocoll.solver.schedule import NATIVE, Collective, Schedule
from topocoll.solver.synthesize import SynthesisOptions, layout, pack_for
from topocoll.solver.verify import Verification, check_verify_memory, verify
from topocoll.topo.model import LinkKind, Topology

log = logging.getLogger(__name__)

#: Software cost of one step's messages in the α-β model when nothing better is known: NCCL's
#: base latency for a ring with the Simple protocol (``baseLat`` in ``src/graph/tuning.cc``).
DEFAULT_PER_MESSAGE_OVERHEAD_S = 8.4e-6

#: Above this many messages over the candidates it would simulate, the planner predicts with
#: the α-β model instead of the event simulator. The simulator's cost follows the messages
#: (transfers of one step between two ranks on one path) more closely than the transfers:
#: 150-310 us per message on 2 cores (``benchmarks/results/events_bench.md``: 1,783 messages
#: of a DGX-1 allreduce in 0.28 s, 8,292 of a DGX A100 allgather in 2.5 s), so this keeps the
#: simulations of one plan within about 2 s.
EVENT_MODEL_MAX_MESSAGES = 6_000

#: Candidates the α-β model predicts more than this many times slower than its fastest are not
#: simulated (their α-β time stands): overlapped execution changed no candidate's time by more
#: than a quarter in ``benchmarks/results/events_bench.md``.
EVENT_MODEL_SHORTLIST = 2.0

#: Up to this many ranks the direct multi-path schedule (:mod:`topocoll.solver.direct`) is a
#: candidate: it holds 2 N (N - 1) transfers per piece of a shard (a few dozen pieces on 8 GPUs).
DIRECT_MAX_RANKS = 16

#: The collectives the direct schedule has a form for (broadcast and reduce have none).
DIRECT_COLLECTIVES = frozenset({Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCE_SCATTER})

#: Slices per shard tried for the two-hop schedule (:func:`topocoll.solver.direct.two_hop`).
#: Deeper ones lost on the MI300X preset (64 MiB allgather by the event simulator: 136, 157
#: and 185 us at 1, 2 and 4 slices): every slice costs a message per connection, and with
#: no per-message cost at all 4 slices still took 127 us against 119 us for one.
TWO_HOP_DEPTHS = (1, 2)

#: Pipeline depths tried for the synthesized trees.
PIPELINE_DEPTHS = (1, 2, 4, 8, 16)

#: Above this many ranks every depth's layout holds up to millions of transfers: try every
#: other depth (measured: 5 depths took 30-60 s of the planner's time at 256 ranks).
MANY_RANKS = 64

#: Above this many ranks only the unpipelined layout is tried, and of the baselines only the
#: low-latency ones, double binary tree and recursive doubling (schedules grow as N^2 transfers
#: per pipeline piece; building and verifying rings would cost more than the synthesis).
LARGE_WORLD_RANKS = 256


class PlanStatus(str, enum.Enum):
    """How the chosen schedule came about."""

    OPTIMAL = "optimal"  # LP trees within the gap of the bound (or proven optimal)
    LIMIT = "limit"  # LP trees, but column generation stopped at its time limit
    DIRECT = "direct"  # the direct multi-path schedule (or two-hop) was predicted fastest at this size
    FALLBACK = "fallback"  # the LP failed; a baseline was chosen instead
    BASELINE = "baseline"  # a baseline was predicted faster at this size


class NativeModel(Protocol):
    """A prediction of the inner backend's own collectives (see :class:`topocoll.solver.nccl_model.NcclNative`)."""

    @property
    def call_overhead_s(self) -> float:
        """The host's cost of any collective call on this backend, which schedules pay too."""
        ...

    def call_s(self, device_s: float) -> float:
        """The time of a call that keeps the device busy ``device_s``, the host's cost
        included (calls issued back to back overlap the two)."""
        ...

    def link_efficiency(self, kind: LinkKind) -> float:
        """The share of a ``kind`` link's bandwidth the backend's point-to-point transfers
        reach: a schedule run on the backend sees each link that much narrower."""
        ...

    @property
    def latency_factor(self) -> float:
        """What the backend's real latencies are of the figures the schedules are priced with
        (per-message overheads, path latencies), which a schedule's latency time is multiplied by."""
        ...

    def time_s(self, collective: Collective, size_bytes: float) -> float:
        """Predicted time of the backend's own ``collective`` of ``size_bytes``."""
        ...

    def algbw_bytes_per_s(self, collective: Collective) -> float:
        """The backend's best algorithm bandwidth for ``collective`` (large sizes)."""
        ...


@dataclass(frozen=True, slots=True)
class Candidate:
    """One verified candidate schedule and its predicted times.

    A :data:`NATIVE` candidate priced by a native model carries the model's bandwidth time
    (``native_t_bw_s_per_byte``); its schedule is a stand-in (a ring in rank order, a double
    binary tree beyond :data:`LARGE_WORLD_RANKS`) that only proves the collective can run.
    """

    name: str
    schedule: Schedule
    verification: Verification
    predicted_time_s: float | None = None  # at the plan's size, by the plan's model
    native_t_bw_s_per_byte: float | None = None

    @property
    def t_bw_s_per_byte(self) -> float:
        """Bandwidth time per byte of the collective's size."""
        if self.native_t_bw_s_per_byte is not None:
            return self.native_t_bw_s_per_byte
        return self.verification.t_bw_s_per_byte


@dataclass(frozen=True, slots=True)
class Plan:
    """The outcome of :func:`plan_collective`.

    Attributes
    ----------
    schedule : Schedule
        The chosen, verified schedule.
    status : PlanStatus
    bound : Bound
    chosen : Candidate
    candidates : tuple of Candidate
        Every verified candidate, the chosen one included.
    size_bytes : float or None
    warnings : tuple of str
    model : str
        What predicted the candidates' times: ``"events"`` or ``"alpha-beta"`` (with ``"+native
        model"`` when a native model priced the inner backend's collective).
    """

    schedule: Schedule
    status: PlanStatus
    bound: Bound
    chosen: Candidate
    candidates: tuple[Candidate, ...]
    size_bytes: float | None
    warnings: tuple[str, ...]
    model: str = "alpha-beta"

    @property
    def ratio_to_bound(self) -> float:
        """``bound / T_bw`` of the chosen schedule (1.0 = optimal)."""
        return self.bound.time_per_byte_s / self.chosen.t_bw_s_per_byte

    def candidate(self, name: str) -> Candidate | None:
        """The candidate called ``name`` (e.g. ``"ring"``), if it was built."""
        return next((c for c in self.candidates if c.name == name), None)


#: Without a size, the fastest schedules by bandwidth time tie (pipelining does not change
#: link loads); the tie goes to the one with the best α-β time at this large size.
BANDWIDTH_REFERENCE_BYTES = 1 << 30


#: Candidates whose predicted times are within this fraction of the fastest count as tied;
#: the tie goes to the fewest concurrent transfers per network link
#: (:func:`max_network_flows_per_link`). The α-β model shares a link perfectly among its
#: flows, which TCP connections through one rate-limited NIC do not: on the emulated
#: ``uniform`` switch (``benchmarks/results/emulated/``) an LP packing with 11-14 transfers per
#: host link in a step reached 75-85 % of the bound where the ring, predicted 0.05 % slower
#: with one transfer per link, reached 91-95 %. 2 % is well inside that loss and well above
#: the differences between pipeline depths of one packing.
NEAR_TIE = 0.02

#: The links where crowding was measured to cost: network links. Between ranks of one host
#: (shared memory) the LP's crowded packing ran 10-25 % faster than the ring on a 2-core
#: host, so there the α-β time alone decides.
CROWDING_KINDS = frozenset({LinkKind.NET})


def max_network_flows_per_link(schedule: Schedule, topology: Topology) -> int:
    """The most transfers that cross one directed network link within one step of ``schedule``.

    Parameters
    ----------
    schedule : Schedule
    topology : Topology
        Gives each hop's link kind; only :data:`CROWDING_KINDS` links are counted.

    Returns
    -------
    int
        0 for a schedule that sends nothing over the network.
    """
    crowding = {(link.src, link.dst) for link in topology.links if link.kind in CROWDING_KINDS}
    most = 0
    for step in schedule.steps:
        counts: dict[tuple[str, str], int] = {}
        for transfer in step:
            for hop in zip(transfer.path, transfer.path[1:]):
                if hop in crowding:
                    counts[hop] = counts.get(hop, 0) + 1
        most = max(most, max(counts.values(), default=0))
    return most


def native_ring_applies(topology: Topology, ranks: Sequence[str]) -> bool:
    """Whether an inner backend's own ring, run over its one connection per pair, takes the
    routes of :func:`topocoll.solver.baselines.rank_order_ring`: every rank is alone on its
    machine (nothing to gain from shared memory) and every machine reaches the network by one
    link (its connections have one way out).

    Parameters
    ----------
    topology : Topology
    ranks : sequence of str
        Rank nodes, in rank order.

    Returns
    -------
    bool
        False too when a rank's node names no machine (``host_id``).
    """
    hosts = [topology.node(r).host_id for r in ranks]
    if None in hosts or len(set(hosts)) != len(hosts):
        return False
    machine = {n.id: n.host_id for n in topology.nodes if n.host_id is not None}
    exits: dict[str, int] = {}
    for link in topology.links:
        host = machine.get(link.src)
        if host is not None and link.kind in CROWDING_KINDS and machine.get(link.dst) != host:
            exits[host] = exits.get(host, 0) + 1
    return all(exits.get(host, 0) == 1 for host in hosts)


def _crosses_network(topology: Topology, ranks: Sequence[str]) -> bool:
    """Whether some ranks reach each other only through :data:`CROWDING_KINDS` links."""
    inside = nx.Graph()
    inside.add_nodes_from(ranks)
    inside.add_edges_from((link.src, link.dst) for link in topology.links if link.kind not in CROWDING_KINDS)
    return not all(nx.has_path(inside, ranks[0], r) for r in ranks[1:])


def choose(
    times_s: Sequence[float],
    network_flows: Sequence[int],
    steps: Sequence[int],
    preferred: Sequence[bool] | None = None,
    t_bw_s_per_byte: Sequence[float] | None = None,
) -> int:
    """The planner's rule: which of several candidates to run, given their predicted times.

    The fastest wins; candidates within :data:`NEAR_TIE` of it count as tied, and a tie goes to
    the fewest concurrent transfers per network link, then to a preferred candidate (the
    inner backend's own collective, :data:`NATIVE`), then to one whose bandwidth time is within
    :data:`NEAR_TIE` of the best among the tied, then to the shorter time, then to the fewest
    steps. The bandwidth time is exact (the verifier computes it) where the predicted time is a
    model's, and a schedule with the better one gains as sizes grow: within the model's error,
    it is the safer choice (a partial DGX-1: LP trees at the bound predicted 0.2-0.6 % slower
    than a ring at 89 % of it, at 64 MiB).

    Parameters
    ----------
    times_s : sequence of float
        Each candidate's predicted time (any model, the same for all).
    network_flows : sequence of int
        Each candidate's :func:`max_network_flows_per_link`.
    steps : sequence of int
        Each candidate's number of steps.
    preferred : sequence of bool, optional
        Candidates that win a tie of equally crowded ones (default: none).
    t_bw_s_per_byte : sequence of float, optional
        Each candidate's bandwidth time per byte (default: not weighed).

    Returns
    -------
    int
        The index of the chosen candidate.

    See Also
    --------
    plan_collective : chooses with the α-β time at a size.
    topocoll.bench.simulate_cli.simulate_report : chooses the same way, per size of a sweep.

    Examples
    --------
    >>> choose([1.00, 1.01, 2.0], [12, 1, 1], [3, 9, 9])  # near tie: the uncrowded one
    1
    >>> choose([1.0, 1.5], [12, 1], [3, 3])
    0
    """
    best = min(times_s)
    tied = [i for i, t in enumerate(times_s) if t <= best * (1 + NEAR_TIE)]
    favour = preferred if preferred is not None else [False] * len(times_s)
    t_bw = t_bw_s_per_byte if t_bw_s_per_byte is not None else [0.0] * len(times_s)
    widest = min(t_bw[i] for i in tied)
    return min(tied, key=lambda i: (network_flows[i], not favour[i], t_bw[i] > widest * (1 + NEAR_TIE), times_s[i], steps[i]))


def backend_topology(native_model: NativeModel, topology: Topology) -> Topology:
    """``topology`` as the backend's own transfers see it: each link narrowed to the share of
    its kind they reach (:meth:`NativeModel.link_efficiency`), each latency times the backend's
    latency factor. A schedule run on the backend is timed on it.

    Parameters
    ----------
    native_model : NativeModel
    topology : Topology

    Returns
    -------
    Topology
    """
    factor = native_model.latency_factor
    links = [
        dataclasses.replace(link, bw_bytes_per_s=link.bw_bytes_per_s * native_model.link_efficiency(link.kind), latency_s=link.latency_s * factor)
        for link in topology.links
    ]
    return Topology(topology.nodes, links, name=topology.name, notes=topology.notes)


def predict_times(
    candidates: Sequence[Candidate], topology: Topology, size_bytes: float, per_message_overhead_s: float,
    native_model: NativeModel | None = None,
) -> tuple[tuple[Candidate, ...], str]:
    """``candidates`` with their predicted time at ``size_bytes``, and the model that gave it.

    With a ``native_model``, the :data:`NATIVE` candidate takes its time from it, and every other
    candidate is held to the same backend: it is timed on the graph as the backend's transfers
    see it (:func:`backend_topology`), with the per-message overhead times the backend's latency
    factor, and pays the backend's cost per call as the backend's own collectives do
    (:meth:`NativeModel.call_s`).
    """
    if native_model is None:
        return _predict_schedules(candidates, topology, size_bytes, per_message_overhead_s)
    scheduled = [c for c in candidates if c.name != NATIVE]
    timed: tuple[Candidate, ...] = ()
    model = "alpha-beta"
    if scheduled:
        held = backend_topology(native_model, topology)
        overhead_s = per_message_overhead_s * native_model.latency_factor
        alpha_beta = [alpha_beta_time_s(c.schedule, held, size_bytes, overhead_s) for c in scheduled]
        timed, model = _predict_schedules(scheduled, held, size_bytes, overhead_s, alpha_beta)
    on_backend = iter(timed)
    out = []
    for c in candidates:
        if c.name == NATIVE:
            collective = c.schedule.collective
            out.append(dataclasses.replace(
                c, predicted_time_s=native_model.time_s(collective, size_bytes),
                native_t_bw_s_per_byte=1.0 / native_model.algbw_bytes_per_s(collective),
            ))
        else:
            timed_c = next(on_backend)
            out.append(dataclasses.replace(timed_c, predicted_time_s=native_model.call_s(timed_c.predicted_time_s)))
    return tuple(out), model + "+native model"


def _predict_schedules(
    candidates: Sequence[Candidate], topology: Topology, size_bytes: float, per_message_overhead_s: float,
    alpha_beta: Sequence[float] | None = None,
) -> tuple[tuple[Candidate, ...], str]:
    """The schedules' times on ``topology`` (see :func:`predict_times`).

    The candidates within :data:`EVENT_MODEL_SHORTLIST` of the fastest by α-β time (``alpha_beta``
    on this topology, else what their verification computed) are run through the event
    simulator, when they hold at most :data:`EVENT_MODEL_MAX_MESSAGES` messages together; the
    others keep their α-β time. Beyond that budget every candidate keeps its α-β time.
    """
    alpha_beta = list(alpha_beta) if alpha_beta is not None else [c.verification.alpha_beta_time_s for c in candidates]
    shortlist = [i for i, t in enumerate(alpha_beta) if t <= min(alpha_beta) * EVENT_MODEL_SHORTLIST]
    programs = {}
    for i in sorted(shortlist, key=lambda i: candidates[i].schedule.transfer_count()):
        programs[i] = compile_events(candidates[i].schedule, topology)
        if sum(p.messages for p in programs.values()) > EVENT_MODEL_MAX_MESSAGES:
            return tuple(dataclasses.replace(c, predicted_time_s=t) for c, t in zip(candidates, alpha_beta)), "alpha-beta"
    times = list(alpha_beta)
    for i, program in programs.items():
        times[i] = simulate_events(program, candidates[i].schedule, size_bytes, per_message_overhead_s).time_s
    return tuple(dataclasses.replace(c, predicted_time_s=t) for c, t in zip(candidates, times)), "events"


def _choose(candidates: Sequence[Candidate], size_bytes: float | None, topology: Topology) -> Candidate:
    if size_bytes is None:
        fastest = min(c.t_bw_s_per_byte for c in candidates)
        candidates = [c for c in candidates if c.t_bw_s_per_byte <= fastest * (1 + NEAR_TIE)]
    index = choose(
        [c.predicted_time_s for c in candidates],
        [max_network_flows_per_link(c.schedule, topology) for c in candidates],
        [len(c.schedule.steps) for c in candidates],
        [c.name == NATIVE for c in candidates],
        [c.t_bw_s_per_byte for c in candidates],
    )
    return candidates[index]


def _packs_by_rails(topology: Topology, collective: Collective, ranks: Sequence[str], options: SynthesisOptions) -> bool:
    """Whether :func:`~topocoll.solver.synthesize.pack_for` packs these ranks hierarchically."""
    return not collective.is_rooted and len(ranks) > options.flat_max_ranks and host_groups(topology, ranks) is not None


def plan_collective(
    topology: Topology,
    collective: Collective | str,
    ranks: Sequence[str] | None = None,
    root: int | None = None,
    size_bytes: float | None = None,
    *,
    per_message_overhead_s: float = DEFAULT_PER_MESSAGE_OVERHEAD_S,
    options: SynthesisOptions = SynthesisOptions(),
    baseline_names: Sequence[str] | None = None,
    native: Collection[Collective] = (),
    native_model: NativeModel | None = None,
) -> Plan:
    """Synthesize, compare and verify: the schedule to run for one collective.

    Parameters
    ----------
    topology : Topology
    collective : Collective or str
    ranks : sequence of str, optional
        Rank nodes in rank order (default: all compute nodes of the topology).
    root : int, optional
        Root rank for broadcast and reduce.
    size_bytes : float, optional
        Message size (nccl-tests convention); chooses pipeline depth and algorithm by the
        predicted time (see the module documentation). Without it the bandwidth-optimal
        schedule wins.
    per_message_overhead_s : float
        Software cost per message (event simulator) or per step (α-β model).
    options : SynthesisOptions
        LP settings (solver, time limit, gap); ``options.pipeline`` is ignored, depths from
        :data:`PIPELINE_DEPTHS` are compared instead.
    baseline_names : sequence of str, optional
        Baselines to compare (default: all of :data:`topocoll.solver.baselines.BASELINES`).
    native : collection of Collective, optional
        Collectives the runtime can hand to its inner backend. Without ``native_model`` the
        backend runs them as a ring in rank order, and a :data:`NATIVE` candidate is compared
        where :func:`native_ring_applies`.
    native_model : NativeModel, optional
        A model of the inner backend's own collectives (e.g. NCCL's,
        :class:`topocoll.solver.nccl_model.NcclNative`): the :data:`NATIVE` candidate is priced
        by it, and every schedule pays its cost per call (:meth:`NativeModel.call_s`).

    Returns
    -------
    Plan

    Raises
    ------
    SolverError
        Invalid request: fewer than two ranks, unknown or non-compute rank nodes, a root
        outside the ranks, ranks that cannot reach each other, a size <= 0.
    ScaleError
        More ranks than the verifier's memory allows a schedule for (about 6000), raised
        before any work.

    See Also
    --------
    choose : the rule that picks among the candidates.
    topocoll.solver.plan : the chosen schedule alone.
    """
    collective = Collective.parse(collective) if isinstance(collective, str) else collective
    ranks = tuple(ranks) if ranks is not None else topology.compute_nodes()
    ranks = check_request(topology, collective, ranks, root)
    if size_bytes is not None and not size_bytes > 0:
        raise SolverError(f"size must be > 0 bytes, got {size_bytes}")
    try:  # every candidate has a chunk per rank at least: refuse now what could not be verified
        check_verify_memory(len(ranks), len(ranks), f"a schedule for {collective.value}")
    except ScheduleError as exc:
        hint = ""
        if collective in (Collective.ALLGATHER, Collective.REDUCE_SCATTER, Collective.ALLREDUCE):
            hint = " (topocoll synthesize --format 3 writes a hierarchical schedule by rule at this scale)"
        raise ScaleError(f"{exc}: not synthesized{hint}") from None
    bound = cut_bound(topology, collective, ranks, root)
    digest = topology.digest()
    root = root if collective.is_rooted else None
    large = len(ranks) > LARGE_WORLD_RANKS
    warnings: list[str] = []
    candidates: list[Candidate] = []
    eval_size = size_bytes if size_bytes is not None else BANDWIDTH_REFERENCE_BYTES

    def consider(name: str, schedule: Schedule) -> None:
        checked = verify(schedule, topology, size_bytes=eval_size, per_message_overhead_s=per_message_overhead_s)
        if not checked.ok:
            # A candidate that does not verify is a bug; never hand it out.
            log.error("candidate %s failed verification: %s", name, checked.errors[0])
            return
        candidates.append(Candidate(name, schedule, checked))

    lp_optimal = False
    try:
        gather, scatter = pack_for(topology, collective, ranks, root, bound, options)
        lp_optimal = all(p.optimal for p in (gather, scatter) if p is not None)
        depths = (1,) if large else PIPELINE_DEPTHS[::2] if len(ranks) > MANY_RANKS else PIPELINE_DEPTHS
        for depth in depths:
            name = "lp" if depth == 1 else f"lp-pipeline{depth}"
            consider(name, layout(collective, ranks, root, gather, scatter, depth, digest, name=name))
        if _packs_by_rails(topology, collective, ranks, options) and candidates:
            # The same machines' trees joined by a binomial rail tree instead of a chain: as fast
            # by bandwidth where the network carries its long hops, log2(machines) levels deep.
            # Only then is it weighed: where its hops crowd the spines (2:1 fat trees: half the
            # chain's bandwidth) the lock-step model would still credit it with the chain's
            # depth, which overlapped pipelining hides.
            chain_t_bw = candidates[0].t_bw_s_per_byte
            shallow = dataclasses.replace(options, rail_tree="binomial")
            gather, scatter = pack_for(topology, collective, ranks, root, bound, shallow)
            first = len(candidates)
            for depth in depths:
                name = "lp-binomial" if depth == 1 else f"lp-binomial-pipeline{depth}"
                consider(name, layout(collective, ranks, root, gather, scatter, depth, digest, name=name))
                if len(candidates) > first and candidates[first].t_bw_s_per_byte > chain_t_bw * (1 + NEAR_TIE):
                    log.info("binomial rail tree dropped: %.2fx the chain's bandwidth time", candidates[first].t_bw_s_per_byte / chain_t_bw)
                    del candidates[first:]
                    break
        if not lp_optimal:
            warnings.append("the LP stopped at its time limit before reaching the bound")
    except SolverError as exc:
        warnings.append(f"LP synthesis failed ({exc}); using the best baseline")
        log.warning("LP synthesis failed: %s", exc)
    if collective in DIRECT_COLLECTIVES and len(ranks) <= DIRECT_MAX_RANKS:
        try:
            consider("direct", direct(topology, collective, ranks))
        except SolverError as exc:  # the traffic routing LP failed: the other candidates stand
            log.info("direct schedule not built: %s", exc)
        straight = next((c for c in candidates if c.name == "direct"), None)
        if straight is None or straight.t_bw_s_per_byte > bound.time_per_byte_s * (1 + NEAR_TIE):
            # Short of the bound without relays: forwarding parts once may reach it, in up to
            # three steps per phase.
            try:
                routings = two_hop_routings(topology, collective, ranks)
                first = len(candidates)
                for depth in TWO_HOP_DEPTHS:
                    consider("two-hop" if depth == 1 else f"two-hop-pipeline{depth}", two_hop(topology, collective, ranks, pipeline=depth, routings=routings))
                if straight is not None and len(candidates) > first and candidates[first].t_bw_s_per_byte > straight.t_bw_s_per_byte / (1 + NEAR_TIE):
                    del candidates[first:]  # forwarding gains too little to be worth its step
            except SolverError as exc:
                log.info("two-hop schedule not built: %s", exc)

    if collective in native and (native_model is not None or (not large and native_ring_applies(topology, ranks))):
        # It wins ties among equally crowded candidates: on the emulated 4-host `uniform`
        # network gloo's own allreduce ran 2-4 % faster than the same ring on the executor.
        # Priced by a model, its schedule only stands in (the backend runs its own algorithm):
        # at scale the cheapest one to build, a double binary tree, rather than N^2 ring transfers.
        stand_in = baselines.double_binary_tree if large else baselines.rank_order_ring
        consider(NATIVE, dataclasses.replace(stand_in(topology, collective, list(ranks)), name=NATIVE))
    if not large and _crosses_network(topology, ranks):
        # Where flows crowd (see NEAR_TIE), the rings that reach a multi-rail bound one transfer
        # per link at a time; within one machine they add planning time for no choice they win.
        try:
            consider("weighted_rings", baselines.weighted_rings(topology, collective, list(ranks), root=root))
        except SolverError as exc:
            log.info("weighted rings not built: %s", exc)

    names = baseline_names if baseline_names is not None else tuple(baselines.BASELINES)
    if large and baseline_names is None:
        # Building and verifying the rings costs as much as synthesis here (N^2 transfers); the
        # low-latency baselines are cheap (N log N) and win below some size, which a sweep over
        # sizes (no size given) must see too: they stay candidates at every size.
        names = ["double_binary_tree", "recursive_doubling"]
    for name in names:
        builder = baselines.BASELINES[name]
        try:
            schedule = builder(topology, collective, list(ranks), root=root)
        except SolverError as exc:
            log.info("baseline %s not applicable: %s", name, exc)
            continue
        if schedule.name != name and any(c.name == schedule.name for c in candidates):
            continue  # a baseline that fell back to another one already present
        consider(schedule.name or name, schedule)
    if not candidates:
        raise SolverError(f"no schedule for {collective.value} over {len(ranks)} ranks verified")
    timed, model = predict_times(candidates, topology, eval_size, per_message_overhead_s, native_model)
    chosen = _choose(timed, size_bytes, topology)
    if chosen.name == "direct" or chosen.name.startswith("two-hop"):
        status = PlanStatus.DIRECT
    elif chosen.name.startswith("lp"):
        status = PlanStatus.OPTIMAL if lp_optimal else PlanStatus.LIMIT
    elif any(c.name.startswith("lp") for c in timed):
        status = PlanStatus.BASELINE
    else:
        status = PlanStatus.FALLBACK
    return Plan(chosen.schedule, status, bound, chosen, timed, size_bytes, tuple(warnings), model)
