"""Exception types of topocoll.

User errors (bad files, bad arguments) raise a subclass of :class:`TopocollError`; each also
subclasses the builtin it resembles so that callers catching ``ValueError`` keep working. The
CLI turns any ``TopocollError`` into one line on stderr and exit status 2.
"""

from __future__ import annotations


class TopocollError(Exception):
    """Base class of every error topocoll raises on purpose."""


class TopologyError(TopocollError, ValueError):
    """A topology violates the model: bad bandwidth, unknown endpoint, duplicate rank, ..."""


class FormatError(TopocollError, ValueError):
    """A file cannot be parsed; the message names the file and the element or line."""


class ScheduleError(TopocollError, ValueError):
    """A schedule is malformed or does not fit its topology."""


class SolverError(TopocollError, RuntimeError):
    """Synthesis was asked for something impossible (e.g. ranks that cannot reach each other)."""


class RequestError(SolverError, ScheduleError):
    """A collective was asked of ranks that cannot take part: too few, repeated, not GPUs or
    hosts, or a root that is not one of them (:func:`topocoll.solver.request.check_request`).

    It is both a :class:`SolverError` and a :class:`ScheduleError`, the types the solver's entry
    points and the baselines raised for it before there was one check."""


class ScaleError(SolverError):
    """A valid request beyond the scale the planner weighs candidates at: verifying a schedule
    for that many ranks would need more memory than it allows. A runtime hands such a
    collective to its inner backend; ``topocoll synthesize --format 3`` still writes a schedule
    by rule for it."""


class CollectiveError(TopocollError, RuntimeError):
    """A collective failed at run time: mismatched inputs across ranks, a dead peer, a timeout."""


class UsageError(TopocollError, ValueError):
    """A command-line argument is invalid (bad size, unknown name, out-of-range root, ...)."""


class ScenarioError(TopocollError, ValueError):
    """An emulation scenario is invalid; the message names the file and the element."""


class EmulateError(TopocollError, RuntimeError):
    """Emulated hosts cannot be brought up here: not root, a missing tool, a kernel without a qdisc."""
