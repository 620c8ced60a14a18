"""Probing: run the experiments of :mod:`topocoll.topo.calibrate` with point-to-point messages.

Every rank of a group walks the same list of experiments in the same order. For one
experiment the senders of its flows send and the receivers receive, all at once after a
barrier. Each flow is sent as :data:`PIECES` messages in a row, and its receiver notes when
each arrived. Flows that share a limit do not finish together (the first to finish leaves the
link to the others), so a flow's rate is taken over the *common window*, from the barrier to
the moment the first flow of the experiment finished: the bytes it had received by then
(interpolated between its pieces) over that time. Those are the rates of flows sharing the
links as they all run, which is what :func:`~topocoll.topo.calibrate.calibrate` reads.

A first round with ``initial_bytes`` per flow finds the speed; when it was shorter than
``target_s`` a second round sends enough bytes to last about ``target_s`` (at most
``max_bytes``), so that the rate is that of a full stream, not of its start. Arrival times are
summed across ranks (each flow has one receiver), so every rank computes the same rates and
the same calibrated topology.

Latency: each probed pair exchanges ``latency_rounds`` one-byte messages back and forth on its
first channel; half the median round trip is its one-way latency.

Messages go through the group's inner gloo groups: channel 0 is the group's own, channel r + 1
the group bound to rail r's NICs. A peer that dies or stops answering makes every rank raise
:class:`~topocoll.errors.CollectiveError` within the timeout, with nothing returned.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from datetime import timedelta
from typing import Any

import torch

from topocoll.collectives.failure import first_line
from topocoll.errors import CollectiveError, TopocollError
from topocoll.topo.calibrate import Calibration, Experiment, Measurement, calibrate, plan_experiments, probe_ranks
from topocoll.topo.io import dumps_topology, load_topology
from topocoll.topo.model import Topology
from topocoll.topo.rails import Rails

__all__ = ["ProbeSettings", "run_probe"]

logger = logging.getLogger(__name__)

#: Messages per flow: the resolution of the common window (one piece in 16 is 6 %).
PIECES = 16

#: Tag of probe messages on the inner groups (the executor's own start at 1 and count up per
#: pair within one collective; a probe runs while no collective does).
_PROBE_TAG = 7_000_000


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    """How long and how much to probe.

    Parameters
    ----------
    target_s : float
        About how long one timed experiment should last (default 0.25 s: at tens of Mbit/s
        that is megabytes, past a token bucket's burst and TCP's slow start).
    initial_bytes : int
        Bytes per flow of the first, sizing round (default 1 MiB).
    max_bytes : int
        Most bytes per flow (default 64 MiB).
    latency_rounds : int
        Round trips per pair for the latency (default 20).
    """

    target_s: float = 0.25
    initial_bytes: int = 1 << 20
    max_bytes: int = 64 << 20
    latency_rounds: int = 20

    def __post_init__(self) -> None:
        if not self.target_s > 0 or not 1 <= self.initial_bytes <= self.max_bytes or self.latency_rounds < 1:
            raise CollectiveError(
                f"probe settings: need target_s > 0, 1 <= initial_bytes <= max_bytes and latency_rounds >= 1, got "
                f"{self.target_s}, {self.initial_bytes}, {self.max_bytes}, {self.latency_rounds}"
            )


def _wait(work: Any, timeout: timedelta, rank: int, what: str) -> None:
    try:
        work.wait(timeout)
    except RuntimeError as exc:
        raise CollectiveError(f"rank {rank}: probe {what} failed: {first_line(exc)}") from None


def _sum(channel0: Any, values: torch.Tensor, timeout: timedelta, rank: int) -> torch.Tensor:
    _wait(channel0.allreduce([values]), timeout, rank, "exchange of results")
    return values


def _timed_round(
    channels: Sequence[Any], rank: int, experiment: Experiment, sizes: Sequence[int], timeout: timedelta, tag: int
) -> torch.Tensor:
    """Arrival time (s after the start) of every piece of every flow, flow ``i`` sending
    ``sizes[i]`` bytes: a (flows, PIECES) tensor, known on every rank."""
    arrivals = torch.zeros(len(experiment.flows), PIECES, dtype=torch.float64)
    pieces = [-(-size // PIECES) for size in sizes]
    bases, total = {}, 0
    for index, flow in enumerate(experiment.flows):
        if rank in (flow.src, flow.dst):
            bases[index], total = total, total + pieces[index] * PIECES
    buffer = torch.empty(max(total, 1), dtype=torch.uint8)
    _sum(channels[0], torch.zeros(1), timeout, rank)  # everyone starts together
    start = time.perf_counter()
    receiving, sending = [], []
    for index, flow in enumerate(experiment.flows):
        if rank not in (flow.src, flow.dst):
            continue
        group, base, piece = channels[flow.channel], bases[index], pieces[index]
        for k in range(PIECES):
            view = buffer[base + piece * k : base + piece * (k + 1)]
            if flow.dst == rank:
                receiving.append((index, k, group.recv([view], flow.src, tag + PIECES * index + k)))
            else:
                sending.append(group.send([view], flow.dst, tag + PIECES * index + k))
    for index, k, work in receiving:  # in posting order: a pair's messages arrive in order
        _wait(work, timeout, rank, experiment.describe())
        arrivals[index, k] = time.perf_counter() - start
    for work in sending:
        _wait(work, timeout, rank, experiment.describe())
    return _sum(channels[0], arrivals.flatten(), timeout, rank).view(len(experiment.flows), PIECES)


def window_rates(arrivals: torch.Tensor, sizes: Sequence[int]) -> tuple[float, ...]:
    """Each flow's rate over the common window: bytes received by the time the first flow
    finished, over that time (interpolated between pieces); flow ``i`` sent ``sizes[i]``."""
    window = float(arrivals[:, -1].min())
    rates = []
    for times, size in zip(arrivals.tolist(), sizes):
        piece = size / arrivals.shape[1]
        received, previous = 0.0, 0.0
        for t in times:
            if t <= window:
                received, previous = received + piece, t
            else:
                received += piece * (window - previous) / max(t - previous, 1e-12)
                break
        rates.append(received / max(window, 1e-9))
    return tuple(rates)


def _latency(channels: Sequence[Any], rank: int, experiments: Sequence[Experiment], rounds: int, timeout: timedelta) -> dict[tuple[int, int], float]:
    pairs = [e.flows[0] for e in experiments if e.kind == "pair"]
    first = {}
    for flow in pairs:
        first.setdefault((flow.src, flow.dst), flow)
    ordered = sorted(first.values(), key=lambda f: (f.src, f.dst))
    one_way = torch.zeros(len(ordered), dtype=torch.float64)
    byte = torch.zeros(1, dtype=torch.uint8)
    for index, flow in enumerate(ordered):
        if rank not in (flow.src, flow.dst):
            continue
        group, peer = channels[flow.channel], flow.dst if rank == flow.src else flow.src
        trips = []
        for _ in range(rounds):
            began = time.perf_counter()
            if rank == flow.src:
                _wait(group.send([byte], peer, _PROBE_TAG - 1), timeout, rank, f"latency {flow.src}->{flow.dst}")
                _wait(group.recv([byte], peer, _PROBE_TAG - 2), timeout, rank, f"latency {flow.src}->{flow.dst}")
            else:
                _wait(group.recv([byte], peer, _PROBE_TAG - 1), timeout, rank, f"latency {flow.src}->{flow.dst}")
                _wait(group.send([byte], peer, _PROBE_TAG - 2), timeout, rank, f"latency {flow.src}->{flow.dst}")
            trips.append(time.perf_counter() - began)
        if rank == flow.src:
            one_way[index] = statistics.median(trips) / 2
    one_way = _sum(channels[0], one_way, timeout, rank)
    return {(f.src, f.dst): float(v) for f, v in zip(ordered, one_way.tolist())}


def run_probe(
    channels: Sequence[Any],
    rank: int,
    topology: Topology,
    rank_nodes: Sequence[str],
    rails: Rails | None,
    timeout: timedelta,
    settings: ProbeSettings | None = None,
    progress: Callable[[str], None] | None = None,
) -> Calibration:
    """Measure the group's links and return the calibrated topology (the same on every rank).

    Parameters
    ----------
    channels : sequence of torch.distributed backends
        Channel 0 (the group's own gloo group), then one per rail when ``rails`` is given.
    rank : int
        This rank in those groups.
    topology : Topology
        The nominal topology (its structure names the links measured).
    rank_nodes : sequence of str
        The node of every rank.
    rails : Rails or None
        The cluster's rails.
    timeout : datetime.timedelta
        Longest wait for one message.
    settings : ProbeSettings, optional
    progress : callable, optional
        Called with one line per experiment (rank 0 passes a printer).

    Returns
    -------
    Calibration

    Raises
    ------
    CollectiveError
        A message failed or timed out (on every rank), or the settings are invalid.
    """
    settings = settings or ProbeSettings()
    if rails is not None and len(channels) != rails.count + 1:
        raise CollectiveError(f"rank {rank}: {rails.count} rails but {len(channels) - 1} rail groups")
    experiments, notes = plan_experiments(topology, rank_nodes, rails)
    if not experiments:
        raise CollectiveError(
            f"rank {rank}: nothing to probe: {len(probe_ranks(topology, rank_nodes))} host(s) with a unique route between them"
        )
    measurements = []
    began = time.perf_counter()
    for number, experiment in enumerate(experiments):
        tag = _PROBE_TAG + 4000 * number
        flows = len(experiment.flows)
        _timed_round(channels, rank, experiment, (min(64 << 10, settings.initial_bytes),) * flows, timeout, tag)  # connect, warm up
        sizes = (settings.initial_bytes,) * flows
        arrivals = _timed_round(channels, rank, experiment, sizes, timeout, tag + 1000)
        if float(arrivals.max()) < settings.target_s and settings.initial_bytes < settings.max_bytes:
            # each flow sized by its own rate to last about target_s: with one size for all,
            # the fastest flow would end the common window while a slower one still ramped up
            sizes = tuple(
                max(1, min(settings.max_bytes, int(size * settings.target_s / max(float(t), 1e-6) * 1.1)))
                for size, t in zip(sizes, arrivals[:, -1].tolist())
            )
            arrivals = _timed_round(channels, rank, experiment, sizes, timeout, tag + 2000)
        rates = window_rates(arrivals, sizes)
        measurements.append(Measurement(experiment, rates, sizes, tuple(max(float(t), 1e-9) for t in arrivals[:, -1])))
        if progress is not None:
            shown = ", ".join(f"{r / 1e6:.3g}" for r in rates)
            amounts = "/".join(str(size) for size in dict.fromkeys(sizes))
            progress(f"probe {number + 1}/{len(experiments)}: {experiment.describe()}: {shown} MB/s ({amounts} B per flow)")
    latencies = _latency(channels, rank, experiments, settings.latency_rounds, timeout)
    result = calibrate(topology, measurements, latencies)
    if progress is not None:
        progress(f"probe: {len(experiments)} experiments in {time.perf_counter() - began:.1f} s")
    if notes:
        result = Calibration(
            Topology(result.topology.nodes, result.topology.links, name=result.topology.name, notes=(*result.topology.notes, *notes)),
            result.measured,
            (*result.notes, *notes),
        )
    return result


# ------------------------------------------------------------------------------ the cache
def probe_cache_path(cache_dir: str | None, topology: Topology, nodes: Sequence[str]) -> Path | None:
    """Where the calibration of ``topology`` with ranks on ``nodes`` is cached (None: no cache)."""
    if cache_dir is not None and cache_dir.strip().lower() == "off":
        return None
    root = Path(cache_dir).expanduser() if cache_dir else Path.home() / ".cache" / "topocoll" / "probe"
    placement = hashlib.sha256(json.dumps(list(nodes)).encode()).hexdigest()[:12]
    return root / f"{topology.digest().split(':')[-1][:24]}-{placement}.json"


def read_cached(path: Path) -> Topology | None:
    try:
        return load_topology(path)
    except FileNotFoundError:
        return None
    except (TopocollError, OSError) as exc:  # a damaged cache entry is measured again
        logger.warning("rank 0: ignoring the probe cache %s: %s", path, exc)
        return None


def write_cached(path: Path, topology: Topology) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(dumps_topology(topology, "json"))
        temporary.replace(path)  # whole or not at all
    except OSError as exc:
        logger.warning("rank 0: cannot write the probe cache %s: %s", path, exc)
