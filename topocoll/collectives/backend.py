"""``TopoProcessGroup``: the ``"topo"`` backend of torch.distributed.

``dist.init_process_group("topo", ...)`` (after ``import topocoll``) gives a process group
whose allreduce, reduce-scatter, allgather, broadcast and reduce run topocoll schedules: rank 0
synthesizes a schedule for the group's topology, shares it through the store, every rank lowers
it and the executor moves the data with point-to-point messages of an inner backend (gloo for
CPU tensors, NCCL for CUDA tensors); between CPU ranks of one host the data itself goes through
shared memory, announced through shared-memory mailboxes (:mod:`topocoll.collectives.shm`). Everything else (send/recv, all-to-all, gather, scatter,
barrier) is handed to the inner backend.

Before each scheduled collective the ranks exchange a small header (the collective's number,
operation, element count, dtype, reduction, root, tensor layout, and whether the local
arguments were valid) through the shared-memory mailboxes, or the inner backend when some rank
shares no memory with the others, so that inputs that differ across ranks raise
:class:`~topocoll.errors.CollectiveError` on every rank instead of hanging or corrupting data;
such errors leave the group usable.

Every collective has a number, the same on every rank; its header and every doorbell of its data
carry it, and a rank accepts nothing of another collective. A peer that dies, hangs or arrives
after the timeout makes the waiting ranks raise within the process-group timeout, naming that
peer; the group is then *broken* (:mod:`topocoll.collectives.failure`): the rank tells its peers,
and every later call on every rank raises at once, naming the first failure. Recover as with
c10d's own backends: ``dist.destroy_process_group()`` (which frees the inner groups' threads and
sockets and the shared memory) and a new ``dist.init_process_group`` on a fresh store.

Every schedule is verified symbolically before it runs, whoever made it
(:mod:`topocoll.collectives.plans`).

Operations run to completion in the calling thread; the returned :class:`TopoWork` is complete
and its ``wait()`` raises the operation's error. ``async_op=True`` is accepted but does not
overlap communication with computation.

The topology and where each rank runs on it are settled at group creation
(:mod:`topocoll.collectives.topology_source`): every rank publishes its machine and device
through the store, the topology is the one of the group's options, the file
``$TOPOCOLL_TOPOLOGY`` names, or else discovered (each machine by its lowest rank, NVML and
sysfs, ``$NCCL_TOPO_FILE`` completed where set) and assembled into a cluster, and every rank is
placed on it by identity (:mod:`topocoll.collectives.placement`). ``TOPOCOLL_DEBUG=INFO`` logs
what was found and chosen (:mod:`topocoll.collectives.debug`).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import socket
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from topocoll.collectives.debug import DEBUG_ENV, configure_logging
from topocoll.collectives.executor import Executor, Reduction, check_reduction
from topocoll.collectives.failure import (
    NO_RANK,
    AgreedError,
    FailedError,
    Failure,
    FailureKind,
    GroupBrokenError,
    first_line,
)
from topocoll.collectives.placement import exchange_identities, local_identity
from topocoll.collectives.probe import ProbeSettings, run_probe
from topocoll.collectives.plans import (
    DEFAULT_SEGMENT_BYTES,
    Planner,
    ScheduleSource,
    announce_topology_error,
    check_digests,
    cuda_planner,
    default_planner,
)
from topocoll.collectives.shm import ShmTransport
from topocoll.collectives.topology_source import (
    TOPOLOGY_ENV,
    TopologySettings,
    dump_topology,
    group_topology,
    summary,
)
from topocoll.collectives.work import TopoWork
from topocoll.errors import CollectiveError, TopocollError
from topocoll.solver.schedule import Collective
from topocoll.topo.host import host_identity
from topocoll.topo.merge import planning_warnings
from topocoll.topo.model import Topology
from topocoll.topo.calibrate import Calibration
from topocoll.topo.io import dumps_topology, load_topology, parse_topology
from topocoll.topo.rails import Rails, find_rails

__all__ = ["BACKEND_NAME", "TOPOLOGY_ENV", "TopoOptions", "TopoProcessGroup", "register"]

logger = logging.getLogger(__name__)

BACKEND_NAME = "topo"
"""The name to pass to ``dist.init_process_group`` / ``dist.new_group``."""

_DTYPES: tuple[torch.dtype, ...] = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
"""Dtypes with a header code (their index). Others are refused."""

_REDUCE_OPS: tuple[tuple[Any, Reduction, bool], ...] = (
    (dist.ReduceOp.SUM, Reduction.SUM, False),
    (dist.ReduceOp.AVG, Reduction.SUM, True),
    (dist.ReduceOp.PRODUCT, Reduction.PRODUCT, False),
    (dist.ReduceOp.MIN, Reduction.MIN, False),
    (dist.ReduceOp.MAX, Reduction.MAX, False),
    (dist.ReduceOp.BAND, Reduction.BAND, False),
    (dist.ReduceOp.BOR, Reduction.BOR, False),
    (dist.ReduceOp.BXOR, Reduction.BXOR, False),
)
"""torch reduce op -> (reduction, divide by the group size afterwards)."""

ABORT_OPERATION = -1
"""Operation code of the header a broken rank sends its peers when they share no memory
(then the header's words are: collective number, this code, origin, culprit, failure kind)."""

HEADER_TAG = 0
"""Message tag of the argument headers (schedule messages start at ``lower.FIRST_TAG``)."""

_HEADER_FIELDS = ("operation", "element count", "dtype", "reduce op", "root", "tensor layout", "argument error")
"""The words of an argument header after its collective number (the layout word is a hash of
the tensors' shapes and dtypes for the operations that take several, else 0)."""

FAILURE_KEY = "failure"
"""Store key (in the group's own prefix) of the group's first failure, as JSON."""

BLAME_LISTEN_S = 0.5
"""How long a rank that timed out waiting for a peer follows the other ranks' blame records in
the store (:meth:`TopoProcessGroup._follow_blame`). Ranks that time out in one collective do
so within a scheduler slice or two of each other, since their waits started together; a store
round trip is well under a millisecond on one host and a few on a network."""


@dataclass(frozen=True, slots=True)
class _Reduce:
    """A parsed torch reduce op."""

    code: int
    reduction: Reduction
    average: bool


@dataclass(frozen=True, slots=True)
class TopoOptions:
    """Options of a "topo" group, passed as ``pg_options`` to ``init_process_group`` / ``new_group``.

    Parameters
    ----------
    topology : Topology, optional
        Use this topology instead of ``$TOPOCOLL_TOPOLOGY`` / the flat one.
    planner : Planner, optional
        Make schedules with this instead of :func:`topocoll.solver.plan` (e.g. a baseline).
    segment_bytes : int or None
        Cut messages into segments of at most this many bytes so that reductions overlap the
        transfers (None: never cut). Default :data:`DEFAULT_SEGMENT_BYTES`.
    shared_memory : bool
        Move CPU data between ranks of one host through shared memory
        (:class:`~topocoll.collectives.shm.ShmTransport`) instead of gloo's loopback TCP
        (default; peers that cannot map each other's files still use gloo).
    probe : bool or None
        Measure the links when the group starts and plan on the calibrated topology
        (:meth:`TopoProcessGroup.probe`); None (default): as ``$TOPOCOLL_PROBE`` says.
    background : bool
        Run collectives on CPU tensors on the group's communication thread, so that
        ``async_op=True`` returns at once and ``wait()`` blocks (default); False runs each
        before it returns.
    """

    topology: Topology | None = None
    planner: Planner | None = None
    segment_bytes: int | None = DEFAULT_SEGMENT_BYTES
    shared_memory: bool = True
    probe: bool | None = None
    background: bool = True


def _parse_reduce_op(op: Any) -> _Reduce:
    for code, (torch_op, reduction, average) in enumerate(_REDUCE_OPS):
        if op == torch_op:
            return _Reduce(code, reduction, average)
    raise CollectiveError(f"reduce op {op} is not supported by the topo backend (premultiplied sums are not)")


def _check_reduce(reduce: _Reduce, dtype: torch.dtype) -> None:
    check_reduction(reduce.reduction, dtype)
    if reduce.average and not (dtype.is_floating_point or dtype.is_complex):
        raise CollectiveError(f"ReduceOp.AVG needs a floating-point tensor, got {dtype} (sum and divide yourself)")


class TopoProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group that runs topocoll schedules.

    Usually created by ``dist.init_process_group("topo", ...)`` or
    ``dist.new_group(ranks, backend="topo")``; it can also be built directly.

    Parameters
    ----------
    store : torch.distributed.Store
        A store private to this group.
    rank, size : int
        This process's rank in the group and the group size.
    timeout : datetime.timedelta
        How long any message or store read may wait.
    global_ranks : sequence of int, optional
        Global rank of each group rank (default ``range(size)``).
    topology : Topology, optional
        The topology (default: ``$TOPOCOLL_TOPOLOGY``, else discovered). Every rank must pass
        an equal one; this is checked. Ranks are placed on it by identity
        (:func:`topocoll.collectives.placement.map_ranks`).
    planner : Planner, optional
        Makes schedules on rank 0 (default :func:`topocoll.solver.plan`).
    segment_bytes : int or None
        Largest message in bytes; longer ones are cut so that reductions overlap transfers.
    shared_memory : bool
        Move CPU data between ranks of one host through shared memory (default True).

    Raises
    ------
    CollectiveError
        The ranks loaded different topologies, discovery failed on some machine, or a rank
        cannot be placed (its device is not in the topology, it shares a GPU with another).
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: timedelta,
        *,
        global_ranks: Sequence[int] | None = None,
        topology: Topology | None = None,
        planner: Planner | None = None,
        segment_bytes: int | None = DEFAULT_SEGMENT_BYTES,
        shared_memory: bool = True,
        probe: bool | None = None,
        background: bool = True,
    ) -> None:
        super().__init__(rank, size)
        self._group_rank = rank
        self._group_size = size
        self._timeout = timeout
        ranks = tuple(global_ranks) if global_ranks else tuple(range(size))
        if len(ranks) != size:
            raise CollectiveError(f"rank {rank}: {len(ranks)} global ranks given for a group of {size}")
        own_store = dist.PrefixStore("topocoll", store)
        configure_logging(os.environ.get(DEBUG_ENV))
        settings = TopologySettings.from_env(os.environ)
        identity = local_identity(rank, ranks[rank], host_identity(override=settings.host_id))
        try:
            identities = exchange_identities(own_store, identity, size)
            topology, nodes = group_topology(own_store, identities, rank, settings, topology)
        except TopocollError as exc:
            announce_topology_error(own_store, rank, str(exc))  # so the other ranks say why
            raise
        except OSError as exc:  # e.g. $TOPOCOLL_TOPOLOGY names a file this host does not have
            message = f"rank {rank}: cannot read the topology {exc.filename}: {exc.strerror}"
            announce_topology_error(own_store, rank, message)
            raise CollectiveError(message) from None
        check_digests(own_store, rank, size, topology.digest())
        self._log_topology(topology, nodes, identities, settings)
        self._store = own_store
        self._sequence = 0
        self._failure: Failure | None = None
        self._abort_sends: list[Any] = []
        self._operation = ""
        self._closed = False
        self._topology = topology
        self._schedules = ScheduleSource(
            topology, nodes, rank, own_store, planner or default_planner, segment_bytes, cuda_planner=planner or cuda_planner
        )
        self._shm: ShmTransport | None = None
        self._cpu_sched: Any = None
        self._cpu_other: Any = None
        self._cpu_executor: Executor | None = None
        self._rail_groups: list[Any] = []
        self._rails: Rails | None = None
        self._cuda_sched: Any = None
        self._cuda_other: Any = None
        self._cuda_executor: Executor | None = None
        self._cuda_connect: tuple[Any, int, int, timedelta] | None = None
        self._cuda_device: torch.device | None = None  # of the last CUDA collective (for barrier)
        # One thread runs this group's CPU collectives in call order (the order every rank
        # calls them in), so that async_op=True overlaps them with the caller's work.
        comm_thread: list[int] = []  # the thread's ident, once it runs
        self._comm_thread = comm_thread
        self._comm: concurrent.futures.ThreadPoolExecutor | None = None
        if background:
            self._comm = concurrent.futures.ThreadPoolExecutor(
                1,
                thread_name_prefix=f"topocoll-rank{rank}",
                initializer=lambda: comm_thread.append(threading.get_ident()),
            )
        try:
            self._connect(store, rank, size, timeout, shared_memory)
            if settings.probe if probe is None else probe:
                self._use_calibrated(self._calibrated(settings.probe_cache), planner, segment_bytes)
        except BaseException:
            # a peer died or timed out during set-up: free what was made (threads, sockets,
            # shared memory) now, not when the exception's traceback lets go of this object
            self.shutdown()
            raise

    def _log_topology(self, topology: Topology, nodes: tuple[str, ...], identities: Sequence[Any], settings: TopologySettings) -> None:
        """Say where the topology came from and where this rank runs; write the dump file."""
        rank = self._group_rank
        logger.info("%s runs on node %s of %s", identities[rank].describe(), nodes[rank], summary(topology))
        if rank == 0:
            for note in topology.notes:
                logger.info("rank 0: topology note: %s", note)
            for warning in planning_warnings(topology):  # said whatever TOPOCOLL_DEBUG is
                logger.warning("rank 0: %s", warning)
        if settings.dump_file and identities[rank].global_rank == settings.dump_rank:
            try:
                dump_topology(topology, settings.dump_file)
            except (TopocollError, OSError) as exc:  # the run goes on without its dump
                logger.warning("rank %d: cannot write the topology dump %s: %s", rank, settings.dump_file, exc)
            else:
                logger.info("rank %d: wrote the group's topology to %s", rank, settings.dump_file)

    def _connect(self, store: Any, rank: int, size: int, timeout: timedelta, shared_memory: bool) -> None:
        # Two inner groups: one carries only our schedule traffic and headers, so that user
        # point-to-point messages (handed to the other) can never match our receives.
        self._cpu_sched = dist.ProcessGroupGloo(dist.PrefixStore("topocoll/sched", store), rank, size, timeout)
        self._cpu_other = dist.ProcessGroupGloo(dist.PrefixStore("topocoll/other", store), rank, size, timeout)
        if shared_memory:
            self._shm = ShmTransport(self._cpu_sched, rank, size, dist.PrefixStore("topocoll/shm", store), timeout)
            weakref.finalize(self, self._shm.close)
        self._rail_groups = self._connect_rails(store, rank, size, timeout)
        self._cpu_executor = Executor(self._shm or self._cpu_sched, rank, timeout, channels=self._rail_groups)
        self._cuda_connect = (store, rank, size, timeout)  # NCCL groups: on the first CUDA tensor

    def _connect_rails(self, store: Any, rank: int, size: int, timeout: timedelta) -> list[Any]:
        """One inner gloo group per rail, bound on every rank to its NIC of that rail.

        A connection's route is chosen by its destination, so without this every transfer
        between two hosts takes one NIC, whatever NIC its path names (``topo/rails.py``). Used
        by CPU tensors only (NCCL drives the NICs itself). Every rank first says whether it has
        its rail interfaces; unless all have them, no rank makes the groups and transfers take
        the group's own transport (rank 0 logs why).
        """
        rails = find_rails(self._topology, self._schedules.nodes)
        if rails is None:
            return []
        agree = dist.PrefixStore("topocoll/rails", store)
        names = rails.interfaces[self._topology.node(self._schedules.nodes[rank]).host_id]
        missing = [name for name in names if not _interface_exists(name)]
        agree.set(str(rank), f"rank {rank} has no interface {', '.join(missing)}" if missing else "")
        reasons = [reason for r in range(size) if (reason := agree.get(str(r)).decode())]
        if reasons:
            if rank == 0:
                logger.info("rank 0: %d rails in the topology, not steered onto: %s", rails.count, "; ".join(reasons[:4]))
            return []
        groups = []
        for rail, name in enumerate(names):
            options = dist.ProcessGroupGloo._Options()
            options._devices = [dist.ProcessGroupGloo.create_device(interface=name)]
            options._timeout = timeout
            groups.append(dist.ProcessGroupGloo(dist.PrefixStore(f"topocoll/rail{rail}", store), rank, size, options))
        self._schedules.use_rails(rails)
        self._rails = rails
        logger.info("rank %d: %d rails, transfers steered onto %s", rank, rails.count, ", ".join(names))
        return groups

    # ------------------------------------------------------------------ probing
    def probe(self, settings: ProbeSettings | None = None, progress: Callable[[str], None] | None = None) -> Calibration:
        """Measure this group's links (collective: every rank calls it) and return the calibration.

        The group's topology is not changed; ``TopoOptions(probe=True)`` or
        ``$TOPOCOLL_PROBE=1`` make a group plan on the calibrated one from the start.

        Raises
        ------
        CollectiveError
            A peer died or timed out (on every rank, within the group's timeout).
        """
        self._drain()
        if self._cpu_sched is None:
            raise CollectiveError(f"rank {self._group_rank}: this topo group was shut down (destroy_process_group)")
        channels = [self._cpu_sched, *self._rail_groups]
        rails = self._rails if self._rail_groups else None
        return run_probe(channels, self._group_rank, self._topology, self._schedules.nodes, rails, self._timeout, settings, progress)

    def _calibrated(self, cache_dir: str | None) -> Topology:
        """The calibrated topology: rank 0's cached one, or measured now; the same on every rank."""
        rank, nodes = self._group_rank, self._schedules.nodes
        path = probe_cache_path(cache_dir, self._topology, nodes)
        agree = dist.PrefixStore(f"probe/{self._topology.digest()}", self._store)
        if rank == 0:
            cached = _read_cached(path) if path is not None else None
            agree.set("cached", "1" if cached is not None else "0")
        if agree.get("cached") == b"1":
            if rank == 0:
                agree.set("topology", dumps_topology(cached, "json"))
                logger.info("rank 0: calibrated topology from the probe cache %s", path)
        else:
            say = (lambda line: logger.info("rank 0: %s", line)) if rank == 0 else None
            calibrated = self.probe(progress=say).topology
            if rank == 0:
                agree.set("topology", dumps_topology(calibrated, "json"))
                if path is not None:
                    _write_cached(path, calibrated)
        return parse_topology(agree.get("topology").decode(), "probe result", "json")  # rank 0's, everywhere

    def _use_calibrated(self, topology: Topology, planner: Planner | None, segment_bytes: int | None) -> None:
        self._topology = topology
        self._schedules = ScheduleSource(
            topology, self._schedules.nodes, self._group_rank, self._store, planner or default_planner, segment_bytes,
            cuda_planner=planner or cuda_planner,
        )
        if self._rail_groups:
            self._schedules.use_rails(self._rails)
        if self._group_rank == 0:
            logger.info("rank 0: planning on the probed topology %s", summary(topology))

    def _cuda_groups(self) -> tuple[Any, Any, Executor]:
        """The NCCL inner groups and their executor, made on the first collective on a CUDA tensor.

        Every rank calls the same collectives in the same order, so every rank makes them at the
        same call; a group that never sees a CUDA tensor never starts NCCL.
        """
        if self._cuda_executor is None:
            if self._cuda_connect is None:
                raise CollectiveError(f"rank {self._group_rank}: this topo group was shut down (destroy_process_group)")
            if not (torch.cuda.is_available() and dist.is_nccl_available()):
                raise CollectiveError(f"rank {self._group_rank}: CUDA tensors need torch with CUDA and NCCL")
            store, rank, size, timeout = self._cuda_connect
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout  # enforced by NCCL's watchdog: waits on the GPU take none
            self._cuda_sched = dist.ProcessGroupNCCL(dist.PrefixStore("topocoll/nccl-sched", store), rank, size, options)
            self._cuda_other = dist.ProcessGroupNCCL(dist.PrefixStore("topocoll/nccl-other", store), rank, size, options)
            self._cuda_executor = Executor(self._cuda_sched, rank, timeout)
        return self._cuda_sched, self._cuda_other, self._cuda_executor

    # ------------------------------------------------------------------ identification
    def getBackendName(self) -> str:  # noqa: N802 (name fixed by torch)
        """``"topo"``."""
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        return BACKEND_NAME

    def _get_backend(self, device: torch.device) -> Any:
        """The inner backend that carries this group's traffic on ``device``'s type.

        c10d asks a group for its per-device backend in several places; the first a CUDA user
        meets is ``init_process_group(..., device_id=cuda:N)``, which connects that backend
        eagerly when it ``supports_splitting``. A Python group registers no C++ backend, so the
        base class would fail with "No backend type associated with
        device type cuda". The inner gloo group answers for CPU, the inner NCCL group (created
        here when CUDA is asked for first) for CUDA; other device types raise ``RuntimeError``
        as the base class does, which is what c10d's callers catch.
        """
        kind = torch.device(device).type
        if kind == "cpu":
            return self._cpu_other
        if kind == "cuda":
            return self._cuda_groups()[1]
        raise CollectiveError(f"rank {self._group_rank}: the topo backend has no backend for device type {kind}")

    # c10d names every group it creates (``_set_group_name``) and later reads the name back,
    # e.g. in ``destroy_process_group(group)``; the base class answers from a C++ backend that
    # a Python group does not register, so the group keeps its name and description itself.
    def _set_group_name(self, name: str) -> None:
        self._group_name = name
        super()._set_group_name(name)

    @property
    def group_name(self) -> str:
        """The name c10d gave this group."""
        name = getattr(self, "_group_name", None)
        if name is None:
            raise CollectiveError(f"rank {self._group_rank}: this topo group was not given a name by torch.distributed")
        return name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc
        super()._set_group_desc(desc)

    @property
    def group_desc(self) -> str:
        """The description c10d gave this group ("undefined" before it gives one)."""
        return getattr(self, "_group_desc", "undefined")

    @property
    def topology(self) -> Topology:
        """The topology the group's schedules are made for."""
        return self._topology

    @property
    def nodes(self) -> tuple[str, ...]:
        """Topology node of each group rank."""
        return self._schedules.nodes

    # ------------------------------------------------------------------ life cycle
    def shutdown(self) -> None:
        """Release everything the group holds: its inner groups (their threads and sockets) and
        its shared memory. ``dist.destroy_process_group`` calls it; later calls on the group
        raise. Idempotent."""
        self._release(wait_for_receivers=True)

    def _release(self, wait_for_receivers: bool, cancel_queued: bool = False) -> None:
        comm, self._comm = getattr(self, "_comm", None), None
        if comm is not None:  # queued collectives run first, unless aborted
            comm.shutdown(wait=not (cancel_queued or self._on_comm_thread()), cancel_futures=cancel_queued)
        if self._closed:
            return
        self._closed = True
        wait_for_receivers = wait_for_receivers and self._failure is None
        if self._shm is not None:
            self._shm.close(wait_for_receivers)
        for inner in (self._cuda_sched, self._cuda_other, *self._rail_groups):
            if inner is not None:
                try:
                    inner.shutdown()
                except RuntimeError as exc:  # a communicator that an error already tore down
                    logger.debug("rank %d: NCCL shutdown: %s", self._group_rank, exc)
        self._abort_sends.clear()
        self._shm = self._cpu_sched = self._cpu_other = self._cuda_sched = self._cuda_other = None
        self._rail_groups = []
        self._cpu_executor = self._cuda_executor = self._cuda_connect = None

    def abort(self) -> None:
        """:meth:`shutdown` without waiting: collectives still queued are cancelled (their
        ``wait()`` raises), and peers are not given time to take the last messages."""
        self._release(wait_for_receivers=False, cancel_queued=True)

    # ------------------------------------------------------------------ plumbing
    def _executor(self, tensor: torch.Tensor) -> Executor:
        if self._cpu_executor is None:
            raise CollectiveError(f"rank {self._group_rank}: this topo group was shut down (destroy_process_group)")
        if tensor.device.type == "cpu":
            return self._cpu_executor
        if tensor.device.type == "cuda":
            self._cuda_device = tensor.device
            return self._cuda_groups()[2]
        raise CollectiveError(f"rank {self._group_rank}: tensors on {tensor.device} are not supported")

    def _other(self, tensors: Sequence[torch.Tensor]) -> Any:
        if self._cpu_other is None:
            raise CollectiveError(f"rank {self._group_rank}: this topo group was shut down (destroy_process_group)")
        if tensors and tensors[0].device.type == "cuda":
            self._cuda_device = tensors[0].device
            return self._cuda_groups()[1]
        return self._cpu_other

    def _complete(self, result: list[torch.Tensor], body: Callable[[], None], *, scheduled: bool = True) -> TopoWork:
        """Run ``body`` on the communication thread (CPU tensors) or now; the returned Work
        carries its outcome to ``wait()``.

        A scheduled collective (one that exchanges an argument header) fails at once on a
        broken or shut-down group, and a failure that may leave the ranks out of step breaks
        the group (:mod:`topocoll.collectives.failure`). Work on CUDA tensors is enqueued on
        the caller's stream from the caller's thread, after every queued CPU collective ran;
        a call from the thread itself (a future's callback) runs at once.
        """
        if self._comm is not None and not self._on_comm_thread():
            if not any(t.device.type == "cuda" for t in result):
                try:
                    return TopoWork.pending(result, self._comm.submit(self._run_body, result, body, scheduled))
                except RuntimeError:  # the thread was shut down: report it as the body would
                    pass
            self._drain()
        return self._run_body(result, body, scheduled)

    def _on_comm_thread(self) -> bool:
        return threading.get_ident() in getattr(self, "_comm_thread", ())

    def _drain(self) -> None:
        """Wait until every collective queued on the communication thread ran."""
        if self._comm is not None and not self._on_comm_thread():
            try:
                self._comm.submit(lambda: None).result()
            except RuntimeError:
                pass  # shut down: nothing is queued

    def _run_body(self, result: list[torch.Tensor], body: Callable[[], None], scheduled: bool) -> TopoWork:
        error: BaseException | None = self._unusable() if scheduled else None
        if error is None:
            try:
                body()
            except AgreedError as exc:  # every rank raised it alike: the ranks are still in step
                error = exc
            except FailedError as exc:
                error = self._break(self._follow_blame(exc.failure)) if scheduled and exc.failure is not None else exc
            except Exception as exc:  # the Work carries it to wait()
                if not isinstance(exc, TopocollError):
                    logger.error("rank %d: unexpected failure:\n%s", self._group_rank, "".join(traceback.format_exception(exc)))
                if scheduled:
                    error = self._break(Failure(self._sequence, self._group_rank, NO_RANK, FailureKind.ERROR, str(exc)))
                else:
                    error = exc
        if error is not None:
            logger.debug("rank %d: collective failed: %s", self._group_rank, error)
            return TopoWork(result, error)
        if scheduled and self._shm is not None:
            self._shm.mark_done(self._sequence)
        if result and result[0].device.type == "cuda":
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(result[0].device))  # after the work just enqueued
            return TopoWork(result, event=event)
        return TopoWork(result)

    # ------------------------------------------------------------------ failures
    def _unusable(self) -> CollectiveError | None:
        if self._closed:
            return CollectiveError(f"rank {self._group_rank}: this topo group was shut down (destroy_process_group)")
        if self._failure is not None:
            return GroupBrokenError(
                f"rank {self._group_rank}: the group is broken since {self._failure.describe()}; "
                "destroy it (dist.destroy_process_group) and create a new one"
            )
        return None

    def _break(self, failure: Failure) -> CollectiveError:
        """Mark the group broken by ``failure`` (the first one only), tell the peers, and return
        the error of the call that failed."""
        if self._failure is None:
            stored = self._stored_failure()
            if not failure.detail and stored is not None and stored.sequence == failure.sequence:
                failure = stored  # the same collective's failure, in the words of the rank that saw it first
            self._failure = failure
            record = {"sequence": failure.sequence, "origin": failure.origin, "culprit": failure.culprit,
                      "kind": int(failure.kind), "detail": failure.detail}
            try:  # the store first: a peer that sees the mailbox record can then read the detail
                self._store.compare_set(FAILURE_KEY, "", json.dumps(record))
            except Exception as exc:  # the store may have died with its host rank
                logger.debug("rank %d: cannot record the failure in the store: %s", self._group_rank, exc)
            if self._shm is not None and self._shm.has_mailboxes:
                self._shm.post_failure(failure)
            else:
                self._send_abort_headers(failure)
            logger.warning("rank %d: %s", self._group_rank, failure.describe())
        operation = self._operation or "collective"
        return CollectiveError(f"rank {self._group_rank}: {operation}: {failure.describe()}")

    def _send_abort_headers(self, failure: Failure) -> None:
        """Without mailboxes, tell every peer through the header channel: a peer's next header
        exchange receives this instead of a header and raises at once, instead of waiting out
        the timeout for a header that never comes. (The sends are kept until shutdown.)"""
        if self._cpu_sched is None:
            return
        words = [failure.sequence, ABORT_OPERATION, failure.origin, failure.culprit, int(failure.kind)]
        header = torch.tensor(words + [0] * (len(_HEADER_FIELDS) + 1 - len(words)), dtype=torch.int64)
        for peer in range(self._group_size):
            if peer != self._group_rank:
                try:
                    self._abort_sends.append(self._cpu_sched.send([header], peer, HEADER_TAG))
                except RuntimeError as exc:  # a dead peer's connection
                    logger.debug("rank %d: cannot tell rank %d of the failure: %s", self._group_rank, peer, exc)

    def _follow_blame(self, failure: Failure) -> Failure:
        """Without mailboxes, find the rank really missing behind a silent peer.

        A rank that timed out waiting for peer ``p`` may be one link of a chain: ``p`` waits
        for ``q``, which died. Each such rank records whom it blames in the store, then follows
        the records for :data:`BLAME_LISTEN_S`: the first rank of the chain that records nothing
        is the one that is dead or stuck. (With mailboxes, heartbeats answer the same question.)
        """
        if failure.kind is not FailureKind.SILENT or self._failure is not None or (self._shm is not None and self._shm.has_mailboxes):
            return failure
        key = f"blame/{failure.sequence}"
        try:
            self._store.set(f"{key}/{self._group_rank}", str(failure.culprit))
            chain = [self._group_rank]
            culprit = failure.culprit
            deadline = time.monotonic() + BLAME_LISTEN_S
            while culprit not in chain and culprit != NO_RANK:
                if self._store.check([f"{key}/{culprit}"]):
                    chain.append(culprit)
                    culprit = int(self._store.get(f"{key}/{culprit}"))
                elif time.monotonic() > deadline:
                    break
                else:
                    time.sleep(BLAME_LISTEN_S / 25)
        except Exception as exc:  # a dead store: keep what this rank saw
            logger.debug("rank %d: cannot follow the blame: %s", self._group_rank, exc)
            return failure
        if culprit in chain or culprit == failure.culprit:
            return failure  # nobody further down the chain (or everyone waits: a deadlock)
        via = " -> ".join(f"rank {r}" for r in chain)
        detail = f"{failure.detail}; it waits too: {via} -> rank {culprit}, which answers nothing"
        return Failure(failure.sequence, failure.origin, culprit, failure.kind, detail)

    def _stored_failure(self) -> Failure | None:
        """The group's first failure as recorded in the store, if any rank recorded one."""
        try:
            if not self._store.check([FAILURE_KEY]):
                return None
            record = json.loads(self._store.get(FAILURE_KEY))
            return Failure(record["sequence"], record["origin"], record["culprit"], FailureKind(record["kind"]), record["detail"])
        except Exception as exc:  # a dead store, or a record of another version: no extra detail
            logger.debug("rank %d: cannot read the failure record: %s", self._group_rank, exc)
            return None

    # ------------------------------------------------------------------ argument headers
    def _agree(
        self,
        operation: str,
        numel: int,
        dtype: torch.dtype,
        reduce_code: int,
        root: int,
        local_error: str | None,
        layout: int = 0,
    ) -> None:
        """Exchange headers for the group's next collective; raise the same AgreedError on every
        rank when they differ, FailedError when a peer does not answer."""
        self._sequence += 1
        self._operation = operation
        dtype_code = _DTYPES.index(dtype) if dtype in _DTYPES else -1
        values = [_OPERATIONS.index(operation), numel, dtype_code, reduce_code, root, layout, 1 if local_error else 0]
        if self._shm is not None and self._shm.has_mailboxes:
            # Every rank shares memory: the headers go through mailboxes, microseconds
            # instead of a round of gloo messages.
            rows = self._shm.exchange_header(self._sequence, values, self._timeout)
        else:
            rows = self._exchange_header_gloo(values)
        if local_error:
            raise AgreedError(f"rank {self._group_rank}: {operation}: {local_error}")
        bad = [r for r, row in enumerate(rows) if row[-1]]
        if bad:
            raise AgreedError(f"rank {self._group_rank}: {operation}: invalid arguments on rank(s) {bad}")
        for field_index, name in enumerate(_HEADER_FIELDS[:-1]):
            values_seen = [row[field_index] for row in rows]
            if len(set(values_seen)) > 1:
                shown = ", ".join(f"rank {r}: {_describe(field_index, v)}" for r, v in enumerate(values_seen))
                raise AgreedError(f"rank {self._group_rank}: {operation}: {name} differs across ranks ({shown})")

    def _exchange_header_gloo(self, values: list[int]) -> list[list[int]]:
        """One round of direct messages through the inner group (tag 0 is kept free by
        lowering): cheaper than gloo's ring allgather, whose n - 1 sequential hops dominate
        small collectives. Each header starts with the collective's number."""
        sequence = self._sequence
        header = torch.tensor([sequence, *values], dtype=torch.int64)
        gathered = [header if r == self._group_rank else torch.empty_like(header) for r in range(self._group_size)]
        peers = [r for r in range(self._group_size) if r != self._group_rank]
        receiving: dict[int, Any] = {}
        sending: list[tuple[int, Any]] = []
        try:
            for peer in peers:
                receiving[peer] = self._cpu_sched.recv([gathered[peer]], peer, HEADER_TAG)
            for peer in peers:
                sending.append((peer, self._cpu_sched.send([header], peer, HEADER_TAG)))
            for peer, work in receiving.items():
                work.wait(self._timeout)
                words = [int(v) for v in gathered[peer].tolist()]
                if words[1] == ABORT_OPERATION:  # the peer broke: its header says how
                    failure = Failure(words[0], words[2], words[3], FailureKind(words[4]))
                    raise FailedError(failure.describe(), failure)
            for peer, work in sending:
                work.wait(self._timeout)
        except FailedError:
            raise
        except RuntimeError as exc:  # posting to or waiting on ``peer`` failed: it is gone or late
            reason = first_line(exc)
            failure = Failure(sequence, self._group_rank, peer, FailureKind.ABSENT, f"no header from rank {peer}: {reason}")
            raise FailedError(failure.describe(), failure) from None
        rows = [[int(v) for v in g.tolist()] for g in gathered]
        elsewhere = [(r, row[0]) for r, row in enumerate(rows) if row[0] != sequence]
        if elsewhere:
            shown = ", ".join(f"rank {r} is at #{k}" for r, k in elsewhere)
            raise CollectiveError(f"the ranks are out of step: this rank is at collective #{sequence}, {shown}")
        return [row[1:] for row in rows]

    def _run(self, collective: Collective, buffer: torch.Tensor, reduce: _Reduce | None, root: int | None) -> None:
        if buffer.numel() == 0 or self._group_size == 1:
            return  # nothing to move (a group of one holds every result already)
        size_bytes = buffer.numel() * buffer.element_size()
        program = self._schedules.program(collective, root, buffer.numel(), size_bytes, buffer.device.type)
        self._executor(buffer).run(program, buffer, reduce.reduction if reduce else None, sequence=self._sequence)

    def _validate(self, tensors: Sequence[torch.Tensor], *, reduce: _Reduce | None = None) -> str | None:
        """A description of what is wrong with the local arguments, or None."""
        if len(tensors) != 1:
            return f"expected exactly one tensor, got {len(tensors)}"
        tensor = tensors[0]
        if tensor.layout is not torch.strided:
            return f"{tensor.layout} tensors are not supported here (all_reduce of sparse COO tensors is handed to gloo)"
        if tensor.dtype not in _DTYPES:
            return f"dtype {tensor.dtype} is not supported"
        try:
            self._executor(tensor)
            if reduce is not None:
                _check_reduce(reduce, tensor.dtype)
        except CollectiveError as exc:
            return str(exc)
        return None

    # ------------------------------------------------------------------ scheduled collectives
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """All-reduce ``tensors[0]`` in place; sparse COO tensors go to the inner gloo group
        (whose sparse all-reduce gathers indices and values), dense ones through a schedule."""
        opts = opts if opts is not None else dist.AllreduceOptions()
        if tensors and all(t.layout is torch.sparse_coo for t in tensors) and tensors[0].device.type == "cpu":
            return self._other(tensors).allreduce(tensors, opts)
        return self._complete(tensors, lambda: self._allreduce(tensors, opts.reduceOp, "allreduce"))

    def _allreduce(self, tensors: list[torch.Tensor], op: Any, operation: str, layout: int = 0) -> None:
        reduce, error = _reduce_or_error(op)
        if error is None:
            error = self._validate(tensors, reduce=reduce)
        tensor = tensors[0] if len(tensors) == 1 else torch.empty(0)
        self._agree(operation, tensor.numel(), tensor.dtype, reduce.code if reduce else -1, 0, error, layout)
        reduce = reduce or _parse_reduce_op(op)  # _agree raised already when op is invalid
        work = tensor if _packed(tensor) else _packed_copy(tensor)
        flat = work.view(-1)
        self._run(Collective.ALLREDUCE, flat, reduce, None)
        if reduce.average and flat.numel():
            flat.div_(self._group_size)
        if work is not tensor:
            tensor.copy_(work)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """All-reduce several tensors of one dtype and device with one schedule run."""
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        return self._complete(tensors, lambda: self._allreduce_coalesced(tensors, opts.reduceOp))

    def _allreduce_coalesced(self, tensors: list[torch.Tensor], op: Any) -> None:
        error = None
        if not tensors:
            error = "no tensors given"
        elif len({(t.dtype, t.device) for t in tensors}) != 1:
            error = "all tensors must share one dtype and device"
        if error is not None:
            reduce, _ = _reduce_or_error(op)
            self._agree("allreduce_coalesced", 0, torch.float32, reduce.code if reduce else -1, 0, error)
        flat = torch.cat([t.reshape(-1) for t in tensors])
        self._allreduce([flat], op, "allreduce_coalesced", _layout(tensors))
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view(t.shape))
            offset += t.numel()

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """Broadcast ``tensors[0]`` of rank ``opts.rootRank`` to every rank, in place."""
        opts = opts if opts is not None else dist.BroadcastOptions()
        return self._complete(tensors, lambda: self._broadcast(tensors, opts.rootRank))

    def _broadcast(self, tensors: list[torch.Tensor], root: int) -> None:
        error = self._validate(tensors) or self._root_error(root)
        tensor = tensors[0] if len(tensors) == 1 else torch.empty(0)
        self._agree("broadcast", tensor.numel(), tensor.dtype, -1, root, error)
        work = tensor if _packed(tensor) else _packed_copy(tensor)
        self._run(Collective.BROADCAST, _bytes_view(work), None, root)
        if work is not tensor:
            tensor.copy_(work)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """Reduce ``tensors[0]`` of every rank into rank ``opts.rootRank``'s, in place there."""
        opts = opts if opts is not None else dist.ReduceOptions()
        return self._complete(tensors, lambda: self._reduce(tensors, opts.rootRank, opts.reduceOp))

    def _reduce(self, tensors: list[torch.Tensor], root: int, op: Any) -> None:
        reduce, error = _reduce_or_error(op)
        error = error or self._validate(tensors, reduce=reduce) or self._root_error(root)
        tensor = tensors[0] if len(tensors) == 1 else torch.empty(0)
        self._agree("reduce", tensor.numel(), tensor.dtype, reduce.code if reduce else -1, root, error)
        reduce = reduce or _parse_reduce_op(op)  # _agree raised already when op is invalid
        is_root = self._group_rank == root
        # Other ranks' inputs stay untouched: the schedule may add partial sums into them.
        work = tensor if is_root and _packed(tensor) else _packed_copy(tensor)
        flat = work.view(-1)
        self._run(Collective.REDUCE, flat, reduce, root)
        if is_root:
            if reduce.average and flat.numel():
                flat.div_(self._group_size)
            if work is not tensor:
                tensor.copy_(work)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """Gather ``input_tensors[0]`` of every rank into ``output_tensors[0][rank]``."""
        outputs = output_tensors[0] if len(output_tensors) == 1 else []
        return self._complete(list(outputs), lambda: self._allgather_list(output_tensors, input_tensors))

    def _allgather_list(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor]) -> None:
        error = self._validate(input_tensors)
        if error is None:
            if len(output_tensors) != 1 or len(output_tensors[0]) != self._group_size:
                error = f"expected one list of {self._group_size} output tensors"
            else:
                error = _same_numel_error(output_tensors[0], input_tensors[0])
        tensor = input_tensors[0] if len(input_tensors) == 1 else torch.empty(0)
        self._agree("allgather", tensor.numel(), tensor.dtype, -1, 0, error)
        gathered = self._gather_into_new(tensor)
        _scatter_copy(gathered, output_tensors[0])

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> TopoWork:  # noqa: A002
        """Gather every rank's ``input`` into ``output`` (``size`` times as many elements)."""
        return self._complete([output], lambda: self._allgather_tensor(output, input))

    def _allgather_tensor(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        error = self._validate([tensor])
        if error is None:
            error = _base_shape_error(output, tensor, self._group_size)
        self._agree("allgather_into_tensor", tensor.numel(), tensor.dtype, -1, 0, error)
        gathered = self._gather_into_new(tensor)
        output.copy_(gathered.view(output.shape))

    def _gather_into_new(self, tensor: torch.Tensor) -> torch.Tensor:
        m = tensor.numel()
        buffer = torch.empty(m * self._group_size, dtype=tensor.dtype, device=tensor.device)
        buffer[self._group_rank * m : (self._group_rank + 1) * m].copy_(tensor.reshape(-1))
        self._run(Collective.ALLGATHER, _bytes_view(buffer), None, None)
        return buffer

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """Gather every rank's ``input_list`` into ``output_lists[rank]`` (torch's layout: one
        list per rank, one tensor per input), with one schedule run over all of them."""
        results = [t for outputs in output_lists for t in outputs]
        return self._complete(results, lambda: self._allgather_coalesced(output_lists, input_list))

    def _allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor]) -> None:
        error = self._coalesced_error(input_list)
        if error is None and len(output_lists) != self._group_size:
            error = f"expected {self._group_size} output lists (one per rank), got {len(output_lists)}"
        for r, outputs in enumerate(output_lists if error is None else []):
            if len(outputs) != len(input_list):
                error = f"output list {r} has {len(outputs)} tensors, expected {len(input_list)} (one per input)"
            else:
                error = next(filter(None, (_same_numel_error([o], i) for o, i in zip(outputs, input_list))), None)
            if error is not None:
                break
        raw = [_raw_bytes(t) for t in input_list] if error is None else []
        size_bytes = sum(b.numel() for b in raw)
        self._agree("allgather_coalesced", size_bytes, torch.uint8, -1, 0, error, _layout(input_list))
        buffer = torch.empty(size_bytes * self._group_size, dtype=torch.uint8, device=input_list[0].device)
        torch.cat(raw, out=buffer[self._group_rank * size_bytes : (self._group_rank + 1) * size_bytes])
        self._run(Collective.ALLGATHER, buffer, None, None)
        for r, outputs in enumerate(output_lists):
            _copy_bytes_into(buffer[r * size_bytes : (r + 1) * size_bytes], outputs)

    def _coalesced_error(self, tensors: Sequence[torch.Tensor]) -> str | None:
        """What is wrong with a list of inputs of a coalesced operation (one device), or None."""
        if not tensors:
            return "no tensors given"
        if len({t.device for t in tensors}) != 1:
            return "all tensors must be on one device"
        return next(filter(None, (self._validate([t]) for t in tensors)), None)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """One all-gather-into-tensor per pair."""
        return self._complete(outputs, lambda: [self._allgather_tensor(o, i) for o, i in zip(outputs, inputs)])

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None) -> TopoWork:
        """Reduce ``input_tensors[0][r]`` over ranks into rank ``r``'s ``output_tensors[0]``."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._complete(output_tensors, lambda: self._reduce_scatter_list(output_tensors, input_tensors, opts.reduceOp))

    def _reduce_scatter_list(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], op: Any) -> None:
        reduce, error = _reduce_or_error(op)
        error = error or self._validate(output_tensors, reduce=reduce)
        if error is None:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self._group_size:
                error = f"expected one list of {self._group_size} input tensors"
            else:
                error = _same_numel_error(input_tensors[0], output_tensors[0])
        output = output_tensors[0] if len(output_tensors) == 1 else torch.empty(0)
        self._agree("reduce_scatter", output.numel(), output.dtype, reduce.code if reduce else -1, 0, error)
        reduce = reduce or _parse_reduce_op(op)  # _agree raised already when op is invalid
        buffer = torch.cat([t.reshape(-1) for t in input_tensors[0]])
        self._reduce_scatter_into(output, buffer, reduce)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> TopoWork:  # noqa: A002
        """Reduce ``input`` (``size`` shards) over ranks; rank ``r`` gets shard ``r`` in ``output``."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._complete([output], lambda: self._reduce_scatter_tensor(output, input, opts.reduceOp))

    def _reduce_scatter_tensor(self, output: torch.Tensor, tensor: torch.Tensor, op: Any) -> None:
        reduce, error = _reduce_or_error(op)
        error = error or self._validate([output], reduce=reduce)
        if error is None:
            error = _base_shape_error(tensor, output, self._group_size)
            if error is None and tensor.dtype != output.dtype:
                error = f"input dtype {tensor.dtype} differs from output dtype {output.dtype}"
        self._agree("reduce_scatter_tensor", output.numel(), output.dtype, reduce.code if reduce else -1, 0, error)
        reduce = reduce or _parse_reduce_op(op)  # _agree raised already when op is invalid
        self._reduce_scatter_into(output, tensor.reshape(-1).clone(), reduce)

    def _reduce_scatter_into(self, output: torch.Tensor, buffer: torch.Tensor, reduce: _Reduce) -> None:
        m = output.numel()
        self._run(Collective.REDUCE_SCATTER, buffer, reduce, None)
        shard = buffer[self._group_rank * m : (self._group_rank + 1) * m]
        if reduce.average and m:
            shard.div_(self._group_size)
        output.copy_(shard.view(output.shape))

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """One reduce-scatter-tensor per pair."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._complete(
            outputs, lambda: [self._reduce_scatter_tensor(o, i, opts.reduceOp) for o, i in zip(outputs, inputs)]
        )

    # ------------------------------------------------------------------ handed to the inner backend
    def barrier(self, opts: Any = None) -> Any:
        """Barrier of the inner backend, after every earlier collective of this rank completed.

        CPU collectives complete before they return; CUDA ones are only enqueued, so the GPU
        work of this group is finished first (as NCCL's barrier does), and once the barrier
        returns every rank's earlier collectives are done.
        """
        self._drain()
        unusable = self._unusable()
        if unusable is not None:
            return TopoWork([], unusable)
        if self._cuda_device is not None:
            torch.cuda.synchronize(self._cuda_device)
        options = dist.BarrierOptions()
        options.timeout = self._timeout
        return self._cpu_sched.barrier(options)

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> Any:
        """gloo's monitored barrier on the inner group: names the ranks that did not arrive.

        ``dist.monitored_barrier`` refuses every backend not named "gloo" before it reaches a
        group, so call this method on the group (``dist.group.WORLD.monitored_barrier(...)``).
        """
        self._drain()
        unusable = self._unusable()
        if unusable is not None:
            raise unusable
        if self._cuda_device is not None:
            torch.cuda.synchronize(self._cuda_device)
        return self._cpu_sched.monitored_barrier(timeout or self._timeout, wait_all_ranks=wait_all_ranks)

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> Any:  # noqa: N803
        """Inner backend's send."""
        return self._other(tensors).send(tensors, dstRank, tag)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> Any:  # noqa: N803
        """Inner backend's receive."""
        return self._other(tensors).recv(tensors, srcRank, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        """Inner backend's receive from any rank."""
        return self._other(tensors).recv_anysource(tensors, tag)

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """Inner backend's gather."""
        return self._other(input_tensors).gather(output_tensors, input_tensors, opts or dist.GatherOptions())

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None) -> Any:
        """Inner backend's scatter."""
        return self._other(output_tensors).scatter(output_tensors, input_tensors, opts or dist.ScatterOptions())

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # noqa: A002
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Any:
        """Inner backend's all-to-all of one tensor."""
        return self._other([input]).alltoall_base(
            output, input, output_split_sizes, input_split_sizes, opts or dist.AllToAllOptions()
        )

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """All-to-all of tensor lists, through the inner backend's single-tensor all-to-all."""
        return self._complete(output_tensors, lambda: self._alltoall(output_tensors, input_tensors))

    def _alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor]) -> None:
        if len(output_tensors) != self._group_size or len(input_tensors) != self._group_size:
            raise CollectiveError(f"rank {self._group_rank}: alltoall needs {self._group_size} input and output tensors")
        if len({t.dtype for t in list(output_tensors) + list(input_tensors)}) != 1:
            raise CollectiveError(f"rank {self._group_rank}: alltoall tensors must share one dtype")
        send = torch.cat([t.reshape(-1) for t in input_tensors])
        receive = torch.empty(sum(t.numel() for t in output_tensors), dtype=send.dtype, device=send.device)
        work = self._other(input_tensors).alltoall_base(
            receive, send, [t.numel() for t in output_tensors], [t.numel() for t in input_tensors], dist.AllToAllOptions()
        )
        work.wait(self._timeout)
        _scatter_copy(receive, output_tensors)

    # torch >= 2.13 names of the single-tensor forms (the underscore names are the older ones)
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> TopoWork:  # noqa: A002
        """Same as :meth:`_allgather_base` (``dist.all_gather_into_tensor``)."""
        return self._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> TopoWork:  # noqa: A002
        """Same as :meth:`_reduce_scatter_base` (``dist.reduce_scatter_tensor``)."""
        return self._reduce_scatter_base(output, input, opts)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """Same as :meth:`allgather_into_tensor_coalesced`."""
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """Same as :meth:`reduce_scatter_tensor_coalesced`."""
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # noqa: A002
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Any:
        """Same as :meth:`alltoall_base` (``dist.all_to_all_single``)."""
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def _root_error(self, root: int) -> str | None:
        if not 0 <= root < self._group_size:
            return f"root {root} is not a rank of this group of {self._group_size}"
        return None


