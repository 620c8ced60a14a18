"""Routed all-to-all against gloo's on emulated clusters (root): ``topocoll-bench alltoall`` per scenario.

For each scenario the cluster comes up (``topocoll emulate``: one network namespace per host,
shaped links) and one rank per host runs ``topocoll-bench alltoall`` with the scenario's
ground-truth topology, once per traffic pattern (``--skew uniform`` and ``--skew zipf:1.2``):
nccl-tests' method, so each size is measured on the topo group and right after on gloo's own
``all_to_all_single``, each after one untimed call, every element checked, the matrix's cut bound
beside it. On hosts with several NICs, gloo's all-to-all runs once more with
``GLOO_SOCKET_IFNAME`` naming the fastest NIC (the launcher hands gloo ``eth0``, the NIC the host
name resolves to): the best a one-NIC all-to-all can do, so that the speedup over gloo is also
given against it. The table collects the rows of every run; each run's busbw-vs-size plot and JSON
are kept next to it.

Why one untimed call before each timed block matters here: the emulated links are TCP over tbf
queues, and a connection that sat idle while the other backend ran restarts in slow start. An
earlier version of this benchmark alternated single calls of the two backends and measured each
just after the other one's: topo took 6.0-7.2 s for 64 MiB per rank on ``multi-rail`` where it
takes 4.1-4.2 s after a call of its own (gloo: 7.6-8.2 s either way).

usage: sudo .venv/bin/python benchmarks/alltoall_emulated.py [--scenarios multi-rail,two-racks,uniform]
       [--sizes 16M:64M] [--iters 3] [-o benchmarks/results/alltoall_emulated]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PATTERNS = ("uniform", "zipf:1.2")


def bench_argv(pattern: str, sizes: str, iters: int, topology: Path, json_path: Path, plot_path: Path | None) -> list[str]:
    """The ``topocoll-bench alltoall`` command line of one run (topo against gloo)."""
    low, _, high = sizes.partition(":")
    return [
        sys.executable, "-m", "topocoll.bench", "alltoall", "-b", low, "-e", high or low, "-f", "2", "-n", str(iters),
        "-w", "1", "-c", "1", "-T", "900", "--skew", pattern, "--topology", str(topology),
        "-J", str(json_path), "-q", *(["--plot", str(plot_path)] if plot_path is not None else []),
    ]


def run_bench(cluster, argv: list[str], what: str) -> str:
    """Run one benchmark command on every emulated host; its output."""
    out, err = io.StringIO(), io.StringIO()
    print(f"{what}: {shlex.join(argv[2:])}", file=sys.stderr, flush=True)
    result = cluster.run_ranks(argv, timeout_s=7200, stdout=out, stderr=err, env={**os.environ, "PYTHONPATH": str(REPO)})
    if result.returncode != 0:
        raise RuntimeError(f"{what}: the benchmark failed ({result.returncode}):\n{err.getvalue()[-3000:]}")
    return out.getvalue()


def measure(name: str, sizes: str, iters: int, out_dir: Path) -> dict:
    """Run every pattern on one emulated scenario; the bench's JSON reports, by pattern."""
    from emulated import fastest_nic  # benchmarks/emulated.py
    from topocoll.bench import scenario as sc
    from topocoll.bench.emulate import EmulatedCluster

    scenario = sc.load_scenario(name)
    fastest = fastest_nic(scenario)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="topocoll-a2a-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)
        with EmulatedCluster(scenario, state_dir=work / "state", apply_delays=False) as cluster:  # this kernel has no netem: rates only
            for pattern in PATTERNS:
                label = pattern.split(":")[0]
                json_path = work / f"{name}-{label}.json"
                plot_path = out_dir / f"{name}-{label}.png"
                argv = bench_argv(pattern, sizes, iters, cluster.truth_path, json_path, plot_path)
                print(run_bench(cluster, argv, f"{name} {pattern}"), file=sys.stderr, flush=True)
                # the report names files of this run: keep their names, not this machine's paths
                text = json_path.read_text().replace(str(work) + "/", "").replace(str(REPO) + "/", "")
                runs[label] = json.loads(text)
                if fastest is not None:
                    fast_path = work / f"{name}-{label}-gloo-fastest.json"
                    argv = ["env", f"GLOO_SOCKET_IFNAME={fastest}", *bench_argv(pattern, sizes, iters, cluster.truth_path, fast_path, None)]
                    run_bench(cluster, [*argv, "--backend", "gloo", "--baseline", "none"], f"{name} {pattern} gloo on {fastest}")
                    fast = json.loads(fast_path.read_text())
                    for row, fast_row in zip(runs[label]["rows"], fast["rows"]):
                        result = next(iter(fast_row["results"].values()))
                        row["gloo_fastest_rail"] = {"nic": fastest, "time_s": result["time_s"], "wrong": result["wrong"]}
    return {"scenario": name, "description": scenario.description, "runs": runs}


