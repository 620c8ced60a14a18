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

import itertools
import logging
import os
import platform
import shlex
import socket
import sys
from datetime import timedelta
from typing import Any

from topocoll.bench import operations
from topocoll.bench.launch import Launch, abort, agree, detect_launch, init_distributed, rank_from_environment, share_cores
from topocoll.bench.options import PROG, BenchConfig, build_parser, validate
from topocoll.bench.run_setup import Setup, cut_bound_time_fn, load_setup, named_planner, placed_setup, schedule_planner
from topocoll.errors import TopocollError, UsageError

__all__ = ["main", "build_parser", "BenchConfig", "load_setup", "validate"]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- topology


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

        planner = schedule_planner(setup.schedule) if setup.schedule is not None else named_planner(config.planner)
        pg_options = TopoOptions(topology=setup.topology, planner=planner)
    init_distributed(launch, config.backend, config.timeout_s, pg_options)
    try:
        if config.backend == "topo":
            setup, error = placed_setup(setup, dist.group.WORLD, config)
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
    elif config.backend == "topo" and config.spec.traffic is not None:
        lines.append("Schedule: routed per call from the traffic matrix (topocoll.solver.traffic.route_fast), cached per quantised matrix")
    elif config.backend == "topo":
        lines.append("Schedule: synthesized by topocoll.solver.plan for each size bucket")
    if config.spec.traffic is not None:
        lines.append(f"Traffic: {config.spec.traffic.label}")
    mode = "in place" if config.spec.in_place else "out of place"
    blocking = {
        0: "issued with async_op=True, waited for at the end",
        1: "each waited for, then a barrier",
        2: "each waited for",
        3: "each iteration waited for, then a barrier (not timed)",
    }[config.blocking]
    forms = "out of place and in place" if config.spec.has_in_place else "out of place only (torch has no in-place form)"
    lines.append(
        f"Operation: {config.spec.collective.value}, {forms} for each backend; {config.iters} iterations "
        f"of {config.agg_iters} operation{'s' if config.agg_iters > 1 else ''}, {blocking} (-z {config.blocking})"
    )
    lines.append(f"Time: {TimeAggregation(config.average).label} (-a {config.average}); #wrong: summed over ranks")
    lines.append(
        f"speedup = baseline time / {config.backend} time, bound = {'the matrix' + chr(39) + 's' if config.spec.traffic else 'cut-bound'} algbw, "
        f"%bound = {config.backend} algbw / bound: "
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


def _traffic_dict(traffic: Any) -> dict[str, Any] | None:
    """An all-to-all's ``--skew`` in the JSON report (None for the other collectives)."""
    if traffic is None:
        return None
    return {
        "pattern": traffic.pattern,
        "zipf_s": traffic.zipf_s if traffic.pattern == "zipf" else None,
        "hot_rank": traffic.hot_rank if traffic.pattern == "hot" else None,
        "seed": traffic.seed if traffic.pattern == "zipf" else None,
        "matrix": [list(row) for row in traffic.weights] if traffic.weights is not None else None,
        "source": traffic.source or None,
    }


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
        "traffic": _traffic_dict(config.spec.traffic),
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
