"""``topocoll synthesize`` and ``topocoll verify``: the solver on the command line."""

from __future__ import annotations

import argparse
import sys
import time

from topocoll.errors import ScheduleError, UsageError
from topocoll.fileio import check_output_path, write_atomic
from topocoll.solver.bound import Bound, cut_bound, in_network_bound
from topocoll.solver.lp import SOLVERS
from topocoll.solver.planner import DEFAULT_PER_MESSAGE_OVERHEAD_S, plan_collective
from topocoll.solver.rail_packing import RAIL_TREES
from topocoll.solver.rule_schedule import (
    EXPAND_MAX_TRANSFERS,
    RULE_COLLECTIVES,
    RuleSchedule,
    load_schedule_or_rule,
    synthesize_by_rule,
)
from topocoll.solver.schedule import FORMAT_RULE, FORMAT_VERSIONS, Collective, Schedule
from topocoll.solver.synthesize import SynthesisOptions
from topocoll.solver.verify import require_topology_digest, verify
from topocoll.topo.io import load_topology
from topocoll.topo.model import Topology
from topocoll.units import format_bandwidth, format_size, format_time, parse_size

SYNTHESIZE_EPILOG = """\
examples:
  topocoll synthesize --topology dgx1.json --collective allreduce -o ar.json
  topocoll synthesize --topology node.xml --collective allgather --ranks gpu0,gpu3,gpu5 -o ag.json
  topocoll synthesize --topology cluster.json --collective broadcast --root 3 --size 4K -o bc.json
  topocoll synthesize --topology h100x128.json --collective allreduce --format 2 -o ar.json

--format 2 writes the compact form (topocoll.schedule/2: each path once, transfers as path
numbers grouped by chunk), a tenth of the size or less for large clusters; the default, format 1,
spells out every transfer as contract 2 of the design describes. Every command reads both.

--format 3 (topocoll.schedule/3) keeps a schedule over several machines by its parts: per rail
the routes between consecutive machines, per machine its own trees, and the rule composing
them, a file linear in the ranks (about 1 MB for an allreduce of 1024 GPUs, where format 2 takes
14 MB). It is the hierarchical LP schedule, bandwidth-optimal and one piece deep, of allgather,
reduce_scatter or allreduce over the same number of ranks on each of two or more machines,
written without weighing it against the baselines (--size only sets the figures). Every
command reads it, spelling it out, up to 20 million transfers; verify checks larger ones by
their parts.

The schedule is verified before it is written. Without --size the bandwidth-optimal schedule
is chosen; with --size the one with the lowest predicted time at that size (small messages get
shallow trees or recursive doubling), by the event simulator where it is affordable, else the
alpha-beta model. When the LP fails or runs out of time, the
best verified baseline is written with a warning.
"""

