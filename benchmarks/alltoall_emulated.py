"""Routed all-to-all against gloo's on emulated clusters (root): skewed and uniform traffic.

For each scenario the cluster comes up (``topocoll emulate``: one network namespace per host,
shaped links), one rank per host, every rank given the scenario's ground-truth topology. Each
rank then calls ``dist.all_to_all_single`` with the splits of a traffic matrix
(:func:`topocoll.solver.traffic.traffic_matrix`: ``uniform`` and ``zipf`` (s = 1.2), every rank
sending the given size), on the topo group (routed over several paths, relays and rails) and on
a gloo group, alternately, and checks that both give the same bytes. The time of a call is the
slowest rank's, the median of ``--iters`` calls after one unmeasured call. busbw is nccl-tests'
``alltoall_perf`` one: size x (n - 1) / n / time, size being the bytes each rank sends.

Beside the measured times: the bandwidth time of the routing topo plans
(:func:`topocoll.solver.traffic.route_fast`), of one path per pair, and the cut bound, on the
ground-truth topology.

usage: sudo .venv/bin/python benchmarks/alltoall_emulated.py [--scenarios multi-rail,two-racks,uniform]
       [--sizes 16M,64M] [--iters 3] [-o benchmarks/results/alltoall_emulated]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PATTERNS = ("uniform", "zipf")
ITEMSIZE = 4  # float32 elements


def counts_of(pattern: str, n: int, size_bytes: int):
    """Whole float32 elements per ordered pair."""
    import numpy as np

    from topocoll.solver.traffic import traffic_matrix

    return np.floor(traffic_matrix(pattern, n, size_bytes, seed=0) / ITEMSIZE).astype(np.int64)


def worker(sizes: list[int], iters: int) -> None:
    """One rank (run on each emulated host): times both backends, prints one JSON line (rank 0)."""
    import torch
    import torch.distributed as dist

    import topocoll.collectives  # noqa: F401  (registers "topo")

    dist.init_process_group("topo", timeout=timedelta(seconds=600))
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo", timeout=timedelta(seconds=600))
    rows = []
    for pattern in PATTERNS:
        for size in sizes:
            counts = counts_of(pattern, n, size)
            in_splits, out_splits = counts[rank].tolist(), counts[:, rank].tolist()
            data = torch.rand(sum(in_splits), generator=torch.Generator().manual_seed(rank))
            outputs = {name: torch.empty(sum(out_splits)) for name in ("topo", "gloo")}
            times = {"topo": [], "gloo": []}
            for k in range(iters + 1):
                for name, group in (("topo", None), ("gloo", gloo)) if k % 2 == 0 else (("gloo", gloo), ("topo", None)):
                    dist.barrier(group=gloo)
                    started = time.perf_counter()
                    dist.all_to_all_single(outputs[name], data, out_splits, in_splits, group=group)
                    elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
                    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=gloo)
                    if k > 0:
                        times[name].append(float(elapsed))
            same = torch.tensor([int(torch.equal(outputs["topo"], outputs["gloo"]))])
            dist.all_reduce(same, op=dist.ReduceOp.MIN, group=gloo)
            rows.append({"pattern": pattern, "size_bytes": size, "time_s": {k: statistics.median(v) for k, v in times.items()},
                         "all_times_s": times, "equal_to_gloo": bool(same.item())})
    if rank == 0:
        print("RESULT " + json.dumps({"world_size": n, "rows": rows}), flush=True)
    dist.destroy_process_group()


def measure(name: str, sizes: list[int], iters: int) -> dict:
    from topocoll.bench import scenario as sc
    from topocoll.bench.emulate import EmulatedCluster
    from topocoll.solver import traffic
    from topocoll.topo.io import load_topology

    scenario = sc.load_scenario(name)
    with tempfile.TemporaryDirectory(prefix="topocoll-a2a-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)
        with EmulatedCluster(scenario, state_dir=work / "state", apply_delays=False) as cluster:  # this kernel has no netem: rates only
            truth = load_topology(cluster.truth_path)
            out, err = io.StringIO(), io.StringIO()
            argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--sizes", ",".join(map(str, sizes)), "--iters", str(iters)]
            result = cluster.run_ranks(argv, timeout_s=3600, stdout=out, stderr=err, env={**os.environ, "PYTHONPATH": str(REPO)})
            if result.returncode != 0:
                raise RuntimeError(f"{name}: the ranks failed ({result.returncode}):\n{err.getvalue()[-3000:]}")
            line = next(line for line in out.getvalue().splitlines() if "RESULT " in line)
            measured = json.loads(line.split("RESULT ", 1)[1])
    ranks = truth.compute_nodes()
    n = len(ranks)
    paths = traffic.candidate_paths(truth, ranks)
    for row in measured["rows"]:
        matrix = counts_of(row["pattern"], n, row["size_bytes"]) * ITEMSIZE
        row["planned_s"] = traffic.route_fast(paths, matrix).time_s
        row["one_path_s"] = traffic.route_single_path(truth, ranks, matrix).time_s
        row["bound_s"] = traffic.traffic_bound(truth, ranks, matrix).time_s
        row["busbw_bytes_per_s"] = {k: row["size_bytes"] * (n - 1) / n / t for k, t in row["time_s"].items()}
    return {"scenario": name, "description": scenario.description, "hosts": n, "rows": measured["rows"]}


def table(results: list[dict]) -> str:
    lines = [
        "| scenario | pattern | size per rank | topo (s) | gloo (s) | topo / gloo speed | planned (s) | one path (s) | bound (s) | equal |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for result in results:
        for r in result["rows"]:
            t = r["time_s"]
            lines.append(
                f"| {result['scenario']} | {r['pattern']} | {r['size_bytes'] >> 20} MiB | {t['topo']:.2f} | {t['gloo']:.2f} | "
                f"{t['gloo'] / t['topo']:.2f}x | {r['planned_s']:.2f} | {r['one_path_s']:.2f} | {r['bound_s']:.2f} | {r['equal_to_gloo']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="multi-rail,two-racks,uniform")
    parser.add_argument("--sizes", default="16M,64M", help="bytes each rank sends, comma-separated")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("-o", "--out", type=Path, default=REPO / "benchmarks" / "results" / "alltoall_emulated")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from topocoll.units import parse_size

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.worker:
        worker(sizes, args.iters)
        return 0
    results = []
    for name in args.scenarios.split(","):
        print(f"{name}: running", file=sys.stderr, flush=True)
        results.append(measure(name, sizes, args.iters))
        print(table(results[-1:]), file=sys.stderr, flush=True)
    from topocoll.fileio import write_atomic

    args.out.mkdir(parents=True, exist_ok=True)
    command = "sudo .venv/bin/python benchmarks/alltoall_emulated.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (
        "# Routed all-to-all against gloo's on emulated clusters\n\n"
        f"Command: `{command.strip()}`. One rank per emulated host, each given the scenario's ground-truth topology; "
        "times are the slowest rank's, median of the measured calls; planned, one path and bound are bandwidth times "
        "on the ground truth (`topocoll route`'s fast, single_path and bound).\n\n" + table(results)
    )
    write_atomic(args.out / "README.md", text)
    write_atomic(args.out / "results.json", json.dumps({"command": command.strip(), "results": results}, indent=1, sort_keys=True) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
