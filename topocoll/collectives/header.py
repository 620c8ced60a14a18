"""The ranks' agreement: a header before every scheduled collective, and the group's first failure.

Before each scheduled collective the ranks exchange a small header (the collective's number,
operation, element count, dtype, reduction, root, tensor layout, and whether the local
arguments were valid) through the shared-memory mailboxes, or through the inner backend when
some rank shares no memory with the others, so that inputs that differ across ranks raise
:class:`~topocoll.collectives.failure.AgreedError` on every rank instead of hanging or
corrupting data; such errors leave the group usable.

When a wait fails, the rank marks the group broken with its first
:class:`~topocoll.collectives.failure.Failure` and tells its peers (the store, the mailbox
status word, or an abort header on the header channel), so that every later call on every rank
raises at once, naming it. :class:`HeaderExchange` is the part of
:class:`~topocoll.collectives.process_group.TopoProcessGroup` that does both.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from topocoll.collectives.executor import Reduction, check_reduction
from topocoll.collectives.failure import NO_RANK, AgreedError, FailedError, Failure, FailureKind, GroupBrokenError, first_line
from topocoll.errors import CollectiveError

logger = logging.getLogger(__name__)

HEADER_DTYPES: tuple[torch.dtype, ...] = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
"""Dtypes with a header code (their index). Others are refused."""


REDUCE_OPS: tuple[tuple[Any, Reduction, bool], ...] = (
    (dist.ReduceOp.SUM, Reduction.SUM, False),
    (dist.ReduceOp.AVG, Reduction.SUM, True),
    (dist.ReduceOp.PRODUCT, Reduction.PRODUCT, False),
    (dist.ReduceOp.MIN, Reduction.MIN, False),
    (dist.ReduceOp.MAX, Reduction.MAX, False),
    (dist.ReduceOp.BAND, Reduction.BAND, False),
    (dist.ReduceOp.BOR, Reduction.BOR, False),
    (dist.ReduceOp.BXOR, Reduction.BXOR, False),
)
"""torch reduce op -> (reduction, divide by the group size afterwards)."""


ABORT_OPERATION = -1
"""Operation code of the header a broken rank sends its peers when they share no memory
(then the header's words are: collective number, this code, origin, culprit, failure kind)."""


HEADER_TAG = 0
"""Message tag of the argument headers (schedule messages start at ``lower.FIRST_TAG``)."""


HEADER_FIELDS = ("operation", "element count", "dtype", "reduce op", "root", "tensor layout", "argument error")
"""The words of an argument header after its collective number (the layout word is a hash of
the tensors' shapes and dtypes for the operations that take several, else 0)."""


FAILURE_KEY = "failure"
"""Store key (in the group's own prefix) of the group's first failure, as JSON."""


BLAME_LISTEN_S = 0.5
"""How long a rank that timed out waiting for a peer follows the other ranks' blame records in
the store (:meth:`HeaderExchange._follow_blame`). Ranks that time out in one collective do
so within a scheduler slice or two of each other, since their waits started together; a store
round trip is well under a millisecond on one host and a few on a network."""


@dataclass(frozen=True, slots=True)
class ParsedReduce:
    """A parsed torch reduce op."""

    code: int
    reduction: Reduction
    average: bool


def parse_reduce_op(op: Any) -> ParsedReduce:
    for code, (torch_op, reduction, average) in enumerate(REDUCE_OPS):
        if op == torch_op:
            return ParsedReduce(code, reduction, average)
    raise CollectiveError(f"reduce op {op} is not supported by the topo backend (premultiplied sums are not)")


def check_reduce(reduce: ParsedReduce, dtype: torch.dtype) -> None:
    check_reduction(reduce.reduction, dtype)
    if reduce.average and not (dtype.is_floating_point or dtype.is_complex):
        raise CollectiveError(f"ReduceOp.AVG needs a floating-point tensor, got {dtype} (sum and divide yourself)")


OPERATIONS = (
    "allreduce",
    "allreduce_coalesced",
    "broadcast",
    "reduce",
    "allgather",
    "allgather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "allgather_coalesced",
)
"""Header codes of the scheduled operations (their index)."""


def describe_field(field_index: int, value: int) -> str:
    if field_index == 0:
        return OPERATIONS[value]
    if field_index == 2:
        return str(HEADER_DTYPES[value]).removeprefix("torch.") if 0 <= value < len(HEADER_DTYPES) else "unsupported dtype"
    if field_index == 5:
        return f"{value:016x}"
    if field_index == 3:
        return str(REDUCE_OPS[value][0]).rsplit(".", 1)[-1] if 0 <= value < len(REDUCE_OPS) else "none"
    return str(value)


def reduce_or_error(op: Any) -> tuple[ParsedReduce | None, str | None]:
    try:
        return parse_reduce_op(op), None
    except CollectiveError as exc:
        return None, str(exc)


def tensor_layout(tensors: Sequence[torch.Tensor]) -> int:
    """A 63-bit digest of the shapes and dtypes of ``tensors``: the header word that makes
    coalesced operations whose tensors differ across ranks fail alike on every rank."""
    text = ";".join(f"{tuple(t.shape)}:{t.dtype}" for t in tensors)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


class HeaderExchange:
    """The header exchange and failure handling of a topo group (a part of its class).

    Uses the group's ``_group_rank``, ``_group_size``, ``_timeout``, ``_store``, ``_shm``,
    ``_cpu_sched``, ``_sequence``, ``_operation``, ``_failure``, ``_closed`` and
    ``_abort_sends``, which :class:`~topocoll.collectives.process_group.TopoProcessGroup` sets.
    """

    # ------------------------------------------------------------------ failures
    def _unusable(self) -> CollectiveError | None:
        if self._closed:
            return CollectiveError(f"rank {self._group_rank}: this topo group was shut down (destroy_process_group)")
        if self._failure is not None:
            return GroupBrokenError(
                f"rank {self._group_rank}: the group is broken since {self._failure.describe()}; "
                "destroy it (dist.destroy_process_group) and create a new one"
            )
        return None

    def _break(self, failure: Failure) -> CollectiveError:
        """Mark the group broken by ``failure`` (the first one only), tell the peers, and return
        the error of the call that failed."""
        if self._failure is None:
            stored = self._stored_failure()
            if stored is not None and stored.sequence < failure.sequence:
                failure = stored  # the group broke in an earlier collective, on another rank
            elif not failure.detail and stored is not None and stored.sequence == failure.sequence:
                failure = stored  # the same collective's failure, in the words of the rank that saw it first
            self._failure = failure
            record = {"sequence": failure.sequence, "origin": failure.origin, "culprit": failure.culprit,
                      "kind": int(failure.kind), "detail": failure.detail}
            try:  # the store first: a peer that sees the mailbox record can then read the detail
                self._store.compare_set(FAILURE_KEY, "", json.dumps(record))
            except Exception as exc:  # the store may have died with its host rank
                logger.debug("rank %d: cannot record the failure in the store: %s", self._group_rank, exc)
            if self._shm is not None and self._shm.has_mailboxes:
                self._shm.post_failure(failure)
            else:
                self._send_abort_headers(failure)
            logger.warning("rank %d: %s", self._group_rank, failure.describe())
        operation = self._operation or "collective"
        return CollectiveError(f"rank {self._group_rank}: {operation}: {failure.describe()}")

    def _send_abort_headers(self, failure: Failure) -> None:
        """Without mailboxes, tell every peer through the header channel: a peer's next header
        exchange receives this instead of a header and raises at once, instead of waiting out
        the timeout for a header that never comes. (The sends are kept until shutdown.)"""
        if self._cpu_sched is None:
            return
        words = [failure.sequence, ABORT_OPERATION, failure.origin, failure.culprit, int(failure.kind)]
        header = torch.tensor(words + [0] * (len(HEADER_FIELDS) + 1 - len(words)), dtype=torch.int64)
        for peer in range(self._group_size):
            if peer != self._group_rank:
                try:
                    self._abort_sends.append(self._cpu_sched.send([header], peer, HEADER_TAG))
                except RuntimeError as exc:  # a dead peer's connection
                    logger.debug("rank %d: cannot tell rank %d of the failure: %s", self._group_rank, peer, exc)

    def _follow_blame(self, failure: Failure) -> Failure:
        """Without mailboxes, find the rank really missing behind a silent or absent peer.

        A rank that timed out waiting for peer ``p`` may be one link of a chain: ``p`` waits
        for ``q``, which died. Each such rank records whom it blames in the store, then follows
        the records for :data:`BLAME_LISTEN_S`: the first rank of the chain that records nothing
        is the one that is dead or stuck. A peer absent from this collective's header exchange
        may be held in an earlier one (:meth:`_earlier_failure`). (With mailboxes, heartbeats
        answer the same question.)
        """
        if self._failure is not None or (self._shm is not None and self._shm.has_mailboxes):
            return failure
        if failure.kind is FailureKind.ABSENT:
            return self._earlier_failure(failure)
        if failure.kind is not FailureKind.SILENT:
            return failure
        key = f"blame/{failure.sequence}"
        try:
            self._store.set(f"{key}/{self._group_rank}", str(failure.culprit))
            chain = [self._group_rank]
            culprit = failure.culprit
            deadline = time.monotonic() + BLAME_LISTEN_S
            while culprit not in chain and culprit != NO_RANK:
                if self._store.check([f"{key}/{culprit}"]):
                    chain.append(culprit)
                    culprit = int(self._store.get(f"{key}/{culprit}"))
                elif time.monotonic() > deadline:
                    break
                else:
                    time.sleep(BLAME_LISTEN_S / 25)
        except Exception as exc:  # a dead store: keep what this rank saw
            logger.debug("rank %d: cannot follow the blame: %s", self._group_rank, exc)
            return failure
        if culprit in chain or culprit == failure.culprit:
            return failure  # nobody further down the chain (or everyone waits: a deadlock)
        via = " -> ".join(f"rank {r}" for r in chain)
        detail = f"{failure.detail}; it waits too: {via} -> rank {culprit}, which answers nothing"
        return Failure(failure.sequence, failure.origin, culprit, failure.kind, detail)

    def _earlier_failure(self, failure: Failure) -> Failure:
        """Why a peer did not come to this collective, if the group broke before it.

        A peer whose group broke in an earlier collective (one this rank got through, e.g. a
        reduce it only sent to) never publishes this collective's header; its abort header and
        this rank's timeout race each other. So this rank looks in the store for
        :data:`BLAME_LISTEN_S`: for the group's failure record of an earlier collective, or for
        the blame the missing peer recorded when it timed out in the previous collective
        (:meth:`_follow_blame` records it before anything else). Either names the rank really
        missing, and is reported instead.
        """
        previous = failure.sequence - 1
        blame_key = f"blame/{previous}/{failure.culprit}"
        deadline = time.monotonic() + BLAME_LISTEN_S
        try:
            while True:
                stored = self._stored_failure()
                if stored is not None and stored.sequence < failure.sequence:
                    return stored
                if stored is None and previous >= 1 and self._store.check([blame_key]):
                    culprit = int(self._store.get(blame_key))
                    detail = f"rank {failure.culprit} waits for it since collective #{previous}, so it did not come to #{failure.sequence}"
                    return Failure(previous, failure.culprit, culprit, FailureKind.SILENT, detail)
                if stored is not None or time.monotonic() > deadline:
                    return failure
                time.sleep(BLAME_LISTEN_S / 25)
        except Exception as exc:  # a dead store: keep what this rank saw
            logger.debug("rank %d: cannot look for an earlier failure: %s", self._group_rank, exc)
            return failure

    def _stored_failure(self) -> Failure | None:
        """The group's first failure as recorded in the store, if any rank recorded one."""
        try:
            if not self._store.check([FAILURE_KEY]):
                return None
            record = json.loads(self._store.get(FAILURE_KEY))
            return Failure(record["sequence"], record["origin"], record["culprit"], FailureKind(record["kind"]), record["detail"])
        except Exception as exc:  # a dead store, or a record of another version: no extra detail
            logger.debug("rank %d: cannot read the failure record: %s", self._group_rank, exc)
            return None

    # ------------------------------------------------------------------ argument headers
    def _agree(
        self,
        operation: str,
        numel: int,
        dtype: torch.dtype,
        reduce_code: int,
        root: int,
        local_error: str | None,
        layout: int = 0,
    ) -> None:
        """Exchange headers for the group's next collective; raise the same AgreedError on every
        rank when they differ, FailedError when a peer does not answer."""
        self._sequence += 1
        self._operation = operation
        dtype_code = HEADER_DTYPES.index(dtype) if dtype in HEADER_DTYPES else -1
        values = [OPERATIONS.index(operation), numel, dtype_code, reduce_code, root, layout, 1 if local_error else 0]
        if self._shm is not None and self._shm.has_mailboxes:
            # Every rank shares memory: the headers go through mailboxes, microseconds
            # instead of a round of gloo messages.
            rows = self._shm.exchange_header(self._sequence, values, self._timeout)
        else:
            rows = self._exchange_header_gloo(values)
        if local_error:
            raise AgreedError(f"rank {self._group_rank}: {operation}: {local_error}")
        bad = [r for r, row in enumerate(rows) if row[-1]]
        if bad:
            raise AgreedError(f"rank {self._group_rank}: {operation}: invalid arguments on rank(s) {bad}")
        for field_index, name in enumerate(HEADER_FIELDS[:-1]):
            values_seen = [row[field_index] for row in rows]
            if len(set(values_seen)) > 1:
                shown = ", ".join(f"rank {r}: {describe_field(field_index, v)}" for r, v in enumerate(values_seen))
                raise AgreedError(f"rank {self._group_rank}: {operation}: {name} differs across ranks ({shown})")

    def _exchange_header_gloo(self, values: list[int]) -> list[list[int]]:
        """One round of direct messages through the inner group (tag 0 is kept free by
        lowering): cheaper than gloo's ring allgather, whose n - 1 sequential hops dominate
        small collectives. Each header starts with the collective's number."""
        sequence = self._sequence
        header = torch.tensor([sequence, *values], dtype=torch.int64)
        gathered = [header if r == self._group_rank else torch.empty_like(header) for r in range(self._group_size)]
        peers = [r for r in range(self._group_size) if r != self._group_rank]
        receiving: dict[int, Any] = {}
        sending: list[tuple[int, Any]] = []
        try:
            for peer in peers:
                receiving[peer] = self._cpu_sched.recv([gathered[peer]], peer, HEADER_TAG)
            for peer in peers:
                sending.append((peer, self._cpu_sched.send([header], peer, HEADER_TAG)))
            for peer, work in receiving.items():
                work.wait(self._timeout)
                words = [int(v) for v in gathered[peer].tolist()]
                if words[1] == ABORT_OPERATION:  # the peer broke: its header says how
                    failure = Failure(words[0], words[2], words[3], FailureKind(words[4]))
                    raise FailedError(failure.describe(), failure)
            for peer, work in sending:
                work.wait(self._timeout)
        except FailedError:
            raise
        except RuntimeError as exc:  # posting to or waiting on ``peer`` failed: it is gone or late
            reason = first_line(exc)
            failure = Failure(sequence, self._group_rank, peer, FailureKind.ABSENT, f"no header from rank {peer}: {reason}")
            raise FailedError(failure.describe(), failure) from None
        rows = [[int(v) for v in g.tolist()] for g in gathered]
        elsewhere = [(r, row[0]) for r, row in enumerate(rows) if row[0] != sequence]
        if elsewhere:
            shown = ", ".join(f"rank {r} is at #{k}" for r, k in elsewhere)
            raise CollectiveError(f"the ranks are out of step: this rank is at collective #{sequence}, {shown}")
        return [row[1:] for row in rows]
