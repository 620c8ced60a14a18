"""Topology-aware schedules against topology-blind ones on emulated clusters (root).

For every scenario (``topocoll emulate list``): bring the cluster up, give the ranks the
scenario's *structure* with every network link at the speed a NIC that reports none is assumed
to have (NCCL's 10 Gb/s socket default: what discovery would say of these virtual NICs),
probe it (``topocoll topo probe``), then run ``topocoll-bench`` on the probed topology for each
collective three ways on the same hosts:

- ``topo``: the topo backend, schedules from the planner on the probed topology;
- ``ring``: the same executor with the ring in rank order (``--planner rank_order_ring``),
  blind to the topology: what separates the schedule's effect from the executor's;
- ``gloo``: gloo's own collective, on the NIC the launcher hands it (``GLOO_SOCKET_IFNAME=eth0``,
  the one the host's name resolves to);
- ``gloo fastest rail``: on hosts with several NICs, gloo's own collective again with
  ``GLOO_SOCKET_IFNAME`` naming the host's fastest NIC, the best a one-NIC collective can do.

``topocoll simulate`` predicts topo's time on the probed topology for comparison: the event
simulator on the schedule the backend ran (planned as the backend plans, with its step cost). Results go
to ``OUT/<scenario>.json`` and ``.png`` (busbw against size) and one table, ``OUT/README.md``.

usage: sudo .venv/bin/python benchmarks/emulated.py [--scenarios a,b] [--sizes 16M,64M] [--port-queue fair] [-o DIR]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from topocoll.bench import scenario as sc  # noqa: E402
from topocoll.bench.emulate import EmulatedCluster  # noqa: E402
from topocoll.bench.network_plan import PORT_QUEUES  # noqa: E402
from topocoll.topo.io import load_topology, save_topology  # noqa: E402
from topocoll.topo.model import LinkKind, Topology  # noqa: E402

COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast")
SERIES = ("topo", "ring", "gloo")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(cluster: EmulatedCluster, argv: list[str], env: dict[str, str], timeout_s: float) -> str:
    out, err = io.StringIO(), io.StringIO()
    result = cluster.run_ranks(argv, timeout_s=timeout_s, stdout=out, stderr=err, env={**os.environ, **env})
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} ... failed ({result.returncode}):\n{err.getvalue()[-3000:]}")
    return out.getvalue() + err.getvalue()


def probe_accuracy(truth: Topology, nominal: Topology, probed: Topology) -> list[dict]:
    """Each network link's probed rate against its tc setting; ``identified`` is false where
    the probe left the link at its nominal (assumed) rate."""
    rows = []
    for link in truth.links:
        if link.kind is LinkKind.NET:
            got = probed.link(link.src, link.dst).bw_bytes_per_s
            rows.append({"link": f"{link.src}->{link.dst}", "set_bytes_per_s": link.bw_bytes_per_s, "probed_bytes_per_s": got,
                         "error_percent": 100 * (got - link.bw_bytes_per_s) / link.bw_bytes_per_s,
                         "identified": got != nominal.link(link.src, link.dst).bw_bytes_per_s})
    return rows


def fastest_nic(scenario: sc.Scenario) -> str | None:
    """The interface of the first host's fastest link when that is not ``eth0`` (NIC k of a host
    is ``eth<k>``, in the order of the scenario's links), else None."""
    host = scenario.hosts[0]
    rates = [link.rate_bits_per_s for link in scenario.links if host in (link.a, link.b)]
    best = max(range(len(rates)), key=lambda k: rates[k])
    return f"eth{best}" if rates[best] > rates[0] else None


def bench(cluster, collective, extra, topology_path, sizes, iters, work: Path, tag: str, prefix: tuple[str, ...] = ()) -> dict:
    out = work / f"{collective}-{tag}.json"
    cluster.renew_queues()  # every process meets new queues (EmulatedCluster.renew_queues says why)
    argv = [*prefix, sys.executable, "-m", "topocoll.bench", collective, "-b", sizes[0], "-e", sizes[-1], "-f", "2",
            "-n", str(iters), "-w", "1", "-c", "1", "-q", "-J", str(out), *extra]
    run(cluster, argv, {"TOPOCOLL_TOPOLOGY": str(topology_path), "PYTHONPATH": str(REPO)}, timeout_s=1800)
    return json.loads(out.read_text())