def table(results: list[dict]) -> str:
    """One line per scenario, pattern and size."""
    lines = [
        "| scenario | traffic | size S per rank | topo (s) | gloo (s) | topo / gloo speed | gloo on the fastest NIC (s) | topo / gloo fastest | "
        "topo busbw (MB/s) | bound busbw (MB/s) | % of bound | #wrong |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        for label, report in result["runs"].items():
            for row in report["rows"]:
                topo, gloo = row["results"]["topo"], row["results"]["baseline"]
                fast = row.get("gloo_fastest_rail")
                wrong = (topo["wrong"] or 0) + (gloo["wrong"] or 0) + ((fast["wrong"] or 0) if fast else 0)
                fast_cells = f"{fast['time_s']:.2f} ({fast['nic']}) | {fast['time_s'] / topo['time_s']:.2f}x" if fast else "- | -"
                lines.append(
                    f"| {result['scenario']} | {label} | {row['size_bytes'] / 2**20:.0f} MiB | {topo['time_s']:.2f} | {gloo['time_s']:.2f} | "
                    f"{row['speedup']:.2f}x | {fast_cells} | {topo['busbw_bytes_per_s'] / 1e6:.2f} | {row['bound_busbw_bytes_per_s'] / 1e6:.2f} | "
                    f"{row['percent_of_bound']:.0f} | {wrong} |"
                )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="multi-rail,two-racks,uniform")
    parser.add_argument("--sizes", default="16M:64M", help="smallest:largest S, doubling (default 16M:64M)")
    parser.add_argument("--iters", type=int, default=3, help="timed calls per size and backend (-n)")
    parser.add_argument("-o", "--out", type=Path, default=REPO / "benchmarks" / "results" / "alltoall_emulated")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "sudo .venv/bin/python benchmarks/alltoall_emulated.py " + " ".join(argv if argv is not None else sys.argv[1:])
    fresh = [measure(name, args.sizes, args.iters, args.out) for name in args.scenarios.split(",")]
    for result in fresh:
        result["command"] = command.strip()
    from topocoll.fileio import write_atomic

    # scenarios measured before and not now keep their rows (each names the command that made it)
    earlier = args.out / "results.json"
    kept = json.loads(earlier.read_text()) if earlier.exists() else {"results": []}
    now = {r["scenario"] for r in fresh}
    for result in kept["results"]:
        result.setdefault("command", kept.get("command", ""))
    results = [r for r in kept["results"] if r["scenario"] not in now] + fresh
    results.sort(key=lambda r: r["scenario"])
    commands = "".join(f"- {r['scenario']}: `{r['command']}`\n" for r in results)
    text = (
        "# Routed all-to-all against gloo's on emulated clusters\n\n"
        f"Commands:\n{commands}\nOne rank per emulated host running `topocoll-bench alltoall` with the scenario's "
        "ground-truth topology (`--skew uniform`: S/n to every rank, as alltoall_perf; `--skew zipf:1.2`: every rank's S "
        "spread by Zipf(1.2) over the others). Times are the slowest rank's (`-a 3`), each size measured on topo and then "
        "on gloo's own all_to_all_single after one untimed call each (gloo on `eth0`, as the launcher hands it; on hosts "
        "with several NICs once more on the fastest one, a run of its own); the bound is the matrix's cut bound on the ground "
        "truth; every element was checked (`#wrong`). Each run's busbw-vs-size plot: `<scenario>-<traffic>.png`.\n\n"
        + table(results)
    )
    write_atomic(args.out / "README.md", text)
    write_atomic(args.out / "results.json", json.dumps({"results": results}, indent=1, sort_keys=True) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
