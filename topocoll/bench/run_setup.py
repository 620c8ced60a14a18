"""What a benchmark run needs besides its options: the topology and the ranks' places on it, the
cut bound, and the planner ``--planner`` or ``--schedule`` forces."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from topocoll.bench.collective_table import BenchArgumentError
from topocoll.bench.options import BenchConfig
from topocoll.errors import TopocollError

log = logging.getLogger(__name__)


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
    """``size_bytes -> bound time`` from :func:`topocoll.solver.bound.cut_bound` (an all-to-all's:
    :func:`topocoll.solver.traffic.traffic_bound` of its matrix), or None if unknown.

    The bound is linear in the size, so it is computed once (a max-flow per rank set) and scaled.
    """
    try:
        if config.spec.traffic is not None:  # all-to-all: the bound of its matrix, S bytes from the busiest sender
            from topocoll.solver.traffic import traffic_bound

            shares = config.spec.traffic.shares(len(setup.nodes))
            per_byte_s = traffic_bound(setup.topology, setup.nodes, shares).time_s
            return lambda size_bytes: per_byte_s * size_bytes
        from topocoll.solver.bound import cut_bound

        bound = cut_bound(setup.topology, config.spec.collective, setup.nodes, config.root if config.spec.rooted else None)
    except (ImportError, TopocollError) as exc:
        log.warning("no cut bound for this run: %s", exc)
        return lambda size_bytes: None
    return bound.time_s


def placed_setup(setup: Setup, group: Any, config: BenchConfig) -> tuple[Setup, str | None]:
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


def named_planner(name: str):
    """The topo backend's planner for ``--planner NAME`` (None: the default)."""
    if name == "auto":
        return None
    from topocoll.solver import baselines

    if name == "lp":
        from topocoll.solver.synthesize import synthesize

        return lambda topology, collective, ranks, root, size_bytes: synthesize(topology, collective, list(ranks), root=root).schedule
    build = getattr(baselines, name)
    return lambda topology, collective, ranks, root, size_bytes: build(topology, collective, list(ranks), root=root)


def schedule_planner(schedule: Any):
    from topocoll.collectives.schedule_source import default_planner

    def planner(topology, collective, ranks, root, size_bytes):
        if collective is schedule.collective and tuple(ranks) == schedule.ranks and (not collective.is_rooted or root == schedule.root):
            return schedule
        return default_planner(topology, collective, ranks, root, size_bytes)

    return planner
