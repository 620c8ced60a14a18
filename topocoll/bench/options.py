"""``topocoll-bench``'s command line: nccl-tests' options parsed and checked into a :class:`BenchConfig`.

Every rank parses the same command line and checks it before torch.distributed starts
(:func:`validate`), so that a bad argument stops every rank at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from topocoll.bench import collective_table
from topocoll.bench.collective_table import BenchArgumentError, CollectiveSpec, RedOp
from topocoll.bench.sizes import parse_size, sweep
from topocoll.errors import TopocollError
from topocoll.fileio import check_output_path

log = logging.getLogger(__name__)


PROG = "topocoll-bench"


DEFAULT_TIMEOUT_S = 300.0
"""Process-group timeout: torch's own default (30 minutes) would leave a rank whose peer died
waiting for half an hour; five minutes covers a single 8 GiB operation over a 1 GB/s link."""


IGNORED_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("-p", "parallel_init", "threads initialize in parallel (one thread per rank here)"),
    ("-y", "stream_null", "run on CUDA's null stream (collectives run on the current stream)"),
    ("-G", "cudagraph", "CUDA graph launches (collectives are not captured into graphs)"),
    ("-C", "report_cputime", "report CPU time (times are the host's wall clock after synchronizing)"),
    ("-S", "report_timestamps", "print a timestamp per line"),
    ("-R", "local_register", "NCCL buffer registration"),
    ("-x", "cta_policy", "NCCL CTA policy"),
    ("-D", "device_implementation", "NCCL device implementation"),
    ("-V", "device_cta_count", "CTAs of the device implementation"),
    ("-M", "memory", "device memory report"),
    ("-u", "unalign", "misalign the buffers by this many elements"),
    ("-I", "per_iter_timing", "per-iteration CUDA event timing"),
    ("-K", "per_iter_skip", "samples left out of the per-iteration summary"),
)
"""nccl-tests' options (``src/common.cu``) that steer CUDA, NCCL or thread details this
benchmark does not have: (flag, long name, what nccl-tests does with it)."""


BACKENDS = ("topo", "gloo", "nccl")


#: Baselines ``--planner`` can force (topocoll.solver.baselines).
PLANNER_BASELINES = ("ring", "rank_order_ring", "double_binary_tree", "hierarchical", "recursive_doubling")


ALL_OPS = (RedOp.SUM, RedOp.PROD, RedOp.MAX, RedOp.MIN, RedOp.AVG)
"""``-o all``: nccl-tests' order (its ``mulsum``, NCCL's pre-multiplied sum, has no
torch.distributed operation that gloo runs)."""


NOT_RUN_TYPES = "uint32, uint64, f8e4m3, f8e5m2"
"""nccl-tests' ``-d all`` types that torch.distributed's CPU backend does not reduce."""


class _Parser(argparse.ArgumentParser):
    """An argument parser that raises instead of printing usage on every rank."""

    def error(self, message: str) -> NoReturn:
        raise BenchArgumentError(message)


def build_parser() -> argparse.ArgumentParser:
    """The ``topocoll-bench`` parser (nccl-tests' option letters where they exist)."""
    parser = _Parser(
        prog=PROG,
        description="Benchmark a collective with nccl-tests' method and output, next to the baseline backend.",
        epilog="Sizes take K, M and G suffixes (powers of 1024). Only rank 0 prints. nccl-tests command lines run "
        "as they are, e.g. 'mpirun -np 4 --oversubscribe topocoll-bench allreduce -b 8 -e 128M -f 2 -g 1' "
        "(--oversubscribe: more ranks than cores); without a launcher the benchmark runs a world of one.",
    )
    parser.add_argument("collective", help="allreduce, allgather, reduce_scatter, broadcast, reduce or alltoall")
    sizes = parser.add_argument_group("sizes (as nccl-tests)")
    sizes.add_argument("-b", "--minbytes", default="32M", help="smallest size S (default 32M)")
    sizes.add_argument("-e", "--maxbytes", default="32M", help="largest size S (default 32M)")
    sizes.add_argument("-f", "--stepfactor", type=int, default=1, help="multiply the size by this (default: use -i)")
    sizes.add_argument("-i", "--stepbytes", default="1M", help="add this many bytes when -f is not given (default 1M)")
    op = parser.add_argument_group("operation")
    op.add_argument("-d", "--datatype", default="float", help=f"{', '.join(collective_table.DTYPE_ITEMSIZES)}, or all of them: all (default float)")
    op.add_argument("-o", "--op", default="sum", help="sum, prod, max, min, avg, or all of them: all (default sum)")
    op.add_argument("-r", "--root", type=int, default=0, help="root rank of broadcast and reduce (default 0)")
    op.add_argument(
        "--skew", default=None, metavar="PATTERN",
        help="alltoall: how each rank's S bytes are split over the destinations: uniform (S/n to every rank, as "
        "alltoall_perf; default), zipf[:S] (Zipf with exponent S, default 1.2, over the other ranks, as "
        "mixture-of-experts routing), hot[:R] (half of every rank's bytes to rank R, default 0), or a matrix "
        "file (JSON list of rows or CSV; row i is what rank i sends each rank, scaled so that the busiest "
        "sender sends S)",
    )
    op.add_argument("--seed", type=int, default=0, help="alltoall --skew zipf: the order of each rank's destinations (default 0)")
    perf = parser.add_argument_group("measurement")
    perf.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size and placement (default 20)")
    perf.add_argument("-m", "--agg_iters", type=int, default=1, help="operations issued together per timed iteration (default 1)")
    perf.add_argument("-w", "--warmup_iters", type=int, default=5, help="untimed operations at the largest and smallest size (default 5)")
    perf.add_argument("-c", "--check", type=int, default=1, help="checked operations per size, 0 to skip checking (default 1)")
    perf.add_argument("-N", "--run_cycles", type=int, default=1, help="run the sweep this many times, printing each; 0 until interrupted (default 1)")
    perf.add_argument(
        "-z", "--blocking", type=int, default=0, choices=(0, 1, 2, 3),
        help="0 issue the timed operations asynchronously and wait at the end; 1 wait for each and barrier; "
        "2 wait for each; 3 wait and barrier after each iteration, timing only the operations (default 0)",
    )
    perf.add_argument(
        "-a", "--average", type=int, default=3, choices=(0, 1, 2, 3),
        help="time across ranks: 0 rank 0, 1 average, 2 minimum, 3 maximum (default 3)",
    )
    perf.add_argument("-T", "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help=f"seconds before a stuck operation fails (default {DEFAULT_TIMEOUT_S:g})")
    setup = parser.add_argument_group("what to run")
    setup.add_argument(
        "--topology", metavar="FILE",
        help="topology file (default: for --backend topo, what the backend discovers on every host; else a flat one)",
    )
    setup.add_argument("--schedule", metavar="FILE", help="run this schedule (JSON) instead of synthesizing one")
    setup.add_argument(
        "--planner", default="auto", metavar="NAME",
        help="schedules of the topo backend: auto (the planner's choice per size, default), lp, or a baseline "
        f"run on the same executor: {', '.join(PLANNER_BASELINES)} (rank_order_ring: the ring in rank order, "
        "blind to the topology)",
    )
    setup.add_argument("--backend", default="topo", choices=BACKENDS, help="backend under test (default topo)")
    setup.add_argument("--baseline", default="auto", help="baseline backend: auto (gloo on CPU, nccl on GPU), gloo, nccl or none")
    setup.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="tensor device (default: cuda when available)")
    compat = parser.add_argument_group(
        "nccl-tests options without a meaning here (accepted, so that nccl-tests command lines run; "
        "a value other than the default is named in the report's header)"
    )
    compat.add_argument("-t", "--nthreads", type=int, default=1, help="threads per process: 1 (a rank is one process)")
    compat.add_argument("-g", "--ngpus", type=int, default=1, help="devices per thread: 1 (a rank drives one device)")
    for flag, name, help_text in IGNORED_OPTIONS:
        compat.add_argument(flag, f"--{name}", default=None, metavar="N", help=help_text)
    out = parser.add_argument_group("output")
    out.add_argument("-J", "--json", "--output_file", dest="json", metavar="FILE", help="write all results as JSON")
    out.add_argument("--csv", metavar="FILE", help="write the table as CSV")
    out.add_argument("--plot", metavar="FILE", help="plot busbw against size (PNG)")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    out.add_argument("-v", "--verbose", action="store_true", help="log details to stderr")
    return parser


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """A validated command line."""

    spec: CollectiveSpec
    sizes: tuple[int, ...]
    min_bytes: int
    max_bytes: int
    step_factor: int
    step_bytes: int
    dtype_names: tuple[str, ...]
    ops: tuple[RedOp, ...]
    combinations: tuple[tuple[str, RedOp], ...]
    root: int
    iters: int
    agg_iters: int
    warmup: int
    check: int
    run_cycles: int
    blocking: int
    average: int
    timeout_s: float
    backend: str
    baseline: str | None
    device: str
    topology_path: str | None
    schedule_path: str | None
    planner: str
    json_path: str | None
    csv_path: str | None
    plot_path: str | None
    quiet: bool
    notes: tuple[str, ...] = ()

    @property
    def datatype(self) -> str:
        """``-d`` as given: one name, or ``all``."""
        return self.dtype_names[0] if len(self.dtype_names) == 1 else "all"


def _combinations(spec: CollectiveSpec, dtype_names: tuple[str, ...], ops: tuple[RedOp, ...], every_op: bool) -> tuple[
    tuple[tuple[str, RedOp], ...], list[str]
]:
    """The (type, op) pairs to run, in nccl-tests' order (types outer), and what was left out.

    Raises
    ------
    BenchArgumentError
        A single type and op that cannot go together (average of integers).
    """
    if not spec.reduces:
        return tuple((name, RedOp.SUM) for name in dtype_names), []
    if len(dtype_names) == 1 and len(ops) == 1:
        collective_table.check_op_dtype(ops[0], dtype_names[0])
    pairs = [(name, op) for name in dtype_names for op in ops if op is not RedOp.AVG or name in collective_table.FLOATING_DTYPES]
    left = []
    if len(pairs) < len(dtype_names) * len(ops):
        left.append("avg of integer types is not run (torch.distributed averages floating-point types only)")
    if every_op:
        left.append("-o all: mulsum is not run (no torch.distributed operation on CPU)")
    return tuple(pairs), left


def parse_skew(text: str, seed: int, world_size: int) -> collective_table.Traffic:
    """``--skew``: a pattern (``uniform``, ``zipf[:S]``, ``hot[:R]``) or a matrix file.

    Raises
    ------
    BenchArgumentError
        A pattern's parameter that is not a number (or not a rank), or neither a pattern nor a
        file; a matrix file that is not ``world_size x world_size`` non-negative numbers.
    """
    name, _, value = text.partition(":")
    pattern = name.lower()
    if pattern in collective_table.TRAFFIC_PATTERNS and not Path(text).exists():
        number = {"zipf": float, "hot": int}.get(pattern)
        try:
            parameter = number(value) if value and number else None
        except ValueError:
            number = None
        if (value and number is None) or (pattern == "zipf" and parameter is not None and not parameter >= 0):
            raise BenchArgumentError(f"--skew {text}: expected uniform, zipf[:EXPONENT >= 0] or hot[:RANK]")
        if pattern == "zipf":
            return collective_table.Traffic("zipf", zipf_s=1.2 if parameter is None else parameter, seed=seed)
        if pattern == "hot":
            hot = parameter or 0
            if not 0 <= hot < world_size:
                raise BenchArgumentError(f"--skew {text}: rank {hot} is not a rank of a world of {world_size} (0..{world_size - 1})")
            return collective_table.Traffic("hot", hot_rank=hot)
        return collective_table.Traffic()
    if not Path(text).exists():
        raise BenchArgumentError(f"--skew {text}: neither uniform, zipf[:S], hot[:R] nor a matrix file")
    from topocoll.solver.route_cli import load_matrix  # numpy, only for a matrix file

    try:
        matrix = load_matrix(text, world_size)
    except TopocollError as exc:
        raise BenchArgumentError(f"--skew {exc}") from None
    return collective_table.Traffic("file", weights=tuple(tuple(float(v) for v in row) for row in matrix), source=text)


def _resolve_device(requested: str) -> str:
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def validate(args: argparse.Namespace, world_size: int) -> BenchConfig:
    """Check every argument that does not need other ranks; identical on every rank.

    Raises
    ------
    BenchArgumentError
        The first problem found, in words.
    """
    spec = collective_table.parse_collective(args.collective)
    if spec.traffic is not None:
        spec = dataclasses.replace(spec, traffic=parse_skew(args.skew or "uniform", args.seed, world_size))
    elif args.skew is not None:
        raise BenchArgumentError(f"--skew splits an alltoall's buffer; {spec.collective.value} has no destinations to skew")
    min_bytes = parse_size(args.minbytes, "minbytes")
    max_bytes = parse_size(args.maxbytes, "maxbytes")
    step_bytes = parse_size(args.stepbytes, "stepbytes")
    sizes = sweep(min_bytes, max_bytes, args.stepfactor, step_bytes)
    every_type = args.datatype.lower() == "all"
    dtype_names = tuple(collective_table.DTYPE_ITEMSIZES) if every_type else (collective_table.canonical_dtype_name(args.datatype),)
    every_op = args.op.lower() == "all"
    ops = ALL_OPS if every_op else (RedOp.parse(args.op),)
    combinations, notes = _combinations(spec, dtype_names, ops, every_op and spec.reduces)
    if every_type:
        notes.insert(0, f"-d all: {NOT_RUN_TYPES} are not run (torch.distributed's CPU backend does not reduce them)")
    for name, value, low in (
        ("iters (-n)", args.iters, 1),
        ("agg_iters (-m)", args.agg_iters, 1),
        ("warmup_iters (-w)", args.warmup_iters, 0),
        ("check (-c)", args.check, 0),
        ("run_cycles (-N)", args.run_cycles, 0),
    ):
        if value < low:
            raise BenchArgumentError(f"{name} must be >= {low}, got {value}")
    for name, value, what in (("nthreads (-t)", args.nthreads, "threads"), ("ngpus (-g)", args.ngpus, "devices")):
        if value != 1:
            raise BenchArgumentError(
                f"{name} {value}: nccl-tests runs {value} {what} in one process; here each rank is one process driving one "
                "device, so start that many more ranks (mpirun -np N, torchrun --nproc-per-node N)"
            )
    for flag, name, help_text in IGNORED_OPTIONS:
        value = getattr(args, name)
        if value is not None and value.strip() not in ("0", ""):
            notes.append(f"{flag} {value} ({help_text.split(' (')[0]}) has no meaning here: ignored")
    if spec.rooted and not 0 <= args.root < world_size:
        raise BenchArgumentError(f"root (-r) {args.root} is not a rank of a world of {world_size} (0..{world_size - 1})")
    device = _resolve_device(args.device)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise BenchArgumentError("--device cuda, but torch sees no CUDA device")
    if args.backend == "nccl" and device != "cuda":
        raise BenchArgumentError("backend nccl needs --device cuda")
    baseline = args.baseline.lower()
    if baseline == "auto":
        baseline = "nccl" if device == "cuda" else "gloo"
    if baseline not in ("gloo", "nccl", "none"):
        raise BenchArgumentError(f"unknown baseline {args.baseline!r}; expected auto, gloo, nccl or none")
    if baseline == "nccl" and device != "cuda":
        raise BenchArgumentError("baseline nccl needs --device cuda")
    for option, path in (("--topology", args.topology), ("--schedule", args.schedule)):
        if path and not Path(path).exists():  # a FIFO or a device: refused when read, in its own words
            raise BenchArgumentError(f"{option} {path}: no such file")
    for option, path in (("-J", args.json), ("--csv", args.csv), ("--plot", args.plot)):
        if path:
            check_output_path(path, option)
    planner = args.planner.lower()
    if planner not in ("auto", "lp", *PLANNER_BASELINES):
        raise BenchArgumentError(f"unknown planner {args.planner!r}; expected auto, lp, {', '.join(PLANNER_BASELINES)}")
    if spec.traffic is not None and (planner != "auto" or args.schedule):
        raise BenchArgumentError(
            "--planner and --schedule choose the schedules of the synthesized collectives; an alltoall is routed "
            "from its traffic matrix on every call"
        )
    if planner != "auto" and (args.backend != "topo" or args.schedule):
        raise BenchArgumentError("--planner chooses the topo backend's schedules: not with --backend gloo/nccl or --schedule")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise BenchArgumentError("--plot needs matplotlib (pip install 'topocoll[plot]')") from None
    return BenchConfig(
        spec=spec,
        sizes=sizes,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        step_factor=args.stepfactor,
        step_bytes=step_bytes,
        dtype_names=dtype_names,
        ops=ops if spec.reduces else (RedOp.SUM,),
        combinations=combinations,
        root=args.root if spec.rooted else 0,
        iters=args.iters,
        agg_iters=args.agg_iters,
        warmup=args.warmup_iters,
        check=args.check,
        run_cycles=args.run_cycles,
        blocking=args.blocking,
        average=args.average,
        timeout_s=float(args.timeout),
        backend=args.backend,
        baseline=None if baseline == "none" else baseline,
        device=device,
        topology_path=args.topology,
        schedule_path=args.schedule,
        planner=planner,
        json_path=args.json,
        csv_path=args.csv,
        plot_path=args.plot,
        quiet=args.quiet,
        notes=tuple(notes),
    )
