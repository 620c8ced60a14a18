"""A rank started by torchrun (``env://``) or mpirun (mpi4py + TCPStore on a port rank 0 picks).

Usage: ``launched_rank.py env|mpi|elastic``. Runs all_reduce / broadcast / all_gather over "topo"
and prints ``OK <rank> <world size> <schedule name>`` when the results are right.

``elastic`` is ``env`` under ``torchrun --max-restarts``: in the first attempt
(``TORCHELASTIC_RESTART_COUNT`` 0) every rank prints ``ATTEMPT0 <rank>`` after one right all_reduce,
then the last rank dies in the middle of the next one; torchrun stops the survivors and starts
every rank again, and the second attempt runs the whole program.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import topocoll.collectives  # noqa: F401  (registers "topo")
from topocoll.solver.schedule import Collective

TIMEOUT = timedelta(seconds=60)


def init(mode: str) -> None:
    if mode in ("env", "elastic"):
        dist.init_process_group("topo", timeout=TIMEOUT)
        return
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    master = dist.TCPStore("127.0.0.1", 0, size, True, timeout=TIMEOUT, wait_for_workers=False) if rank == 0 else None
    port = comm.bcast(master.port if master else None, root=0)
    store = master or dist.TCPStore("127.0.0.1", port, size, False, timeout=TIMEOUT)
    dist.init_process_group("topo", store=store, rank=rank, world_size=size, timeout=TIMEOUT)


def die_in_first_attempt() -> None:
    """The first attempt of ``elastic``: one right all_reduce, then the last rank dies."""
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.ones(1 << 16)
    dist.all_reduce(x)
    assert bool((x == n).all()), "first attempt: wrong all_reduce"
    print(f"ATTEMPT0 {rank}", flush=True)
    if rank == n - 1:
        os._exit(3)  # a dead peer: no clean-up of any kind
    dist.all_reduce(x)  # the survivors wait here until torchrun stops them
    raise SystemExit("first attempt: the all_reduce with a dead peer returned")


def main() -> int:
    mode = sys.argv[1]
    init(mode)
    if mode == "elastic" and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        die_in_first_attempt()
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.arange(1000, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(x)
    ok = torch.equal(x, torch.arange(1000, dtype=torch.float64) * (n * (n + 1) // 2))
    y = torch.full((7,), rank, dtype=torch.int64)
    dist.broadcast(y, src=n - 1)
    ok = ok and bool((y == n - 1).all())
    out = torch.empty(n * 3, dtype=torch.int32)
    dist.all_gather_into_tensor(out, torch.full((3,), rank, dtype=torch.int32))
    ok = ok and torch.equal(out, torch.arange(n, dtype=torch.int32).repeat_interleave(3))
    group = dist.group.WORLD
    name = group._schedules.schedule(Collective.ALLREDUCE, None, 8192).name  # 8000 bytes -> bucket 8192
    dist.destroy_process_group()
    if ok:
        print(f"OK {rank} {n} {name}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
