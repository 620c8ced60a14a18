"""Where a process group's schedules come from.

Rank 0 of the group synthesizes a schedule (through a planner, by default
:func:`topocoll.solver.plan`) the first time a (collective, root, size bucket) is needed and
publishes its JSON through the group's store; the other ranks read it from there. Every rank
checks that the schedule was made for its own topology (digest) and its own rank-to-node map,
then verifies it symbolically (:func:`topocoll.solver.verify.verify`: it implements its
collective on this topology) before lowering it for its rank, whatever made it: the default
planner, a planner passed by the user, or the store. Verification runs once per distinct
schedule (its JSON digest), not per call. Schedules are cached per (collective, root, size bucket) and
programs per (collective, root, size bucket, element count). The topology of the group is fixed
when the group is created, so the topology digest is part of every cache key implicitly (and of
the store key explicitly).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from topocoll.collectives.failure import AgreedError
from topocoll.collectives.lower import RankProgram, lower
from topocoll.errors import CollectiveError, ScaleError, ScheduleError, TopocollError
from topocoll.solver.schedule import NATIVE, Collective, Schedule, native_schedule
from topocoll.topo.model import Topology
from topocoll.topo.rails import Rails

__all__ = [
    "Planner", "ScheduleSource", "size_bucket", "default_planner", "cuda_planner", "native_beyond_scale",
    "NCCL_NATIVE_COLLECTIVES", "check_digests", "announce_topology_error",
]

logger = logging.getLogger(__name__)

Planner = Callable[[Topology, Collective, tuple[str, ...], "int | None", "int | None"], Schedule]
"""``planner(topology, collective, ranks, root, size_bytes) -> Schedule``."""

PROGRAM_CACHE_ENTRIES = 256
"""Lowered programs kept per group. A program is a few hundred small records; the bound only
keeps a workload with ever-changing tensor sizes from growing the cache without limit."""


DEFAULT_SEGMENT_BYTES: int | None = None
"""Messages are not cut by default. Cutting lets a receiver reduce one segment while the next is
on the wire, but measured side by side on a 2-core host (4 ranks, gloo over loopback, 16 MiB
all_reduce) 1 MiB segments were 5 % slower and 256 KiB segments 30 % slower than whole
messages: with the cores saturated by the transport there is nothing to overlap. Pass
``segment_bytes`` where the reduction runs on other hardware than the transport."""


STEP_OVERHEAD_S = 1e-4
"""Cost of one schedule step in the solver's α-β model, for the gloo executor.

Measured here (4 ranks, 2 cores, gloo over loopback): each extra step of a small all_reduce
costs about 2 ms, while data moves at about 0.5 GB/s per rank. The flat topology models its
links at 12 GB/s (:data:`topocoll.topo.bandwidth.SHM_BW_BYTES_PER_S`), so in the model's units
a step costs 2e-3 s x 0.5 / 12 = 1e-4 s, twelve times NCCL's figure (the solver's default),
which would make the planner favour deep pipelines (e.g. 18-step broadcasts) that this path
pays for in synchronisation."""


#: The collectives gloo runs itself as a ring in rank order (its allreduce and allgather), which
#: the CPU planner may therefore hand back to it (:data:`topocoll.solver.schedule.NATIVE`).
GLOO_RING_COLLECTIVES = (Collective.ALLREDUCE, Collective.ALLGATHER)


def default_planner(
    topology: Topology, collective: Collective, ranks: tuple[str, ...], root: int | None, size_bytes: int | None
) -> Schedule:
    """Synthesize with :func:`topocoll.solver.plan` (imported on first use), steps costed at
    :data:`STEP_OVERHEAD_S`, gloo's own ring among the candidates (:data:`GLOO_RING_COLLECTIVES`);
    past the scale the planner weighs, gloo's own collective (:func:`native_beyond_scale`)."""
    from topocoll.solver import plan

    # the value, not the member: plan() parses str arguments, and Collective members are str
    return native_beyond_scale(
        topology, collective, ranks, root,
        lambda: plan(
            topology, collective.value, list(ranks), root=root, size_bytes=size_bytes, per_message_overhead_s=STEP_OVERHEAD_S,
            native=GLOO_RING_COLLECTIVES,
        ),
    )