VERIFY_EPILOG = """\
examples:
  topocoll verify ar.json --topology dgx1.json
  topocoll verify ar.json --topology dgx1.json --size 256M

Exit status 0 when the schedule implements its collective on the topology, 1 when not, and
2 when it cannot be checked: an unreadable file, or a schedule without a topology digest
(re-synthesize it with topocoll synthesize).
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``synthesize`` and ``verify`` to the ``topocoll`` parser."""
    p = subparsers.add_parser(
        "synthesize",
        help="synthesize an optimal schedule for a collective",
        description="Synthesize a multi-path schedule by LP tree packing, compare it with the cut "
        "bound and the baselines, verify it and write it as JSON.",
        epilog=SYNTHESIZE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--topology", required=True, metavar="FILE", help="topology: JSON, NCCL XML, nvidia-smi or rocm-smi text")
    p.add_argument("--collective", required=True, help="allreduce, allgather, reduce_scatter, broadcast or reduce")
    p.add_argument("--ranks", metavar="NODE,NODE,...", help="topology nodes of the ranks in rank order (default: every GPU/host)")
    p.add_argument("--root", type=int, help="root rank for broadcast and reduce (default 0)")
    p.add_argument("--size", metavar="BYTES", help="message size (K/M/G suffixes), chooses pipelining and algorithm")
    p.add_argument("--time-limit", type=float, default=60.0, metavar="S", help="LP time budget in seconds (default 60)")
    p.add_argument("--solver", choices=SOLVERS, default="highs", help="LP solver (default highs)")
    p.add_argument(
        "--overhead-us",
        type=float,
        default=DEFAULT_PER_MESSAGE_OVERHEAD_S * 1e6,
        metavar="US",
        help=f"software cost per step in the alpha-beta model, µs (default {DEFAULT_PER_MESSAGE_OVERHEAD_S * 1e6:g})",
    )
    p.add_argument("-o", "--output", required=True, metavar="SCHEDULE.json", help="where to write the schedule")
    add_format_option(p, by_rule=True)
    p.add_argument(
        "--rail-tree",
        choices=RAIL_TREES,
        default="chain",
        help="with --format 3, the tree each rank's data follows from machine to machine: chain (default; "
        "neighbours, for oversubscribed networks) or binomial (log2(machines) deep, for non-blocking ones)",
    )
    p.set_defaults(func=run_synthesize)

    v = subparsers.add_parser(
        "verify",
        help="check a schedule against a topology",
        description="Replay a schedule symbolically: correctness of the collective, paths against the "
        "topology, bandwidth time, alpha-beta time and distance to the cut bound.",
        epilog=VERIFY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    v.add_argument("schedule", metavar="SCHEDULE.json")
    v.add_argument("--topology", required=True, metavar="FILE")
    v.add_argument("--size", metavar="BYTES", default="256M", help="size for the reported times (default 256M)")
    v.add_argument("--overhead-us", type=float, default=DEFAULT_PER_MESSAGE_OVERHEAD_S * 1e6, metavar="US")
    v.set_defaults(func=run_verify)


#: Above this size a format-1 schedule file gets a hint to write format 2 instead: format 1 reads
#: at about 13 MB/s on 2 cores (211 MB in 16 s, ``benchmarks/results/scale.md``' 1024-GPU
#: allreduce), so such a file takes seconds to load wherever it is used.
COMPACT_HINT_BYTES = 50_000_000


def add_format_option(parser: argparse.ArgumentParser, by_rule: bool = False) -> None:
    """``--format {1,2}`` (and 3 where ``by_rule``): which schedule file format to write."""
    parser.add_argument(
        "--format",
        type=int,
        choices=sorted(FORMAT_VERSIONS) + ([3] if by_rule else []),
        default=1,
        help="schedule file format: 1 spells out every transfer (default), 2 is the compact form for large clusters"
        + (", 3 describes a multi-machine schedule by rule (thousands of GPUs)" if by_rule else ""),
    )


def rank_nodes(topology: Topology, text: str | None) -> tuple[str, ...]:
    """The nodes ``--ranks NODE,NODE,...`` names (default: every compute node), each checked."""
    if text is None:
        return topology.compute_nodes()
    ranks = tuple(part.strip() for part in text.split(",") if part.strip())
    for node_id in ranks:
        if not topology.graph.has_node(node_id):
            raise UsageError(f"--ranks: no node {node_id!r} in the topology")
    return ranks


def _size(text: str | None) -> int | None:
    if text is None:
        return None
    size = parse_size(text, "--size")
    if size <= 0:
        raise UsageError(f"--size must be > 0 bytes, got {text!r}")
    return size


def _bandwidth_line(label: str, size: float, time_s: float, bound: Bound, extra: str = "") -> str:
    percent = 100.0 * bound.time_s(size) / time_s
    return f"{label:<12}algbw {format_bandwidth(size / time_s):>12}  {percent:6.2f} % of bound{extra}"


def run_synthesize(args: argparse.Namespace) -> int:
    """Handler of ``topocoll synthesize``."""
    collective = Collective.parse(args.collective)
    check_output_path(args.output, "-o")
    topology = load_topology(args.topology)
    ranks = rank_nodes(topology, args.ranks)
    size = _size(args.size)
    root = (args.root if args.root is not None else 0) if collective.is_rooted else None
    if args.root is not None and not collective.is_rooted:
        raise UsageError(f"--root applies to broadcast and reduce, not {collective.value}")
    if args.rail_tree != "chain" and args.format != 3:
        raise UsageError("--rail-tree applies to --format 3 (otherwise the planner weighs both rail trees)")
    options = SynthesisOptions(time_limit_s=args.time_limit, solver=args.solver, rail_tree=args.rail_tree)
    if args.format == 3:
        return _synthesize_by_rule(args, topology, collective, ranks, size, options)
    started = time.perf_counter()
    result = plan_collective(
        topology, collective, ranks, root, size, per_message_overhead_s=args.overhead_us * 1e-6, options=options
    )
    elapsed = time.perf_counter() - started
    from topocoll.topo.merge import planning_warnings

    for warning in [*planning_warnings(topology), *result.warnings]:
        print(f"topocoll: warning: {warning}", file=sys.stderr)
    report_size = size if size is not None else 1 << 28
    chosen = result.chosen
    bound = result.bound
    lines = [
        f"{'topology':<12}{args.topology} ({topology.digest()[:19]}…)",
        f"{'collective':<12}{collective.value} over {len(ranks)} ranks"
        + (f", root {root}" if root is not None else "")
        + f", size {format_size(report_size)}{'' if size else ' (for the figures below)'}",
        f"{'bound':<12}algbw {format_bandwidth(bound.algbw_bytes_per_s):>12}  binding set: {', '.join(bound.bottleneck[:6])}"
        + (" …" if len(bound.bottleneck) > 6 else ""),
        _bandwidth_line(
            "schedule",
            report_size,
            chosen.t_bw_s_per_byte * report_size,
            bound,
            f"  [{chosen.name}, {result.status.value}, {len(chosen.schedule.chunks)} chunks, {len(chosen.schedule.steps)} steps]",
        ),
    ]
    in_switch = in_network_bound(topology, collective, ranks)
    if in_switch is not None and in_switch.algbw_bytes_per_s > bound.algbw_bytes_per_s:
        lines.append(
            f"{'in-switch':<12}algbw {format_bandwidth(in_switch.algbw_bytes_per_s):>12}  with {in_switch.mechanism} "
            "(reduction inside the NVSwitches): not for point-to-point schedules, so NCCL's NVLS may pass the bound above"
        )
    if size is not None:
        model = "event simulator" if result.model == "events" else "alpha-beta model"
        lines.append(f"{'':<12}predicted time {format_time(chosen.predicted_time_s)} at {format_size(size)} ({model})")
    for label, name, what in (("ring", "ring", ""), ("rings", "multichannel_ring", "  [NCCL-style, one ring per channel]")):
        candidate = result.candidate(name)
        if candidate is not None:
            lines.append(_bandwidth_line(label, report_size, candidate.t_bw_s_per_byte * report_size, bound, what))
        else:
            lines.append(f"{label:<12}n/a (not built for this many ranks)")
    lines.append(f"{'solved in':<12}{elapsed:.2f} s ({options.solver})")
    text = chosen.schedule.to_json(args.format)
    write_atomic(args.output, text)
    lines.append(f"{'wrote':<12}{args.output} ({FORMAT_VERSIONS[args.format]}, {len(text) / 1e6:.1f} MB)")
    if args.format == 1 and len(text) > COMPACT_HINT_BYTES:
        lines.append(f"{'':<12}--format 2 writes the same schedule in a tenth of the size or less, read several times faster")
    print("\n".join(lines))
    return 0


def _synthesize_by_rule(
    args: argparse.Namespace, topology: Topology, collective: Collective, ranks: tuple[str, ...], size: int | None, options: SynthesisOptions
) -> int:
    """``topocoll synthesize --format 3``: the hierarchical schedule by rule, not planned."""
    if collective not in RULE_COLLECTIVES:
        raise UsageError(f"--format 3 describes allgather, reduce_scatter and allreduce, not {collective.value}")
    started = time.perf_counter()
    schedule, bound = synthesize_by_rule(topology, collective, ranks, options)
    elapsed = time.perf_counter() - started
    t_bw_per_byte, busiest = schedule.t_bw_s_per_byte(topology)
    report_size = size if size is not None else 1 << 28
    parts = schedule.gather or schedule.scatter
    text = schedule.to_json()
    write_atomic(args.output, text)
    print("\n".join([
        f"{'topology':<12}{args.topology} ({topology.digest()[:19]}…)",
        f"{'collective':<12}{collective.value} over {len(ranks)} ranks on {len(parts.hosts)} machines, size {format_size(report_size)}",
        f"{'bound':<12}algbw {format_bandwidth(bound.algbw_bytes_per_s):>12}",
        _bandwidth_line(
            "schedule", report_size, t_bw_per_byte * report_size, bound,
            f"  [hierarchical by rule, {args.rail_tree} rail tree, {parts.tree_count} trees, pipeline {schedule.pipeline}; "
            f"busiest link {busiest[0]} -> {busiest[1]}]",
        ),
        f"{'solved in':<12}{elapsed:.2f} s ({options.solver})",
        f"{'wrote':<12}{args.output} ({FORMAT_RULE}, {len(text) / 1e6:.1f} MB)",
    ]))
    return 0


def run_verify(args: argparse.Namespace) -> int:
    """Handler of ``topocoll verify``."""
    size = _size(args.size)
    schedule = load_schedule_or_rule(args.schedule)
    if isinstance(schedule, RuleSchedule):
        if schedule.transfers_at_least() > EXPAND_MAX_TRANSFERS:
            return _verify_by_parts(args, schedule, size)
        schedule = schedule.expand(args.schedule)
    require_topology_digest(schedule, args.schedule)
    topology = load_topology(args.topology)
    result = verify(schedule, topology, size_bytes=size, per_message_overhead_s=args.overhead_us * 1e-6)
    print(f"{'schedule':<12}{args.schedule}: {schedule.collective.value} over {len(schedule.ranks)} ranks, "
          f"{len(schedule.chunks)} chunks, {len(schedule.steps)} steps ({schedule.name or 'unnamed'})")
    if not result.ok:
        print(f"{'correct':<12}NO: {result.error_count} error(s)")
        for error in result.errors:
            print(f"{'':<12}{error}")
        return 1
    bound = _schedule_bound(schedule, topology)
    print(f"{'correct':<12}yes")
    print(f"{'T_bw':<12}{format_time(result.t_bw_s)} at {format_size(size)}"
          + (f" (bottleneck {result.bottleneck_link[0]} -> {result.bottleneck_link[1]})" if result.bottleneck_link else ""))
    print(f"{'alpha-beta':<12}{format_time(result.alpha_beta_time_s)} at {format_size(size)}")
    print(_bandwidth_line("bandwidth", size, result.t_bw_s, bound))
    print(f"{'bound':<12}algbw {format_bandwidth(bound.algbw_bytes_per_s):>12}")
    return 0


def _verify_by_parts(args: argparse.Namespace, schedule: RuleSchedule, size: int) -> int:
    """``topocoll verify`` of a schedule by rule too large to spell out: checked by its parts."""
    topology = load_topology(args.topology)
    print(f"{'schedule':<12}{args.schedule}: {schedule.collective.value} over {len(schedule.ranks)} ranks, by rule "
          f"({schedule.transfers_at_least() / 1e6:.0f} million transfers and more spelt out: checked by its parts)")
    try:
        schedule.check(topology)
    except ScheduleError as exc:
        print(f"{'correct':<12}NO: {exc}")
        return 1
    t_bw_per_byte, busiest = schedule.t_bw_s_per_byte(topology)
    bound = cut_bound(topology, schedule.collective, schedule.ranks)
    print(f"{'correct':<12}yes (every route and host tree checked; each composed tree spans the ranks)")
    print(f"{'T_bw':<12}{format_time(t_bw_per_byte * size)} at {format_size(size)} (bottleneck {busiest[0]} -> {busiest[1]})")
    print(_bandwidth_line("bandwidth", size, t_bw_per_byte * size, bound))
    print(f"{'bound':<12}algbw {format_bandwidth(bound.algbw_bytes_per_s):>12}")
    return 0


def _schedule_bound(schedule: Schedule, topology: Topology) -> Bound:
    """The cut bound a verified schedule is measured against; an all-to-all's is its matrix's
    (:func:`topocoll.solver.traffic.traffic_bound`) per byte of the schedule's buffer size."""
    if not schedule.collective.is_routed:
        return cut_bound(topology, schedule.collective, schedule.ranks, schedule.root)
    from topocoll.solver.traffic import traffic_bound  # numpy and scipy, only for an all-to-all

    found = traffic_bound(topology, schedule.ranks, schedule.matrix_bytes)
    return Bound(schedule.collective, schedule.ranks, found.time_s / (schedule.reference_bytes or 1.0), found.cut)