_OPERATIONS = (
    "allreduce",
    "allreduce_coalesced",
    "broadcast",
    "reduce",
    "allgather",
    "allgather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "allgather_coalesced",
)
"""Header codes of the scheduled operations (their index)."""


def _describe(field_index: int, value: int) -> str:
    if field_index == 0:
        return _OPERATIONS[value]
    if field_index == 2:
        return str(_DTYPES[value]).removeprefix("torch.") if 0 <= value < len(_DTYPES) else "unsupported dtype"
    if field_index == 5:
        return f"{value:016x}"
    if field_index == 3:
        return str(_REDUCE_OPS[value][0]).rsplit(".", 1)[-1] if 0 <= value < len(_REDUCE_OPS) else "none"
    return str(value)


def _reduce_or_error(op: Any) -> tuple[_Reduce | None, str | None]:
    try:
        return _parse_reduce_op(op), None
    except CollectiveError as exc:
        return None, str(exc)


def _bytes_view(buffer: torch.Tensor) -> torch.Tensor:
    """Copy-only collectives move raw bytes: no per-dtype concerns, one schedule per size."""
    return buffer.view(-1).view(torch.uint8) if buffer.dtype != torch.bool else buffer.view(-1)


def _same_numel_error(tensors: Sequence[torch.Tensor], like: torch.Tensor) -> str | None:
    for i, t in enumerate(tensors):
        if t.numel() != like.numel() or t.dtype != like.dtype or t.device != like.device:
            return (
                f"tensor {i} has {t.numel()} {t.dtype} elements on {t.device}, "
                f"expected {like.numel()} {like.dtype} on {like.device}"
            )
    return None