def simulate(topology_path: Path, collective: str, sizes_bytes: list[int], work: Path) -> dict[int, tuple[float, str]]:
    """``topocoll simulate``'s prediction of the schedule the backend ran at each size: planned
    as the backend plans CPU collectives (its planner, for the size's bucket, on the probed
    topology), run through the event simulator with the backend's step cost. Returns
    ``{size: (time_s, schedule name)}``."""
    from topocoll.cli import main as topocoll
    from topocoll.collectives.schedule_source import STEP_OVERHEAD_S, default_planner, size_bucket
    from topocoll.solver.schedule import Collective

    topology = load_topology(topology_path)
    kind = Collective.parse(collective)
    predicted = {}
    for size in sizes_bytes:
        schedule = default_planner(topology, kind, topology.compute_nodes(), 0 if kind.is_rooted else None, size_bucket(size))
        path, out = work / f"{collective}-{size}-schedule.json", work / f"{collective}-{size}-sim.json"
        path.write_text(schedule.to_json())
        with open(os.devnull, "w") as sink:
            stdout, sys.stdout = sys.stdout, sink
            try:
                status = topocoll(["simulate", "--topology", str(topology_path), "--schedule", str(path), "--sizes", str(size),
                                   "--model", "events", "--overhead-us", str(STEP_OVERHEAD_S * 1e6), "--baselines", "none",
                                   "-J", str(out)])
            finally:
                sys.stdout = stdout
        if status != 0:
            raise RuntimeError(f"topocoll simulate failed for {collective} at {size} B")
        (row,) = json.loads(out.read_text())["rows"]
        predicted[size] = (row["results"]["topocoll"]["time_s"], schedule.name)
    return predicted


def resimulate(out: Path, names: list[str]) -> None:
    """Predict again, with :func:`simulate`, every row of ``OUT/<scenario>.json`` from the probed
    topology the file keeps (the measurements stay as they are)."""
    for name in names:
        path = out / f"{name}.json"
        result = json.loads(path.read_text())
        with tempfile.TemporaryDirectory(prefix="topocoll-emulated-") as tmp:
            work = Path(tmp)
            (work / "probed.json").write_text(json.dumps(result["probed_topology"]))
            for collective, data in result["collectives"].items():
                predicted = simulate(work / "probed.json", collective, [r["size_bytes"] for r in data["rows"]], work)
                for row in data["rows"]:
                    row["predicted_time_s"], row["predicted_schedule"] = predicted[row["size_bytes"]]
        path.write_text(_without_run_dir(json.dumps(result, indent=1, sort_keys=True)) + "\n")
        say(f"{name}: predicted again")


