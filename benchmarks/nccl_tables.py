"""NCCL's published allreduce tables against topocoll's model of NCCL, and its calibration.

Run from the repository root::

    python benchmarks/nccl_tables.py            # writes results/nccl_tables.{md,json}

For every nccl-tests allreduce table in ``tests/data/topologies`` (three Azure single-machine
tables, two two-machine ``all_reduce_perf`` outputs) the machine is rebuilt from topocoll's
presets, as the table's header describes it, and :mod:`topocoll.solver.nccl_model` predicts
NCCL's busbw at each size: the fastest of its algorithms (ring, tree, NVLS, NVLS-tree) and
protocols (LL, LL128, Simple) that the table's ``NCCL_ALGO`` allowed (:data:`MACHINES`).

The model's free parameters (:class:`topocoll.solver.nccl_model.Calibration`: the host's cost per
call by GPU generation, a floor under the time of calls issued back to back, the share of each
limit that rings, NVLS and the network reach, a factor on NCCL's published latencies and one on
NVLS's, and NVLS's cost per chunk) are
fitted here to all tables at once, by least squares on the logarithm of predicted over measured
busbw (a robust loss, so that one odd table cannot pull the rest). A two-machine
table with small sizes also fits its network's latency per hop, for LL/LL128 and for Simple
(properties of that network: ``topocoll topo probe`` measures the first; the second is large
where a transport stages Simple's chunks through the host, as TCP without RDMA does). To show
how the model does on a machine it has not seen, every table is also predicted by a fit to the
*other* tables ("held out").

Then topocoll itself, as a ``topo`` group on CUDA would run it (``topocoll simulate --nccl``):
its planner's schedules, each taking at least NCCL's host cost per call and reaching NCCL's share of
each link, or NCCL's own allreduce at the sizes where that is predicted faster; on the tables'
machines and on machines where the topology is uneven (a PCIe box, partial allocations).
"""

from __future__ import annotations

import argparse
import dataclasses
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
WITHIN = 0.15  # the target: predicted within 15 % of measured

#: (table file, what the machine is, how to build it): NIC counts and speeds from the tables'
#: headers and the vendors' instance pages (A3 Mega: 8 x 200 Gbit/s of GPUDirect-TCPXO, a TCP
#: transport without RDMA; OCI BM.GPU.H100.8: 16 x 200 Gbit/s RoCE). ``nccl_algo``: the
#: ``NCCL_ALGO`` the publisher's benchmark script sets (Azure/AI-benchmarking-guide,
#: ``Benchmarks/NVIDIA/NCCLBandwidth.py``: ``NVLS`` on 8 GPUs, with ``all_reduce_perf -g 8``,
#: one process driving all eight). The A100 page says NVLS too, but the A100 has none and NCCL
#: refuses to run without an algorithm, so that table ran NCCL's own choice.
MACHINES = (
    ("azure-ndv4-a100-8gpu.allreduce-busbw-table.txt", "Azure NDv4, 8x A100 (NVSwitch)", dict(preset="dgx-a100", nodes=1)),
    ("azure-ndv5-h100-8gpu.allreduce-busbw-table.txt", "Azure NDv5, 8x H100 (NVSwitch)", dict(preset="dgx-h100", nodes=1, nccl_algo="NVLS")),
    ("azure-ndh200v5-h200-8gpu.allreduce-busbw-table.txt", "Azure ND H200 v5, 8x H200 (NVSwitch)", dict(preset="dgx-h100", nodes=1, nccl_algo="NVLS")),
    ("gcp-a3mega-h100-2node.all_reduce_perf.txt", "GCP A3 Mega, 2 x 8 H100, 8 x 200 Gbit/s TCPXO each",
     dict(preset="dgx-h100", nodes=2, nics=8, gbit=200, rdma=False)),
    ("oci-bm.gpu.h100.8-2node-roce.all_reduce_perf.txt", "OCI BM.GPU.H100.8, 2 x 8 H100, 16 x 200 Gbit/s RoCE each",
     dict(preset="dgx-h100", nodes=2, nics=16, gbit=200, rdma=True)),
)
#: Below this size a two-machine table's time is mostly latency: such a table fits its network's latency.
LATENCY_SIZES_BYTES = 1 << 16
#: A table that fits no latency of its network: none beyond NCCL's figures (Simple: the default rule).
NO_LATENCY = (0.0, None)


