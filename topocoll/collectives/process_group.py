"""``TopoProcessGroup``: the process group behind torch.distributed's ``"topo"`` backend.

Its allreduce, reduce-scatter, allgather, broadcast and reduce run topocoll schedules: rank 0
synthesizes a schedule for the group's topology, shares it through the store, every rank
verifies and lowers it (:mod:`topocoll.collectives.schedule_source`), and the executor moves the data
with point-to-point messages of an inner backend (gloo for CPU tensors, NCCL for CUDA tensors);
between CPU ranks of one host the data itself goes through shared memory
(:mod:`topocoll.collectives.shm`). What it hands to the inner backend as it is lives in
:mod:`topocoll.collectives.passthrough`; the header before every collective and the handling of
a broken group in :mod:`topocoll.collectives.header`.

Collectives on CPU tensors run on one communication thread per group, in the order the rank
called them: ``async_op=True`` returns a pending :class:`~topocoll.collectives.work.TopoWork` at
once and ``wait()`` blocks and raises the collective's error. On CUDA tensors the work is
enqueued on the current stream and the returned work holds an event.

The topology and where each rank runs on it are settled at group creation
(:mod:`topocoll.collectives.topology_source`, :mod:`topocoll.collectives.placement`), from the
:class:`~topocoll.collectives.topology_source.TopologySettings` the group is given: the
registry (:mod:`topocoll.collectives.backend`) reads them from the environment, the one place
the group's settings come from it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import socket
import threading
import traceback
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from topocoll.collectives.alltoall import AllToAllCalls, AllToAllPlanner
from topocoll.collectives.executor import Executor
from topocoll.collectives.failure import NO_RANK, AgreedError, FailedError, Failure, FailureKind
from topocoll.collectives.header import HeaderExchange
from topocoll.collectives.passthrough import InnerBackendCalls
from topocoll.collectives.placement import exchange_identities, local_identity
from topocoll.collectives.probe import ProbeSettings, probe_cache_path, read_cached, run_probe, write_cached
from topocoll.collectives.schedule_source import (
    DEFAULT_SEGMENT_BYTES,
    Planner,
    ScheduleSource,
    announce_topology_error,
    check_digests,
    cuda_planner,
    default_planner,
)
from topocoll.collectives.scheduled import ScheduledCollectives
from topocoll.collectives.shm import ShmTransport
from topocoll.collectives.topology_source import TopologySettings, dump_topology, group_topology, summary
from topocoll.collectives.work import TopoWork
from topocoll.errors import CollectiveError, TopocollError
from topocoll.topo.calibrate import Calibration
from topocoll.topo.host import host_identity
from topocoll.topo.io import dumps_topology, parse_topology
from topocoll.topo.merge import planning_warnings
from topocoll.topo.model import Topology
from topocoll.topo.rails import Rails, find_rails

__all__ = ["BACKEND_NAME", "TopoProcessGroup"]

logger = logging.getLogger(__name__)

BACKEND_NAME = "topo"
"""The name to pass to ``dist.init_process_group`` / ``dist.new_group``."""


class TopoProcessGroup(ScheduledCollectives, AllToAllCalls, HeaderExchange, InnerBackendCalls, dist.ProcessGroup):
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
        The topology (default: the file ``settings`` names, else discovered). Every rank must
        pass an equal one; this is checked. Ranks are placed on it by identity
        (:func:`topocoll.collectives.placement.map_ranks`).
    settings : TopologySettings, optional
        Where the topology comes from, this machine's identity, probing (default: none of the
        environment's; the registry passes ``TopologySettings.from_env(os.environ)``).
    planner : Planner, optional
        Makes schedules on rank 0 (default :func:`topocoll.solver.plan`).
    segment_bytes : int or None
        Largest message in bytes; longer ones are cut so that reductions overlap transfers.
    shared_memory : bool
        Move CPU data between ranks of one host through shared memory (default True).
    dataflow : bool
        Run CPU schedules in data-flow order, not in lock step (default False).

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
        dataflow: bool = False,
        settings: TopologySettings | None = None,
    ) -> None:
        super().__init__(rank, size)
        self._dataflow = dataflow
        self._group_rank = rank
        self._group_size = size
        self._timeout = timeout
        ranks = tuple(global_ranks) if global_ranks else tuple(range(size))
        if len(ranks) != size:
            raise CollectiveError(f"rank {rank}: {len(ranks)} global ranks given for a group of {size}")
        own_store = dist.PrefixStore("topocoll", store)
        settings = settings if settings is not None else TopologySettings()
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
        self._a2a_planner: AllToAllPlanner | None = None  # made on the first routed all-to-all
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
        self._cpu_executor = Executor(
            self._shm or self._cpu_sched, rank, timeout, channels=self._rail_groups, native=self._cpu_sched, dataflow=self._dataflow
        )
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
            cached = read_cached(path) if path is not None else None
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
                    write_cached(path, calibrated)
        return parse_topology(agree.get("topology").decode(), "probe result", "json")  # rank 0's, everywhere

    def _use_calibrated(self, topology: Topology, planner: Planner | None, segment_bytes: int | None) -> None:
        self._topology = topology
        self._schedules = ScheduleSource(
            topology, self._schedules.nodes, self._group_rank, self._store, planner or default_planner, segment_bytes,
            cuda_planner=planner or cuda_planner,
        )
        self._a2a_planner = None
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
            self._cuda_executor = Executor(self._cuda_sched, rank, timeout, native=self._cuda_sched)
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




































def _interface_exists(name: str) -> bool:
    try:
        socket.if_nametoindex(name)
    except OSError:
        return False
    return True