def _base_shape_error(large: torch.Tensor, small: torch.Tensor, size: int) -> str | None:
    if large.numel() != small.numel() * size:
        return f"the large tensor has {large.numel()} elements, expected {size} x {small.numel()}"
    if large.dtype != small.dtype or large.device != small.device:
        return f"dtype/device differ: {large.dtype} on {large.device} vs {small.dtype} on {small.device}"
    return None


def _layout(tensors: Sequence[torch.Tensor]) -> int:
    """A 63-bit digest of the shapes and dtypes of ``tensors``: the header word that makes
    coalesced operations whose tensors differ across ranks fail alike on every rank."""
    text = ";".join(f"{tuple(t.shape)}:{t.dtype}" for t in tensors)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def _raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``tensor`` as a flat uint8 tensor (a view when it is packed)."""
    return (tensor if _packed(tensor) else _packed_copy(tensor)).reshape(-1).view(torch.uint8)


def _packed(tensor: torch.Tensor) -> bool:
    """Whether the elements of ``tensor`` lie next to each other with unit stride.

    torch calls a tensor of zero or one element contiguous whatever its strides, but a flat
    view of it keeps the stride, and a byte view (``view(torch.uint8)``), or a transport that
    reads memory, needs unit strides."""
    return tensor.is_contiguous() and (tensor.numel() > 1 or all(s == 1 for s in tensor.stride()))


def _packed_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` with packed, unit-stride storage."""
    packed = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    packed.copy_(tensor)
    return packed


