"""What a rank knows when a collective fails, and the error every later call raises.

A collective that fails on one rank (a peer that never arrived, a peer that went silent in the
middle of the data, a transport error) leaves the ranks out of step: some are past the
argument header, some are not; messages of the failed collective may still sit in arenas and
inner-backend queues. Nothing safe can run on such a group again, so the rank marks the group
*broken*, tells its peers (a :class:`Failure` record in its shared-memory mailbox, and the
group's store), and every later call on every rank raises :class:`GroupBrokenError` at once,
naming the first failure, until the group is destroyed and created again. That is what c10d's
own backends do after an error (NCCL aborts its communicator).

A failure is described by the rank that saw it first (*origin*), the rank it blames
(*culprit*) and how that rank failed (:class:`FailureKind`); a rank that learns of a failure
from a peer passes the same record on, so the message on every rank names the first failure
rather than the last link of the chain.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from topocoll.errors import CollectiveError

__all__ = ["first_line", "AgreedError", "FailureKind", "Failure", "FailedError", "GroupBrokenError", "NO_RANK"]

NO_RANK = -1
"""``culprit`` of a failure no other rank is to blame for."""


def first_line(error: BaseException) -> str:
    """The first line of an inner backend's error (gloo's run to several), or its type's name."""
    text = str(error)
    return text.splitlines()[0] if text else type(error).__name__


class FailureKind(enum.IntEnum):
    """How a collective failed (the integer is what mailboxes store)."""

    ABSENT = 1
    """The culprit never reached the collective (its argument header did not arrive)."""
    SILENT = 2
    """The culprit reached the collective but its data stopped coming (it died or hangs)."""
    ERROR = 3
    """The origin rank itself failed (a transport error, no memory, a schedule it refused)."""


@dataclass(frozen=True, slots=True)
class Failure:
    """The first failure of a group, as every rank reports it.

    Parameters
    ----------
    sequence : int
        Number of the collective that failed (1 is the group's first scheduled collective).
    origin : int
        The rank that saw the failure first.
    culprit : int
        The rank ``origin`` blames, or :data:`NO_RANK`.
    kind : FailureKind
        How it failed.
    detail : str
        The origin rank's own message, where it is known ("" when only the record travelled).
    """

    sequence: int
    origin: int
    culprit: int
    kind: FailureKind
    detail: str = ""

    def describe(self) -> str:
        """One sentence naming the failure: which collective, which rank, what happened."""
        if self.kind is FailureKind.ABSENT:
            what = f"rank {self.culprit} did not arrive"
        elif self.kind is FailureKind.SILENT:
            what = f"rank {self.culprit} stopped answering in the middle of it"
        else:
            what = f"it failed on rank {self.origin}"
        return f"collective #{self.sequence} failed: {what} ({self.detail or f'reported by rank {self.origin}'})"


class GroupBrokenError(CollectiveError):
    """A collective on a group whose earlier collective failed (see the module docstring)."""


class FailedError(CollectiveError):
    """A wait that ended in a failure: this rank's own timeout, or a failure a peer posted.

    Parameters
    ----------
    message : str
        The text of the error.
    failure : Failure, optional
        The record to post and pass on (None on a copy raised again by ``Work.wait()``).
    """

    def __init__(self, message: str, failure: Failure | None = None) -> None:
        super().__init__(message)
        self.failure = failure


class AgreedError(CollectiveError):
    """An error every rank of the group raises at the same point of the same collective: the
    arguments differ across ranks, or rank 0 could not make the schedule. The ranks stay in
    step, so the group stays usable."""
