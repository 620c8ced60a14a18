"""The executor: runs a :class:`~topocoll.collectives.lower.RankProgram` on a flat tensor.

Messages travel through point-to-point ``send`` / ``recv`` of an inner torch.distributed
backend (gloo for CPU tensors, NCCL for CUDA tensors).

For every step the executor posts all receives, then all sends, waits for all of them, and only
then applies the receives that landed in scratch space and may not be applied early (contract
2: transfers of a step read the values from before it); isolated receives are reduced as soon
as they arrive, overlapping the reduction with the messages still in flight.

``dataflow=True`` runs CPU programs in data-flow order instead
(:mod:`topocoll.collectives.dataflow`), wherever the transport progresses a posted receive on
its own (gloo, and the shared-memory transport when no peer shares memory, as between
machines): messages are posted in program order, each once the messages it depends on (the
writes of the elements it reads or writes, the sends still reading what it overwrites) are
done, so a rank forwards a chunk as soon as it arrived instead of after the slowest message of
the step. Receives in scratch space are applied when a later message needs them, when they
arrived while the rank posts, or at the end. It is not the default: on the emulated
``two-racks`` cluster (an LP schedule of 21 steps, 16-64 MiB) it ran no faster than lock step
(70.7-79.8 % of the bound against 73.9-75.9 %, two runs each).

Reductions are single in-place torch calls per message; there is no Python work per element.

A transport may offer two optional hooks, which :class:`~topocoll.collectives.shm.ShmTransport`
does: ``begin_program(messages)`` (called before a program runs, to size staging space; the
caller of :meth:`Executor.run` must then make sure that every peer finished the previous run,
which the backend's header exchange does) and
``recv_apply(target, src, tag, apply)`` (an isolated reduction applied where the data lies, with
no copy into scratch first).

On CUDA tensors every step is issued as one group (``_start_coalescing()`` /
``_end_coalescing()`` of the NCCL backend), and all receives are applied after the group.

The scratch area is one grow-only tensor per (dtype, device), owned by the :class:`Executor`
and reused across calls.
"""

from __future__ import annotations

import collections
import enum
import logging
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from topocoll.collectives.dataflow import DataflowPlan, Event, dataflow_plan
from topocoll.collectives.failure import NO_RANK, Failure, FailedError, FailureKind, first_line
from topocoll.collectives.lower import ProgramStep, RankProgram, Recv
from topocoll.errors import CollectiveError
from topocoll.solver.schedule import SYNTHESIZED, Collective, Op

__all__ = ["Reduction", "Executor", "combine", "check_reduction"]

logger = logging.getLogger(__name__)

#: Data-flow plans an executor keeps: the programs of the collectives a training step repeats (a
#: rank's schedule source keeps up to 256 programs, most of them run rarely).
PLAN_CACHE_ENTRIES = 32


class Reduction(str, enum.Enum):
    """How a ``REDUCE`` transfer combines the received values into the local ones."""

    SUM = "sum"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"


def _minimum(dst: torch.Tensor, src: torch.Tensor) -> None:
    torch.minimum(dst, src, out=dst)


def _maximum(dst: torch.Tensor, src: torch.Tensor) -> None:
    torch.maximum(dst, src, out=dst)


_COMBINE: dict[Reduction, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    Reduction.SUM: torch.Tensor.add_,
    Reduction.PRODUCT: torch.Tensor.mul_,
    Reduction.MIN: _minimum,
    Reduction.MAX: _maximum,
    Reduction.BAND: torch.Tensor.bitwise_and_,
    Reduction.BOR: torch.Tensor.bitwise_or_,
    Reduction.BXOR: torch.Tensor.bitwise_xor_,
}

_BITWISE = (Reduction.BAND, Reduction.BOR, Reduction.BXOR)

