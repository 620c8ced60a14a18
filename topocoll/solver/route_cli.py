"""``topocoll route``: route an all-to-all traffic matrix over a topology, next to its bound."""

from __future__ import annotations

import argparse
import csv
import io
import time
from collections.abc import Sequence

import numpy as np

from topocoll import fileio
from topocoll.errors import FormatError, SolverError, UsageError
from topocoll.fileio import check_output_path, write_atomic
from topocoll.solver import traffic
from topocoll.solver.cli import add_format_option, rank_nodes
from topocoll.topo.io import load_topology
from topocoll.topo.model import Topology
from topocoll.units import format_time, parse_size

MATRIX_LIMIT_BYTES = 64 * fileio.MIB
"""Largest matrix file read: 8192 ranks of 8-byte numbers as text stay far below it."""

EPILOG = """\
examples:
  topocoll route --topology cluster.json --pattern zipf --bytes-per-rank 64M
  topocoll route --topology cluster.json --pattern hot --hot-rank 3 --bytes-per-rank 16M -o r.json
  topocoll route --topology node.xml --matrix moe-step.csv --method fast

The matrix holds the bytes rank i sends to rank j (row i, column j), as JSON (a list of rows)
or CSV (one row per line; sizes may carry K/M/G suffixes). Every method is printed with its
bandwidth time (the busiest link's load over its bandwidth) and its ratio to the cut bound:
lp (the optimum, multi-path with relays), fast (the per-step method), single_path (one widest
route per pair, as NCCL sends) and direct (no relay through another rank). -o writes the routing
of --method (default lp) as an all-to-all schedule (topocoll.schedule/1 JSON, collective
alltoall, the matrix included), which 'topocoll verify' checks: every pair's bytes delivered
exactly once, every path a route of the topology.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``route`` to the ``topocoll`` parser."""
    p = subparsers.add_parser(
        "route",
        help="route an all-to-all traffic matrix over several paths per pair",
        description="Split each pair's bytes of an all-to-all over several paths (other NICs, rails, relays "
        "through other ranks) so that the busiest link finishes first, and compare with one path per pair "
        "and with the cut bound.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--topology", required=True, metavar="FILE", help="topology: JSON, NCCL XML, nvidia-smi or rocm-smi text")
    p.add_argument("--ranks", metavar="NODE,NODE,...", help="topology nodes of the ranks in rank order (default: every GPU/host)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--matrix", metavar="FILE", help="bytes per ordered pair, JSON or CSV")
    source.add_argument("--pattern", choices=traffic.PATTERNS, help="a synthetic matrix instead of a file")
    p.add_argument("--bytes-per-rank", default="64M", metavar="BYTES", help="bytes each rank sends, for --pattern (default 64M)")
    p.add_argument("--zipf-s", type=float, default=1.2, metavar="S", help="Zipf exponent of --pattern zipf (default 1.2)")
    p.add_argument("--hot-rank", type=int, default=0, metavar="R", help="the hot expert of --pattern hot (default 0)")
    p.add_argument("--seed", type=int, default=0, help="order of --pattern zipf's destinations (default 0)")
    p.add_argument("--method", choices=("lp", "fast", "single_path", "direct"), default="lp", help="the routing -o writes (default lp)")
    p.add_argument("-o", "--output", metavar="SCHEDULE.json", help="write the routing of --method as an all-to-all schedule")
    add_format_option(p)
    p.set_defaults(func=run_route)


def load_matrix(path: str, n: int) -> np.ndarray:
    """The matrix in ``path`` (JSON list of rows, or CSV), checked to be ``n x n``.

    Raises
    ------
    FormatError
        Not JSON or CSV of numbers, naming the file and the row.
        Also: not ``n x n``, or a negative or non-finite entry (:func:`topocoll.solver.traffic.check_matrix`).
    """
    text = fileio.read_input(path, MATRIX_LIMIT_BYTES, "traffic matrix")
    if text.lstrip().startswith("["):
        rows = fileio.loads_json(text, path)
        if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
            raise FormatError(f"{path}: expected a JSON list of rows (lists of numbers)")
    else:
        rows = [row for row in csv.reader(io.StringIO(text)) if any(cell.strip() for cell in row)]
    matrix = []
    for i, row in enumerate(rows):
        try:
            matrix.append([_bytes(cell) for cell in row])
        except (TypeError, ValueError, UsageError):
            raise FormatError(f"{path}: row {i}: expected numbers of bytes, got {row!r:.80}") from None
    try:
        return traffic.check_matrix(matrix, n)
    except SolverError as exc:
        raise FormatError(f"{path}: {exc}") from None


def _bytes(cell: object) -> float:
    """A number, or a size with a K/M/G suffix (``"64M"``)."""
    if isinstance(cell, bool):
        raise TypeError("a boolean is not a number of bytes")
    if isinstance(cell, (int, float)):
        return float(cell)
    text = str(cell).strip()
    try:
        return float(text)
    except ValueError:
        return float(parse_size(text, "bytes"))


def run_route(args: argparse.Namespace) -> int:
    """Handler of ``topocoll route``."""
    if args.output:
        check_output_path(args.output, "-o", (".json",))
    topology = load_topology(args.topology)
    ranks = rank_nodes(topology, args.ranks)
    if args.matrix:
        matrix = load_matrix(args.matrix, len(ranks))
        what = args.matrix
    else:
        size = parse_size(args.bytes_per_rank, "--bytes-per-rank")
        matrix = traffic.traffic_matrix(args.pattern, len(ranks), size, zipf_s=args.zipf_s, hot_rank=args.hot_rank, seed=args.seed)
        what = f"{args.pattern} pattern, {args.bytes_per_rank} per rank"
    bound = traffic.traffic_bound(topology, ranks, matrix)
    print(f"{'topology':<12}{args.topology} ({topology.digest()[:19]}...)")
    print(f"{'traffic':<12}{what}: {len(ranks)} ranks, {matrix.sum() / 1e6:.1f} MB in all")
    print(f"{'bound':<12}{format_time(bound.time_s):>12}   ({'out of' if bound.outbound else 'into'} {', '.join(bound.cut[:4])}{' ...' if len(bound.cut) > 4 else ''})")
    routings = {}
    for method, make in _methods(topology, ranks, matrix):
        started = time.perf_counter()
        routing = make()
        planned_s = time.perf_counter() - started
        routings[method] = routing
        ratio = routing.time_s / bound.time_s if bound.time_s > 0 else 1.0
        print(
            f"{method:<12}{format_time(routing.time_s):>12}   {ratio:5.2f}x the bound, {routing.paths_per_pair():.1f} paths/pair, "
            f"planned in {format_time(planned_s)}"
        )
    if args.output:
        chosen = routings[args.method]
        write_atomic(args.output, traffic.routing_schedule(chosen, topology, matrix).to_json(args.format))
        print(f"{'wrote':<12}{args.output} ({args.method})")
    return 0


def _methods(topology: Topology, ranks: Sequence[str], matrix: np.ndarray):
    yield "lp", lambda: traffic.route_lp(topology, ranks, matrix)
    yield "fast", lambda: traffic.route_fast(traffic.candidate_paths(topology, ranks), matrix)
    yield "single_path", lambda: traffic.route_single_path(topology, ranks, matrix)
    yield "direct", lambda: traffic.route_direct(topology, ranks, matrix)
