"""The benchmark loop: warm up, time, check and combine across ranks, one size at a time.

It follows nccl-tests' ``TimeTest``/``BenchTime``: ``warmup`` untimed operations at the largest
and at the smallest size, then for each size, out of place and then in place: one untimed
operation, ``iters`` timed iterations of ``agg_iters`` operations each (the time of one
operation is the elapsed time over ``iters x agg_iters``), then ``check`` operations on freshly
filled buffers whose outputs are compared element by element with the reference. Each size is
measured on the backend under test and right after on the baseline group, so that the numbers
share the machine's state of the moment.

``blocking`` is nccl-tests' ``-z``: 0 issues the timed operations with ``async_op=True`` and
waits for all of them at the end (the backend may run them back to back, as a CUDA stream
does); 1 waits for each operation and then meets the other ranks at a barrier; 2 waits for each
operation; 3 waits for each iteration's operations and meets at a barrier, timing only the
operations.

Times are combined across ranks as ``-a`` says (nccl-tests: 0 rank 0, 1 average, 2 minimum,
3 maximum); wrong elements are summed over ranks. Metadata (times, counts) always travels on the
plain gloo group, never on the backend under test.
"""

from __future__ import annotations

import enum
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from topocoll.bench import operations
from topocoll.bench.collective_table import CollectiveSpec, RedOp
from topocoll.bench.report import Measurement, Row
from topocoll.solver.metrics import algbw_bytes_per_s

__all__ = ["TimeAggregation", "SweepSettings", "Series", "measure_size", "warm_up", "combine_time_s", "sum_over_ranks"]

log = logging.getLogger(__name__)


class TimeAggregation(int, enum.Enum):
    """nccl-tests' ``-a``: how one time is made of the ranks' times."""

    RANK0 = 0
    AVG = 1
    MIN = 2
    MAX = 3

    @property
    def label(self) -> str:
        """Words for the report header."""
        return {0: "rank 0's time", 1: "average across ranks", 2: "minimum across ranks", 3: "maximum across ranks"}[self.value]


@dataclass(frozen=True, slots=True)
class SweepSettings:
    """What to run at each size (shared by every series).

    Attributes
    ----------
    spec : CollectiveSpec
    op : RedOp
    dtype_name : str
    dtype : torch.dtype
    root : int
    iters, warmup, check : int
        nccl-tests' ``-n``, ``-w`` and ``-c``.
    aggregation : TimeAggregation
    device : torch.device
    agg_iters : int
        nccl-tests' ``-m``: operations per timed iteration.
    blocking : int
        nccl-tests' ``-z`` (module docstring).
    """

    spec: CollectiveSpec
    op: RedOp
    dtype_name: str
    dtype: torch.dtype
    root: int
    iters: int
    warmup: int
    check: int
    aggregation: TimeAggregation
    device: torch.device
    agg_iters: int = 1
    blocking: int = 0


@dataclass(frozen=True, slots=True)
class Series:
    """A process group to measure, with its label for the report."""

    label: str
    group: "dist.ProcessGroup | None"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def combine_time_s(time_s: float, aggregation: TimeAggregation, meta: "dist.ProcessGroup") -> float:
    """One time from every rank's ``time_s`` (collective over ``meta``)."""
    value = torch.tensor([time_s], dtype=torch.float64)
    if aggregation is TimeAggregation.RANK0:
        dist.broadcast(value, src=0, group=meta)
    elif aggregation is TimeAggregation.MIN:
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=meta)
    elif aggregation is TimeAggregation.MAX:
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=meta)
    else:
        dist.all_reduce(value, op=dist.ReduceOp.SUM, group=meta)
        value /= dist.get_world_size(meta)
    return float(value.item())


def sum_over_ranks(count: int, meta: "dist.ProcessGroup") -> int:
    """Sum of an integer over all ranks."""
    value = torch.tensor([count], dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.SUM, group=meta)
    return int(value.item())


def warm_up(settings: SweepSettings, series: Series, sizes: tuple[int, ...], rank: int, world_size: int) -> None:
    """nccl-tests' warm-up: ``warmup`` operations at the largest, then at the smallest size."""
    if settings.warmup <= 0 or not sizes:
        return
    for size in (max(sizes), min(sizes)):
        counts = settings.spec.counts(size, _itemsize(settings.dtype), world_size)
        if counts.in_count == 0:
            continue
        buffers = operations.make_buffers(settings.spec, counts, settings.op, settings.dtype, rank, settings.root, settings.device)
        for _ in range(settings.warmup):
            operations.issue(settings.spec, buffers, series.group, settings.op, settings.root)
        _synchronize(settings.device)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _wait(works: list, device: torch.device) -> None:
    for work in works:
        if work is not None:
            work.wait()
    works.clear()
    _synchronize(device)