_REDUCE_OPS = {
    Reduction.SUM: dist.ReduceOp.SUM,
    Reduction.PRODUCT: dist.ReduceOp.PRODUCT,
    Reduction.MIN: dist.ReduceOp.MIN,
    Reduction.MAX: dist.ReduceOp.MAX,
    Reduction.BAND: dist.ReduceOp.BAND,
    Reduction.BOR: dist.ReduceOp.BOR,
    Reduction.BXOR: dist.ReduceOp.BXOR,
}


def check_reduction(reduction: Reduction, dtype: torch.dtype) -> None:
    """Refuse the combinations gloo refuses: bitwise reductions of floating-point data.

    Raises
    ------
    CollectiveError
        ``reduction`` is bitwise and ``dtype`` is floating point or complex.
    """
    if reduction in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
        raise CollectiveError(f"reduction {reduction.value} needs an integer or bool tensor, got {dtype}")
    if reduction in (Reduction.MIN, Reduction.MAX) and dtype.is_complex:
        raise CollectiveError(f"reduction {reduction.value} is undefined for complex tensors ({dtype})")


def combine(reduction: Reduction, dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst = reduction(dst, src)`` in place (both tensors of the same shape and dtype)."""
    _COMBINE[reduction](dst, src)


class Executor:
    """Runs rank programs over point-to-point ops of one inner backend.

    Parameters
    ----------
    transport : torch.distributed backend
        Anything with torch's ``send(tensors, dst, tag)`` / ``recv(tensors, src, tag)`` that
        return ``Work`` objects (``ProcessGroupGloo``, ``ProcessGroupNCCL``). Its ranks are the
        program's ranks.
    rank : int
        This process's rank in ``transport`` (for messages).
    timeout : datetime.timedelta
        How long to wait for one message before giving up.
    grouped : bool, optional
        Run every step as one group of operations (:meth:`_run_step_grouped`). Default: for
        tensors on accelerators (NCCL), not for CPU tensors.
    channels : sequence of torch.distributed backends, optional
        Backends for messages on channels 1, 2, ... (one per rail, each bound to that rail's
        NICs); channel 0 is ``transport``. Only the ungrouped (gloo) path uses them.
    native : torch.distributed backend, optional
        The inner backend whose own collectives :meth:`run_native` calls.
    dataflow : bool
        Run CPU programs in data-flow order rather than in lock step (default False), where the
        transport allows (its ``progresses_alone``, True when it has no such attribute).
    """

    def __init__(
        self,
        transport: Any,
        rank: int,
        timeout: timedelta,
        *,
        grouped: bool | None = None,
        channels: Sequence[Any] = (),
        native: Any = None,
        dataflow: bool = False,
    ) -> None:
        self._native = native
        self._dataflow = dataflow
        self._transport = transport
        self._channels = (transport, *channels)
        self._grouped = grouped
        self._rank = rank
        self._timeout = timeout
        self._scratch: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        # data-flow plans of the programs run last, by identity (programs come from a cache)
        self._plans: collections.OrderedDict[int, tuple[RankProgram, DataflowPlan]] = collections.OrderedDict()
        self._sequence = 0  # of the program running (for failures)

    def _dataflow_plan(self, program: RankProgram) -> DataflowPlan:
        """:func:`dataflow_plan` of ``program``, kept for the next run of the same program (it
        costs about 5 us per message, as much as a small collective)."""
        entry = self._plans.get(id(program))
        if entry is not None and entry[0] is program:
            self._plans.move_to_end(id(program))
            return entry[1]
        plan = dataflow_plan(program)
        self._plans[id(program)] = (program, plan)
        while len(self._plans) > PLAN_CACHE_ENTRIES:
            self._plans.popitem(last=False)
        return plan

    def scratch(self, dtype: torch.dtype, device: torch.device, numel: int) -> torch.Tensor:
        """A reusable flat scratch tensor of at least ``numel`` elements."""
        key = (dtype, device)
        buffer = self._scratch.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = torch.empty(numel, dtype=dtype, device=device)
            self._scratch[key] = buffer
        return buffer

    def run(self, program: RankProgram, buffer: torch.Tensor, reduction: Reduction | None, sequence: int | None = None) -> None:
        """Run ``program`` on ``buffer`` in place.

        Parameters
        ----------
        program : RankProgram
            The program of this rank.
        buffer : torch.Tensor
            Flat, contiguous, ``program.count`` elements.
        reduction : Reduction or None
            How ``REDUCE`` receives combine; None for collectives that only copy.
        sequence : int, optional
            The group's number of this collective: a staging transport stamps it on every
            message and accepts only messages of the same collective (without it, the
            transport counts programs itself); it also names the collective in failures.

        Raises
        ------
        FailedError
            A message failed or timed out (the failure blames the peer; the message names the
            step).
        CollectiveError
            The program reduces but no reduction was given.
        """
        if buffer.dim() != 1 or not buffer.is_contiguous() or buffer.numel() != program.count:
            raise CollectiveError(
                f"rank {self._rank}: executor needs a flat contiguous buffer of {program.count} elements, "
                f"got shape {tuple(buffer.shape)}"
            )
        grouped = buffer.device.type != "cpu" if self._grouped is None else self._grouped
        # data-flow order waits for one message while others are under way: only where posted
        # receives progress without their wait() (gloo; not a shared-memory transport)
        dataflow = self._dataflow and not grouped and getattr(self._transport, "progresses_alone", True)
        plan = self._dataflow_plan(program) if dataflow else None
        scratch = self.scratch(buffer.dtype, buffer.device, program.scratch_elements if plan is None else plan.scratch_elements)
        if reduction is None and any(r.op is Op.REDUCE for step in program.steps for r in step.recvs):
            raise CollectiveError(f"rank {self._rank}: {program.collective.value} program reduces but no reduction op was given")
        if any(m.channel >= len(self._channels) for step in program.steps for m in (*step.sends, *step.recvs)):
            raise CollectiveError(
                f"rank {self._rank}: {program.collective.value} program uses rails this executor has no groups for "
                f"(it has {len(self._channels)} channel(s))"
            )
        begin_program = getattr(self._transport, "begin_program", None)
        if begin_program is not None:  # transports that stage data (shared memory) size it first
            size = buffer.element_size()
            try:
                begin_program(  # only channel 0 messages go through the staging transport
                    [(send.peer, send.numel * size) for step in program.steps for send in step.sends if send.channel == 0],
                    incoming=[recv.peer for step in program.steps for recv in step.recvs if recv.channel == 0],
                    **({} if sequence is None else {"sequence": sequence}),
                )
            except OSError as exc:
                raise CollectiveError(f"rank {self._rank}: cannot stage {program.collective.value} data: {exc}") from exc
        self._sequence = sequence or 0
        if plan is not None:
            self._run_dataflow(plan, buffer, scratch, reduction, program.collective.value)
            return
        for index, step in enumerate(program.steps):
            if grouped:
                self._run_step_grouped(index, step, buffer, scratch, reduction)
            else:
                self._run_step(index, step, buffer, scratch, reduction, program.collective.value)

    def run_native(
        self,
        collective: Collective,
        buffer: torch.Tensor,
        reduction: Reduction | None,
        world_size: int,
        sequence: int | None = None,
        root: int | None = None,
    ) -> None:
        """Run ``collective`` on ``buffer`` in place with the inner backend's own collective (a
        schedule named :data:`topocoll.solver.schedule.NATIVE`), on the buffer as :meth:`run`
        takes it.

        Parameters
        ----------
        collective : Collective
            ``ALLREDUCE``; ``ALLGATHER`` (``buffer`` is the output, this rank's shard in place);
            ``REDUCE_SCATTER`` (``buffer`` is the input, this rank's shard of it receives the
            result); ``BROADCAST`` or ``REDUCE`` (to or from ``root``, in place).
        buffer : torch.Tensor
            Flat and contiguous; ``world_size`` equal shards for allgather and reduce-scatter.
        reduction : Reduction or None
            For allreduce, reduce-scatter and reduce.
        world_size : int
        sequence : int, optional
            As for :meth:`run`.
        root : int, optional
            Root rank of broadcast and reduce.

        Raises
        ------
        FailedError
            The inner collective failed or timed out.
        CollectiveError
            No inner backend was given, or the collective is not one it runs natively.
        """
        if self._native is None:
            raise CollectiveError(f"rank {self._rank}: this executor has no inner backend to run {collective.value} natively")
        self._sequence = sequence or 0
        reduces = collective in (Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.REDUCE)
        if (reduces and reduction is None) or (collective.is_rooted and root is None) or collective not in SYNTHESIZED:
            raise CollectiveError(f"rank {self._rank}: {collective.value} is not run by the inner backend")
        shard = buffer.numel() // world_size
        mine = buffer[self._rank * shard : (self._rank + 1) * shard]
        if collective is Collective.ALLREDUCE:
            options = dist.AllreduceOptions()
            options.reduceOp = _REDUCE_OPS[reduction]
            options.timeout = self._timeout
            work = self._native.allreduce([buffer], options)
        elif collective is Collective.ALLGATHER:
            work = self._native._allgather_base(buffer, mine.clone())  # the group's timeout
        elif collective is Collective.REDUCE_SCATTER:
            options = dist.ReduceScatterOptions()
            options.reduceOp = _REDUCE_OPS[reduction]
            options.timeout = self._timeout
            result = torch.empty_like(mine)
            work = self._native._reduce_scatter_base(result, buffer, options)
        elif collective is Collective.BROADCAST:
            options = dist.BroadcastOptions()
            options.rootRank, options.rootTensor, options.timeout = root, 0, self._timeout
            work = self._native.broadcast([buffer], options)
        else:
            options = dist.ReduceOptions()
            options.reduceOp, options.rootRank, options.rootTensor, options.timeout = _REDUCE_OPS[reduction], root, 0, self._timeout
            work = self._native.reduce([buffer], options)
        self._wait(work, f"the inner backend's {collective.value}", 0, None)
        if collective is Collective.REDUCE_SCATTER:
            mine.copy_(result)

    def _run_step(
        self,
        index: int,
        step: ProgramStep,
        buffer: torch.Tensor,
        scratch: torch.Tensor,
        reduction: Reduction | None,
        collective: str,
    ) -> None:
        """One step over a transport whose sends and receives progress independently (gloo).

        Every receive is posted before any send: a gloo pair whose two ranks both post their
        send first moves one direction at a time. Measured on ``two-racks``' 50 Mbit/s uplink,
        64 MiB each way between two ranks: 2.98 MB/s each way with sends first, 5.63-5.66 MB/s
        (95 % of the link) with receives first, whichever rank came late.
        """
        try:
            receiving = []
            recv_apply = getattr(self._transport, "recv_apply", None)
            for recv in step.recvs:
                isolated_reduce = reduction is not None and recv.op is Op.REDUCE and not recv.after_step
                if recv_apply is not None and recv.channel == 0 and isolated_reduce:
                    # an isolated reduce the transport can apply where the data lies
                    target = buffer[recv.start : recv.stop]
                    work = recv_apply(target, recv.peer, recv.tag, self._combiner(reduction))
                    if work is not None:
                        receiving.append((recv, None, work))
                        continue
                landing = self._landing(recv, buffer, scratch)
                receiving.append((recv, landing, self._channels[recv.channel].recv([landing], recv.peer, recv.tag)))
            sending = [
                (send, self._channels[send.channel].send([buffer[send.start : send.stop]], send.peer, send.tag))
                for send in step.sends
            ]
            deferred = []
            for recv, landing, work in receiving:
                self._wait(work, f"receive from rank {recv.peer}", index, recv.peer)
                if landing is None:
                    continue  # applied by the transport
                if recv.after_step:
                    deferred.append((recv, landing))
                elif recv.scratch_start is not None:
                    # isolated: nothing else of this step touches the range, so reduce now while
                    # later messages are still arriving
                    self._apply(recv, landing, buffer, reduction)
            for send, work in sending:
                self._wait(work, f"send to rank {send.peer}", index, send.peer)
        except RuntimeError as exc:
            if isinstance(exc, CollectiveError):
                raise
            raise CollectiveError(f"rank {self._rank}: step {index} of {collective} failed: {exc}") from exc
        for recv, landing in deferred:
            self._apply(recv, landing, buffer, reduction)

    def _run_dataflow(
        self, plan: DataflowPlan, buffer: torch.Tensor, scratch: torch.Tensor, reduction: Reduction | None, collective: str
    ) -> None:
        """Post ``plan``'s messages in order, each once what it depends on happened; then apply
        and complete the rest. The transport progresses posted messages on its own threads
        (``progresses_alone``), so waiting here for one message never holds up another."""
        messages = plan.messages
        works: list[Any] = [None] * len(messages)
        landings: list[torch.Tensor | None] = [None] * len(messages)
        happened: set[tuple[Event, int]] = set()
        pending: list[int] = []  # receives into scratch not applied yet, in posting order

        def complete(m: int) -> None:
            message = messages[m]
            what = f"receive from rank {message.recv.peer}" if message.recv is not None else f"send to rank {message.send.peer}"
            peer = message.recv.peer if message.recv is not None else message.send.peer
            self._wait(works[m], what, message.step, peer)
            happened.add((Event.DONE, m))
            if message.recv is not None and landings[m] is None:  # landed in the buffer
                happened.add((Event.APPLIED, m))

        def satisfy(needed: tuple[tuple[Event, int], ...]) -> None:
            # depth first, iteratively: an application may need earlier ones (long chains of
            # reductions into one range would overflow Python's recursion)
            stack = [(event, False) for event in reversed(needed)]
            while stack:
                (kind, m), ready = stack.pop()
                if (kind, m) in happened:
                    continue
                if kind is Event.DONE or landings[m] is None:
                    complete(m)
                elif not ready:
                    stack.append(((kind, m), True))
                    stack.extend((event, False) for event in reversed(messages[m].apply_after))
                else:
                    self._apply(messages[m].recv, landings[m], buffer, reduction)
                    happened.add((Event.APPLIED, m))

        def apply_arrived() -> None:
            """Apply, without waiting, the receives that arrived and whose turn it is."""
            for m in pending:
                if (Event.APPLIED, m) in happened:
                    continue
                done = getattr(works[m], "is_completed", None)
                if done is None or not done():
                    return  # in order: a later one may depend on this one
                if any(e not in happened and not (e == (Event.DONE, m)) for e in messages[m].apply_after):
                    return
                happened.add((Event.DONE, m))
                self._apply(messages[m].recv, landings[m], buffer, reduction)
                happened.add((Event.APPLIED, m))

        try:
            step = -1
            for m, message in enumerate(messages):
                if message.step != step:
                    step = message.step
                    apply_arrived()
                    pending[:] = [p for p in pending if (Event.APPLIED, p) not in happened]
                satisfy(message.post_after)
                recv, send = message.recv, message.send
                if send is not None:
                    works[m] = self._channels[send.channel].send([buffer[send.start : send.stop]], send.peer, send.tag)
                    continue
                if message.scratch_start is None:
                    works[m] = self._channels[recv.channel].recv([buffer[recv.start : recv.stop]], recv.peer, recv.tag)
                else:
                    landings[m] = scratch[message.scratch_start : message.scratch_start + recv.numel]
                    works[m] = self._channels[recv.channel].recv([landings[m]], recv.peer, recv.tag)
                    pending.append(m)
            for m, message in enumerate(messages):
                satisfy(((Event.APPLIED if message.recv is not None else Event.DONE, m),))
        except RuntimeError as exc:
            if isinstance(exc, CollectiveError):
                raise
            raise CollectiveError(f"rank {self._rank}: step {messages[m].step} of {collective} failed: {exc}") from exc

    def _run_step_grouped(
        self, index: int, step: ProgramStep, buffer: torch.Tensor, scratch: torch.Tensor, reduction: Reduction | None
    ) -> None:
        """One step as one group of operations, every receive applied after the whole group.

        NCCL: point-to-point calls issued one by one on a pair's stream would let two ranks'
        receives wait for sends queued behind them, so a backend that ``supports_coalescing``
        gets the step between ``_start_coalescing()`` and ``_end_coalescing()`` (c10d's
        ``Backend`` methods, which take no device) and one Work for all of it. A backend without
        coalescing (gloo) runs the same code with one Work per message, which is what lets the
        CPU tests run this path on a real gloo backend.
        """
        landings = [(recv, self._landing(recv, buffer, scratch)) for recv in step.recvs]
        coalescing = bool(getattr(self._transport, "supports_coalescing", False))
        try:
            if coalescing:
                self._transport._start_coalescing()
            works = [(self._transport.recv([landing], recv.peer, recv.tag), f"receive from rank {recv.peer}", recv.peer)
                     for recv, landing in landings]
            works += [(self._transport.send([buffer[send.start : send.stop]], send.peer, send.tag), f"send to rank {send.peer}", send.peer)
                      for send in step.sends]
            if coalescing:
                works = [(self._transport._end_coalescing(), "grouped messages", None)]
        except RuntimeError as exc:
            if isinstance(exc, CollectiveError):
                raise
            raise CollectiveError(f"rank {self._rank}: step {index} failed: {exc}") from exc
        for work, what, peer in works:
            self._wait(work, what, index, peer, stream_ordered=True)
        for recv, landing in landings:
            if recv.scratch_start is not None:
                self._apply(recv, landing, buffer, reduction)

    @staticmethod
    def _combiner(reduction: Reduction) -> Callable[[torch.Tensor, torch.Tensor], None]:
        return lambda target, data: combine(reduction, target, data)

    @staticmethod
    def _landing(recv: Recv, buffer: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
        if recv.scratch_start is None:
            return buffer[recv.start : recv.stop]
        return scratch[recv.scratch_start : recv.scratch_start + recv.numel]

    @staticmethod
    def _apply(recv: Recv, landing: torch.Tensor, buffer: torch.Tensor, reduction: Reduction | None) -> None:
        target = buffer[recv.start : recv.stop]
        if recv.op is Op.COPY or reduction is None:
            target.copy_(landing)
        else:
            combine(reduction, target, landing)

    def _wait(self, work: Any, what: str, step: int, peer: int | None, *, stream_ordered: bool = False) -> None:
        """Wait for one Work; ``stream_ordered`` (the grouped path) calls ``wait()`` without a
        timeout: on NCCL that makes the current CUDA stream wait for the messages and returns at
        once, so the host enqueues the whole program and the GPU orders it (the receives' local
        reductions run on the current stream after their messages, the next step's messages after
        them), and the timeout is the NCCL watchdog's (the inner groups are made with the group's
        timeout). ``wait(timeout)`` would block the host on every step. On gloo both forms block
        the host, ``wait()`` up to the group's own timeout."""
        try:
            if stream_ordered:
                work.wait()
            else:
                work.wait(self._timeout)
        except CollectiveError:
            raise  # the transport's own, naming the peer already
        except RuntimeError as exc:
            reason = first_line(exc)
            detail = f"rank {self._rank}, step {step}: {what} failed: {reason}"
            if peer is None:
                failure = Failure(self._sequence, self._rank, NO_RANK, FailureKind.ERROR, detail)
            else:
                failure = Failure(self._sequence, self._rank, peer, FailureKind.SILENT, detail)
            raise FailedError(f"rank {self._rank}: {failure.describe()}", failure) from None
