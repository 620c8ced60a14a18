"""``topocoll-bench``: measure a collective the way nccl-tests does, next to its baseline.

::

    mpirun -np 4 topocoll-bench allreduce -b 8 -e 128M -f 2 -n 20 -w 5 -c 1
    torchrun --nproc-per-node 4 -m topocoll.bench allreduce -b 8 -e 128M -f 2
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 topocoll-bench allgather ...

Every rank parses the same command line and checks it before torch.distributed starts, so a bad
argument stops every rank at once: rank 0 prints one line and all exit with status 2. The run
itself exits with status 1 when any element of any checked result is wrong. Only rank 0 prints
the table (stdout) and progress (stderr), and writes ``-J``/``--csv``/``--plot`` files.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import logging
import os
import platform
import shlex
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from topocoll.bench import collective_table, operations
from topocoll.bench.launch import Launch, abort, agree, detect_launch, init_distributed, rank_from_environment, share_cores
from topocoll.bench.collective_table import BenchArgumentError, CollectiveSpec, RedOp
from topocoll.bench.sizes import parse_size, sweep
from topocoll.errors import TopocollError, UsageError
from topocoll.fileio import check_output_path

__all__ = ["main", "build_parser", "BenchConfig", "validate"]

log = logging.getLogger(__name__)

PROG = "topocoll-bench"

DEFAULT_TIMEOUT_S = 300.0
"""Process-group timeout: torch's own default (30 minutes) would leave a rank whose peer died
waiting for half an hour; five minutes covers a single 8 GiB operation over a 1 GB/s link."""

BACKENDS = ("topo", "gloo", "nccl")

#: Baselines ``--planner`` can force (topocoll.solver.baselines).
PLANNER_BASELINES = ("ring", "rank_order_ring", "double_binary_tree", "hierarchical", "recursive_doubling")


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
    parser.add_argument("collective", help="allreduce, allgather, reduce_scatter, broadcast or reduce")
    sizes = parser.add_argument_group("sizes (as nccl-tests)")
    sizes.add_argument("-b", "--minbytes", default="32M", help="smallest size S (default 32M)")
    sizes.add_argument("-e", "--maxbytes", default="32M", help="largest size S (default 32M)")
    sizes.add_argument("-f", "--stepfactor", type=int, default=1, help="multiply the size by this (default: use -i)")
    sizes.add_argument("-i", "--stepbytes", default="1M", help="add this many bytes when -f is not given (default 1M)")
    op = parser.add_argument_group("operation")
    op.add_argument("-d", "--datatype", default="float", help=f"{', '.join(collective_table.DTYPE_ITEMSIZES)}, or all of them: all (default float)")
    op.add_argument("-o", "--op", default="sum", help="sum, prod, max, min, avg, or all of them: all (default sum)")
    op.add_argument("-r", "--root", type=int, default=0, help="root rank of broadcast and reduce (default 0)")
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


# ---------------------------------------------------------------------------- topology
@dataclass(frozen=True, slots=True)
class Setup:
    """The topology, the ranks' nodes and the schedule the run uses."""

    topology: Any
    nodes: tuple[str, ...]
    schedule: Any
    topology_source: str


def load_setup(config: BenchConfig, world_size: int) -> Setup:
    """Load (or discover) the topology and the schedule, and check they fit the run.

    A schedule file must carry the digest of the run's topology, and is verified
    (:func:`topocoll.solver.verify.verify`) once here, before any rank runs it.

    Raises
    ------
    TopocollError
        Unreadable files, a topology with too few compute nodes, a schedule for another
        collective, root, world size or topology, a schedule without a topology digest, or one
        the verifier refuses (its first error).
    """
    from topocoll.topo.discover import flat_topology

    if config.topology_path:
        from topocoll.topo.io import load_topology

        topology = load_topology(config.topology_path)
        source = config.topology_path
    elif config.backend == "topo" and not config.schedule_path:
        # the backend discovers the machines and places the ranks; the run takes both from it
        return Setup(None, (), None, "discovered by the topo backend")
    else:
        topology = flat_topology(world_size)
        source = "flat: CPU processes on one shared-memory hub, assumed bandwidth"
    compute = topology.compute_nodes()
    if len(compute) < world_size:
        raise BenchArgumentError(
            f"topology {topology.name or config.topology_path}: {len(compute)} compute nodes, but {world_size} ranks need {world_size}"
        )
    nodes = tuple(compute[:world_size])
    schedule = None
    if config.schedule_path:
        from topocoll.solver.schedule import load_schedule
        from topocoll.solver.verify import require_topology_digest, verify

        path = config.schedule_path
        schedule = load_schedule(path)
        if schedule.collective is not config.spec.collective:
            raise BenchArgumentError(f"{path}: schedule is for {schedule.collective.value}, the benchmark runs {config.spec.collective.value}")
        if len(schedule.ranks) != world_size:
            raise BenchArgumentError(f"{path}: schedule is for {len(schedule.ranks)} ranks, the run has {world_size}")
        require_topology_digest(schedule, path)
        if schedule.topology_digest != topology.digest():
            raise BenchArgumentError(f"{path}: schedule was made for another topology ({schedule.topology_digest[:19]}...)")
        if config.spec.rooted and schedule.root != config.root:
            raise BenchArgumentError(f"{path}: schedule has root {schedule.root}, the benchmark uses -r {config.root}")
        verify(schedule, topology).raise_if_failed(path)
    return Setup(topology, nodes, schedule, source)


