"""One rank of a test on emulated hosts (started by ``EmulatedCluster.run_ranks``).

usage: python -m tests.bench.emulated_worker rails both|rail0 SIZE_BYTES
       python -m tests.bench.emulated_worker collectives
       python -m tests.bench.emulated_worker probed

``rails``: a broadcast from rank 0 to rank 1 of a two-rank group on ``multi-rail``, by a
schedule of two halves: over both rails (``both``) or both over rail 0 (``rail0``); prints
``rails N`` (the group's rail count) and checks the data.
``probed``: a ``topo`` group (run with ``TOPOCOLL_PROBE=1``); prints ``probed <digest>`` and
``link SRC DST BW`` for each network link of the topology the group plans on.
``collectives``: every collective of ``topo`` on the truth topology, checked bit for bit against
gloo's on the same inputs; prints ``ok COLLECTIVE`` per collective.
Exits 1 on a wrong result.
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from topocoll.collectives import TopoOptions
from topocoll.solver.schedule import Chunk, Op, Schedule, Transfer


def two_rail_planner(both: bool):
    def planner(topology, collective, ranks, root, size_bytes):
        a, b = ranks
        second = "1" if both else "0"
        steps = ((
            Transfer(0, 1, 0, Op.COPY, (a, f"{a}.eth0", "rail0", f"{b}.eth0", b)),
            Transfer(0, 1, 1, Op.COPY, (a, f"{a}.eth{second}", f"rail{second}", f"{b}.eth{second}", b)),
        ),)
        return Schedule(collective, tuple(ranks), 0, topology.digest(), (Chunk(0, 0.0, 0.5), Chunk(1, 0.5, 0.5)), steps, name="two-rail")
    return planner


def rails(mode: str, size_bytes: int) -> int:
    dist.init_process_group("topo", timeout=timedelta(seconds=60), pg_options=TopoOptions(planner=two_rail_planner(mode == "both")))
    group = dist.group.WORLD
    print(f"rails {len(group._rail_groups)}", flush=True)
    data = torch.arange(size_bytes // 4, dtype=torch.int32)
    buffer = data.clone() if dist.get_rank() == 0 else torch.zeros_like(data)
    dist.broadcast(buffer, src=0)
    ok = torch.equal(buffer, data)
    dist.destroy_process_group()
    return 0 if ok else 1


def collectives() -> int:
    dist.init_process_group("topo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    wrong = 0
    n = 3 * world * 1000 + 7 * world
    x = torch.arange(n, dtype=torch.int64) * (rank + 1) - 5 * rank
    for name in ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce"):
        outs = []
        for group in (dist.group.WORLD, gloo):
            t = x.clone()
            if name == "allreduce":
                dist.all_reduce(t, group=group)
            elif name == "allgather":
                out = torch.empty(n * world, dtype=t.dtype)
                dist.all_gather_into_tensor(out, t, group=group)
                t = out
            elif name == "reduce_scatter":
                out = torch.empty(n // world, dtype=t.dtype)
                dist.reduce_scatter_tensor(out, t, group=group)
                t = out
            elif name == "broadcast":
                dist.broadcast(t, src=world - 1, group=group)
            else:
                dist.reduce(t, dst=1, group=group)
                t = t if rank == 1 else torch.zeros(0)
            outs.append(t)
        same = torch.equal(outs[0], outs[1])
        wrong += not same
        print(f"{'ok' if same else 'WRONG'} {name}", flush=True)
    dist.destroy_process_group()
    return 1 if wrong else 0


def probed() -> int:
    dist.init_process_group("topo", timeout=timedelta(seconds=60))
    topology = dist.group.WORLD.topology
    print(f"probed {topology.digest()}", flush=True)
    for link in topology.links:
        if link.kind.value == "net":
            print(f"link {link.src} {link.dst} {link.bw_bytes_per_s}", flush=True)
    x = torch.ones(1000)
    dist.all_reduce(x)
    ok = bool((x == dist.get_world_size()).all())
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1] == "probed":
        sys.exit(probed())
    if sys.argv[1] == "rails":
        sys.exit(rails(sys.argv[2], int(sys.argv[3])))
    sys.exit(collectives())
