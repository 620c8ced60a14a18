"""Time per training step on "topo" and on gloo: DDP (with and without overlap), FSDP2, 2-D mesh.

Starts ``--world-size`` processes on this host (FileStore rendezvous in a temporary directory)
once per configuration, and trains the same models in each:

* ``gloo``: gloo's own collectives;
* ``topo``: the topo backend, collectives on its communication thread, so that DDP's
  ``async_op=True`` gradient buckets overlap the rest of the backward pass (the default);
* ``topo-serial``: the topo backend with ``TopoOptions(background=False)``: each collective runs
  before it returns, so DDP's buckets wait for each other and for the backward pass.

Programs: ``ddp`` (a transformer of ``--layers`` encoder layers, ``--bucket-mib`` buckets),
``ddp-compute`` (the same steps inside ``no_sync()``: no gradient traffic, the floor that
overlap can approach), ``fsdp2`` (``fully_shard`` per layer) and ``mesh_2d`` (data x tensor
parallel over a ``(n/2, 2)`` DeviceMesh). A step's time is the slowest rank's, between barriers;
the table gives the median over ``--steps`` measured steps after ``--warmup`` unmeasured ones.
Configurations run in turn, then again in reverse order (``--rounds``), and the steps of every
round are pooled, so that all see the same machine load.

For DDP it also gives the share of the gradient traffic hidden behind the backward pass:
``hidden = (t_serial - t_overlap) / (t_serial - t_compute)`` (1: all of it, 0: none).
The losses of every configuration are compared with gloo's step by step.

Usage::

    python benchmarks/training.py [--world-size 4] [--steps 10] [--rounds 2]
        [--out benchmarks/results/training.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from pathlib import Path

CONFIGS = ("gloo", "topo", "topo-serial")
PROGRAMS = ("ddp", "ddp-compute", "fsdp2", "mesh_2d")


def _model(vocab: int, width: int, layers: int):
    from torch import nn

    class Transformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, dropout=0.0, batch_first=True)
                for _ in range(layers)
            )
            self.head = nn.Linear(width, vocab)

        def forward(self, tokens):
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    return Transformer()


def _steps(model, rank: int, args, step_count: int, context=None):
    """Train ``step_count`` steps; each step's time on this rank and its loss."""
    import contextlib

    import torch
    import torch.distributed as dist
    from torch import nn

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    times, losses = [], []
    for step in range(step_count):
        g = torch.Generator().manual_seed(1000 * step + rank)
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
        target = torch.roll(tokens, 1, dims=1)
        dist.barrier()
        start = time.perf_counter()
        with context() if context else contextlib.nullcontext():
            loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), target.flatten())
            optimizer.zero_grad()
            loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return times, losses


def _mesh_2d_steps(rank: int, world: int, args, step_count: int):
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("up", nn.Linear(args.width, 4 * args.width))
    model.add_module("act", nn.ReLU())
    model.add_module("down", nn.Linear(4 * args.width, args.width))
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dp_rank = mesh["dp"].get_local_rank()
    times, losses = [], []
    for step in range(step_count):
        g = torch.Generator().manual_seed(1000 * step + dp_rank)
        x = torch.randn(args.batch * args.seq, args.width, generator=g)
        dist.barrier()
        start = time.perf_counter()
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return times, losses


def _rank_main(rank: int, world: int, store_file: str, config: str, args, queue) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import topocoll  # noqa: F401  (registers "topo")
    from topocoll.collectives import TopoOptions

    torch.set_num_threads(1)
    # FSDP2 warns that the 2-D mesh's Sequential returns a view; nothing here changes it in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    backend = "gloo" if config == "gloo" else "topo"
    options = TopoOptions(background=False) if config == "topo-serial" else None
    dist.init_process_group(
        backend, init_method=f"file://{store_file}", rank=rank, world_size=world, timeout=timedelta(seconds=300), pg_options=options
    )
    count = args.warmup + args.steps
    measured: dict[str, tuple[list[float], list[float]]] = {}
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(_model(args.vocab, args.width, args.layers), bucket_cap_mb=args.bucket_mib)
    measured["ddp"] = _steps(ddp, rank, args, count)
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(_model(args.vocab, args.width, args.layers), bucket_cap_mb=args.bucket_mib)
    measured["ddp-compute"] = _steps(ddp, rank, args, count, context=ddp.no_sync)
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    sharded = _model(args.vocab, args.width, args.layers)
    for layer in sharded.layers:
        fully_shard(layer)
    fully_shard(sharded)
    measured["fsdp2"] = _steps(sharded, rank, args, count)
    measured["mesh_2d"] = _mesh_2d_steps(rank, world, args, count)
    result = {}
    for program, (times, losses) in measured.items():
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank
        result[program] = {"step_s": slowest.tolist()[args.warmup :], "losses": losses}
    if rank == 0:
        params = sum(p.numel() for p in _model(args.vocab, args.width, args.layers).parameters())
        queue.put({"programs": result, "parameters": params, "torch": torch.__version__})
    dist.barrier()
    dist.destroy_process_group()


