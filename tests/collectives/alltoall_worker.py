"""One rank of :mod:`tests.collectives.test_alltoall` (spawned: a module of its own)."""

from __future__ import annotations

import json
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import topocoll.collectives  # noqa: F401  (registers "topo")
from topocoll.collectives.backend import TopoOptions
from topocoll.errors import CollectiveError
from topocoll.topo.model import LinkKind, Node, NodeKind, TopologyBuilder

GB = 1e9
DTYPES = (torch.float32, torch.int64, torch.bool, torch.complex64, torch.bfloat16)


def triangle(n: int = 3):
    """Ranks on three hosts: host0-host1 slow, both fast to host2, so 0 -> 1 traffic is worth
    relaying through rank 2."""
    b = TopologyBuilder("triangle")
    for i in range(n):
        b.add_node(Node(f"host{i}", NodeKind.HOST, rank=i))
    b.add_link("host0", "host1", LinkKind.NET, 1 * GB)
    b.add_link("host0", "host2", LinkKind.NET, 10 * GB)
    b.add_link("host1", "host2", LinkKind.NET, 10 * GB)
    return b.build()


def _data(rank: int, rows: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100 + rank)
    values = torch.randint(-1000, 1000, (rows, 3), generator=g)
    if dtype is torch.bool:
        return values % 2 == 0
    if dtype.is_complex:
        return torch.complex(values.float(), -values.float()).to(dtype)
    return values.to(dtype)


def rank_main(rank: int, n: int, store_file: str, out_file: str) -> None:
    report: dict = {"problems": [], "checked": 0}

    def expect(ok: bool, what: str) -> None:
        report["checked"] += 1
        if not ok:
            report["problems"].append(f"rank {rank}: {what}")

    try:
        timeout = timedelta(seconds=60)
        dist.init_process_group("topo", init_method=f"file://{store_file}", rank=rank, world_size=n, timeout=timeout,
                                pg_options=TopoOptions(topology=triangle(n), shared_memory=False))
        topo = dist.group.WORLD
        gloo = dist.new_group(backend="gloo")
        # uneven splits: rank r sends (r + 1) * (j + 1) rows to rank j, rank 0 sends rank 1 many
        for seed, dtype in enumerate(DTYPES):
            in_splits = [(rank + 1) * (j + 1) + (400 if (rank, j) == (0, 1) else 0) for j in range(n)]
            out_splits = [(i + 1) * (rank + 1) + (400 if (i, rank) == (0, 1) else 0) for i in range(n)]
            data = _data(rank, sum(in_splits), dtype, seed)
            mine = torch.empty(sum(out_splits), 3, dtype=dtype)
            theirs = torch.empty_like(mine)
            dist.all_to_all_single(mine, data, out_splits, in_splits, group=topo)
            dist.all_to_all_single(theirs, data, out_splits, in_splits, group=gloo)
            expect(torch.equal(mine, theirs), f"all_to_all_single {dtype} differs from gloo's")
        # even splits, async
        data = torch.arange(n * 4, dtype=torch.float64) + 100 * rank
        mine, theirs = torch.empty_like(data), torch.empty_like(data)
        work = dist.all_to_all_single(mine, data, group=topo, async_op=True)
        work.wait()
        dist.all_to_all_single(theirs, data, group=gloo)
        expect(torch.equal(mine, theirs), "async even all_to_all_single differs from gloo's")
        # in place (one tensor as input and output): the blocks each rank should receive
        data = torch.arange(n * 1000, dtype=torch.float32) + 10000 * rank
        expected = torch.cat([torch.arange(rank * 1000, (rank + 1) * 1000, dtype=torch.float32) + 10000 * i for i in range(n)])
        dist.all_to_all_single(data, data, group=topo)
        expect(torch.equal(data, expected), "in-place all_to_all_single returned wrong blocks")
        # only to itself: the plan is empty, the inner backend's all-to-all moves the bytes
        own = [5 if j == rank else 0 for j in range(n)]
        data = torch.arange(5, dtype=torch.int32) + rank
        mine, theirs = torch.empty_like(data), torch.empty_like(data)
        dist.all_to_all_single(mine, data, own, own, group=topo)
        dist.all_to_all_single(theirs, data, own, own, group=gloo)
        expect(torch.equal(mine, theirs), "all_to_all_single to itself differs from gloo's")
        # the list form, a different shape for every peer
        inputs = [torch.full((j + 1, rank + 2), rank * 10 + j, dtype=torch.int32) for j in range(n)]
        outputs = [torch.empty(rank + 1, i + 2, dtype=torch.int32) for i in range(n)]
        dist.all_to_all(outputs, inputs, group=topo)
        expect(all(torch.equal(o, torch.full_like(o, i * 10 + rank)) for i, o in enumerate(outputs)), "all_to_all list")
        # the plan relays part of 0 -> 1 through rank 2
        planner = topo._a2a_planner
        chains = [c for plan in planner._cache.values() for c in plan[0 * n + 1]]
        expect(any(c.ranks == (0, 2, 1) for c in chains), f"no relay through rank 2 in {chains}")
        # splits that do not match what the peers expect: an error on every rank, then it works again
        bad = [1] * n if rank != 1 else [2] * n
        try:
            dist.all_to_all_single(torch.empty(sum(bad)), torch.zeros(sum(bad)), bad, bad, group=topo)
            expect(False, "mismatched splits did not raise")
        except CollectiveError as exc:
            expect("expects" in str(exc) or "invalid" in str(exc), f"mismatch message: {exc}")
        try:
            dist.all_to_all_single(torch.empty(n), torch.zeros(n), [1] * n, [2] + [1] * (n - 1), group=topo)
            expect(False, "splits that do not add up did not raise")
        except CollectiveError as exc:
            expect("add up" in str(exc) or "invalid arguments" in str(exc), f"sum message: {exc}")
        data = torch.arange(n, dtype=torch.int64) * (rank + 1)
        mine = torch.empty_like(data)
        dist.all_to_all_single(mine, data, group=topo)
        expect(torch.equal(mine, torch.arange(1, n + 1) * rank), "all_to_all_single after the errors")
        dist.destroy_process_group()
    except Exception:
        report["problems"].append(f"rank {rank}: {traceback.format_exc()}")
    with open(out_file, "w") as f:
        json.dump(report, f)