def cut_bound_time_fn(setup: Setup, config: BenchConfig):
    """``size_bytes -> bound time`` from :func:`topocoll.solver.bound.cut_bound`, or None if unknown.

    The bound is linear in the size, so it is computed once (a max-flow per rank set) and scaled.
    """
    try:
        from topocoll.solver.bound import cut_bound

        bound = cut_bound(setup.topology, config.spec.collective, setup.nodes, config.root if config.spec.rooted else None)
    except (ImportError, TopocollError) as exc:
        log.warning("no cut bound for this run: %s", exc)
        return lambda size_bytes: None
    return bound.time_s


def _placed(setup: Setup, group: Any, config: BenchConfig) -> tuple[Setup, str | None]:
    """The setup with the topology and rank placement of the "topo" group, or the reason a
    given schedule does not fit that placement."""
    placed = dataclasses.replace(setup, topology=group.topology, nodes=tuple(group.nodes))
    schedule = setup.schedule
    if schedule is not None and tuple(schedule.ranks) != placed.nodes:
        return placed, (
            f"{config.schedule_path}: schedule ranks {', '.join(schedule.ranks[:4])}{' ...' if len(schedule.ranks) > 4 else ''} "
            f"differ from where the ranks run ({', '.join(placed.nodes[:4])}{' ...' if len(placed.nodes) > 4 else ''}); "
            "make it with --ranks in that order"
        )
    return placed, None


def _named_planner(name: str):
    """The topo backend's planner for ``--planner NAME`` (None: the default)."""
    if name == "auto":
        return None
    from topocoll.solver import baselines

    if name == "lp":
        from topocoll.solver.synthesize import synthesize

        return lambda topology, collective, ranks, root, size_bytes: synthesize(topology, collective, list(ranks), root=root).schedule
    build = getattr(baselines, name)
    return lambda topology, collective, ranks, root, size_bytes: build(topology, collective, list(ranks), root=root)


def _schedule_planner(schedule: Any):
    from topocoll.collectives.schedule_source import default_planner

    def planner(topology, collective, ranks, root, size_bytes):
        if collective is schedule.collective and tuple(ranks) == schedule.ranks and (not collective.is_rooted or root == schedule.root):
            return schedule
        return default_planner(topology, collective, ranks, root, size_bytes)

    return planner


# ------------------------------------------------------------------------------- main
def _fail(launch_rank: int, message: str, status: int) -> int:
    if launch_rank == 0:
        print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``topocoll-bench``; returns the exit status (0 ok, 1 wrong results, 2 bad use)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    env_rank = rank_from_environment()
    parser = build_parser()
    if any(a in ("-h", "--help") for a in argv):
        if env_rank == 0:
            parser.print_help()
        return 0
    try:
        launch = detect_launch()
    except UsageError as exc:
        return _fail(env_rank, str(exc), 2)
    share_cores()
    error: str | None = None
    config = setup = None
    try:
        args = parser.parse_args(argv)
        quiet_rank = logging.WARNING if launch.rank == 0 else logging.ERROR  # warnings once, from rank 0
        level = logging.INFO if args.verbose else quiet_rank
        logging.basicConfig(level=level, format=f"{PROG}: rank {launch.rank}: %(levelname)s %(name)s: %(message)s")
        config = validate(args, launch.world_size)
        setup = load_setup(config, launch.world_size)
    except TopocollError as exc:
        error = str(exc)
    except OSError as exc:
        error = f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}"
    error = agree(launch, error)
    if error is not None:
        return _fail(launch.rank, error, 2)
    assert config is not None and setup is not None
    try:
        return _run(launch, config, setup, argv)
    except KeyboardInterrupt:
        return _fail(launch.rank, "interrupted", 130)
    except Exception as exc:  # a failure on one rank: say where, then stop every rank
        message = str(exc)
        prefix = f"rank {launch.rank}: "
        print(f"{PROG}: error: {prefix}{message.removeprefix(prefix)}", file=sys.stderr, flush=True)
        log.debug("failure", exc_info=True)
        abort(launch, 1)
        return 1