#: The collectives a CUDA group may hand back to NCCL (:data:`topocoll.solver.schedule.NATIVE`)
#: where NCCL's model predicts NCCL faster; past the scale the planner weighs, every collective
#: is handed to it (:func:`native_beyond_scale`).
NCCL_NATIVE_COLLECTIVES = (Collective.ALLREDUCE, Collective.ALLGATHER)


def cuda_planner(
    topology: Topology, collective: Collective, ranks: tuple[str, ...], root: int | None, size_bytes: int | None
) -> Schedule:
    """Synthesize for CUDA tensors: steps costed at the solver's default, NCCL's per-message
    figure (:data:`topocoll.solver.DEFAULT_PER_MESSAGE_OVERHEAD_S`), since the steps run as NCCL
    point-to-point kernels ordered on the GPU, not through gloo's host round trips. NCCL's own
    collective is a candidate (:data:`NCCL_NATIVE_COLLECTIVES`), priced by
    :mod:`topocoll.solver.nccl_model`, so that the group hands NCCL what NCCL is predicted to do
    faster."""
    from topocoll.solver import plan
    from topocoll.solver.nccl_model import nccl_native

    def planned() -> Schedule:
        model = nccl_native(topology, ranks)
        return plan(
            topology, collective.value, list(ranks), root=root, size_bytes=size_bytes,
            native=NCCL_NATIVE_COLLECTIVES if model is not None else (), native_model=model,
        )

    return native_beyond_scale(topology, collective, ranks, root, planned)


def native_beyond_scale(
    topology: Topology, collective: Collective, ranks: tuple[str, ...], root: int | None, planned: Callable[[], Schedule]
) -> Schedule:
    """``planned()``, or, where the planner refuses the scale (:class:`~topocoll.errors.ScaleError`:
    more ranks than it can verify a schedule for), a :func:`~topocoll.solver.schedule.native_schedule`,
    so that the group runs the collective with its inner backend's own (NCCL's on CUDA, gloo's
    on CPU) instead of failing. A schedule by rule covers such scales offline
    (``topocoll synthesize --format 3``) but is not run by the backend.
    """
    try:
        return planned()
    except ScaleError as exc:
        logger.info("%s over %d ranks goes to the inner backend's own collective: %s", collective.value, len(ranks), exc)
        return native_schedule(collective, ranks, root, topology.digest())


def size_bucket(size_bytes: int) -> int:
    """The power of two at or above ``size_bytes`` (1 for 0): schedules are shared per bucket."""
    if size_bytes <= 1:
        return 1
    return 1 << (size_bytes - 1).bit_length()


def _as_text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


_TOPOLOGY_ERROR = "error:"
"""Prefix of what a rank publishes instead of a digest when it could not load its topology."""


def announce_topology_error(store: Any, rank: int, message: str, key: str = "topology_digest") -> None:
    """Publish, where the digest would go, that this rank could not load its topology, so that
    the other ranks' :func:`check_digests` names the rank and its reason instead of waiting for
    the store to time out."""
    try:
        store.set(f"{key}/{rank}", _TOPOLOGY_ERROR + message)
    except RuntimeError as exc:  # the store itself is gone: the caller raises its own error anyway
        logger.debug("rank %d: cannot announce the topology error: %s", rank, exc)


def check_digests(store: Any, rank: int, size: int, digest: str, key: str = "topology_digest") -> None:
    """Publish this rank's topology digest and compare it with every other rank's.

    Raises
    ------
    CollectiveError
        On every rank, when any two ranks loaded different topologies, or a rank could not load
        its topology (:func:`announce_topology_error`).
    """
    store.set(f"{key}/{rank}", digest)
    digests = {r: _as_text(store.get(f"{key}/{r}")) for r in range(size)}
    failed = sorted(r for r, d in digests.items() if d.startswith(_TOPOLOGY_ERROR))
    if failed:
        reason = digests[failed[0]][len(_TOPOLOGY_ERROR) :]
        raise CollectiveError(f"rank {rank}: rank {failed[0]} could not load its topology: {reason}")
    differing = sorted(r for r, d in digests.items() if d != digests[0])
    if differing:
        raise CollectiveError(
            f"rank {rank}: ranks {differing} loaded a different topology than rank 0 "
            f"({digests[differing[0]][:19]}... vs {digests[0][:19]}...); point TOPOCOLL_TOPOLOGY at the same file everywhere"
        )