def _copy_bytes_into(flat: torch.Tensor, outputs: Sequence[torch.Tensor]) -> None:
    """Fill ``outputs`` in order from the raw bytes ``flat`` (each with its own dtype)."""
    offset = 0
    for out in outputs:
        nbytes = out.numel() * out.element_size()
        landing = out if _packed(out) else torch.empty(out.shape, dtype=out.dtype, device=out.device)
        landing.reshape(-1).view(torch.uint8).copy_(flat[offset : offset + nbytes])
        if landing is not out:
            out.copy_(landing)
        offset += nbytes


def probe_cache_path(cache_dir: str | None, topology: Topology, nodes: Sequence[str]) -> Path | None:
    """Where the calibration of ``topology`` with ranks on ``nodes`` is cached (None: no cache)."""
    if cache_dir is not None and cache_dir.strip().lower() == "off":
        return None
    root = Path(cache_dir).expanduser() if cache_dir else Path.home() / ".cache" / "topocoll" / "probe"
    placement = hashlib.sha256(json.dumps(list(nodes)).encode()).hexdigest()[:12]
    return root / f"{topology.digest().split(':')[-1][:24]}-{placement}.json"


def _read_cached(path: Path) -> Topology | None:
    try:
        return load_topology(path)
    except FileNotFoundError:
        return None
    except (TopocollError, OSError) as exc:  # a damaged cache entry is measured again
        logger.warning("rank 0: ignoring the probe cache %s: %s", path, exc)
        return None


