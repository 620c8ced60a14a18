"""A rank of the native test: three machines of one CPU process each on one switch, so that
gloo's own ring takes the routes the planner's ring would (spawned processes, so this is a
module of its own)."""

from __future__ import annotations

import importlib
import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist

#: A slow network (100 MB/s), so that a 4 MiB collective is bandwidth-bound and the rank-order
#: ring ties with the planner's other schedules.
NET_BW_BYTES_PER_S = 1e8


def star(n: int):
    from topocoll.topo.model import LinkKind, Node, NodeKind, TopologyBuilder

    b = TopologyBuilder("three-hosts")
    b.add_node(Node("sw0", NodeKind.NET_SWITCH))
    for i in range(n):
        b.add_node(Node(f"host{i}", NodeKind.HOST, rank=i, host_id=f"m{i}"))
        b.add_node(Node(f"host{i}.nic0", NodeKind.NIC, host_id=f"m{i}"))
        for a, c, kind, bw in ((f"host{i}", f"host{i}.nic0", LinkKind.PCIE, 10 * NET_BW_BYTES_PER_S),
                               (f"host{i}.nic0", "sw0", LinkKind.NET, NET_BW_BYTES_PER_S)):
            b.add_link(a, c, kind, bw)  # both directions
    return b.build()


def native_worker(rank: int, n: int, store_file: str, out_file: str, verify_memory_limit_bytes: float | None = None) -> None:
    """Compare the topo group's collectives with gloo's; ``verify_memory_limit_bytes`` lowers the
    verifier's memory limit so that the planner refuses the scale of these 3 ranks, as it does
    for thousands (the same check, the same refusal)."""
    from topocoll.collectives.backend import TopoOptions
    from topocoll.collectives.schedule_source import size_bucket
    from topocoll.solver.schedule import Collective

    if verify_memory_limit_bytes is not None:  # the module (topocoll.solver.verify is its function)
        importlib.import_module("topocoll.solver.verify").VERIFY_MEMORY_LIMIT_BYTES = verify_memory_limit_bytes
    report: dict = {"problems": [], "schedules": {}}
    os.environ["TOPOCOLL_HOSTID"] = f"m{rank}"
    dist.init_process_group("topo", init_method=f"file://{store_file}", rank=rank, world_size=n, timeout=timedelta(seconds=60),
                            pg_options=TopoOptions(topology=star(n)))
    topo = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    numel = (4 << 20) // 4
    generator = torch.Generator().manual_seed(rank)
    data = torch.randn(numel, generator=generator)
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG):
        mine, theirs = data.clone(), data.clone()
        dist.all_reduce(mine, op=op, group=topo)
        dist.all_reduce(theirs, op=dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op, group=gloo)
        if op == dist.ReduceOp.AVG:
            theirs /= n
        if not torch.equal(mine, theirs):
            report["problems"].append(f"rank {rank}: all_reduce {op} differs from gloo's")
    shard = data[: numel // n].clone()
    mine, theirs = torch.empty(n * shard.numel()), torch.empty(n * shard.numel())
    dist.all_gather_into_tensor(mine, shard, group=topo)
    dist.all_gather_into_tensor(theirs, shard, group=gloo)
    if not torch.equal(mine, theirs):
        report["problems"].append(f"rank {rank}: all_gather_into_tensor differs from gloo's")
    out, want = torch.empty(shard.numel()), torch.empty(shard.numel())
    dist.reduce_scatter_tensor(out, data[: n * shard.numel()].clone(), group=topo)
    dist.reduce_scatter_tensor(want, data[: n * shard.numel()].clone(), group=gloo)
    if not torch.allclose(out, want, rtol=1e-5, atol=1e-5):
        report["problems"].append(f"rank {rank}: reduce_scatter_tensor differs from gloo's")
    root = n - 1
    mine, theirs = data.clone(), data.clone()
    dist.broadcast(mine, root, group=topo)
    dist.broadcast(theirs, root, group=gloo)
    if not torch.equal(mine, theirs):
        report["problems"].append(f"rank {rank}: broadcast differs from gloo's")
    mine, theirs = data.clone(), data.clone()
    dist.reduce(mine, root, op=dist.ReduceOp.MAX, group=topo)
    dist.reduce(theirs, root, op=dist.ReduceOp.MAX, group=gloo)
    if rank == root and not torch.equal(mine, theirs):
        report["problems"].append(f"rank {rank}: reduce differs from gloo's")
    for collective, size, at in ((Collective.ALLREDUCE, numel * 4, None), (Collective.ALLGATHER, n * shard.numel() * 4, None),
                                 (Collective.REDUCE_SCATTER, n * shard.numel() * 4, None), (Collective.BROADCAST, numel * 4, root),
                                 (Collective.REDUCE, numel * 4, root)):
        report["schedules"][collective.value] = topo._schedules.schedule(collective, at, size_bucket(size)).name
    dist.destroy_process_group()
    with open(out_file, "w") as f:
        json.dump(report, f)
