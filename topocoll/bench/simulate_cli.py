"""``topocoll simulate``: the benchmark's table, predicted.

For one topology and one collective it predicts time, algbw and busbw per size for topocoll's
schedule (synthesized, or read with ``--schedule``) and for the baselines (ring, double binary
tree, hierarchical), next to the cut bound, in the same nccl-tests-style table the benchmark
prints, so that schedules can be compared before the machines exist.

Two models: the event simulator (:mod:`topocoll.solver.events`: messages as flows sharing links
max-min fairly, started when their data arrived) and the α-β model
(:mod:`topocoll.solver.alpha_beta`: steps in lock step). ``--model auto`` runs the event
simulator where it is affordable (:data:`EVENT_MODEL_BUDGET`) and the α-β model above that.
After the table come the busiest links of topocoll's schedule at the largest size; ``--png``
draws them on the topology.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from topocoll.errors import ScheduleError, TopocollError
from topocoll.fileio import check_output_path
from topocoll.topo.model import LinkKind

__all__ = ["register", "run_simulate", "simulate_report", "parse_ranks", "DEFAULT_BASELINES"]

log = logging.getLogger(__name__)

DEFAULT_BASELINES = ("ring", "multichannel_ring", "double_binary_tree", "hierarchical")
"""The baselines compared by default (names of :data:`topocoll.solver.baselines.BASELINES`)."""

TOPOCOLL_LABEL = "topocoll"
NCCL_LABEL = "nccl"

MODELS = ("auto", "events", "alpha-beta")
"""``--model`` choices."""

EVENT_MODEL_BUDGET = 100_000
"""``--model auto`` runs the event simulator when messages x sizes, summed over the schedules
compared, is at most this: 15-30 s on 2 cores (150-310 us per message and size,
``benchmarks/results/events_bench.md``), beyond which the α-β model answers."""

BUSIEST_LINKS_SHOWN = 8
"""Links listed after the table."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``simulate`` to the ``topocoll`` parser."""
    parser = subparsers.add_parser(
        "simulate",
        help="predict time and bandwidth per size for topocoll's schedule and the baselines",
        description=(
            "Predict the nccl-tests table (time, algbw, busbw per size) for topocoll's schedule and\n"
            "the baselines (one ring, NCCL-style multi-channel rings, double binary tree, hierarchical),\n"
            "next to the cut bound, by the event simulator where affordable or the alpha-beta model;\n"
            "then the busiest links of topocoll's schedule at the largest size.\n\n"
            "examples:\n"
            "  topocoll simulate --topology dgx.json --collective allreduce --sizes 1K:1G\n"
            "  topocoll simulate --topology dgx.json --collective allgather --sizes 64M --png load.png\n"
            "  topocoll simulate --topology cluster.json --schedule ar.json --model alpha-beta -J pred.json --plot busbw.png"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--topology", required=True, metavar="FILE", help="topology file (JSON, NCCL XML, nvidia-smi or rocm-smi text)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--schedule", metavar="FILE", help="topocoll's schedule to evaluate (JSON); sets the collective and ranks")
    what.add_argument("--collective", help="synthesize a schedule for this collective (allreduce, allgather, reduce_scatter, broadcast, reduce)")
    parser.add_argument("--sizes", default="1K:1G", help="MIN:MAX[:FACTOR] (factor 2 by default) or a comma list; K/M/G suffixes (default 1K:1G)")
    parser.add_argument("--ranks", help="the ranks' nodes, comma-separated, or a number N for the first N compute nodes (default: all)")
    parser.add_argument("--root", type=int, default=0, help="root rank of broadcast and reduce (default 0)")
    parser.add_argument("-d", "--datatype", default="float", help="element type for the count column (default float)")
    parser.add_argument("--baselines", default=",".join(DEFAULT_BASELINES), help=f"comma list, or 'none' (default {','.join(DEFAULT_BASELINES)})")
    parser.add_argument(
        "--overhead-us", type=float, default=None,
        help="software overhead per message (event simulator) or per step's messages (alpha-beta) in microseconds "
        "(default: the planner's, NCCL's base ring latency)",
    )
    parser.add_argument(
        "--model", default="auto", metavar="{" + ",".join(MODELS) + "}",
        help="events: messages as flows sharing links, each started when its data arrived; alpha-beta: steps in lock step; "
        "auto (default): events where affordable, else alpha-beta",
    )
    parser.add_argument(
        "--nccl", action="store_true",
        help="add NCCL's own collective (topocoll's calibrated model of its ring, tree and NVLS algorithms) and run every "
        "schedule as on NCCL: NCCL's host cost per call (a floor under each call's time), NCCL's share of each link, and topocoll handing allreduce and "
        "allgather to NCCL where NCCL is predicted faster (GPU ranks only)",
    )
    parser.add_argument("--png", metavar="FILE", help="draw the topology with the link load of topocoll's schedule at the largest size (PNG)")
    parser.add_argument("-J", "--json", metavar="FILE", help="write the predictions as JSON")
    parser.add_argument("--csv", metavar="FILE", help="write the table as CSV")
    parser.add_argument("--plot", metavar="FILE", help="plot predicted busbw against size (PNG)")
    parser.set_defaults(func=run_simulate)


def parse_ranks(text: str | None, compute_nodes: Sequence[str]) -> tuple[str, ...]:
    """Nodes named by ``--ranks``: None (all), ``N`` (the first N) or ``a,b,c``.

    Raises
    ------
    ScheduleError
        A count out of range, an unknown or repeated node.

    Examples
    --------
    >>> parse_ranks("2", ("gpu0", "gpu1", "gpu2"))
    ('gpu0', 'gpu1')
    """
    compute = tuple(compute_nodes)
    if text is None or not text.strip():
        return compute
    text = text.strip()
    if text.isdigit():
        n = int(text)
        if not 2 <= n <= len(compute):
            raise ScheduleError(f"--ranks {n}: the topology has {len(compute)} compute nodes, pick 2..{len(compute)}")
        return compute[:n]
    nodes = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [n for n in nodes if n not in compute]
    if unknown:
        raise ScheduleError(f"--ranks: {unknown[0]!r} is not a compute node of the topology ({', '.join(compute[:6])}{' ...' if len(compute) > 6 else ''})")
    if len(set(nodes)) != len(nodes):
        raise ScheduleError("--ranks: a node is named twice")
    if len(nodes) < 2:
        raise ScheduleError("--ranks: a collective needs at least 2 ranks")
    return nodes


def planned_candidates(topology: Any, collective: Any, ranks: tuple[str, ...], root: int | None, per_message_overhead_s: float) -> tuple[Any, ...]:
    """Every verified candidate topocoll's planner weighs (synthesized layouts and baselines),
    as :class:`topocoll.solver.planner.Candidate` (schedule and verification).

    :func:`topocoll.solver.plan` picks, for a given size, the candidate with the lowest α-β
    time; the candidates themselves do not depend on the size, so they are built once and the
    choice is replayed per size by :func:`simulate_report`.
    """
    from topocoll.solver import plan_collective

    # by name: the planner parses the collective from text
    result = plan_collective(topology, collective.value, list(ranks), root=root, per_message_overhead_s=per_message_overhead_s)
    for warning in result.warnings:
        log.warning("%s", warning)
    return result.candidates


def simulate_report(
    topology: Any,
    collective: Any,
    ranks: tuple[str, ...],
    sizes: Sequence[int],
    *,
    root: int | None = None,
    schedule: Any = None,
    baselines: Sequence[str] = DEFAULT_BASELINES,
    dtype_name: str = "float",
    per_message_overhead_s: float = 0.0,
    config: dict[str, Any] | None = None,
    make_candidates: Callable[..., tuple[Any, ...]] = planned_candidates,
    model: str = "alpha-beta",
    nccl: bool = False,
) -> Any:
    """Predict the benchmark table for topocoll's schedule and the baselines.

    Parameters
    ----------
    topology : Topology
    collective : Collective
    ranks : tuple of str
        Rank nodes in rank order.
    sizes : sequence of int
        nccl-tests sizes S in bytes.
    root : int, optional
        Root of broadcast / reduce.
    schedule : Schedule, optional
        topocoll's schedule. When None, topocoll's series is, at each size, the candidate of
        :func:`planned_candidates` that the planner's rule (:func:`topocoll.solver.planner.choose`) picks.
    baselines : sequence of str
        Names in :data:`topocoll.solver.baselines.BASELINES`.
    dtype_name : str
        nccl-tests type name for the ``count`` column.
    per_message_overhead_s : float
        α beyond the links' latency, per step.
    config : dict, optional
        Extra settings to record in the report.
    make_candidates : callable
        ``(topology, collective, ranks, root, per_message_overhead_s) -> candidates`` (each with
        ``schedule`` and ``t_bw_s_per_byte``) to choose topocoll's schedule from.
    model : str
        ``"events"``, ``"alpha-beta"`` or ``"auto"`` (see :data:`EVENT_MODEL_BUDGET`).
    nccl : bool
        Add NCCL's own collective (:mod:`topocoll.solver.nccl_model`) as the series ``nccl``,
        and run every schedule on NCCL as the CUDA planner does: each takes at least NCCL's
        host cost per call (calls issued back to back overlap it) and reaches NCCL's share of
        each link, and topocoll's series hands the collective to NCCL at the sizes where NCCL
        is predicted faster (for the collectives a ``topo`` group hands over). The ranks must
        be GPUs.

    Returns
    -------
    Report
        ``kind="simulate"``, series ``topocoll`` then the baselines; a baseline that cannot
        build this collective gets empty cells (logged). Its ``config`` records the model that
        ran and, under ``busiest_links``, the links of topocoll's schedule at the largest size.
    """
    from topocoll.bench.collective_table import COLLECTIVES, DTYPE_ITEMSIZES, canonical_dtype_name
    from topocoll.bench.report import Measurement, Report, Row
    from topocoll.solver.baselines import BASELINES
    from topocoll.solver.bound import cut_bound, in_network_bound
    from topocoll.solver.alpha_beta import simulate
    from topocoll.solver.events import event_sweep
    from topocoll.solver.metrics import algbw_bytes_per_s, busbw_bytes_per_s
    from topocoll.solver.planner import backend_topology, choose, max_network_flows_per_link
    from topocoll.solver.request import check_request
    from topocoll.solver.verify import verify

    spec = COLLECTIVES[collective]
    dtype_name = canonical_dtype_name(dtype_name)
    itemsize = DTYPE_ITEMSIZES[dtype_name]
    n = len(ranks)
    root = root if spec.rooted else None
    ranks = check_request(topology, collective, ranks, root)
    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        raise ScheduleError(f"unknown baseline {unknown[0]!r}; expected some of {', '.join(BASELINES)}")
    native = None
    if nccl:
        from topocoll.collectives.schedule_source import NCCL_NATIVE_COLLECTIVES
        from topocoll.solver.nccl_model import nccl_native

        native = nccl_native(topology, ranks)
        if native is None:
            raise ScheduleError("--nccl models NCCL's collectives, which run on GPUs: the ranks are not all GPUs")
        hands_over = schedule is None and collective in NCCL_NATIVE_COLLECTIVES
        held_topology = backend_topology(native, topology)  # where schedules run as NCCL's transfers
    # the planner verified its candidates already: their bandwidth times come with them
    planned = () if schedule is not None else make_candidates(topology, collective, ranks, root, per_message_overhead_s)
    candidates = (schedule,) if schedule is not None else tuple(c.schedule for c in planned)
    bandwidth_times = {id(c.schedule): c.t_bw_s_per_byte for c in planned}
    baseline_schedules: list[tuple[str, Any]] = []
    for name in baselines:
        try:
            baseline_schedules.append((name, BASELINES[name](topology, collective, list(ranks), root=root)))
        except TopocollError as exc:
            log.warning("baseline %s: %s", name, exc)
            baseline_schedules.append((name, None))
    counts = [spec.counts(size, itemsize, n) for size in sizes]
    counts = [c for c in counts if c.in_count > 0 and c.out_count > 0]
    effective = [c.size_bytes for c in counts]
    compared = [*candidates, *(s for _, s in baseline_schedules if s is not None)]
    model = resolve_model(model, compared, len(effective))

    def points_of(sched: Any, on: Any = topology, overhead_s: float = per_message_overhead_s) -> tuple[Any, ...]:
        if model == "events":
            return event_sweep(sched, on, effective, overhead_s)
        return simulate(sched, on, effective, overhead_s)

    def measured(size: int, time_s: float) -> Measurement:
        return Measurement(time_s, algbw_bytes_per_s(size, time_s), busbw_bytes_per_s(collective, size, time_s, n))

    def on_nccl(sched: Any) -> list[Measurement]:
        points = points_of(sched, held_topology, per_message_overhead_s * native.latency_factor)
        return [measured(size, native.call_s(p.time_s)) for size, p in zip(effective, points)]

    def t_bw_of(sched: Any) -> float:
        if id(sched) not in bandwidth_times:
            bandwidth_times[id(sched)] = verify(sched, topology).t_bw_s_per_byte
        return bandwidth_times[id(sched)]

    def predict(sched: Any, points: Sequence[Any] | None = None) -> list[Measurement]:
        if native is not None:
            return on_nccl(sched)
        points = points if points is not None else points_of(sched)
        return [Measurement(p.time_s, p.algbw_bytes_per_s, p.busbw_bytes_per_s) for p in points]

    # topocoll's series: at each size the candidate the planner's rule picks
    candidate_points = [points_of(c) for c in candidates]
    per_candidate = [predict(c, points) for c, points in zip(candidates, candidate_points)]
    flows = [max_network_flows_per_link(c, topology) for c in candidates]
    steps = [len(c.steps) for c in candidates]
    t_bws = [t_bw_of(c) for c in candidates] if len(candidates) > 1 else None
    nccl_column = [measured(size, native.time_s(collective, size)) for size in effective] if native is not None else []
    chosen: list[Any] = []
    topocoll_column: list[Measurement] = []
    handed: list[int] = []
    for i in range(len(effective)):
        best = choose([per_candidate[k][i].time_s for k in range(len(candidates))], flows, steps, t_bw_s_per_byte=t_bws)
        chosen.append(candidates[best])
        topocoll_column.append(per_candidate[best][i])
        last_point = candidate_points[best][i]
        if native is not None and hands_over and nccl_column[i].time_s < topocoll_column[i].time_s:
            topocoll_column[i] = nccl_column[i]  # the group hands this size to NCCL
            handed.append(effective[i])
    columns: list[list[Measurement | None]] = [list(topocoll_column)]
    for _name, sched in baseline_schedules:
        columns.append(list(predict(sched)) if sched is not None else [None] * len(effective))
    if native is not None:
        columns.append(list(nccl_column))
    predicted = list(zip(*columns)) if effective else []
    bound = cut_bound(topology, collective, ranks, root)
    rows = tuple(
        Row(
            size_bytes=c.size_bytes,
            count=c.count,
            dtype=dtype_name,
            redop="sum" if spec.reduces else "none",
            root=root if spec.rooted else -1,
            results=tuple(results),
            bound_time_s=bound.time_s(c.size_bytes),
        )
        for c, results in zip(counts, predicted)
    )
    digest = topology.digest()
    picked = sorted({(s.name or "unnamed", len(s.steps)) for s in chosen})
    topocoll_text = ", ".join(f"{name} ({steps} steps)" for name, steps in picked) or "-"
    baseline_text = ", ".join(f"{label} {len(s.steps)} steps" for label, s in baseline_schedules if s is not None)
    source = "given schedule" if schedule is not None else f"plan's choice among {len(candidates)} verified candidates per size"
    header = (
        f"topocoll simulate {collective.value}: {n} ranks of {topology.name or '(unnamed)'} ({digest[:19]}...), "
        f"{MODEL_TITLES[model]}, per-message overhead {per_message_overhead_s * 1e6:g} us",
        f"Ranks: {_rank_list(ranks)}" + (f"; root {root}" if root is not None else ""),
        f"topocoll: {source}: {topocoll_text}",
        f"Baselines: {baseline_text or 'none'}",
        "speedup = fastest baseline time / topocoll time; bound = cut-bound algbw; %bound = topocoll algbw / bound",
        "Predicted, not measured: " + MODEL_CAVEATS[model],
    )
    if native is not None:
        header += (
            f"nccl: NCCL's own collective by topocoll's calibrated model ({native.view.machines} machine(s), "
            f"{'NVLS, ' if native.view.nvls else ''}host cost {native.call_overhead_s * 1e6:.1f} us per call, "
            f"the floor of a call's time); schedules run on NCCL: each takes at least that, reaches {native.link_efficiency(LinkKind.NVLINK):.0%} of each link inside a machine and "
            f"{native.link_efficiency(LinkKind.NET):.0%} of each network link, as NCCL's own transfers do, and its latencies "
            f"x {native.latency_factor:.2f}, as NCCL's own",
            "topocoll hands the collective to NCCL at: " + (", ".join(f"{size}" for size in handed) if handed else "no size"),
        )
    in_switch = in_network_bound(topology, collective, ranks)
    if in_switch is not None and in_switch.algbw_bytes_per_s <= bound.algbw_bytes_per_s:
        in_switch = None  # no faster than point-to-point (two GPUs): nothing to say
    if in_switch is not None:
        header += (
            f"In-switch reduction ({in_switch.mechanism}) allows algbw up to {in_switch.algbw_bytes_per_s / 1e9:.2f} GB/s, past the "
            "cut bound: NCCL's NVLS algorithm is not held to it, point-to-point schedules are",
        )
    settings = {
        "topology": {"name": topology.name, "digest": digest, "notes": list(topology.notes), "nodes": list(ranks)},
        "collective": collective.value,
        "sizes_bytes": effective,
        "root": root,
        "datatype": dtype_name,
        "per_message_overhead_s": per_message_overhead_s,
        "model": model,
        "busiest_links": busiest_links(chosen[-1], topology, effective[-1], per_message_overhead_s, model, last_point) if effective else [],
        "topocoll_schedule_per_size": {str(size): (s.name or None) for size, s in zip(effective, chosen)},
        "baselines": {label: (s.name if s is not None else None) for label, s in baseline_schedules},
        "nccl_model": (
            {"handed_to_nccl_sizes_bytes": handed, "call_overhead_s": native.call_overhead_s,
             "link_efficiency": {"inside_machine": native.link_efficiency(LinkKind.NVLINK), "network": native.link_efficiency(LinkKind.NET)},
             "latency_factor": native.latency_factor}
            if native is not None else None
        ),
        "in_switch_bound": (
            {"mechanism": in_switch.mechanism, "algbw_bytes_per_s": in_switch.algbw_bytes_per_s} if in_switch is not None else None
        ),
    }
    settings.update(config or {})
    return Report(
        kind="simulate",
        collective=collective,
        world_size=n,
        series=(TOPOCOLL_LABEL, *(label for label, _ in baseline_schedules), *((NCCL_LABEL,) if native is not None else ())),
        rows=rows,
        header=header,
        config=settings,
        ranks=tuple({"rank": i, "node": node} for i, node in enumerate(ranks)),
        checked=False,
        show_wrong=False,
    )


MODEL_TITLES = {"events": "event simulator", "alpha-beta": "alpha-beta model"}
MODEL_CAVEATS = {
    "events": "messages share links max-min fairly and start when their data arrived; arithmetic is free.",
    "alpha-beta": "steps are barriers, links are shared fluidly, arithmetic is free.",
}


def resolve_model(model: str, schedules: Sequence[Any], sizes: int) -> str:
    """The model ``--model`` names; ``auto`` is the event simulator within :data:`EVENT_MODEL_BUDGET`."""
    if model not in MODELS:
        raise ScheduleError(f"unknown model {model!r}; expected one of {', '.join(MODELS)}")
    if model != "auto":
        return model
    from topocoll.solver.events import message_count

    work = sum(message_count(s) for s in schedules) * max(sizes, 1)
    if work <= EVENT_MODEL_BUDGET:
        return "events"
    log.warning("%d messages x %d sizes is beyond the event simulator's budget here: using the alpha-beta model", work // max(sizes, 1), sizes)
    return "alpha-beta"


def busiest_links(
    schedule: Any, topology: Any, size_bytes: float, per_message_overhead_s: float, model: str = "events", simulated: Any = None
) -> list[dict[str, Any]]:
    """Every link ``schedule`` uses at ``size_bytes``, busiest first, by ``model``.

    Each entry: ``src``, ``dst``, ``bytes``, ``bw_bytes_per_s``, ``utilisation`` (bytes over
    bandwidth x the model's completion time) and ``bottleneck`` (within 1 % of the busiest).
    ``simulated``: the event simulator's result for this schedule and size, when already at hand.
    """
    if model == "events":
        from topocoll.solver.events import event_sweep

        (result,) = (simulated,) if simulated is not None else event_sweep(schedule, topology, [size_bytes], per_message_overhead_s)
        uses = [(u.src, u.dst, u.bytes, u.bw_bytes_per_s) for u in result.links]
        time_s = result.time_s
    else:
        from topocoll.solver.verify import verify

        checked = verify(schedule, topology, size_bytes=size_bytes, per_message_overhead_s=per_message_overhead_s)
        uses = [(a, b, load * size_bytes, topology.capacity(a, b)) for (a, b), load in checked.link_load.items()]
        time_s = checked.alpha_beta_time_s or 0.0
    rows = [
        {"src": a, "dst": b, "bytes": float(carried), "bw_bytes_per_s": float(bw),
         "utilisation": float(carried / (bw * time_s)) if time_s > 0 else 0.0}
        for a, b, carried, bw in uses
    ]
    rows.sort(key=lambda r: (-r["utilisation"], r["src"], r["dst"]))
    top = rows[0]["utilisation"] if rows else 0.0
    for r in rows:
        r["bottleneck"] = bool(r["utilisation"] >= top * 0.99)
    return rows


def _rank_list(ranks: Sequence[str], shown: int = 8) -> str:
    """The ranks' nodes, the first few of a long list and how many more."""
    if len(ranks) <= shown:
        return ", ".join(ranks)
    return f"{', '.join(ranks[:shown])}, ... ({len(ranks)} ranks, to {ranks[-1]})"


def links_text(links: Sequence[dict[str, Any]], size_bytes: float, model: str = "events", shown: int = BUSIEST_LINKS_SHOWN) -> str:
    """The busiest links as ``#`` comment lines after the table."""
    if not links:
        return ""
    lines = [f"# Busiest links of topocoll's schedule at {size_bytes:.0f} B ({MODEL_TITLES[model]}; * = bottleneck):",
             f"# {'link':<36} {'GB':>10} {'GB/s':>9} {'busy %':>7}"]
    for link in links[:shown]:
        name = f"{link['src']} -> {link['dst']}"
        lines.append(
            f"# {name:<36} {link['bytes'] / 1e9:>10.4g} {link['bw_bytes_per_s'] / 1e9:>9.4g} "
            f"{100 * link['utilisation']:>6.1f}{' *' if link['bottleneck'] else ''}"
        )
    if len(links) > shown:
        lines.append(f"# ... {len(links) - shown} more links in the JSON output")
    return "\n".join(lines) + "\n"


def run_simulate(args: argparse.Namespace) -> int:
    """Handler of ``topocoll simulate``; prints the table, writes the requested files."""
    from topocoll.bench.collective_table import BenchArgumentError
    from topocoll.bench.sizes import parse_size_range
    from topocoll.solver.schedule import Collective, load_schedule
    from topocoll.solver.verify import require_topology_digest, verify
    from topocoll.topo.io import load_topology

    from topocoll.solver.planner import DEFAULT_PER_MESSAGE_OVERHEAD_S

    sizes = parse_size_range(args.sizes)
    if args.model not in MODELS:
        raise BenchArgumentError(f"--model {args.model!r}: expected one of {', '.join(MODELS)}")
    overhead_s = DEFAULT_PER_MESSAGE_OVERHEAD_S if args.overhead_us is None else args.overhead_us * 1e-6
    if not overhead_s >= 0:
        raise BenchArgumentError(f"--overhead-us must be >= 0, got {args.overhead_us}")
    for option, path in (("-J", args.json), ("--csv", args.csv), ("--plot", args.plot), ("--png", args.png)):
        if path:
            check_output_path(path, option)
    topology = load_topology(args.topology)
    schedule = None
    if args.schedule:
        schedule = load_schedule(args.schedule)
        collective = schedule.collective
        for node in schedule.ranks:
            topology.node(node)
        require_topology_digest(schedule, args.schedule)
        if schedule.topology_digest != topology.digest():
            raise ScheduleError(f"{args.schedule}: made for another topology ({schedule.topology_digest[:19]}...) than {args.topology}")
        verify(schedule, topology).raise_if_failed(args.schedule)  # predictions of a wrong schedule mean nothing
        ranks = schedule.ranks
        if args.ranks and parse_ranks(args.ranks, topology.compute_nodes()) != ranks:
            raise ScheduleError(f"--ranks differs from the ranks of {args.schedule} ({', '.join(ranks)})")
        root = schedule.root
    else:
        collective = Collective.parse(args.collective)
        ranks = parse_ranks(args.ranks, topology.compute_nodes())
        root = args.root
        if collective.is_rooted and not (root is not None and 0 <= root < len(ranks)):  # the flag, named
            raise BenchArgumentError(f"--root {root} is not a rank of {len(ranks)} (0..{len(ranks) - 1})")
    if collective.is_routed:
        raise BenchArgumentError(
            f"simulate predicts the synthesized collectives; an {collective.value} is routed from its traffic matrix: "
            "'topocoll route' prints its times next to the bound, 'topocoll verify' those of a schedule file"
        )
    baselines = () if args.baselines.strip().lower() == "none" else tuple(b.strip() for b in args.baselines.split(",") if b.strip())
    report = simulate_report(
        topology,
        collective,
        ranks,
        sizes,
        root=root,
        schedule=schedule,
        baselines=baselines,
        dtype_name=args.datatype,
        per_message_overhead_s=overhead_s,
        model=args.model,
        nccl=args.nccl,
    )
    links = report.config["busiest_links"]
    largest = report.rows[-1].size_bytes if report.rows else 0
    sys.stdout.write(report.to_text() + links_text(links, largest, report.config["model"]))
    report.write_outputs(args.json, args.csv, args.plot)
    if args.png:
        from topocoll.topo.draw import draw_topology

        use = {(link["src"], link["dst"]): link["utilisation"] for link in links}
        title = f"{collective.value}, {len(ranks)} ranks of {topology.name or 'topology'}: link load at {largest:.0f} B"
        draw_topology(topology, args.png, title=title, link_utilisation=use)
    return 0
