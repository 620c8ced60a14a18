"""NCCL's published allreduce tables against topocoll's model of NCCL's algorithms, uncalibrated.

Run from the repository root::

    python benchmarks/nccl_tables.py            # writes results/nccl_tables.{md,json}

For every nccl-tests allreduce table in ``tests/data/topologies`` (three Azure single-machine
tables, two two-machine ``all_reduce_perf`` outputs) the machine is rebuilt from topocoll's
presets, as the table's header describes it, and ``topocoll simulate``'s model (the event
simulator where affordable, else the α-β model, NCCL's per-message overhead) predicts the busbw
of NCCL's ring (one ring per channel: ``multichannel_ring``) and double binary tree at each size
of the table. "NCCL predicted" is the faster of the two, as NCCL's tuner picks per size; on
Hopper NVSwitch machines the in-switch bound (NVLS, reduction inside the switch) is shown beside
it, since NCCL runs NVLS there. The error is predicted / measured - 1.

No parameter is fitted to these tables here: the report measures how far the model is from
NCCL, the first half of calibrating it.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
RESULTS_DIR = Path(__file__).resolve().parent / "results"
TABLES_DIR = REPO_ROOT / "tests" / "data" / "topologies"
SMALLEST_BYTES = 1024  # the Azure tables start here; below it every model is pure latency

#: (table file, what the machine is, how to build it): NIC counts and speeds from the tables' headers
#: and the vendors' instance pages (A3 Mega: 8 x 200 Gbit/s; OCI BM.GPU.H100.8: 16 x 200 Gbit/s RoCE).
MACHINES = (
    ("azure-ndv4-a100-8gpu.allreduce-busbw-table.txt", "Azure NDv4, 8x A100 (NVSwitch)", dict(preset="dgx-a100", nodes=1)),
    ("azure-ndv5-h100-8gpu.allreduce-busbw-table.txt", "Azure NDv5, 8x H100 (NVSwitch)", dict(preset="dgx-h100", nodes=1)),
    ("azure-ndh200v5-h200-8gpu.allreduce-busbw-table.txt", "Azure ND H200 v5, 8x H200 (NVSwitch)", dict(preset="dgx-h100", nodes=1)),
    ("gcp-a3mega-h100-2node.all_reduce_perf.txt", "GCP A3 Mega, 2 x 8 H100, 8 x 200 Gbit/s each", dict(preset="dgx-h100", nodes=2, nics=8, gbit=200)),
    ("oci-bm.gpu.h100.8-2node-roce.all_reduce_perf.txt", "OCI BM.GPU.H100.8, 2 x 8 H100, 16 x 200 Gbit/s RoCE each", dict(preset="dgx-h100", nodes=2, nics=16, gbit=200)),
)


def read_table(path: Path) -> list[tuple[int, float]]:
    """(size in bytes, measured busbw in bytes/s) of a table: a markdown table of sizes with K/M/G
    suffixes (rounded to the nearest power of two, as nccl-tests' sizes are), or nccl-tests output
    (its out-of-place busbw)."""
    rows = []
    for line in path.read_text().splitlines():
        markdown = re.match(r"^\|\s*([\d.]+)([KMG]?)\s*\|\s*([\d.]+)\s*\|", line)
        if markdown:
            value = float(markdown.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[markdown.group(2)]
            rows.append((1 << round(math.log2(value)), float(markdown.group(3)) * 1e9))
            continue
        cells = line.split()
        if len(cells) >= 9 and not line.startswith("#") and cells[0].isdigit():
            rows.append((int(cells[0]), float(cells[7]) * 1e9))
    return [(size, busbw) for size, busbw in rows if size >= SMALLEST_BYTES]


def build(machine: dict):
    from topocoll.topo.cluster import make_cluster
    from topocoll.topo.presets import build_preset

    if machine["nodes"] == 1:
        return build_preset(machine["preset"])
    return make_cluster(machine["preset"], machine["nodes"], nics_per_node=machine["nics"], nic_bw_bytes_per_s=machine["gbit"] * 1e9 / 8)


def predict(name: str, what: str, machine: dict) -> dict:
    """Measured against predicted busbw at every size of one table."""
    from topocoll.bench.simulate_cli import simulate_report
    from topocoll.solver.bound import in_network_bound
    from topocoll.solver.metrics import bus_factor
    from topocoll.solver.planner import DEFAULT_PER_MESSAGE_OVERHEAD_S
    from topocoll.solver.schedule import Collective

    measured = read_table(TABLES_DIR / name)
    topology = build(machine)
    ranks = topology.compute_nodes()
    report = simulate_report(
        topology, Collective.ALLREDUCE, ranks, [size for size, _ in measured],
        baselines=("multichannel_ring", "double_binary_tree"), per_message_overhead_s=DEFAULT_PER_MESSAGE_OVERHEAD_S, model="auto",
    )
    series = report.series
    in_switch = in_network_bound(topology, Collective.ALLREDUCE, ranks)
    factor = bus_factor(Collective.ALLREDUCE, len(ranks))
    rows = []
    for (size, busbw), row in zip(measured, report.rows):
        got = {label: m.busbw_bytes_per_s for label, m in zip(series, row.results) if m is not None}
        nccl = max(got.get("multichannel_ring", 0.0), got.get("double_binary_tree", 0.0))
        rows.append({
            "size_bytes": size,
            "measured_busbw_bytes_per_s": busbw,
            "ring_busbw_bytes_per_s": got.get("multichannel_ring"),
            "tree_busbw_bytes_per_s": got.get("double_binary_tree"),
            "nccl_predicted_busbw_bytes_per_s": nccl,
            "topocoll_predicted_busbw_bytes_per_s": got.get("topocoll"),
            "error_percent": 100 * (nccl / busbw - 1),
        })
    return {
        "table": name, "machine": what, "gpus": len(ranks), "model": report.config.get("model"),
        "in_switch_busbw_bytes_per_s": in_switch.algbw_bytes_per_s * factor if in_switch is not None else None,
        "rows": rows,
    }


def markdown(results: list[dict], command: str) -> str:
    lines = [
        "# NCCL's allreduce tables against topocoll's model of NCCL (uncalibrated)",
        "",
        f"Command: `{command}`. Date (UTC): {datetime.now(timezone.utc):%Y-%m-%d %H:%M}. Machine: {platform.machine()}, "
        f"CPython {platform.python_version()}. busbw in GB/s (nccl-tests' definition); NCCL predicted = the faster of "
        "NCCL's ring (one per channel) and double binary tree by topocoll's model; error = predicted / measured - 1.",
        "",
    ]
    for r in results:
        errors = [abs(x["error_percent"]) for x in r["rows"]]
        within = sum(e <= 15 for e in errors)
        nvls = f"; in-switch (NVLS) bound {r['in_switch_busbw_bytes_per_s'] / 1e9:.0f} GB/s busbw" if r["in_switch_busbw_bytes_per_s"] else ""
        lines += [
            f"## {r['machine']} ({r['gpus']} GPUs): `{r['table']}`",
            "",
            f"Model: {r['model']}{nvls}. Within 15 %: {within} of {len(errors)} sizes; median |error| {sorted(errors)[len(errors) // 2]:.0f} %.",
            "",
            "| size | measured | NCCL predicted | error | ring | tree | topocoll predicted |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for x in r["rows"]:
            cell = lambda v: f"{v / 1e9:.2f}" if v is not None else "-"  # noqa: E731
            lines.append(
                f"| {x['size_bytes']} | {x['measured_busbw_bytes_per_s'] / 1e9:.2f} | {x['nccl_predicted_busbw_bytes_per_s'] / 1e9:.2f} | "
                f"{x['error_percent']:+.0f} % | {cell(x['ring_busbw_bytes_per_s'])} | {cell(x['tree_busbw_bytes_per_s'])} | "
                f"{cell(x['topocoll_predicted_busbw_bytes_per_s'])} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "nccl_tables", help="output path without extension")
    args = parser.parse_args(argv)
    results = []
    for name, what, machine in MACHINES:
        print(f"{what} ...", file=sys.stderr, flush=True)
        results.append(predict(name, what, machine))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    text = markdown(results, "python benchmarks/nccl_tables.py")
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
