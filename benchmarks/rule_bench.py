"""Schedules by rule at scale: allgather, reduce-scatter and allreduce on 1024 and 8192 DGX H100 GPUs.

Run from the repository root::

    python benchmarks/rule_bench.py                  # writes results/rule_scale.{md,json}
    python benchmarks/rule_bench.py --nodes 128      # 1024 GPUs only

Every case runs in its own child process (``--worker``) so that its peak memory is its own. For
each network (rail-optimized, a 2:1 oversubscribed fat tree, SuperPOD scalable units), size and
collective, the child builds the cluster and reports:

- ``synth_s``: :func:`~topocoll.solver.rule_schedule.synthesize_by_rule`, the cut bound (by
  max-flows) included, and ``bound_s`` of that the bound alone (timed apart beforehand);
- ``check_s``: checking the schedule's parts against the topology and summing its link loads;
- ``pct``: the cut bound's time over the schedule's bandwidth time, from those loads;
- ``rule_mb``: the format-3 file; ``transfers``: what spelling it out would take at least;
- ``rail_tree``: chain for every case; binomial too for the allreduce on every network at the smaller
  size and on SuperPOD at the larger (its hops: machines times log2 of them, each with its
  spine routes);
- ``peak_mb``: the process's peak memory.
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
NETWORKS = (("rail", {"network": "rail"}), ("fat-tree 2:1", {"network": "fat-tree", "oversubscription": 2.0}), ("superpod", {"network": "superpod"}))
COLLECTIVES = ("allgather", "reduce_scatter", "allreduce")


def run_case(network: str, nodes: int, collective_name: str, rail_tree: str) -> dict:
    """One case in this process (the ``--worker`` side)."""
    from topocoll.solver.bound import cut_bound
    from topocoll.solver.rule_schedule import synthesize_by_rule
    from topocoll.solver.schedule import Collective
    from topocoll.solver.synthesize import SynthesisOptions
    from topocoll.topo.cluster import make_cluster

    collective = Collective.parse(collective_name)
    topology = make_cluster("dgx-h100", nodes, **dict(NETWORKS)[network])
    ranks = list(topology.compute_nodes())
    started = time.perf_counter()
    cut_bound(topology, collective, ranks)
    bound_s = time.perf_counter() - started
    started = time.perf_counter()
    schedule, bound = synthesize_by_rule(topology, collective, ranks, SynthesisOptions(rail_tree=rail_tree))
    synth_s = time.perf_counter() - started
    started = time.perf_counter()
    schedule.check(topology)
    t_bw, busiest = schedule.t_bw_s_per_byte(topology)
    check_s = time.perf_counter() - started
    text = schedule.to_json()
    return {
        "network": network,
        "gpus": len(ranks),
        "collective": collective.value,
        "rail_tree": rail_tree,
        "synth_s": synth_s,
        "bound_s": bound_s,
        "check_s": check_s,
        "pct": 100 * bound.time_per_byte_s / t_bw,
        "busiest": list(busiest),
        "rule_mb": len(text) / 1e6,
        "transfers": schedule.transfers_at_least(),
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def markdown(rows: list[dict], command: str) -> str:
    """The report as a markdown page."""
    lines = [
        "# Schedules by rule (format 3) on DGX H100 clusters",
        "",
        f"Command: `{command}`. Date (UTC): {datetime.now(timezone.utc):%Y-%m-%d %H:%M}. "
        f"Machine: {platform.machine()}, CPython {platform.python_version()}, 2 cores.",
        "The hierarchical schedule kept by its parts (`topocoll synthesize --format 3`); % = cut bound / its bandwidth "
        "time, from link loads summed over its parts; synthesis includes the cut bound, which the next column times on its own beforehand (the two differ by the noise of a shared 2-core machine: the test suite ran beside part of this run).",
        "",
        "| network | GPUs | collective | rail tree | synthesis s | cut bound alone s | check + loads s | peak MB | % of bound | busiest link | format 3 MB | transfers spelt out |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['network']} | {r['gpus']} | {r['collective']} | {r['rail_tree']} | {r['error']} | | | | | | | |")
            continue
        lines.append(
            f"| {r['network']} | {r['gpus']} | {r['collective']} | {r['rail_tree']} | {r['synth_s']:.1f} | {r['bound_s']:.1f} | {r['check_s']:.1f} | "
            f"{r['peak_mb']:.0f} | {r['pct']:.2f} | {r['busiest'][0]} -> {r['busiest'][1]} | {r['rule_mb']:.1f} | {r['transfers'] / 1e6:.1f} million |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="128,1024", help="comma list of DGX H100 counts (default 128,1024: 1024 and 8192 GPUs)")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="limit per case")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "rule_scale", help="output path without extension")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_case(args.worker[0], int(args.worker[1]), args.worker[2], args.worker[3])), flush=True)
        return 0
    cases = [(nodes, network, collective, "chain") for nodes in (int(x) for x in args.nodes.split(",")) for network, _ in NETWORKS for collective in COLLECTIVES]
    # The binomial rail tree: every network at the smaller size, and the allreduce on SuperPOD at the larger one.
    sizes = sorted(int(x) for x in args.nodes.split(","))
    cases += [(sizes[0], network, "allreduce", "binomial") for network, _ in NETWORKS]
    if len(sizes) > 1:
        cases.append((sizes[-1], "superpod", "allreduce", "binomial"))
    rows = []
    for nodes, network, collective, tree in cases:
        print(f"{network}, {nodes} DGX H100, {collective}, {tree} rail tree ...", flush=True)
        command = [sys.executable, __file__, "--worker", network, str(nodes), collective, tree]
        base = {"network": network, "gpus": 8 * nodes, "collective": collective, "rail_tree": tree}
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s, cwd=REPO_ROOT, check=False)
            found = [line for line in done.stdout.splitlines() if line.startswith("{")]
            row = json.loads(found[-1]) if found else {**base, "error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
        except subprocess.TimeoutExpired:
            row = {**base, "error": f"timed out after {args.timeout_s:.0f} s"}
        rows.append(row)
        print("  " + (row.get("error") or f"{row['pct']:.2f} % of bound, {row['synth_s']:.1f} s, {row['peak_mb']:.0f} MB, {row['rule_mb']:.1f} MB"), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(rows, "python benchmarks/rule_bench.py"))
    print(f"wrote {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