def measure(name: str, sizes: list[str], iters: int, delays: bool, port_queue: str, probe_only: bool = False) -> dict:
    scenario = sc.load_scenario(name)
    with tempfile.TemporaryDirectory(prefix="topocoll-emulated-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)
        with EmulatedCluster(scenario, state_dir=work / "state", apply_delays=delays, port_queue=port_queue) as cluster:
            truth = load_topology(cluster.truth_path)
            nominal = sc.assumed_rates(truth)
            save_topology(nominal, work / "nominal.json")
            say(f"{name}: probing")
            began = time.monotonic()
            log = run(cluster, [sys.executable, "-m", "topocoll.cli", "topo", "probe", "-o", str(work / "probed.json")],
                      {"TOPOCOLL_TOPOLOGY": str(work / "nominal.json"), "PYTHONPATH": str(REPO)}, timeout_s=600)
            probe_s = time.monotonic() - began
            probed = load_topology(work / "probed.json")
            save_topology(probed, work / "probed.json")
            result = {"scenario": name, "description": scenario.description, "hosts": len(scenario.hosts),
                      "delays_applied": delays, "port_queue": port_queue, "probe_s": probe_s, "probe_log": [l for l in log.splitlines() if "probe" in l][-40:],
                      "probe_accuracy": probe_accuracy(truth, nominal, probed), "probed_topology": json.loads((work / "probed.json").read_text()),
                      "collectives": {}}
            for collective in () if probe_only else COLLECTIVES:
                say(f"{name}: {collective}")
                topo = bench(cluster, collective, ["--baseline", "gloo"], work / "probed.json", sizes, iters, work, "topo")
                ring = bench(cluster, collective, ["--planner", "rank_order_ring", "--baseline", "none"], work / "probed.json", sizes, iters, work, "ring")
                fastest = fastest_nic(scenario)
                best_rail = None
                if fastest is not None:
                    best_rail = bench(cluster, collective, ["--backend", "gloo", "--baseline", "none"], work / "probed.json", sizes,
                                      iters, work, "gloo-fastest", prefix=("env", f"GLOO_SOCKET_IFNAME={fastest}"))
                predicted = simulate(work / "probed.json", collective, [r["size_bytes"] for r in topo["rows"]], work)
                rows = []
                for i, (a, b) in enumerate(zip(topo["rows"], ring["rows"])):
                    size = a["size_bytes"]
                    fast = next(iter(best_rail["rows"][i]["results"].values())) if best_rail is not None else None
                    rows.append({
                        "size_bytes": size,
                        "busbw_bytes_per_s": {"topo": a["results"]["topo"]["busbw_bytes_per_s"], "ring": b["results"]["topo"]["busbw_bytes_per_s"],
                                              "gloo": a["results"]["baseline"]["busbw_bytes_per_s"]},
                        "time_s": {"topo": a["results"]["topo"]["time_s"], "ring": b["results"]["topo"]["time_s"], "gloo": a["results"]["baseline"]["time_s"]},
                        **({"gloo_fastest_rail": {"nic": fastest, "busbw_bytes_per_s": fast["busbw_bytes_per_s"], "time_s": fast["time_s"]}}
                           if fast is not None else {}),
                        "wrong": a["results"]["topo"]["wrong"] + b["results"]["topo"]["wrong"] + a["results"]["baseline"]["wrong"]
                        + (fast["wrong"] if fast is not None else 0),
                        "bound_busbw_bytes_per_s": a["bound_busbw_bytes_per_s"],
                        "predicted_time_s": predicted[size][0],
                        "predicted_schedule": predicted[size][1],
                    })
                result["collectives"][collective] = {"rows": rows, "command": topo["config"]["command"]}
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(result["collectives"]), figsize=(4 * len(result["collectives"]), 3.4), squeeze=False)
    for ax, (collective, data) in zip(axes[0], result["collectives"].items()):
        sizes = [r["size_bytes"] / 2**20 for r in data["rows"]]
        for series, style in zip(SERIES, ("o-", "s--", "^:")):
            ax.plot(sizes, [r["busbw_bytes_per_s"][series] / 1e6 for r in data["rows"]], style, label=series)
        ax.plot(sizes, [r["bound_busbw_bytes_per_s"] / 1e6 for r in data["rows"]], "k-", lw=0.8, label="bound (probed)")
        ax.set_xscale("log", base=2)
        ax.set_title(collective)
        ax.set_xlabel("size (MiB)")
        ax.set_ylabel("busbw (MB/s)")
        ax.set_ylim(bottom=0)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{result['scenario']}: {result['hosts']} emulated hosts")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(results: list[dict]) -> str:
    lines = ["| scenario | collective | size | topo MB/s | ring MB/s | gloo MB/s | topo/gloo | topo/ring | gloo fastest rail MB/s | topo/gloo fastest rail "
             "| bound MB/s | % bound | simulate vs measured | wrong |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        for collective, data in result["collectives"].items():
            for r in data["rows"]:
                b = r["busbw_bytes_per_s"]
                predicted = r["predicted_time_s"]
                sim = f"{100 * (predicted - r['time_s']['topo']) / r['time_s']['topo']:+.0f} %" if predicted else "-"
                fast = r.get("gloo_fastest_rail")
                rail = (f"{fast['busbw_bytes_per_s'] / 1e6:.2f} ({fast['nic']}) | {b['topo'] / fast['busbw_bytes_per_s']:.2f}x"
                        if fast else "- | -")
                lines.append(
                    f"| {result['scenario']} | {collective} | {r['size_bytes'] >> 20} MiB | {b['topo'] / 1e6:.2f} | {b['ring'] / 1e6:.2f} | "
                    f"{b['gloo'] / 1e6:.2f} | {b['topo'] / b['gloo']:.2f}x | {b['topo'] / b['ring']:.2f}x | {rail} | "
                    f"{r['bound_busbw_bytes_per_s'] / 1e6:.2f} | {100 * b['topo'] / r['bound_busbw_bytes_per_s']:.0f} | {sim} | {r['wrong']} |"
                )
    lines += ["", "| scenario | probe time | network links | identified | worst error of an identified link against its tc rate |",
              "|---|---|---|---|---|"]
    for result in results:
        rows = result["probe_accuracy"]
        errors = [abs(r["error_percent"]) for r in rows if r["identified"]]
        worst = f"{max(errors):.1f} %" if errors else "-"
        lines.append(f"| {result['scenario']} | {result['probe_s']:.1f} s | {len(rows)} | {len(errors)} | {worst} |")
    return "\n".join(lines) + "\n"


#: The results README keeps its prose; the script rewrites only what lies between these.
TABLE_BEGIN, TABLE_END = "<!-- results table: written by benchmarks/emulated.py -->", "<!-- end of results table -->"


def write_summary(out: Path) -> str:
    """Rebuild the table in ``OUT/README.md`` from every ``OUT/<scenario>.json``, so that
    re-running some scenarios keeps the others' rows and the README's own text."""
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if not p.name.endswith(".probe.json")]
    commands = "".join(f"- {r['scenario']}: `{r['command']}`\n" for r in results)
    text = f"{TABLE_BEGIN}\n{commands}\n{table(results)}{TABLE_END}"
    summary = out / "README.md"
    old = summary.read_text() if summary.exists() else "# topo against topology-blind collectives on emulated clusters\n\n"
    if TABLE_BEGIN in old and TABLE_END in old:
        new = old[: old.index(TABLE_BEGIN)] + text + old[old.index(TABLE_END) + len(TABLE_END):]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    summary.write_text(new)
    return table(results)


