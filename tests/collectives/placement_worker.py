"""A rank of the placement test: started with a machine name of its own (``TOPOCOLL_HOSTID``)
and a local rank that is not its position, it reports where the "topo" group placed it and the
schedule the group ran (spawned processes, so this is a module of its own)."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist



def placement_worker(rank: int, n: int, store_file: str, out_file: str, hosts: list[str], dump: str, size_bytes: int) -> None:
    import topocoll  # noqa: F401  (registers "topo")
    from topocoll.solver.schedule import Collective

    os.environ["TOPOCOLL_HOSTID"] = hosts[rank]
    os.environ["TOPOCOLL_TOPO_DUMP_FILE"] = dump
    os.environ["LOCAL_RANK"] = str(n - 1 - rank)  # a launcher's local rank: not what places a rank
    for name in ("TOPOCOLL_TOPOLOGY", "NCCL_TOPO_FILE", "TOPOCOLL_CLUSTER"):
        os.environ.pop(name, None)
    dist.init_process_group(
        "topo",
        init_method=f"file://{store_file}",
        rank=rank,
        world_size=n,
        timeout=timedelta(seconds=60),
    )
    group = dist.group.WORLD
    numel = size_bytes // 4
    tensor = torch.full((numel,), float(rank + 1))
    dist.all_reduce(tensor)
    bucket_schedule = group._schedules.schedule(Collective.ALLREDUCE, None, size_bytes)
    report = {
        "node": group.nodes[rank],
        "host_id": group.topology.node(group.nodes[rank]).host_id,
        "node_rank": group.topology.node(group.nodes[rank]).rank,
        "digest": group.topology.digest(),
        "sum_ok": bool(torch.all(tensor == n * (n + 1) / 2)),
        "schedule": bucket_schedule.to_json_dict(),
    }
    dist.destroy_process_group()
    with open(out_file, "w") as f:
        json.dump(report, f)
