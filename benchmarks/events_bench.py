"""Event simulator benchmark: what overlapped execution predicts for the LP layouts, and its cost.

Run from the repository root::

    python benchmarks/events_bench.py            # writes results/events_bench.{md,json}

For each 8-GPU preset and collective, the LP tree packing is laid out at several pipeline
depths; each layout's time at 1 GiB is predicted three ways and reported as % of the cut bound:

- ``T_bw``: the ideal pipelined time (busiest link's load / bandwidth), which the LP optimises;
- ``α-β``: steps in lock step (:mod:`topocoll.solver.alpha_beta`);
- ``events``: the event simulator (:mod:`topocoll.solver.events`): messages share links max-min
  fairly and start when their data arrived.

The cost columns give the simulator's wall time for one size and its time per transfer, to show
how it grows with the schedule. The per-message overhead is the planner's default.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

from topocoll.solver.alpha_beta import simulate
from topocoll.solver.bound import cut_bound
from topocoll.solver.events import compile_events, simulate_events
from topocoll.solver.planner import DEFAULT_PER_MESSAGE_OVERHEAD_S
from topocoll.solver.schedule import Collective
from topocoll.solver.synthesize import SynthesisOptions, layout, pack_for
from topocoll.solver.verify import verify
from topocoll.topo.presets import build_preset

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SIZE_BYTES = 1 << 30
PRESETS = ("dgx1-v100", "dgx-a100", "dgx-h100", "pcie-8gpu", "mi300x")
COLLECTIVES = (Collective.ALLGATHER, Collective.ALLREDUCE)
DEPTHS = (1, 4, 16, 64)


def measure(preset: str, collective: Collective) -> list[dict]:
    """One row per pipeline depth of the LP packing of ``collective`` on ``preset``."""
    topo = build_preset(preset)
    ranks = topo.compute_nodes()
    bound = cut_bound(topo, collective, ranks, None)
    gather, scatter = pack_for(topo, collective, ranks, None, bound, SynthesisOptions())
    rows = []
    for depth in DEPTHS:
        schedule = layout(collective, ranks, None, gather, scatter, depth, topo.digest(), name=f"lp-pipeline{depth}")
        checked = verify(schedule, topo)
        (ab,) = simulate(schedule, topo, [SIZE_BYTES], DEFAULT_PER_MESSAGE_OVERHEAD_S)
        started = time.perf_counter()
        program = compile_events(schedule, topo)
        compiled = time.perf_counter()
        result = simulate_events(program, schedule, SIZE_BYTES, DEFAULT_PER_MESSAGE_OVERHEAD_S)
        ended = time.perf_counter()
        best = bound.time_s(SIZE_BYTES)
        rows.append({
            "preset": preset,
            "collective": collective.value,
            "depth": depth,
            "transfers": schedule.transfer_count(),
            "messages": program.messages,
            "steps": len(schedule.steps),
            "t_bw_pct": 100 * bound.time_per_byte_s / checked.t_bw_s_per_byte,
            "alpha_beta_pct": 100 * best / ab.time_s,
            "events_pct": 100 * best / result.time_s,
            "events": result.events,
            "compile_s": compiled - started,
            "simulate_s": ended - compiled,
        })
    return rows


def markdown(rows: list[dict], command: str) -> str:
    """The results as a markdown page."""
    lines = [
        "# Event simulator benchmark",
        "",
        f"Command: `{command}`. Date (UTC): {datetime.now(timezone.utc):%Y-%m-%d %H:%M}. "
        f"Machine: {platform.machine()}, CPython {platform.python_version()}.",
        f"LP tree packings laid out at several pipeline depths, 1 GiB, per-message overhead "
        f"{DEFAULT_PER_MESSAGE_OVERHEAD_S * 1e6:g} us. % = cut-bound time / predicted time.",
        "",
        "| preset | collective | depth | transfers | messages | T_bw % | α-β % | events % | compile s | simulate s | us / transfer |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per = 1e6 * (r["compile_s"] + r["simulate_s"]) / r["transfers"]
        lines.append(
            f"| {r['preset']} | {r['collective']} | {r['depth']} | {r['transfers']} | {r['messages']} | "
            f"{r['t_bw_pct']:.1f} | {r['alpha_beta_pct']:.1f} | {r['events_pct']:.1f} | "
            f"{r['compile_s']:.2f} | {r['simulate_s']:.2f} | {per:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for events_bench.{md,json}")
    args = parser.parse_args()
    rows = []
    for preset in PRESETS:
        for collective in COLLECTIVES:
            for row in measure(preset, collective):
                rows.append(row)
                print(f"{row['preset']:<10} {row['collective']:<10} depth {row['depth']:>3}: {row['transfers']:>6} transfers, "
                      f"T_bw {row['t_bw_pct']:5.1f} %  α-β {row['alpha_beta_pct']:5.1f} %  events {row['events_pct']:5.1f} %  "
                      f"({row['compile_s'] + row['simulate_s']:.2f} s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "events_bench.json").write_text(json.dumps(rows, indent=1) + "\n")
    (args.out / "events_bench.md").write_text(markdown(rows, "python benchmarks/events_bench.py"))
    print(f"wrote {args.out / 'events_bench.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