def read_table(path: Path, bus_factor: float) -> list[tuple[int, float]]:
    """(size in bytes, measured busbw in bytes/s) of a table: a markdown table of sizes with K/M/G
    suffixes (rounded to the nearest power of two, as nccl-tests' sizes are) and busbw, or
    nccl-tests output, whose out-of-place time gives the busbw (``size / time * bus_factor``, as
    nccl-tests computes it) more precisely than its two-decimal busbw column (0.01 GB/s at 1 KiB)."""
    rows = []
    for line in path.read_text().splitlines():
        markdown = re.match(r"^\|\s*([\d.]+)([KMG]?)\s*\|\s*([\d.]+)\s*\|", line)
        if markdown:
            value = float(markdown.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[markdown.group(2)]
            rows.append((1 << round(math.log2(value)), float(markdown.group(3)) * 1e9))
            continue
        cells = line.split()
        if len(cells) >= 9 and not line.startswith("#") and cells[0].isdigit():
            size, time_s = int(cells[0]), float(cells[5]) * 1e-6
            rows.append((size, size / time_s * bus_factor))
    return [(size, busbw) for size, busbw in rows if size >= SMALLEST_BYTES]


def build(machine: dict):
    from topocoll.topo.cluster import make_cluster
    from topocoll.topo.presets import build_preset

    if machine["nodes"] == 1:
        return build_preset(machine["preset"])
    return make_cluster(machine["preset"], machine["nodes"], nics_per_node=machine["nics"], nic_bw_bytes_per_s=machine["gbit"] * 1e9 / 8)


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    what: str
    view: object  # NcclView
    measured: tuple[tuple[int, float], ...]
    algorithms: frozenset | None = None  # of nccl_model.Algorithm: what NCCL_ALGO allowed; None: all

    @property
    def fits_latency(self) -> bool:
        return self.view.machines > 1 and any(size < LATENCY_SIZES_BYTES for size, _ in self.measured)


def load_tables(free_choice: bool = False) -> list[Table]:
    """The tables, each with its machine's view and held to the algorithms its publisher's
    ``NCCL_ALGO`` allowed; ``free_choice``: to none, as if ``NCCL_ALGO`` were unset."""
    from topocoll.solver.metrics import bus_factor
    from topocoll.solver.nccl_model import nccl_algorithms, nccl_view
    from topocoll.solver.schedule import Collective

    tables = []
    for name, what, machine in MACHINES:
        topology = build(machine)
        view = dataclasses.replace(nccl_view(topology, topology.compute_nodes()), network_rdma=machine.get("rdma", True))
        measured = read_table(TABLES_DIR / name, bus_factor(Collective.ALLREDUCE, view.ranks))
        algorithms = nccl_algorithms(machine["nccl_algo"]) if "nccl_algo" in machine and not free_choice else None
        tables.append(Table(name, what, view, tuple(measured), algorithms))
    return tables


def predicted_busbw(table: Table, calibration, network_latency_s: float, network_simple_latency_s: float | None = None) -> list[tuple[float, str]]:
    """(predicted busbw, the algorithm/protocol) at each size of ``table``, with the network's
    latency per hop for LL/LL128 and for Simple (None: twice the first)."""
    from topocoll.solver.metrics import bus_factor
    from topocoll.solver.nccl_model import nccl_time
    from topocoll.solver.schedule import Collective

    view = dataclasses.replace(table.view, network_latency_s=network_latency_s, network_simple_latency_s=network_simple_latency_s)
    factor = bus_factor(Collective.ALLREDUCE, view.ranks)
    out = []
    for size, _ in table.measured:
        best = nccl_time(view, Collective.ALLREDUCE, size, calibration, table.algorithms)
        out.append((size / best.time_s(size) * factor, best.label))
    return out


#: The fitted parameters in order, with their bounds: host costs in microseconds, shares in (0, 1].
PARAMETERS = (
    ("call_overhead_sm80_us", 0.0, 200.0),
    ("call_overhead_sm90_us", 0.0, 200.0),
    ("ring_efficiency", 0.2, 1.0),
    ("nvls_efficiency", 0.2, 1.0),
    ("network_efficiency", 0.2, 1.0),
    ("latency_scale", 0.1, 3.0),
    ("nvls_latency_scale", 0.1, 3.0),
    ("nvls_chunk_us", 0.0, 100.0),
)
START = (20.0, 15.0, 0.8, 0.7, 0.8, 1.0, 1.0, 1.0)
#: The host costs (SM 8.x, 9.x; microseconds) the fit may start from: with the host's cost a
#: floor under the device's time (``max``, not a sum), the loss has a local minimum wherever a
#: host cost stops binding, so the fit starts from the best of these, each with each of
#: :data:`CHUNK_STARTS_US` for NVLS's cost per chunk.
HOST_STARTS_US = tuple((a, b) for a in (5.0, 15.0, 30.0, 50.0) for b in (5.0, 15.0, 30.0, 50.0))
CHUNK_STARTS_US = (0.5, 3.0, 10.0)
#: The loss's scale: residuals (log of predicted / measured) beyond about 15 % count linearly.
F_SCALE = 0.1


def calibration_of(values) -> object:
    from topocoll.solver.nccl_model import US, Calibration

    ring, nvls, network, latency, nvls_latency, nvls_chunk_us = map(float, values[2:8])
    return Calibration({80: values[0] * US, 90: values[1] * US}, ring, nvls, network, latency, nvls_latency, nvls_chunk_us * US)


def fit(tables: list[Table], fixed=None) -> tuple[tuple[float, ...], dict[str, tuple[float, float]]]:
    """Least-squares fit of :data:`PARAMETERS` (unless ``fixed``) and of each latency-fitting
    table's network latencies to ``tables``; returns the parameters and, per such table, its
    network's latency per hop for LL/LL128 and for Simple, in seconds."""
    import numpy as np
    from scipy.optimize import least_squares

    latency_tables = [t.name for t in tables if t.fits_latency]
    free = 0 if fixed is not None else len(PARAMETERS)

    def unpack(x):
        values = tuple(fixed) if fixed is not None else tuple(x[:free])
        return values, {name: (x[free + 2 * i] * 1e-6, x[free + 2 * i + 1] * 1e-6) for i, name in enumerate(latency_tables)}

    def residuals(x):
        values, latencies = unpack(x)
        calibration = calibration_of(values)
        out = []
        for t in tables:
            for (_, measured), (predicted, _) in zip(t.measured, predicted_busbw(t, calibration, *latencies.get(t.name, NO_LATENCY))):
                out.append(math.log(predicted / measured))
        return np.array(out)

    x0 = ([] if fixed is not None else list(START)) + [20.0, 40.0] * len(latency_tables)
    lower = ([] if fixed is not None else [p[1] for p in PARAMETERS]) + [0.0, 0.0] * len(latency_tables)
    upper = ([] if fixed is not None else [p[2] for p in PARAMETERS]) + [1000.0, 5000.0] * len(latency_tables)
    if not x0:
        return tuple(fixed), {}
    if fixed is None:
        starts = (start(x0, host_us, chunk_us) for host_us in HOST_STARTS_US for chunk_us in CHUNK_STARTS_US)
        x0 = min(starts, key=lambda x: cost(residuals(x)))
    # soft_l1 with a scale near the target: residuals beyond ~15 % count linearly, not squared
    result = least_squares(residuals, x0, bounds=(lower, upper), loss="soft_l1", f_scale=F_SCALE)
    return unpack(result.x)


def start(x0: list[float], host_us: tuple[float, float], chunk_us: float) -> list[float]:
    """``x0`` with its two host costs (the first two parameters) replaced by ``host_us`` and
    NVLS's cost per chunk by ``chunk_us``."""
    chunk = [p[0] for p in PARAMETERS].index("nvls_chunk_us")
    return [*host_us, *x0[2:chunk], chunk_us, *x0[chunk + 1:]]


def cost(residuals) -> float:
    """The fit's loss (soft_l1 at :data:`F_SCALE`) of ``residuals``, as ``least_squares`` sums it."""
    z = (residuals / F_SCALE) ** 2
    return float(sum(2 * ((1 + z) ** 0.5 - 1)))


def evaluate(tables: list[Table]) -> dict:
    """Fit to all tables, then to each table's complement (held out), and predict every row."""
    values, latencies = fit(tables)
    calibration = calibration_of(values)
    held_out = {}
    for t in tables:
        others = [o for o in tables if o is not t]
        kept, _ = fit(others)
        _, own_latency = fit([t], fixed=kept) if t.fits_latency else ((), {})
        held_out[t.name] = (calibration_of(kept), *own_latency.get(t.name, NO_LATENCY))
    results = []
    for t in tables:
        own = latencies.get(t.name, NO_LATENCY)
        fitted = predicted_busbw(t, calibration, *own)
        alone = predicted_busbw(t, *held_out[t.name])
        rows = []
        for (size, measured), (busbw, label), (busbw_out, _) in zip(t.measured, fitted, alone):
            rows.append({
                "size_bytes": size,
                "measured_busbw_bytes_per_s": measured,
                "predicted_busbw_bytes_per_s": busbw,
                "algorithm": label,
                "error_percent": 100 * (busbw / measured - 1),
                "held_out_busbw_bytes_per_s": busbw_out,
                "held_out_error_percent": 100 * (busbw_out / measured - 1),
            })
        view = t.view
        results.append({
            "table": t.name, "machine": t.what, "gpus": view.ranks, "machines": view.machines,
            "gpu_bw_bytes_per_s": view.gpu_bw_bytes_per_s, "network_bw_bytes_per_s": view.network_bw_bytes_per_s,
            "nvls": view.nvls, "network_rdma": view.network_rdma,
            "network_latency_s": own[0], "network_simple_latency_s": own[1], "rows": rows,
        })
    return {"calibration": dict(zip((p[0] for p in PARAMETERS), values)), "tables": results}


#: Machines where the topology is uneven, beside the tables' ones: (label, preset, GPUs taken
#: of one machine, or the GPUs taken of each machine of a rail-optimized cluster of them).
UNEVEN = (
    ("8-GPU PCIe box (two sockets, two PCIe switches each)", "pcie-8gpu", 8),
    ("5 GPUs of a DGX-1 (NVLink hybrid cube-mesh)", "dgx1-v100", 5),
    ("5 GPUs of a DGX A100", "dgx-a100", 5),
    ("3 GPUs of a DGX H100", "dgx-h100", 3),
    ("8, 8 and 1 GPUs of three DGX H100 (a scheduler's job of 17)", "dgx-h100", (8, 8, 1)),
    ("4, 4, 2 and 1 GPUs of four DGX H100 (a job of 11)", "dgx-h100", (4, 4, 2, 1)),
)
UNEVEN_SIZES = tuple(1 << k for k in range(10, 34, 3))


def against_nccl(label: str, topology, ranks, sizes) -> dict:
    """topocoll on NCCL against NCCL's own allreduce, by the calibrated model, at ``sizes``."""
    from topocoll.bench.simulate_cli import simulate_report
    from topocoll.solver.planner import DEFAULT_PER_MESSAGE_OVERHEAD_S
    from topocoll.solver.schedule import Collective

    report = simulate_report(
        topology, Collective.ALLREDUCE, tuple(ranks), list(sizes), baselines=(), per_message_overhead_s=DEFAULT_PER_MESSAGE_OVERHEAD_S,
        model="auto", nccl=True,
    )
    handed = set(report.config["nccl_model"]["handed_to_nccl_sizes_bytes"])
    picks = report.config["topocoll_schedule_per_size"]
    rows = [{
        "size_bytes": row.size_bytes,
        "topocoll_busbw_bytes_per_s": row.results[0].busbw_bytes_per_s,
        "nccl_busbw_bytes_per_s": row.results[-1].busbw_bytes_per_s,
        "speedup": row.results[-1].time_s / row.results[0].time_s,
        "runs": "NCCL" if row.size_bytes in handed else picks[str(row.size_bytes)],
    } for row in report.rows]
    return {"machine": label, "gpus": len(ranks), "rows": rows}


def comparisons(tables: list[Table]) -> list[dict]:
    from topocoll.topo.allocation import allocate
    from topocoll.topo.cluster import make_cluster
    from topocoll.topo.presets import build_preset

    out = []
    for (name, what, machine), table in zip(MACHINES, tables):
        print(f"  topocoll vs NCCL: {what} ...", file=sys.stderr, flush=True)
        topology = build(machine)
        out.append(against_nccl(what, topology, topology.compute_nodes(), [size for size, _ in table.measured]))
    for label, preset, gpus in UNEVEN:
        print(f"  topocoll vs NCCL: {label} ...", file=sys.stderr, flush=True)
        if isinstance(gpus, int):
            topology = build_preset(preset)
            ranks = topology.compute_nodes()[:gpus]
        else:
            topology = allocate(make_cluster(preset, len(gpus)), gpus_per_node=gpus, seed=0)
            ranks = topology.compute_nodes()
        out.append(against_nccl(label, topology, ranks, UNEVEN_SIZES))
    return out


def comparison_markdown(rows: list[dict]) -> list[str]:
    lines = [
        "## topocoll on NCCL against NCCL (predicted)",
        "",
        "`topocoll simulate --nccl`'s rule: each schedule takes at least NCCL's host cost per call and reaches NCCL's share of each "
        "link (the ring efficiency above); topocoll runs NCCL's own allreduce where that is predicted faster. "
        "speedup = NCCL's predicted time / topocoll's; \"runs\" is what topocoll runs at that size.",
        "",
        "| machine | GPUs | least speedup | most speedup | sizes handed to NCCL |",
        "|---|---:|---:|---:|---:|",
    ]
    for c in rows:
        speedups = [r["speedup"] for r in c["rows"]]
        handed = sum(r["runs"] == "NCCL" for r in c["rows"])
        lines.append(f"| {c['machine']} | {c['gpus']} | {min(speedups):.2f}x | {max(speedups):.2f}x | {handed} of {len(speedups)} |")
    lines.append("")
    for c in rows:
        lines += [f"### {c['machine']}", "", "| size | topocoll busbw | NCCL busbw | speedup | runs |", "|---:|---:|---:|---:|---|"]
        for r in c["rows"]:
            lines.append(
                f"| {r['size_bytes']} | {r['topocoll_busbw_bytes_per_s'] / 1e9:.2f} | {r['nccl_busbw_bytes_per_s'] / 1e9:.2f} | "
                f"{r['speedup']:.2f}x | {r['runs']} |"
            )
        lines.append("")
    return lines


def _within(rows: list[dict], key: str) -> int:
    return sum(abs(r[key]) <= 100 * WITHIN for r in rows)


def markdown(report: dict, command: str) -> str:
    cal = report["calibration"]
    every = [r for t in report["tables"] for r in t["rows"]]
    lines = [
        "# NCCL's allreduce tables against topocoll's model of NCCL",
        "",
        f"Command: `{command}`. Date (UTC): {datetime.now(timezone.utc):%Y-%m-%d %H:%M}. Machine: {platform.machine()}, "
        f"CPython {platform.python_version()}. busbw in GB/s (nccl-tests' definition). \"predicted\" is "
        "`topocoll.solver.nccl_model` with the calibration fitted to all five tables, \"held out\" the same model fitted to the "
        "other four; error = predicted / measured - 1; \"algorithm\" is the algorithm/protocol the model predicts NCCL runs, "
        "among those the table's `NCCL_ALGO` allowed: the publisher of the Azure tables ran `all_reduce_perf -g 8` (one "
        "thread issuing every call on all eight GPUs) with `NCCL_ALGO=NVLS` on the 8-GPU Hopper machines.",
        "",
        "## Calibration (fitted to all tables)",
        "",
        "| parameter | value |",
        "|---|---:|",
        *(f"| {name} | {value:.3f} |" for name, value in cal.items()),
        "",
        f"Within 15 %: **{_within(every, 'error_percent')} of {len(every)}** sizes fitted, "
        f"{_within(every, 'held_out_error_percent')} of {len(every)} held out.",
        "",
        "Held out, a parameter that only the held-out table determines keeps its starting value: the A100 table is "
        "the only one of Ampere GPUs (the host cost per call on SM 8.x) and the only one where NCCL runs rings at large "
        "sizes (the Hopper machines run NVLS), so its held-out column predicts with neither.",
        "",
        "| table | sizes | within 15 % (fitted) | within 15 % (held out) | median abs error | network latency fitted (LL, Simple) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for t in report["tables"]:
        errors = sorted(abs(r["error_percent"]) for r in t["rows"])
        simple = t.get("network_simple_latency_s")
        latency = f"{t['network_latency_s'] * 1e6:.1f} us, {simple * 1e6:.1f} us" if simple is not None else "-"
        lines.append(
            f"| {t['machine']} | {len(errors)} | {_within(t['rows'], 'error_percent')} | {_within(t['rows'], 'held_out_error_percent')} | "
            f"{errors[len(errors) // 2]:.0f} % | {latency} |"
        )
    lines.append("")
    for t in report["tables"]:
        net = f", network {t['network_bw_bytes_per_s'] / 1e9:.0f} GB/s per machine" if t["network_bw_bytes_per_s"] else ""
        lines += [
            f"## {t['machine']}: `{t['table']}`",
            "",
            f"{t['gpus']} GPUs on {t['machines']} machine(s), {t['gpu_bw_bytes_per_s'] / 1e9:.0f} GB/s per GPU inside a machine{net}; "
            f"NVLS {'yes' if t['nvls'] else 'no'}.",
            "",
            "| size | measured | predicted | error | algorithm | held out | error |",
            "|---:|---:|---:|---:|---|---:|---:|",
        ]
        for r in t["rows"]:
            lines.append(
                f"| {r['size_bytes']} | {r['measured_busbw_bytes_per_s'] / 1e9:.2f} | {r['predicted_busbw_bytes_per_s'] / 1e9:.2f} | "
                f"{r['error_percent']:+.0f} % | {r['algorithm']} | {r['held_out_busbw_bytes_per_s'] / 1e9:.2f} | {r['held_out_error_percent']:+.0f} % |"
            )
        lines.append("")
    lines += free_choice_markdown(report.get("free_choice"))
    lines += comparison_markdown(report.get("against_nccl", []))
    return "\n".join(lines)


def free_choice_markdown(free: dict | None) -> list[str]:
    """The same fit with every table predicted by NCCL's free choice, ``NCCL_ALGO`` ignored."""
    if not free:
        return []
    every = [r for t in free["tables"] for r in t["rows"]]
    lines = [
        "## The same fit as if NCCL had chosen freely",
        "",
        "The predictions above hold each table to the `NCCL_ALGO` it ran with. Fitted instead as if NCCL had chosen "
        "among all its algorithms (the `free_choice` part of the JSON): within 15 % at "
        f"{_within(every, 'error_percent')} of {len(every)} sizes fitted, {_within(every, 'held_out_error_percent')} of "
        f"{len(every)} held out.",
        "",
        "| parameter | value |",
        "|---|---:|",
        *(f"| {name} | {value:.3f} |" for name, value in free["calibration"].items()),
        "",
        "| table | within 15 % (fitted) | misses (size: error, algorithm) |",
        "|---|---:|---|",
    ]
    for t in free["tables"]:
        misses = ", ".join(
            f"{r['size_bytes']}: {r['error_percent']:+.0f} % {r['algorithm']}" for r in t["rows"] if abs(r["error_percent"]) > 100 * WITHIN
        )
        lines.append(f"| {t['machine']} | {_within(t['rows'], 'error_percent')} of {len(t['rows'])} | {misses or '-'} |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "nccl_tables", help="output path without extension")
    args = parser.parse_args(argv)
    print("fitting the model of NCCL to the tables (all, then each held out) ...", file=sys.stderr, flush=True)
    tables = load_tables()
    report = evaluate(tables)
    print("... and as if NCCL had chosen freely (NCCL_ALGO ignored) ...", file=sys.stderr, flush=True)
    report["free_choice"] = evaluate(load_tables(free_choice=True))
    report["against_nccl"] = comparisons(tables)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report, "python benchmarks/nccl_tables.py")
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