def _run(launch: Launch, config: BenchConfig, setup: Setup, argv: list[str]) -> int:
    import torch
    import torch.distributed as dist

    from topocoll.bench.report import Report
    from topocoll.bench.runner import Progress, Series, SweepSettings, TimeAggregation, measure_size, warm_up

    rank, world = launch.rank, launch.world_size
    if config.device == "cuda":
        torch.cuda.set_device(launch.local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    pg_options = None
    if config.backend == "topo":
        from topocoll.collectives import TopoOptions

        planner = _schedule_planner(setup.schedule) if setup.schedule is not None else _named_planner(config.planner)
        pg_options = TopoOptions(topology=setup.topology, planner=planner)
    init_distributed(launch, config.backend, config.timeout_s, pg_options)
    try:
        if config.backend == "topo":
            setup, error = _placed(setup, dist.group.WORLD, config)
            if error is not None:  # the same on every rank: the placement is agreed
                return _fail(rank, error, 2)
        timeout = timedelta(seconds=config.timeout_s)
        meta = dist.new_group(backend="gloo", timeout=timeout)
        baseline_group = None
        if config.baseline == "gloo":
            baseline_group = meta
        elif config.baseline == "nccl":
            baseline_group = dist.new_group(backend="nccl", timeout=timeout)
        ranks_info = _gather_rank_info(rank, device, setup, meta)
        series = [Series(config.backend, dist.group.WORLD)]
        if baseline_group is not None:
            series.append(Series("baseline", baseline_group))
        runs = [
            SweepSettings(
                spec=config.spec,
                op=op,
                dtype_name=dtype_name,
                dtype=operations.DTYPES[dtype_name],
                root=config.root,
                iters=config.iters,
                warmup=config.warmup,
                check=config.check,
                aggregation=TimeAggregation(config.average),
                device=device,
                agg_iters=config.agg_iters,
                blocking=config.blocking,
            )
            for dtype_name, op in config.combinations
        ]
        bound_fn = cut_bound_time_fn(setup, config) if rank == 0 else (lambda size_bytes: None)
        header = _header_lines(config, setup, launch, ranks_info)
        skeleton = Report(
            kind="bench",
            collective=config.spec.collective,
            world_size=world,
            series=tuple(s.label for s in series),
            rows=(),
            header=tuple(header),
            checked=config.check > 0,
            placements=True,
        )
        if rank == 0:
            print(skeleton.preamble(), end="", flush=True)
        total = len(config.sizes) * len(runs) * (config.run_cycles or 1)
        progress = Progress(total, enabled=rank == 0 and not config.quiet)
        rows = []
        done = 0
        try:
            for settings in runs:  # as nccl-tests: each type and op warms up, then runs its cycles
                for s in series:
                    warm_up(settings, s, config.sizes, rank, world)
                for _cycle in itertools.count() if config.run_cycles == 0 else range(config.run_cycles):
                    for size in config.sizes:
                        row = measure_size(settings, tuple(series), size, rank, world, meta, bound_fn)
                        if row is not None:
                            rows.append(row)
                            if rank == 0:
                                print(skeleton.format_row(row), flush=True)
                        done += 1
                        progress.advance(done, size)
        finally:
            progress.close()
        report = Report(
            kind="bench",
            collective=config.spec.collective,
            world_size=world,
            series=skeleton.series,
            rows=tuple(rows),
            header=skeleton.header,
            config=_config_dict(config, setup, launch, argv),
            ranks=tuple(ranks_info),
            checked=config.check > 0,
            placements=True,
        )
        if rank == 0:
            print("\n".join(report.footer()), flush=True)
            report.write_outputs(config.json_path, config.csv_path, config.plot_path)
        dist.barrier(group=meta)
        return 1 if report.wrong_total else 0
    finally:
        dist.destroy_process_group()


def _gather_rank_info(rank: int, device: Any, setup: Setup, meta: Any) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name = props.name
        busid = f"{getattr(props, 'pci_domain_id', 0):04x}:{getattr(props, 'pci_bus_id', 0):02x}:{getattr(props, 'pci_device_id', 0):02x}"
        dev = str(device.index)
    else:
        name = f"{platform.machine() or 'cpu'} CPU process"
        busid = None
        dev = "cpu"
    mine = {
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": dev,
        "busid": busid,
        "name": name,
        "node": setup.nodes[rank],
    }
    gathered: list[Any] = [None] * dist.get_world_size(meta)
    dist.all_gather_object(gathered, mine, group=meta)
    return gathered


def _header_lines(config: BenchConfig, setup: Setup, launch: Launch, ranks: list[dict[str, Any]]) -> list[str]:
    from topocoll.bench.runner import TimeAggregation

    step = f"{config.step_factor}(factor)" if config.step_factor > 1 else f"{config.step_bytes}(bytes)"
    topology = setup.topology
    lines = [
        f"nThread 1 nGpus 1 minBytes {config.min_bytes} maxBytes {config.max_bytes} step: {step} "
        f"warmup iters: {config.warmup} iters: {config.iters} agg iters: {config.agg_iters} validation: {config.check} graph: 0",
        "",
        f"{PROG} {config.spec.collective.value}: backend {config.backend}"
        + (f" vs baseline {config.baseline}" if config.baseline else " (no baseline)")
        + f", {launch.world_size} rank{'s' if launch.world_size > 1 else ''} on {config.device}, launched by {launch.method.value}",
        f"Topology: {topology.name or '(unnamed)'} ({setup.topology_source}), {len(topology.nodes)} nodes, "
        f"{len(topology.links)} links, {topology.digest()[:19]}...",
    ]
    lines += [f"  note: {note}" for note in topology.notes]
    lines += [f"Note: {note}" for note in config.notes]
    if setup.schedule is not None:
        lines.append(f"Schedule: {config.schedule_path} ({setup.schedule.name or 'unnamed'}, {len(setup.schedule.steps)} steps)")
    elif config.backend == "topo" and config.planner != "auto":
        lines.append(f"Schedule: --planner {config.planner} (the same for every size)")
    elif config.backend == "topo":
        lines.append("Schedule: synthesized by topocoll.solver.plan for each size bucket")
    mode = "in place" if config.spec.in_place else "out of place"
    blocking = {
        0: "issued with async_op=True, waited for at the end",
        1: "each waited for, then a barrier",
        2: "each waited for",
        3: "each iteration waited for, then a barrier (not timed)",
    }[config.blocking]
    lines.append(
        f"Operation: {config.spec.collective.value}, out of place and in place for each backend; {config.iters} iterations "
        f"of {config.agg_iters} operation{'s' if config.agg_iters > 1 else ''}, {blocking} (-z {config.blocking})"
    )
    lines.append(f"Time: {TimeAggregation(config.average).label} (-a {config.average}); #wrong: summed over ranks")
    lines.append(
        f"speedup = baseline time / {config.backend} time, bound = cut-bound algbw, %bound = {config.backend} algbw / bound: "
        f"{mode}, torch.distributed's own form of {config.spec.collective.value}"
    )
    lines += ["", "Using devices"]
    for info in ranks:
        where = f"[{info['busid']}] " if info["busid"] else ""
        lines.append(
            f" Rank {info['rank']:2d} Group  0 Pid {info['pid']:6d} on {info['host']:>10} device {info['device']:>2} "
            f"{where}{info['name']} -> {info['node']}"
        )
    return lines


def _config_dict(config: BenchConfig, setup: Setup, launch: Launch, argv: list[str]) -> dict[str, Any]:
    return {
        "command": shlex.join([PROG, *argv]),
        "launcher": launch.method.value,
        "collective": config.spec.collective.value,
        "sizes_bytes": list(config.sizes),
        "min_bytes": config.min_bytes,
        "max_bytes": config.max_bytes,
        "step_factor": config.step_factor,
        "step_bytes": config.step_bytes,
        "datatype": config.datatype,
        "op": (config.ops[0].value if len(config.ops) == 1 else "all") if config.spec.reduces else None,
        "combinations": [{"type": name, "redop": op.value if config.spec.reduces else None} for name, op in config.combinations],
        "root": config.root if config.spec.rooted else None,
        "iters": config.iters,
        "agg_iters": config.agg_iters,
        "warmup_iters": config.warmup,
        "check": config.check,
        "run_cycles": config.run_cycles,
        "blocking": config.blocking,
        "notes": list(config.notes),
        "average": config.average,
        "timeout_s": config.timeout_s,
        "backend": config.backend,
        "baseline": config.baseline,
        "device": config.device,
        "topology": {
            "name": setup.topology.name,
            "digest": setup.topology.digest(),
            "source": setup.topology_source,
            "notes": list(setup.topology.notes),
            "nodes": list(setup.nodes),
        },
        "schedule": config.schedule_path,
        "planner": config.planner,
    }


def run_as_script() -> None:
    """``python -m topocoll.bench``."""
    sys.exit(main())
