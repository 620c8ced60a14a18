"""How the benchmark's processes find each other.

Three ways to start ``topocoll-bench``:

- ``mpirun -np N topocoll-bench ...``: mpi4py gives the rank and the world size; rank 0 starts a
  TCP key-value store on a free port (port 0, chosen by the kernel, so no two runs collide) and
  broadcasts its address and port over MPI; torch.distributed then carries all the data.
- ``torchrun --nproc-per-node N -m topocoll.bench ...``, or any launcher that sets ``RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``: torch.distributed's ``env://``.
- anything else is a single process, which the benchmark refuses (a collective needs two ranks).

MPI is only initialized when an MPI launcher's variables are present, so that ``torchrun`` runs
never load an MPI library.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from topocoll.bench.collective_table import BenchArgumentError

__all__ = ["LaunchMethod", "Launch", "detect_launch", "rank_from_environment", "init_distributed", "agree", "abort"]

log = logging.getLogger(__name__)

MPI_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE")
"""Variables an MPI launcher sets in every process (Open MPI, MPICH/Hydra, PMIx, MVAPICH)."""

MPI_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")

MPI_LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")

LOOPBACK_ADDR = "127.0.0.1"

#: How launchers tell a process how many ranks share its machine.
LOCAL_SIZE_VARIABLES = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE")


def share_cores(environ: Mapping[str, str] | None = None) -> int | None:
    """Give this rank its share of the cores for torch's intra-op threads, as torchrun does.

    Ranks on one machine that each start one thread per core fight over the cores (torch's
    element-wise kernels then run many times slower). Unless ``OMP_NUM_THREADS`` is set, use
    ``cores // local ranks`` threads (at least one). Returns the thread count set, or None.
    """
    env = os.environ if environ is None else environ
    if "OMP_NUM_THREADS" in env:
        return None
    local = _first_int(env, LOCAL_SIZE_VARIABLES)
    if local is None or local < 2:
        return None
    import torch

    threads = max(1, (os.cpu_count() or 1) // local)
    torch.set_num_threads(threads)
    return threads


class LaunchMethod(str, enum.Enum):
    """Who started the processes."""

    MPI = "mpirun"
    ENV = "env://"
    SINGLE = "single process"


@dataclass(frozen=True, slots=True)
class Launch:
    """This process's place in the job, known before torch.distributed starts.

    Attributes
    ----------
    method : LaunchMethod
    rank, world_size, local_rank : int
    comm : object
        The mpi4py communicator (``MPI.COMM_WORLD``) for MPI launches, else None.
    """

    method: LaunchMethod
    rank: int
    world_size: int
    local_rank: int = 0
    comm: Any = field(default=None, compare=False, repr=False)


def _first_int(environ: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = environ.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def rank_from_environment(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank as the launcher's variables say (0 when there is none).

    Used to print argument errors on rank 0 only, before anything is initialized.
    """
    env = os.environ if environ is None else environ
    rank = _first_int(env, ("RANK",)) if "WORLD_SIZE" in env else None
    if rank is None:
        rank = _first_int(env, MPI_RANK_VARIABLES)
    return rank or 0


def detect_launch(environ: Mapping[str, str] | None = None) -> Launch:
    """Work out how this process was started.

    ``RANK`` and ``WORLD_SIZE`` (torchrun, or set by hand) take precedence over an MPI
    launcher's variables; with neither the process is alone.

    Raises
    ------
    BenchArgumentError
        ``env://`` variables that are not integers, or ``MASTER_ADDR`` / ``MASTER_PORT``
        missing.
    """
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _first_int(env, ("RANK",)), _first_int(env, ("WORLD_SIZE",))
        if rank is None or world is None:
            raise BenchArgumentError(f"RANK={env['RANK']!r} and WORLD_SIZE={env['WORLD_SIZE']!r} must be integers")
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
        if missing and world > 1:
            raise BenchArgumentError(f"env:// launch needs {' and '.join(missing)} (torchrun sets them)")
        local = _first_int(env, ("LOCAL_RANK",))
        return Launch(LaunchMethod.ENV, rank, world, rank if local is None else local)
    if any(name in env for name in MPI_SIZE_VARIABLES + MPI_RANK_VARIABLES):
        from mpi4py import MPI  # initializes MPI; only under an MPI launcher

        comm = MPI.COMM_WORLD
        local = _first_int(env, MPI_LOCAL_RANK_VARIABLES)
        return Launch(LaunchMethod.MPI, comm.Get_rank(), comm.Get_size(), comm.Get_rank() if local is None else local, comm)
    return Launch(LaunchMethod.SINGLE, 0, 1, 0)


def agree(launch: Launch, error: str | None) -> str | None:
    """The first error any rank found (MPI launches), so that all ranks stop together.

    Under ``env://`` there is no channel before torch.distributed starts; every rank checks
    the same arguments and files, and returns its own verdict.
    """
    if launch.method is not LaunchMethod.MPI:
        return error
    errors = launch.comm.allgather(error)
    for rank, message in enumerate(errors):
        if message is not None:
            return message if rank == launch.rank or message == error else f"rank {rank}: {message}"
    return None


def abort(launch: Launch, status: int) -> None:
    """End every rank of an MPI job at once (another rank may be blocked in a collective)."""
    if launch.method is LaunchMethod.MPI:
        launch.comm.Abort(status)


def _same_host(launch: Launch) -> tuple[bool, str]:
    hosts = launch.comm.allgather(socket.gethostname())
    return len(set(hosts)) == 1, hosts[0]


def _host_address(hostname: str) -> str:
    """An address of this host that other hosts can use (the resolver's, unless loopback)."""
    try:
        infos = socket.getaddrinfo(hostname, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        infos = []
    for info in infos:
        address = info[4][0]
        if not address.startswith("127."):
            return address
    return hostname


def init_distributed(launch: Launch, backend: str, timeout_s: float, pg_options: Any = None) -> None:
    """Start torch.distributed's default group with ``backend``.

    Parameters
    ----------
    launch : Launch
        From :func:`detect_launch` (a single process gets a world of one).
    backend : str
        ``"topo"``, ``"gloo"`` or ``"nccl"``.
    timeout_s : float
        Store and collective timeout in seconds.
    pg_options : object, optional
        Backend options (:class:`topocoll.collectives.TopoOptions` for ``"topo"``).
    """
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    kwargs: dict[str, Any] = {"rank": launch.rank, "world_size": launch.world_size, "timeout": timeout}
    if pg_options is not None:
        kwargs["pg_options"] = pg_options
    if launch.method is LaunchMethod.ENV:
        dist.init_process_group(backend, init_method="env://", **kwargs)
        return
    if launch.method is LaunchMethod.SINGLE:  # alone, as nccl-tests started without mpirun: an in-process store
        dist.init_process_group(backend, store=dist.HashStore(), **kwargs)
        return
    single_host, first_host = _same_host(launch)
    address = os.environ.get("MASTER_ADDR") or (LOOPBACK_ADDR if single_host else _host_address(first_host))
    if launch.rank == 0:
        store = dist.TCPStore(address, 0, launch.world_size, True, timeout=timeout, wait_for_workers=False)
        port = store.port
    else:
        store, port = None, None
    address, port = launch.comm.bcast((address, port), root=0)
    if launch.rank != 0:
        store = dist.TCPStore(address, port, launch.world_size, False, timeout=timeout)
    log.info("rank %d: store at %s:%d", launch.rank, address, port)
    dist.init_process_group(backend, store=store, **kwargs)