def _without_run_dir(text: str) -> str:
    """The report with the run's temporary folder left out of the file names it mentions (they
    name files of the run, not of the machine that ran it)."""
    return re.sub(r"/[^\s\"']*?topocoll-emulated-[A-Za-z0-9_]+/", "", text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(sc.shipped_scenarios()), help="comma-separated (default: all shipped)")
    parser.add_argument("--sizes", default="16M,32M,64M", help="sizes, smallest to largest, doubling (default 16M,32M,64M)")
    parser.add_argument("-n", "--iters", type=int, default=3, help="timed operations per size (default 3)")
    parser.add_argument("--delays", action="store_true", help="emulate the scenarios' delays too (needs the netem qdisc)")
    parser.add_argument("--port-queue", choices=PORT_QUEUES, default="fifo",
                        help="how the emulated switch ports queue (topocoll emulate up --port-queue; default fifo)")
    parser.add_argument("--probe-only", action="store_true", help="only probe; write OUT/<scenario>.probe.json")
    parser.add_argument("--resimulate", action="store_true",
                        help="measure nothing: predict every row of OUT/<scenario>.json again from the probed topology it keeps")
    parser.add_argument("-o", "--out", default=str(REPO / "benchmarks" / "results" / "emulated"), help="results folder")
    args = parser.parse_args()
    # SIGTERM (kill, a job scheduler) unwinds like Ctrl-C, so that the cluster comes down: by
    # default Python dies on it at once, leaving namespaces and ranks behind
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.resimulate:
        resimulate(out, args.scenarios.split(","))
        print(write_summary(out))
        return 0
    for name in args.scenarios.split(","):
        result = measure(name, args.sizes.split(","), args.iters, args.delays, args.port_queue, args.probe_only)
        result["command"] = "sudo .venv/bin/python benchmarks/emulated.py " + " ".join(sys.argv[1:])
        if args.probe_only:
            (out / f"{name}.probe.json").write_text(_without_run_dir(json.dumps(result, indent=1, sort_keys=True)) + "\n")
            say(table([result]))
            continue
        (out / f"{name}.json").write_text(_without_run_dir(json.dumps(result, indent=1, sort_keys=True)) + "\n")
        plot(result, out / f"{name}.png")
        say(table([result]))
    if args.probe_only:
        return 0
    print(write_summary(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
