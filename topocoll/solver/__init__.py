"""topocoll.solver: cut bounds, LP synthesis, baselines and verification of schedules.

Pure functions over :class:`~topocoll.topo.model.Topology` and
:class:`~topocoll.solver.schedule.Schedule`. The usual entry points:

- :func:`plan` — the verified schedule to run for a collective (and size);
- :func:`topocoll.solver.planner.plan_collective` — the same with the bound, every candidate
  and their predicted times;
- :func:`topocoll.solver.bound.cut_bound` — the physical limit;
- :func:`topocoll.solver.verify.verify` — symbolic proof of a schedule.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from topocoll.solver.bound import Bound, cut_bound
from topocoll.solver.planner import DEFAULT_PER_MESSAGE_OVERHEAD_S, NativeModel, Plan, PlanStatus, plan_collective
from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer
from topocoll.solver.synthesize import SynthesisOptions
from topocoll.solver.verify import Verification, verify
from topocoll.topo.model import Topology

__all__ = [
    "Bound",
    "Chunk",
    "Collective",
    "Op",
    "Plan",
    "PlanStatus",
    "Schedule",
    "SynthesisOptions",
    "Transfer",
    "Verification",
    "cut_bound",
    "plan",
    "plan_collective",
    "verify",
]


def plan(
    topology: Topology,
    collective: Collective | str,
    ranks: Sequence[str] | None = None,
    root: int | None = None,
    size_bytes: float | None = None,
    *,
    per_message_overhead_s: float = DEFAULT_PER_MESSAGE_OVERHEAD_S,
    options: SynthesisOptions = SynthesisOptions(),
    native: Collection[Collective] = (),
    native_model: NativeModel | None = None,
) -> Schedule:
    """The verified schedule to run: :func:`plan_collective`'s choice, without the details.

    Examples
    --------
    >>> from topocoll.topo.presets import build_preset
    >>> dgx1 = build_preset("dgx1-v100")
    >>> schedule = plan(dgx1, "allgather", ["gpu0", "gpu1", "gpu2"])
    >>> schedule.collective.value, len(schedule.ranks)
    ('allgather', 3)
    """
    return plan_collective(
        topology, collective, ranks, root, size_bytes, per_message_overhead_s=per_message_overhead_s, options=options, native=native,
        native_model=native_model,
    ).schedule