def _timed_s(settings: SweepSettings, series: Series, buffers, meta: "dist.ProcessGroup") -> float:
    """This rank's time of one operation: ``iters`` iterations of ``agg_iters`` operations."""
    spec, blocking = settings.spec, settings.blocking
    works: list = []
    operations_s = 0.0
    start = time.perf_counter()
    for _ in range(settings.iters):
        began = time.perf_counter()
        for _ in range(settings.agg_iters):
            works.append(operations.issue(spec, buffers, series.group, settings.op, settings.root, async_op=True))
            if blocking in (1, 2):
                _wait(works, settings.device)
            if blocking == 1:
                dist.barrier(group=meta)
        if blocking == 3:
            _wait(works, settings.device)
            operations_s += time.perf_counter() - began
            dist.barrier(group=meta)
    _wait(works, settings.device)
    elapsed_s = operations_s if blocking == 3 else time.perf_counter() - start
    return elapsed_s / (settings.iters * settings.agg_iters)


def _measure_one(
    settings: SweepSettings, series: Series, size: int, rank: int, world_size: int, meta: "dist.ProcessGroup", in_place: bool
) -> Measurement:
    spec = settings.spec
    counts = spec.counts(size, _itemsize(settings.dtype), world_size)
    buffers = operations.make_buffers(spec, counts, settings.op, settings.dtype, rank, settings.root, settings.device, in_place)
    operations.issue(spec, buffers, series.group, settings.op, settings.root)  # untimed, as nccl-tests' "sync" call
    _synchronize(settings.device)
    dist.barrier(group=meta)
    time_s = combine_time_s(_timed_s(settings, series, buffers, meta), settings.aggregation, meta)
    wrong: int | None = None
    if settings.check > 0:
        expected = operations.expected_output(spec, counts, settings.op, settings.dtype, rank, settings.root, world_size)
        wrong = 0
        for _ in range(settings.check):
            buffers = operations.make_buffers(spec, counts, settings.op, settings.dtype, rank, settings.root, settings.device, in_place)
            operations.issue(spec, buffers, series.group, settings.op, settings.root)
            _synchronize(settings.device)
            local_wrong = 0 if expected is None else operations.count_wrong(buffers.output, expected, settings.op)
            wrong = sum_over_ranks(local_wrong, meta)
            if wrong:
                break
    alg = algbw_bytes_per_s(counts.size_bytes, time_s) if time_s > 0 else 0.0
    return Measurement(time_s, alg, alg * spec.bus_factor(world_size), wrong)


def measure_size(
    settings: SweepSettings,
    series: tuple[Series, ...],
    size: int,
    rank: int,
    world_size: int,
    meta: "dist.ProcessGroup",
    bound_time_s: Callable[[int], float | None],
) -> Row | None:
    """Measure one size on every series, out of place and in place; None when the size holds
    no element per rank."""
    spec = settings.spec
    counts = spec.counts(size, _itemsize(settings.dtype), world_size)
    if counts.in_count == 0 or counts.out_count == 0:
        return None
    placed = tuple(
        tuple(_measure_one(settings, s, size, rank, world_size, meta, in_place) if not in_place or spec.has_in_place else None for s in series)
        for in_place in (False, True)
    )
    return Row(
        size_bytes=counts.size_bytes,
        count=counts.count,
        dtype=settings.dtype_name,
        redop=settings.op.value if spec.reduces else "none",
        root=settings.root if spec.rooted else -1,
        results=placed[1] if spec.in_place else placed[0],
        bound_time_s=bound_time_s(counts.size_bytes) if rank == 0 else None,
        placed=placed,
    )


class Progress:
    """Progress of a long sweep on stderr (rank 0): a rich bar on a terminal, else plain lines.

    Plain lines start only once the sweep has run for :data:`QUIET_S`, so short runs stay quiet.
    """

    QUIET_S = 5.0
    """Seconds of silence before plain progress lines appear (a UX choice, not a measurement)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._total = total
        self._enabled = enabled
        self._start = time.monotonic()
        self._bar = None
        self._task = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(transient=True, console=Console(stderr=True))
            self._bar.start()
            self._task = self._bar.add_task("sweep", total=total)

    def advance(self, done: int, size_bytes: int) -> None:
        """Report that ``done`` of the sizes are finished, the last being ``size_bytes``."""
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=done, description=f"size {size_bytes} B")
            return
        elapsed = time.monotonic() - self._start
        if elapsed >= self.QUIET_S:
            print(f"topocoll-bench: {done}/{self._total} sizes done (last {size_bytes} B), {elapsed:.0f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Remove the bar."""
        if self._bar is not None:
            self._bar.stop()
