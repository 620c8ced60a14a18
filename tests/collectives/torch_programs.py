"""Programs PyTorch users run, as one rank of :mod:`tests.collectives.test_torch_programs`.

The same function runs under gloo and under "topo" (spawned processes, so this is a module of
its own); each program's outcome goes into the rank's JSON report, values as lists, failures as
``"error: ..."``, so the test compares the two backends entry by entry.
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

STEPS = 3
TIMEOUT = timedelta(seconds=60)


class TinyTransformer(nn.Module):
    """Two encoder layers over a learned embedding: small enough for 4 ranks on 2 cores."""

    def __init__(self, vocab: int = 64, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True) for _ in range(2)
        )
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class MLP(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.randint(0, 64, (2, 8), generator=g)
    return tokens, torch.roll(tokens, 1, dims=1)


def _train(model: nn.Module, rank: int, batch_rank: int | None = None) -> list[float]:
    """``STEPS`` SGD steps of next-token loss; the losses as this rank saw them."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        tokens, target = _batch(rank if batch_rank is None else batch_rank, step)
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), target.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return losses


def _ddp(rank: int, world: int) -> list[float]:
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(TinyTransformer(), bucket_cap_mb=0.01)  # several buckets
    return _train(model, rank)


def _fsdp2(rank: int, world: int) -> list[float]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = TinyTransformer()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    return _train(model, rank)


def _mesh_2d(rank: int, world: int) -> list[float]:
    """Data parallel (FSDP2) × tensor parallel (column then row split of an MLP)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = MLP()
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dp_rank = mesh["dp"].get_local_rank()
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + dp_rank)  # one batch per data-parallel rank
        x = torch.randn(4, 16, generator=g)
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return losses


def _functional(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed._functional_collectives as fc

    group = dist.group.WORLD
    x = torch.arange(4, dtype=torch.float32) + rank
    return {
        "all_reduce": fc.all_reduce(x, "sum", group).tolist(),
        "all_gather_tensor": fc.all_gather_tensor(x, 0, group).tolist(),
        "reduce_scatter_tensor": fc.reduce_scatter_tensor(torch.arange(4.0 * world), "sum", 0, group).tolist(),
    }


def _compiled(rank: int, world: int) -> list[float]:
    import torch.distributed._functional_collectives as fc

    group_name = dist.group.WORLD.group_name

    def f(x: torch.Tensor) -> torch.Tensor:
        return fc.all_reduce(x * 2, "sum", group_name) + 1

    return torch.compile(f, backend="eager", fullgraph=True)(torch.full((3,), float(rank))).tolist()


def _dtensor(rank: int, world: int) -> list[float]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    d = distribute_tensor(torch.arange(2.0 * world), mesh, [Shard(0)])
    return d.redistribute(mesh, [Replicate()]).to_local().tolist()


def _sparse(rank: int, world: int) -> list[float]:
    s = torch.sparse_coo_tensor(torch.tensor([[rank, world]]), torch.tensor([1.0, float(rank)]), (world + 1,))
    dist.all_reduce(s)
    return s.to_dense().tolist()


def _monitored_barrier(rank: int, world: int) -> str:
    group = dist.group.WORLD
    # dist.monitored_barrier checks for the name "gloo"; the group's own method is the way
    barrier = group.monitored_barrier if dist.get_backend() != "gloo" else None
    if barrier is None:
        dist.monitored_barrier(timeout=TIMEOUT)
    else:
        barrier(TIMEOUT)
    return "passed"


def _subgroups(rank: int, world: int) -> list[float]:
    mine, _ = dist.new_subgroups(group_size=2)
    t = torch.full((2,), float(rank))
    dist.all_reduce(t, group=mine)
    pair = dist.new_group([0, world - 1])
    u = torch.ones(1)
    if rank in (0, world - 1):
        dist.all_reduce(u, group=pair)
        dist.destroy_process_group(pair)
    return t.tolist() + u.tolist()


PROGRAMS: dict[str, Callable[[int, int], Any]] = {
    "group_name": lambda rank, world: [dist.group.WORLD.group_name, dist.group.WORLD.group_desc],
    "device_mesh": lambda rank, world: str(__import__("torch.distributed.device_mesh", fromlist=["x"]).init_device_mesh("cpu", (world,))),
    "functional": _functional,
    "compiled_functional": _compiled,
    "dtensor": _dtensor,
    "sparse_all_reduce": _sparse,
    "monitored_barrier": _monitored_barrier,
    "subgroups": _subgroups,
    "ddp": _ddp,
    "fsdp2": _fsdp2,
    "mesh_2d": _mesh_2d,
}


def torch_programs(rank: int, world: int, store_file: str, out_file: str, backend: str) -> None:
    import topocoll  # noqa: F401  (registers "topo")

    torch.set_num_threads(1)
    report: dict[str, Any] = {}
    dist.init_process_group(backend, init_method=f"file://{store_file}", rank=rank, world_size=world, timeout=TIMEOUT)
    for name, program in PROGRAMS.items():
        try:
            report[name] = program(rank, world)
        except Exception as exc:  # reported for the comparison
            report[name] = f"error: {type(exc).__name__}: {exc}"
            traceback.print_exc()
    dist.destroy_process_group()
    # recovery: a new default group in the same processes, after the old one was destroyed
    try:
        dist.init_process_group(backend, init_method=f"file://{store_file}.again", rank=rank, world_size=world, timeout=TIMEOUT)
        t = torch.full((2,), float(rank + 1))
        dist.all_reduce(t)
        dist.destroy_process_group()
        report["reinit"] = t.tolist()
    except Exception as exc:  # reported for the comparison
        report["reinit"] = f"error: {type(exc).__name__}: {exc}"
    report["shm_left"] = sorted(n for n in os.listdir("/dev/shm") if n.startswith("topocoll-")) if os.path.isdir("/dev/shm") else []
    with open(out_file, "w") as f:
        json.dump(report, f)
