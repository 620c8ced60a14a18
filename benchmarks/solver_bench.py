"""Solver benchmark: synthesis time, peak memory and % of the cut bound.

Run from the repository root::

    python benchmarks/solver_bench.py                      # every case, writes results/solver_bench.{md,json}
    python benchmarks/solver_bench.py --only dgx1 --out build/bench  # cases whose name contains "dgx1"
    python benchmarks/solver_bench.py --max-ranks 64       # skip the larger clusters

Every case runs in its own child process (``--worker``) so that its peak memory (``ru_maxrss``
of the child) is its own and a case that runs away cannot take the others down. For each
topology and collective (allgather, reduce-scatter, allreduce, 64 MiB) the child measures:

- ``synth_s``: :func:`topocoll.solver.synthesize.synthesize` (cut bound, tree packing, layout);
- ``lp_pct``: bound / T_bw of that synthesized schedule, verified;
- ``plan_s``: :func:`topocoll.solver.planner.plan_collective` at 64 MiB (packs again, lays out
  every pipeline depth, builds and verifies the baselines, picks by α-β time);
- ``chosen`` and ``chosen_pct``: the planner's choice and its % of bound;
- ``rings_pct``: the multi-channel ring's (NCCL's rings as NCCL runs them), the planner's
  candidate or, where the planner leaves it out, built here up to ``--ring-max-ranks`` ranks;
- ``ring_pct`` and ``dbt_pct``: the ring and double-binary-tree candidates' % of bound. The
  planner leaves the ring out above :data:`topocoll.solver.planner.LARGE_WORLD_RANKS` ranks
  (its schedule has N^2 transfers); it is then built and verified here directly when
  ``--ring-max-ranks`` allows, else reported as n/a.

Goals (from the project plan): 8 GPUs < 0.5 s, 64 < 5 s, 256 < 20 s, 1024 < 60 s per synthesis
(a case is held to the goal of the smallest listed size >= its rank count: 16 GPUs to 5 s),
peak memory < 8 GB, % of bound >= 99.5 (for the LP schedule; the planner's α-β choice at 64 MiB
is reported next to it and may be a baseline).
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURE_DIR = REPO_ROOT / "tests" / "data" / "topologies"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
SIZE_BYTES = 64 * 2**20
COLLECTIVES = ("allgather", "reduce_scatter", "allreduce")
#: Goals of the plan: synthesis seconds by rank count (the first bound >= the rank count applies).
TIME_GOALS_S = ((8, 0.5), (64, 5.0), (256, 20.0), (1024, 60.0))
MEMORY_GOAL_BYTES = 8e9
PCT_GOAL = 99.5
CLUSTER_NODES = (8, 32, 128)
PARTIAL_DGX1 = (3, 5, 6)

log = logging.getLogger("solver_bench")


@dataclass(frozen=True, slots=True)
class Row:
    """One (case, collective) measurement."""

    case: str
    kind: str
    ranks: int
    collective: str
    synth_s: float | None
    lp_pct: float | None
    plan_s: float | None
    chosen: str | None
    chosen_pct: float | None
    ring_pct: float | None
    dbt_pct: float | None
    rings_pct: float | None
    peak_rss_bytes: int | None
    note: str = ""

    @property
    def time_goal_s(self) -> float:
        for ranks, goal in TIME_GOALS_S:
            if self.ranks <= ranks:
                return goal
        return TIME_GOALS_S[-1][1]


# ----------------------------------------------------------------------------- cases
def case_names(max_ranks: int) -> list[tuple[str, str, int]]:
    """``(name, kind, expected ranks)`` of every case (kind: preset, partial, fixture, cluster)."""
    from topocoll.topo.presets import PRESETS

    cases = [(f"preset:{name}", "preset", p.gpus) for name, p in PRESETS.items()]
    cases += [(f"partial:dgx1-v100:{k}", "partial", k) for k in PARTIAL_DGX1]
    cases += [(f"partial:dgx-a100:{k}", "partial", k) for k in PARTIAL_DGX1]
    for name, ranks in nvlink_fixtures():
        cases.append((f"fixture:{name}", "fixture", ranks))
    cases += [(f"cluster:dgx-h100:rail:{n}", "cluster", 8 * n) for n in CLUSTER_NODES]
    return [c for c in cases if c[2] <= max_ranks]


def nvlink_fixtures() -> list[tuple[str, int]]:
    """Fixture files that parse as topologies and list NVLinks, with their GPU counts."""
    from topocoll.errors import TopocollError
    from topocoll.topo.io import load_topology
    from topocoll.topo.model import LinkKind

    found = []
    if not FIXTURE_DIR.is_dir():
        return found
    for path in sorted(FIXTURE_DIR.iterdir()):
        try:
            topo = load_topology(path)
        except TopocollError:
            continue  # not a topology (results, graph files, README)
        if any(link.kind is LinkKind.NVLINK for link in topo.links) and len(topo.compute_nodes()) >= 2:
            found.append((path.name, len(topo.compute_nodes())))
    return found


def build_case(name: str):
    """The topology and ranks of case ``name``."""
    from topocoll.topo.cluster import make_cluster
    from topocoll.topo.io import load_topology
    from topocoll.topo.presets import build_preset

    kind, _, rest = name.partition(":")
    if kind == "preset":
        topo = build_preset(rest)
        return topo, list(topo.compute_nodes())
    if kind == "partial":
        preset, count = rest.rsplit(":", 1)
        topo = build_preset(preset)
        return topo, [f"gpu{i}" for i in range(int(count))]
    if kind == "fixture":
        topo = load_topology(FIXTURE_DIR / rest)
        return topo, list(topo.compute_nodes())
    if kind == "cluster":
        preset, network, nodes = rest.split(":")
        topo = make_cluster(preset, int(nodes), network=network)
        return topo, list(topo.compute_nodes())
    raise ValueError(f"unknown case {name!r}")


# ----------------------------------------------------------------------------- worker
def run_case(name: str, kind: str, ring_max_ranks: int) -> list[Row]:
    """Measure one case in this process (the ``--worker`` side)."""
    from topocoll.solver import baselines
    from topocoll.solver.planner import plan_collective
    from topocoll.solver.schedule import Collective
    from topocoll.solver.synthesize import synthesize
    from topocoll.solver.verify import verify

    topo, ranks = build_case(name)
    rows = []
    for collective_name in COLLECTIVES:
        collective = Collective.parse(collective_name)
        notes = []
        start = time.perf_counter()
        synthesis = synthesize(topo, collective, ranks)
        synth_s = time.perf_counter() - start
        checked = verify(synthesis.schedule, topo)
        bound = synthesis.bound.time_per_byte_s
        lp_pct = 100 * bound / checked.t_bw_s_per_byte if checked.ok else None
        if not checked.ok:
            notes.append(f"lp schedule fails verification: {checked.errors[0]}")
        del synthesis, checked
        start = time.perf_counter()
        plan = plan_collective(topo, collective, ranks, size_bytes=SIZE_BYTES)
        plan_s = time.perf_counter() - start

        def pct(candidate) -> float | None:
            return None if candidate is None else 100 * plan.bound.time_per_byte_s / candidate.t_bw_s_per_byte

        ring_pct = pct(plan.candidate("ring"))
        if plan.candidate("ring") is None and len(ranks) <= ring_max_ranks:
            schedule = baselines.BASELINES["ring"](topo, collective, ranks)
            ring_check = verify(schedule, topo)
            ring_pct = 100 * plan.bound.time_per_byte_s / ring_check.t_bw_s_per_byte if ring_check.ok else None
            notes.append("ring built outside the planner")
            del schedule, ring_check
        elif plan.candidate("ring") is None:
            notes.append(f"ring n/a: over {ring_max_ranks} ranks its N^2 transfers are not built")
        rings_pct = pct(plan.candidate("multichannel_ring"))
        if rings_pct is None and len(ranks) <= ring_max_ranks:
            schedule = baselines.BASELINES["multichannel_ring"](topo, collective, ranks)
            rings_check = verify(schedule, topo)
            rings_pct = 100 * plan.bound.time_per_byte_s / rings_check.t_bw_s_per_byte if rings_check.ok else None
            notes.append("multi-channel ring built outside the planner")
            del schedule, rings_check
        if plan.candidate("double_binary_tree") is None:
            notes.append("dbt n/a: no double-binary-tree candidate (the builder returns another baseline for this collective)")
        notes.extend(plan.warnings)
        row = Row(
            name,
            kind,
            len(ranks),
            collective_name,
            synth_s,
            lp_pct,
            plan_s,
            plan.chosen.name,
            100 * plan.ratio_to_bound,
            ring_pct,
            pct(plan.candidate("double_binary_tree")),
            rings_pct,
            None,
            "; ".join(notes),
        )
        del plan
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        row = Row(**{**asdict(row), "peak_rss_bytes": peak})
        rows.append(row)
        # One line per row as soon as it is known, so a case cut off by its time limit keeps
        # the collectives it finished.
        print(json.dumps(asdict(row)), flush=True)
    return rows


def run_child(name: str, kind: str, ranks: int, ring_max_ranks: int, timeout_s: float) -> list[Row]:
    """Run one case in a child process; a failure becomes a row with a note."""
    command = [sys.executable, __file__, "--worker", name, "--kind", kind, "--ring-max-ranks", str(ring_max_ranks)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=REPO_ROOT, check=False)
        stdout, note = done.stdout, ""
        if done.returncode != 0:
            note = "failed: " + (done.stderr.strip().splitlines() or ["no output"])[-1]
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        note = f"timed out after {timeout_s:.0f} s"
    rows = [Row(**json.loads(line)) for line in stdout.splitlines() if line.startswith("{")]
    finished = {r.collective for r in rows}
    rows += [Row(name, kind, ranks, c, None, None, None, None, None, None, None, None, None, note) for c in COLLECTIVES if c not in finished]
    return rows


# ----------------------------------------------------------------------------- report
def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


HEADER = ("case", "ranks", "collective", "synth s", "goal s", "plan s", "peak MB", "LP %", "chosen", "chosen %", "ring %", "rings %", "dbt %", "notes")


def table_rows(rows: list[Row]) -> list[tuple[str, ...]]:
    out = []
    for r in rows:
        out.append(
            (
                r.case,
                str(r.ranks),
                r.collective,
                _fmt(r.synth_s, ".2f"),
                _fmt(r.time_goal_s, "g"),
                _fmt(r.plan_s, ".2f"),
                _fmt(None if r.peak_rss_bytes is None else r.peak_rss_bytes / 1e6, ".0f"),
                _fmt(r.lp_pct, ".2f"),
                r.chosen or "n/a",
                _fmt(r.chosen_pct, ".2f"),
                _fmt(r.ring_pct, ".2f"),
                _fmt(r.rings_pct, ".2f"),
                _fmt(r.dbt_pct, ".2f"),
                r.note,
            )
        )
    return out


def misses(rows: list[Row]) -> list[str]:
    """One line per goal a row misses."""
    found = []
    for r in rows:
        where = f"{r.case} {r.collective}"
        if r.synth_s is None:
            found.append(f"{where}: no result ({r.note})")
            continue
        if r.synth_s > r.time_goal_s:
            found.append(f"{where}: synthesis {r.synth_s:.2f} s > {r.time_goal_s:g} s")
        if r.peak_rss_bytes is not None and r.peak_rss_bytes > MEMORY_GOAL_BYTES:
            found.append(f"{where}: peak memory {r.peak_rss_bytes / 1e9:.2f} GB > 8 GB")
        if r.lp_pct is None or r.lp_pct < PCT_GOAL:
            found.append(f"{where}: LP schedule at {_fmt(r.lp_pct, '.2f')} % of bound < {PCT_GOAL} %")
        if r.chosen_pct is not None and r.chosen_pct < PCT_GOAL:
            found.append(f"{where}: planner chose {r.chosen} at {r.chosen_pct:.2f} % of bound (64 MiB, α-β)")
    return found


def markdown(rows: list[Row], meta: dict) -> str:
    lines = [
        "# Solver benchmark",
        "",
        f"Command: `{meta['command']}`. Date (UTC): {meta['date_utc']}. Machine: {meta['machine']}.",
        f"Size {SIZE_BYTES // 2**20} MiB. % = cut bound / bandwidth time of the schedule (100 = optimal).",
        "synth s = synthesize() (bound + tree packing + layout); plan s = plan_collective() at 64 MiB "
        "(packs again, all pipeline depths, baselines, verification). peak MB = max RSS of the case's process.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    for row in table_rows(rows):
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
    lines += ["", "## Goals missed", ""]
    missed = misses(rows)
    lines += [f"- {m}" for m in missed] if missed else ["None."]
    return "\n".join(lines) + "\n"


def print_table(rows: list[Row]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for row in table_rows(rows):
            print("  ".join(row))
        return
    table = Table(title=f"solver benchmark, {SIZE_BYTES // 2**20} MiB")
    for column in HEADER:
        table.add_column(column, overflow="fold")
    for row in table_rows(rows):
        table.add_row(*row)
    Console(width=220).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only cases whose name contains this text")
    parser.add_argument("--max-ranks", type=int, default=1024, help="skip cases with more ranks")
    parser.add_argument("--ring-max-ranks", type=int, default=1024, help="build the ring outside the planner up to this many ranks")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="limit per case (all three collectives)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "solver_bench", help="output path without extension")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        run_case(args.worker, args.kind, args.ring_max_ranks)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows: list[Row] = []
    for name, kind, ranks in case_names(args.max_ranks):
        if args.only and args.only not in name:
            continue
        log.info("running %s (%d ranks)", name, ranks)
        start = time.perf_counter()
        rows.extend(run_child(name, kind, ranks, args.ring_max_ranks, args.timeout_s))
        log.info("  done in %.1f s", time.perf_counter() - start)
    print_table(rows)
    import platform

    meta = {
        "command": "python benchmarks/solver_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "size_bytes": SIZE_BYTES,
        "goals": {"time_s_by_ranks": TIME_GOALS_S, "memory_bytes": MEMORY_GOAL_BYTES, "pct_of_bound": PCT_GOAL},
    }
    from topocoll.fileio import write_atomic

    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out.with_suffix(".json"), json.dumps({"meta": meta, "rows": [asdict(r) for r in rows], "missed": misses(rows)}, indent=1))
    write_atomic(args.out.with_suffix(".md"), markdown(rows, meta))
    print("\n".join(misses(rows)) or "all goals met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