def _run_config(config: str, args) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory() as workdir:
        store_file = os.path.join(workdir, "store")
        procs = [
            context.Process(target=_rank_main, args=(r, args.world_size, store_file, config, args, queue))
            for r in range(args.world_size)
        ]
        for p in procs:
            p.start()
        try:
            result = queue.get(timeout=args.timeout_s)
        finally:
            for p in procs:
                p.join(60)
                if p.is_alive():
                    p.kill()
        failed = [r for r, p in enumerate(procs) if p.exitcode != 0]
        if failed:
            raise RuntimeError(f"{config}: ranks {failed} failed")
    return result


def _relative_gap(losses: list[float], reference: list[float]) -> float:
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4, help="ranks (even: the 2-D mesh is (n/2, 2))")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per program, configuration and round")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps first")
    parser.add_argument("--rounds", type=int, default=2, help="times every configuration runs (order reversed each time)")
    parser.add_argument("--layers", type=int, default=4, help="transformer encoder layers")
    parser.add_argument("--width", type=int, default=256, help="model width (feed-forward: 4x)")
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    parser.add_argument("--seq", type=int, default=32, help="tokens per sequence")
    parser.add_argument("--bucket-mib", type=float, default=2.0, help="DDP's bucket_cap_mb")
    parser.add_argument("--timeout-s", type=float, default=1800, help="give up on a configuration after this")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "training.json")
    args = parser.parse_args(argv)
    if args.world_size < 2 or args.world_size % 2:
        parser.error("--world-size must be even and at least 2 (the 2-D mesh is (n/2, 2))")

    runs: dict[str, list[dict]] = {config: [] for config in CONFIGS}
    for round_index in range(args.rounds):
        for config in CONFIGS if round_index % 2 == 0 else CONFIGS[::-1]:
            print(f"round {round_index + 1}/{args.rounds}: {config}", file=sys.stderr, flush=True)
            runs[config].append(_run_config(config, args))

    rows = []
    for program in PROGRAMS:
        reference = runs["gloo"][0]["programs"][program]["losses"]
        for config in CONFIGS:
            steps = [t for run in runs[config] for t in run["programs"][program]["step_s"]]
            losses = runs[config][0]["programs"][program]["losses"]
            rows.append(
                {
                    "program": program,
                    "config": config,
                    "step_s_median": statistics.median(steps),
                    "step_s_all": steps,
                    "losses": losses,
                    "loss_gap_to_gloo": _relative_gap(losses, reference),
                    "losses_equal_across_rounds": all(run["programs"][program]["losses"] == losses for run in runs[config]),
                }
            )
    median = {(r["program"], r["config"]): r["step_s_median"] for r in rows}
    compute = median[("ddp-compute", "topo")]
    serial, overlapped = median[("ddp", "topo-serial")], median[("ddp", "topo")]
    hidden = (serial - overlapped) / (serial - compute) if serial > compute else float("nan")

    n = args.world_size
    params = runs["gloo"][0]["parameters"]
    print(
        f"{n} ranks on one host, transformer {args.layers}x{args.width} ({params / 1e6:.2f} M parameters, "
        f"{params * 4 / 2**20:.1f} MiB of float32 gradients), DDP buckets {args.bucket_mib} MiB; "
        f"median step of the slowest rank over {args.rounds} x {args.steps} steps"
    )
    print(f"{'program':<12} | " + " | ".join(f"{c + ' ms':>15}" for c in CONFIGS) + " | topo/gloo | max loss gap to gloo")
    for program in PROGRAMS:
        cells = " | ".join(f"{median[(program, c)] * 1e3:>15.1f}" for c in CONFIGS)
        gap = max(r["loss_gap_to_gloo"] for r in rows if r["program"] == program)
        ratio = median[(program, "gloo")] / median[(program, "topo")]
        print(f"{program:<12} | {cells} | {ratio:>8.2f}x | {gap:.1e}")
    print(f"DDP gradient traffic hidden behind backward on topo: {hidden:.0%}")

    report = {
        "benchmark": "training",
        "world_size": n,
        "model": {"layers": args.layers, "width": args.width, "vocab": args.vocab, "parameters": params},
        "batch": {"sequences": args.batch, "tokens": args.seq},
        "bucket_mib": args.bucket_mib,
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "metric": "median over pooled rounds of the slowest rank's step time (between barriers)",
        "hidden_share_ddp_topo": hidden,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": runs["gloo"][0]["torch"]},
        "rows": rows,
    }
    from topocoll.fileio import write_atomic

    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out, json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