class ScheduleSource:
    """Schedules and lowered programs for one rank of one process group.

    Parameters
    ----------
    topology : Topology
        The topology every rank of the group loaded (digests already compared).
    nodes : tuple of str
        ``nodes[i]`` is the topology node group rank ``i`` runs on.
    rank : int
        This process's rank in the group.
    store : torch.distributed.Store
        A store private to the group (a ``PrefixStore``); rank 0 publishes schedules there.
    planner : Planner
        Makes a schedule for CPU tensors; only rank 0 calls it.
    segment_bytes : int or None
        Largest message of a lowered program in bytes (None: no limit).
    cuda_planner : Planner, optional
        Makes a schedule for CUDA tensors (default: ``planner``). Schedules are kept and
        published per device type, since the step overhead the planner weighs differs.
    """

    def __init__(
        self,
        topology: Topology,
        nodes: tuple[str, ...],
        rank: int,
        store: Any,
        planner: Planner,
        segment_bytes: int | None = DEFAULT_SEGMENT_BYTES,
        cuda_planner: Planner | None = None,
    ) -> None:
        if segment_bytes is not None and (isinstance(segment_bytes, bool) or not isinstance(segment_bytes, int) or segment_bytes < 1):
            raise CollectiveError(f"segment_bytes must be a positive integer or None, got {segment_bytes!r}")
        self._segment_bytes = segment_bytes
        self._topology = topology
        self._digest = topology.digest()
        self._nodes = tuple(nodes)
        self._rank = rank
        self._store = store
        self._planners = {"cpu": planner, "cuda": cuda_planner or planner}
        self._schedules: dict[tuple[Collective, int | None, int, str], Schedule] = {}
        self._verified: set[str] = set()  # JSON digests of the schedules that passed verification
        self._programs: OrderedDict[tuple[Collective, int | None, int, int, int, str], RankProgram] = OrderedDict()
        self._rails: Rails | None = None

    def use_rails(self, rails: Rails) -> None:
        """Lower CPU programs with each message on the channel of its rail (the group made one
        inner group per rail). Programs lowered before are dropped."""
        self._rails = rails
        self._programs.clear()

    @property
    def nodes(self) -> tuple[str, ...]:
        """Topology node of each group rank."""
        return self._nodes

    def program(self, collective: Collective, root: int | None, count: int, size_bytes: int, device: str = "cpu") -> RankProgram:
        """The program of this rank for ``collective`` on ``count`` elements (``size_bytes`` bytes)
        of tensors on ``device`` (``"cpu"`` or ``"cuda"``).

        Raises
        ------
        CollectiveError
            Rank 0 could not make a schedule, or the schedule does not fit this rank's topology.
        """
        bucket = size_bucket(size_bytes)
        key = (collective, root, bucket, count, size_bytes, device)
        program = self._programs.get(key)
        if program is not None:
            self._programs.move_to_end(key)
            return program
        schedule = self.schedule(collective, root, bucket, device)
        segment = None
        if self._segment_bytes is not None and count:
            segment = max(1, self._segment_bytes * count // max(size_bytes, 1))
        rails = self._rails if device == "cpu" else None  # NCCL drives the NICs itself
        program = lower(schedule, self._rank, count, max_message_elements=segment, rails=rails)
        self._programs[key] = program
        while len(self._programs) > PROGRAM_CACHE_ENTRIES:
            self._programs.popitem(last=False)
        return program

    def schedule(self, collective: Collective, root: int | None, bucket: int, device: str = "cpu") -> Schedule:
        """The group's schedule for ``collective`` in size bucket ``bucket`` (bytes) on ``device``."""
        if device not in self._planners:
            raise CollectiveError(f"rank {self._rank}: no planner for {device} tensors")
        key = (collective, root, bucket, device)
        cached = self._schedules.get(key)
        if cached is not None:
            return cached
        store_key = f"schedule/{self._digest}/{device}/{collective.value}/{root}/{bucket}"
        if self._rank == 0:
            schedule, text = self._plan_and_publish(store_key, collective, root, bucket, device)
        else:
            schedule, text = self._fetch(store_key)
            self._check(schedule, text, collective, root)
        self._schedules[key] = schedule
        if self._rank == 0 and logger.isEnabledFor(logging.INFO):
            logger.info("rank 0: %s (%s tensors)", self._describe(schedule, bucket), device)
        return schedule

    def _describe(self, schedule: Schedule, bucket: int) -> str:
        """What ``TOPOCOLL_DEBUG=INFO`` says about a schedule: its shape and share of the bound."""
        from topocoll.solver.bound import cut_bound
        from topocoll.solver.verify import verify

        if schedule.name == NATIVE:
            return f"{schedule.collective.value} up to {bucket} bytes: the inner backend's own collective"
        head = f"{schedule.collective.value} up to {bucket} bytes: schedule {schedule.name!r}, {len(schedule.steps)} steps"
        try:
            bound = cut_bound(self._topology, schedule.collective, self._nodes, schedule.root)
            t_bw = verify(schedule, self._topology).t_bw_s_per_byte
        except TopocollError as exc:  # a report must not fail the collective
            return f"{head} (no bound: {exc})"
        if t_bw <= 0:
            return head
        return f"{head}, {100.0 * bound.time_per_byte_s / t_bw:.2f} % of the cut bound ({1e-9 / bound.time_per_byte_s:.2f} GB/s algbw)"

    def _plan_and_publish(
        self, store_key: str, collective: Collective, root: int | None, bucket: int, device: str
    ) -> tuple[Schedule, str]:
        """Plan, check and verify on rank 0, then publish the schedule or the reason there is none
        (so every rank raises the same error at the same collective)."""
        try:
            schedule = self._planners[device](self._topology, collective, self._nodes, root, bucket)
            # The compact form: a tenth of the bytes through the store on large groups.
            text = json.dumps({"schedule": schedule.to_json_dict(version=2)})
            self._check(schedule, text, collective, root)
        except TopocollError as exc:
            self._store.set(store_key, json.dumps({"error": str(exc)}))
            raise AgreedError(f"rank 0: no {collective.value} schedule for ranks {list(self._nodes)}: {exc}") from None
        except Exception as exc:
            self._store.set(store_key, json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
            raise
        logger.debug("rank 0 planned %s (%s) for %d bytes: %d steps", collective.value, schedule.name, bucket, len(schedule.steps))
        self._store.set(store_key, text)
        return schedule, text

    def _fetch(self, store_key: str) -> tuple[Schedule, str]:
        try:
            text = _as_text(self._store.get(store_key))
        except RuntimeError as exc:
            raise CollectiveError(f"rank {self._rank}: rank 0 never published schedule {store_key}: {exc}") from exc
        source = f"schedule from rank 0 ({store_key})"
        try:
            payload = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise CollectiveError(f"rank {self._rank}: {source} is not JSON: {exc}") from None
        if isinstance(payload, dict) and "error" in payload:
            raise AgreedError(f"rank {self._rank}: rank 0 could not make a schedule: {payload['error']}")
        if not isinstance(payload, dict) or "schedule" not in payload:
            raise CollectiveError(f"rank {self._rank}: {source} holds neither a schedule nor an error")
        try:
            return Schedule.from_json_dict(payload["schedule"], source=source), text
        except TopocollError as exc:
            raise CollectiveError(f"rank {self._rank}: {exc}") from None

    def _check(self, schedule: Schedule, text: str, collective: Collective, root: int | None) -> None:
        """Refuse a schedule that is not for this group and collective, or that does not verify
        (``text`` is its JSON, whose digest remembers that it verified)."""
        if not schedule.topology_digest:
            raise CollectiveError(f"rank {self._rank}: the {collective.value} schedule has no topology digest")
        if schedule.topology_digest != self._digest:
            raise CollectiveError(
                f"rank {self._rank}: schedule was made for topology {schedule.topology_digest[:19]}..., "
                f"this rank has {self._digest[:19]}..."
            )
        if schedule.collective is not collective or tuple(schedule.ranks) != self._nodes:
            raise CollectiveError(
                f"rank {self._rank}: got a {schedule.collective.value} schedule over {list(schedule.ranks)}, "
                f"needed {collective.value} over {list(self._nodes)}"
            )
        if collective.is_rooted and schedule.root != root:
            raise CollectiveError(f"rank {self._rank}: schedule has root {schedule.root}, needed {root}")
        if schedule.name == NATIVE:
            return  # the inner backend's own collective runs; its schedule is never lowered
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest not in self._verified:
            from topocoll.solver.verify import verify

            try:
                verify(schedule, self._topology).raise_if_failed(f"the {collective.value} schedule {schedule.name!r}")
            except ScheduleError as exc:
                raise CollectiveError(f"rank {self._rank}: {exc}") from None
            self._verified.add(digest)