def _write_cached(path: Path, topology: Topology) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(dumps_topology(topology, "json"))
        temporary.replace(path)  # whole or not at all
    except OSError as exc:
        logger.warning("rank 0: cannot write the probe cache %s: %s", path, exc)


def _interface_exists(name: str) -> bool:
    try:
        socket.if_nametoindex(name)
    except OSError:
        return False
    return True


def _scatter_copy(flat: torch.Tensor, outputs: Sequence[torch.Tensor]) -> None:
    offset = 0
    for out in outputs:
        out.copy_(flat[offset : offset + out.numel()].view(out.shape))
        offset += out.numel()


def _create(options: Any, backend_options: Any = None) -> TopoProcessGroup:
    """Backend creator torch.distributed calls (extended API: it gets the global ranks)."""
    extra = backend_options if isinstance(backend_options, TopoOptions) else TopoOptions()
    store = options.store
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is not None:
        # torchrun hands every attempt of an elastic run the same store (its agent's, unless
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): an attempt's keys must not meet the addresses and
        # digests its dead predecessor left there. The agent restarts all its workers together,
        # so the ranks of one attempt agree on the count.
        store = dist.PrefixStore(f"topocoll/attempt{attempt}", store)
    return TopoProcessGroup(
        store,
        options.group_rank,
        options.group_size,
        options.timeout,
        global_ranks=list(options.global_ranks_in_group) or None,
        topology=extra.topology,
        planner=extra.planner,
        segment_bytes=extra.segment_bytes,
        shared_memory=extra.shared_memory,
        probe=extra.probe,
        background=extra.background,
    )


def register() -> None:
    """Register ``"topo"`` with torch.distributed (devices ``cpu`` and ``cuda``); idempotent."""
    plugins = getattr(dist.Backend, "_plugins", {})
    existing = plugins.get(BACKEND_NAME.upper())
    if existing is not None:
        if getattr(existing, "creator_fn", None) is not _create:
            raise CollectiveError(f"another backend is already registered as {BACKEND_NAME!r}")
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])
