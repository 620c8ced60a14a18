"""Scale report: planning allreduce on DGX H100 clusters of 64 to 1024 GPUs on three networks.

Run from the repository root::

    python benchmarks/scale_bench.py                 # writes results/scale.{md,json}
    python benchmarks/scale_bench.py --nodes 8,32    # fewer sizes

Every case runs in its own child process (``--worker``) so that its peak memory is its own. For
each network (rail-optimized, a 2:1 oversubscribed fat tree, SuperPOD scalable units) and size,
the child builds the cluster, plans an allreduce at 1 GiB (:func:`plan_collective`) and reports:

- ``plan_s`` and ``peak_mb``: the planner's time (packing, layouts, baselines, verification,
  prediction) and the process's peak memory;
- ``chosen`` and ``pct``: the plan's choice and its bandwidth time's % of the cut bound;
- ``transfers``, ``json_mb`` and ``compact_mb``: the chosen schedule's size, as a file of format 1
  (every transfer spelt out) and of the compact format 2;
- ``verify_s``: reading the compact file's text and verifying it (what ``topocoll verify``
  spends beyond starting up, loading the topology and computing the bound);
- ``busbw``: predicted busbw at 1 GiB of the chosen schedule and of every other candidate the
  planner built (the model the plan used: the event simulator where affordable, else α-β);
- ``nccl_busbw`` and ``chosen_on_nccl_busbw``: NCCL's own allreduce by topocoll's calibrated
  model of it (:mod:`topocoll.solver.nccl_model`), and the chosen schedule run on NCCL as the
  CUDA planner prices it (NCCL's host cost per call as a floor, link share and latency factor).

8192 GPUs are not run: the planner refuses them before synthesis (their verification would need
more memory than it allows; see the README's known limits).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
SIZE_BYTES = 1 << 30
NETWORKS = (("rail", {"network": "rail"}), ("fat-tree 2:1", {"network": "fat-tree", "oversubscription": 2.0}), ("superpod", {"network": "superpod"}))


def run_case(network: str, nodes: int) -> dict:
    """One case in this process (the ``--worker`` side)."""
    from topocoll.solver.metrics import bus_factor
    from topocoll.solver.nccl_model import nccl_native, nccl_time
    from topocoll.solver.planner import DEFAULT_PER_MESSAGE_OVERHEAD_S, plan_collective, predict_times
    from topocoll.solver.schedule import Collective, Schedule
    from topocoll.solver.verify import verify
    from topocoll.topo.cluster import make_cluster

    kwargs = dict(NETWORKS)[network]
    topology = make_cluster("dgx-h100", nodes, **kwargs)
    started = time.perf_counter()
    plan = plan_collective(topology, Collective.ALLREDUCE, size_bytes=SIZE_BYTES)
    plan_s = time.perf_counter() - started
    n = len(plan.schedule.ranks)
    factor = bus_factor(Collective.ALLREDUCE, n)
    busbw = {c.name: SIZE_BYTES / c.predicted_time_s * factor / 1e9 for c in plan.candidates}
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    compact = plan.schedule.to_json(2)
    started = time.perf_counter()
    checked = verify(Schedule.from_json(compact), topology, size_bytes=SIZE_BYTES)
    verify_s = time.perf_counter() - started
    checked.raise_if_failed()
    nccl = nccl_native(topology, plan.schedule.ranks)
    (on_nccl,), _ = predict_times([plan.chosen], topology, SIZE_BYTES, DEFAULT_PER_MESSAGE_OVERHEAD_S, native_model=nccl)
    on_nccl_s = on_nccl.predicted_time_s
    return {
        "network": network,
        "gpus": n,
        "plan_s": plan_s,
        "peak_mb": peak_mb,
        "chosen": plan.chosen.name,
        "pct": 100 * plan.ratio_to_bound,
        "transfers": plan.schedule.transfer_count(),
        "json_mb": len(plan.schedule.to_json()) / 1e6,
        "compact_mb": len(compact) / 1e6,
        "verify_s": verify_s,
        "model": plan.model,
        "bound_busbw": SIZE_BYTES / plan.bound.time_s(SIZE_BYTES) * factor / 1e9,
        "busbw": busbw,
        "nccl_busbw": SIZE_BYTES / nccl.time_s(Collective.ALLREDUCE, SIZE_BYTES) * factor / 1e9,
        "nccl_algorithm": nccl_time(nccl.view, Collective.ALLREDUCE, SIZE_BYTES).label,
        "chosen_on_nccl_busbw": SIZE_BYTES / on_nccl_s * factor / 1e9,
    }


def markdown(rows: list[dict], command: str) -> str:
    """The report as a markdown page."""
    lines = [
        "# Scale report: allreduce on DGX H100 clusters",
        "",
        f"Command: `{command}`. Date (UTC): {datetime.now(timezone.utc):%Y-%m-%d %H:%M}. "
        f"Machine: {platform.machine()}, CPython {platform.python_version()}, 2 cores.",
        f"Allreduce planned at {SIZE_BYTES >> 30} GiB; % = cut bound / the chosen schedule's bandwidth time; "
        "busbw predicted at that size by the plan's model (GB/s, nccl-tests' definition).",
        "",
        "Against NCCL (the second table): NCCL's own allreduce by topocoll's calibrated model of it "
        "(`benchmarks/results/nccl_tables.md`), and the chosen schedule run on NCCL as the CUDA planner prices it "
        "(NCCL's host cost per call as a floor under its time, its share of each link, its latency factor); where NCCL is faster, a `topo` "
        "group on CUDA hands the allreduce to NCCL.",
        "",
        "| network | GPUs | plan s | peak MB | chosen | % of bound | transfers | JSON MB (format 1) | compact MB (format 2) | read + verify s | model | bound busbw | chosen busbw | other candidates' busbw |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['network']} | {r['gpus']} | | | {r['error']} | | | | | | | | | |")
            continue
        others = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["busbw"].items(), key=lambda kv: -kv[1]) if k != r["chosen"])
        lines.append(
            f"| {r['network']} | {r['gpus']} | {r['plan_s']:.1f} | {r['peak_mb']:.0f} | {r['chosen']} | {r['pct']:.2f} | "
            f"{r['transfers']} | {r['json_mb']:.1f} | {r['compact_mb']:.1f} | {r['verify_s']:.1f} | {r['model']} | {r['bound_busbw']:.1f} | {r['busbw'][r['chosen']]:.1f} | {others} |"
        )
    lines += [
        "",
        "| network | GPUs | NCCL (model) busbw | NCCL's algorithm | chosen on NCCL busbw | topo runs |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r or "nccl_busbw" not in r:
            continue
        runs = "NCCL" if r["nccl_busbw"] >= r["chosen_on_nccl_busbw"] else r["chosen"]
        lines.append(
            f"| {r['network']} | {r['gpus']} | {r['nccl_busbw']:.1f} | {r['nccl_algorithm']} | {r['chosen_on_nccl_busbw']:.1f} | {runs} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="8,32,128", help="comma list of DGX H100 counts (default 8,32,128: 64 to 1024 GPUs)")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="limit per case")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "scale", help="output path without extension")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_case(args.worker[0], int(args.worker[1]))), flush=True)
        return 0
    rows = []
    for nodes in (int(x) for x in args.nodes.split(",")):
        for network, _ in NETWORKS:
            print(f"{network}, {nodes} DGX H100 ...", flush=True)
            command = [sys.executable, __file__, "--worker", network, str(nodes)]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s, cwd=REPO_ROOT, check=False)
                found = [line for line in done.stdout.splitlines() if line.startswith("{")]
                row = json.loads(found[-1]) if found else {"network": network, "gpus": 8 * nodes, "error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
            except subprocess.TimeoutExpired:
                row = {"network": network, "gpus": 8 * nodes, "error": f"timed out after {args.timeout_s:.0f} s"}
            rows.append(row)
            print("  " + (row.get("error") or f"{row['chosen']} {row['pct']:.2f} % of bound, {row['plan_s']:.1f} s, {row['peak_mb']:.0f} MB"), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(rows, "python benchmarks/scale_bench.py"))
    print(f"wrote {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
