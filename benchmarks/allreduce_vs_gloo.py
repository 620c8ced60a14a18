"""All-reduce through the "topo" backend next to gloo's own, in one run on this host.

Starts ``--world-size`` processes (FileStore rendezvous in a temporary directory). Each rank
joins a gloo world group and a "topo" group over the same ranks (schedules from
:func:`topocoll.solver.plan`, or a baseline with ``--planner``), then, size by size,
alternates rounds of topo and gloo all_reduce on float32 buffers so that both see the same
machine load (which one goes first alternates). A round's time is the slowest rank's (gathered
through gloo); small sizes get more rounds (at least 64 MiB moved per size and backend). The
table reports the median over rounds, algbw = S / t and busbw = algbw * 2(n-1)/n (nccl-tests' definitions,
GB = 1e9 bytes). Rank 0 prints the table and writes the results file.

What limits it (2 cores shared by 4 ranks; profiled with cProfile on rank 0). Through gloo's
loopback TCP (``--transport gloo``) topo ran at 0.6-0.9x gloo's native all_reduce: over 95 % of
its time was inside gloo's point-to-point calls, whose unbound-buffer path costs a rendezvous
per message, where gloo's own collective uses pre-registered buffers. With the default
shared-memory transport a message costs one copy into a mapping and one reduction straight out
of it; its doorbell and the per-call argument header (which makes mismatched inputs raise on
every rank) go through shared-memory mailboxes that waiting ranks poll, so gloo carries nothing
between ranks of one host. Measured (three runs): 1 MiB 1.6-1.9x gloo, 16 MiB 1.9-2.0x, 64 MiB
2.1-2.3x. What limits it now: at 1 MiB the ranks' polling and the OS scheduling 4 processes on 2
cores (about 3 ms per call against gloo's 6); at 64 MiB the memory copies (one into the mapping,
one reduction out of it per message).
Cutting messages into segments (``--segment-bytes``) did not help on this host.
The schedule each size ran is recorded per row (``topo_schedule``); on the flat topology the
solver's choice is a two-step direct reduce-scatter + allgather.

Usage::

    python benchmarks/allreduce_vs_gloo.py [--world-size 4] [--sizes-mib 1 16 64]
        [--rounds 7] [--out benchmarks/results/allreduce_vs_gloo.json]
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
from datetime import timedelta
from pathlib import Path

MIB = 1 << 20
GB = 1e9
MIN_MIB_PER_SIZE = 64


def _busbw_factor(world_size: int) -> float:
    return 2 * (world_size - 1) / world_size


def _baseline_planner(name: str):
    from topocoll.solver import baselines

    builder = getattr(baselines, name)

    def planner(topology, collective, ranks, root, size_bytes):
        return builder(topology, collective, list(ranks), root=root)

    return planner


def _rank_main(
    rank: int,
    world_size: int,
    store_file: str,
    sizes_mib: list[int],
    rounds: int,
    warmup: int,
    planner_name: str,
    segment_bytes: int | None,
    shared_memory: bool,
    queue,
) -> None:
    import torch
    import torch.distributed as dist

    from topocoll.collectives import TopoOptions
    from topocoll.collectives.schedule_source import size_bucket
    from topocoll.solver.schedule import Collective

    torch.set_num_threads(1)
    options = TopoOptions(
        planner=None if planner_name == "plan" else _baseline_planner(planner_name),
        segment_bytes=segment_bytes,
        shared_memory=shared_memory,
    )
    dist.init_process_group(
        "gloo", init_method=f"file://{store_file}", rank=rank, world_size=world_size, timeout=timedelta(seconds=300)
    )
    gloo = dist.group.WORLD
    topo = dist.new_group(backend="topo", pg_options=options)
    rows = []
    for size_mib in sizes_mib:
        numel = size_mib * MIB // 4
        base = torch.full((numel,), float(rank + 1), dtype=torch.float32)
        times: dict[str, list[float]] = {"topo": [], "gloo": []}
        expected = float(world_size * (world_size + 1) // 2)
        # small sizes are noisy: measure at least MIN_MIB_PER_SIZE MiB per backend
        size_rounds = max(rounds, -(-MIN_MIB_PER_SIZE // size_mib))
        pairs = (("topo", topo), ("gloo", gloo))
        for r in range(warmup + size_rounds):
            for name, group in pairs if r % 2 else pairs[::-1]:  # alternate who goes first
                buffer = base.clone()
                dist.barrier(group=gloo)
                start = time.perf_counter()
                dist.all_reduce(buffer, group=group)
                elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=gloo)
                if r >= warmup:
                    times[name].append(float(elapsed))
                if r == 0 and not bool((buffer == expected).all()):
                    raise RuntimeError(f"rank {rank}: {name} all_reduce gave a wrong result")
        row = {"size_bytes": numel * 4}
        for name, values in times.items():
            t = statistics.median(values)
            algbw = numel * 4 / t
            row[name] = {
                "time_s_median": t,
                "time_s_min": min(values),
                "time_s_all": values,
                "algbw_GB_per_s": algbw / GB,
                "busbw_GB_per_s": algbw * _busbw_factor(world_size) / GB,
            }
        used = topo._schedules.schedule(Collective.ALLREDUCE, None, size_bucket(numel * 4))  # noqa: SLF001
        row["topo_schedule"] = {"name": used.name, "chunks": len(used.chunks), "steps": len(used.steps)}
        row["rounds"] = size_rounds
        row["busbw_ratio_topo_over_gloo"] = row["topo"]["busbw_GB_per_s"] / row["gloo"]["busbw_GB_per_s"]
        rows.append(row)
    if rank == 0:
        queue.put({"rows": rows, "torch": torch.__version__})
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=7, help="measured rounds per size and backend")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured rounds first")
    parser.add_argument(
        "--planner", default="plan", help="'plan' (the solver, default) or a baseline of topocoll.solver.baselines, e.g. 'ring'"
    )
    parser.add_argument(
        "--segment-bytes", type=int, default=None, help="cut topo messages into segments of this size (default: whole)"
    )
    parser.add_argument(
        "--transport",
        choices=("shm", "gloo"),
        default="shm",
        help="how topo moves data between ranks of this host: shared memory (default) or gloo's loopback TCP",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "allreduce_vs_gloo.json")
    args = parser.parse_args(argv)

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory() as workdir:
        store_file = os.path.join(workdir, "store")
        procs = [
            context.Process(
                target=_rank_main,
                args=(
                    r,
                    args.world_size,
                    store_file,
                    args.sizes_mib,
                    args.rounds,
                    args.warmup,
                    args.planner,
                    args.segment_bytes,
                    args.transport == "shm",
                    queue,
                ),
            )
            for r in range(args.world_size)
        ]
        for p in procs:
            p.start()
        result = queue.get(timeout=3600)
        for p in procs:
            p.join(120)
        failed = [r for r, p in enumerate(procs) if p.exitcode != 0]
        if failed:
            print(f"ranks {failed} failed", file=sys.stderr)
            return 1

    n = args.world_size
    print(f"all_reduce float32, {n} ranks on one host, planner {args.planner!r}; median over rounds of the slowest rank")
    print(
        f"{'size':>8} | {'topo schedule':<24} | {'topo ms':>8} {'busbw GB/s':>10} | {'gloo ms':>8} {'busbw GB/s':>10} "
        f"| {'topo/gloo':>9} | rounds"
    )
    for row in result["rows"]:
        used = row["topo_schedule"]
        label = f"{used['name']} ({used['steps']} steps)"
        print(
            f"{row['size_bytes'] // MIB:>5} MiB | {label:<24} | {row['topo']['time_s_median'] * 1e3:>8.1f} "
            f"{row['topo']['busbw_GB_per_s']:>10.3f} | {row['gloo']['time_s_median'] * 1e3:>8.1f} "
            f"{row['gloo']['busbw_GB_per_s']:>10.3f} | {row['busbw_ratio_topo_over_gloo']:>9.2f} | {row['rounds']}"
        )
    report = {
        "benchmark": "allreduce_vs_gloo",
        "world_size": n,
        "dtype": "float32",
        "rounds": args.rounds,
        "min_mib_per_size": MIN_MIB_PER_SIZE,
        "warmup": args.warmup,
        "metric": "median over rounds of the slowest rank's time; busbw = S/t * 2(n-1)/n, GB = 1e9 bytes",
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": result["torch"]},
        "planner": args.planner,
        "segment_bytes": args.segment_bytes,
        "transport": args.transport,
        "rows": result["rows"],
    }
    from topocoll.fileio import write_atomic

    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out, json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
