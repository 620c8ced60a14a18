"""The collectives a topo group runs by schedule: allreduce, broadcast, reduce, allgather and
reduce-scatter in every form torch calls (list, tensor, coalesced, single), each checked, agreed
across ranks (:mod:`topocoll.collectives.header`) and run on the group's executor
(:class:`ScheduledCollectives`, a part of
:class:`~topocoll.collectives.process_group.TopoProcessGroup`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from topocoll.collectives.header import HEADER_DTYPES, ParsedReduce, check_reduce, parse_reduce_op, reduce_or_error, tensor_layout
from topocoll.collectives.schedule_source import size_bucket
from topocoll.collectives.tensor_views import (
    base_shape_error,
    bytes_view,
    copy_bytes_into,
    is_packed,
    is_same_memory,
    overlaps,
    packed_copy,
    raw_bytes,
    same_numel_error,
    scatter_copy,
)
from topocoll.collectives.work import TopoWork
from topocoll.errors import CollectiveError
from topocoll.solver.schedule import NATIVE, Collective


class ScheduledCollectives:
    """The scheduled collectives of a topo group. Uses the group's ``_complete`` (runs a body on
    the communication thread), ``_agree`` (the header exchange), ``_executor`` and
    ``_schedules``, and its rank, size and sequence number."""

    def _run(self, collective: Collective, buffer: torch.Tensor, reduce: ParsedReduce | None, root: int | None) -> None:
        if buffer.numel() == 0 or self._group_size == 1:
            return  # nothing to move (a group of one holds every result already)
        size_bytes = buffer.numel() * buffer.element_size()
        device = buffer.device.type
        if self._schedules.schedule(collective, root, size_bucket(size_bytes), device).name == NATIVE:
            self._executor(buffer).run_native(
                collective, buffer, reduce.reduction if reduce else None, self._group_size, sequence=self._sequence, root=root
            )
            return
        program = self._schedules.program(collective, root, buffer.numel(), size_bytes, device)
        self._executor(buffer).run(program, buffer, reduce.reduction if reduce else None, sequence=self._sequence)

    def _validate(self, tensors: Sequence[torch.Tensor], *, reduce: ParsedReduce | None = None) -> str | None:
        """A description of what is wrong with the local arguments, or None."""
        if len(tensors) != 1:
            return f"expected exactly one tensor, got {len(tensors)}"
        tensor = tensors[0]
        if tensor.layout is not torch.strided:
            return f"{tensor.layout} tensors are not supported here (all_reduce of sparse COO tensors is handed to gloo)"
        if tensor.dtype not in HEADER_DTYPES:
            return f"dtype {tensor.dtype} is not supported"
        try:
            self._executor(tensor)
            if reduce is not None:
                check_reduce(reduce, tensor.dtype)
        except CollectiveError as exc:
            return str(exc)
        return None

    # ------------------------------------------------------------------ scheduled collectives
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """All-reduce ``tensors[0]`` in place; sparse COO tensors go to the inner gloo group
        (whose sparse all-reduce gathers indices and values), dense ones through a schedule."""
        opts = opts if opts is not None else dist.AllreduceOptions()
        if tensors and all(t.layout is torch.sparse_coo for t in tensors) and tensors[0].device.type == "cpu":
            return self._other(tensors).allreduce(tensors, opts)
        return self._complete(tensors, lambda: self._allreduce(tensors, opts.reduceOp, "allreduce"))

    def _allreduce(self, tensors: list[torch.Tensor], op: Any, operation: str, layout: int = 0) -> None:
        reduce, error = reduce_or_error(op)
        if error is None:
            error = self._validate(tensors, reduce=reduce)
        tensor = tensors[0] if len(tensors) == 1 else torch.empty(0)
        self._agree(operation, tensor.numel(), tensor.dtype, reduce.code if reduce else -1, 0, error, layout)
        reduce = reduce or parse_reduce_op(op)  # _agree raised already when op is invalid
        work = tensor if is_packed(tensor) else packed_copy(tensor)
        flat = work.view(-1)
        self._run(Collective.ALLREDUCE, flat, reduce, None)
        if reduce.average and flat.numel():
            flat.div_(self._group_size)
        if work is not tensor:
            tensor.copy_(work)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """All-reduce several tensors of one dtype and device with one schedule run."""
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        return self._complete(tensors, lambda: self._allreduce_coalesced(tensors, opts.reduceOp))

    def _allreduce_coalesced(self, tensors: list[torch.Tensor], op: Any) -> None:
        error = None
        if not tensors:
            error = "no tensors given"
        elif len({(t.dtype, t.device) for t in tensors}) != 1:
            error = "all tensors must share one dtype and device"
        if error is not None:
            reduce, _ = reduce_or_error(op)
            self._agree("allreduce_coalesced", 0, torch.float32, reduce.code if reduce else -1, 0, error)
        flat = torch.cat([t.reshape(-1) for t in tensors])
        self._allreduce([flat], op, "allreduce_coalesced", tensor_layout(tensors))
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view(t.shape))
            offset += t.numel()

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """Broadcast ``tensors[0]`` of rank ``opts.rootRank`` to every rank, in place."""
        opts = opts if opts is not None else dist.BroadcastOptions()
        return self._complete(tensors, lambda: self._broadcast(tensors, opts.rootRank))

    def _broadcast(self, tensors: list[torch.Tensor], root: int) -> None:
        error = self._validate(tensors) or self._root_error(root)
        tensor = tensors[0] if len(tensors) == 1 else torch.empty(0)
        self._agree("broadcast", tensor.numel(), tensor.dtype, -1, root, error)
        work = tensor if is_packed(tensor) else packed_copy(tensor)
        self._run(Collective.BROADCAST, bytes_view(work), None, root)
        if work is not tensor:
            tensor.copy_(work)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """Reduce ``tensors[0]`` of every rank into rank ``opts.rootRank``'s, in place there."""
        opts = opts if opts is not None else dist.ReduceOptions()
        return self._complete(tensors, lambda: self._reduce(tensors, opts.rootRank, opts.reduceOp))

    def _reduce(self, tensors: list[torch.Tensor], root: int, op: Any) -> None:
        reduce, error = reduce_or_error(op)
        error = error or self._validate(tensors, reduce=reduce) or self._root_error(root)
        tensor = tensors[0] if len(tensors) == 1 else torch.empty(0)
        self._agree("reduce", tensor.numel(), tensor.dtype, reduce.code if reduce else -1, root, error)
        reduce = reduce or parse_reduce_op(op)  # _agree raised already when op is invalid
        is_root = self._group_rank == root
        # Other ranks' inputs stay untouched: the schedule may add partial sums into them.
        work = tensor if is_root and is_packed(tensor) else packed_copy(tensor)
        flat = work.view(-1)
        self._run(Collective.REDUCE, flat, reduce, root)
        if is_root:
            if reduce.average and flat.numel():
                flat.div_(self._group_size)
            if work is not tensor:
                tensor.copy_(work)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """Gather ``input_tensors[0]`` of every rank into ``output_tensors[0][rank]``."""
        outputs = output_tensors[0] if len(output_tensors) == 1 else []
        return self._complete(list(outputs), lambda: self._allgather_list(output_tensors, input_tensors))

    def _allgather_list(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor]) -> None:
        error = self._validate(input_tensors)
        if error is None:
            if len(output_tensors) != 1 or len(output_tensors[0]) != self._group_size:
                error = f"expected one list of {self._group_size} output tensors"
            else:
                error = same_numel_error(output_tensors[0], input_tensors[0])
        tensor = input_tensors[0] if len(input_tensors) == 1 else torch.empty(0)
        self._agree("allgather", tensor.numel(), tensor.dtype, -1, 0, error)
        gathered = self._gather_into_new(tensor)
        scatter_copy(gathered, output_tensors[0])

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> TopoWork:  # noqa: A002
        """Gather every rank's ``input`` into ``output`` (``size`` times as many elements)."""
        return self._complete([output], lambda: self._allgather_tensor(output, input))

    def _allgather_tensor(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        error = self._validate([tensor])
        if error is None:
            error = base_shape_error(output, tensor, self._group_size)
        self._agree("allgather_into_tensor", tensor.numel(), tensor.dtype, -1, 0, error)
        m = tensor.numel()
        flat = output.view(-1) if is_packed(output) else None
        mine = flat[self._group_rank * m : (self._group_rank + 1) * m] if flat is not None else None
        if mine is None or (overlaps(tensor, output) and not is_same_memory(tensor, mine)):
            # a strided output, or an input inside it elsewhere than this rank's shard
            gathered = self._gather_into_new(tensor)
            output.copy_(gathered.view(output.shape))
            return
        # straight into the output, with no buffer of the whole size to allocate and copy back:
        # on a 2-core host that took 56-101 ms at 64 MiB, about the 120 ms by which gloo's own
        # allgather run through the group trailed gloo's on an emulated 4-host cluster
        if not is_same_memory(tensor, mine):
            mine.copy_(tensor.reshape(-1))
        self._run(Collective.ALLGATHER, bytes_view(flat), None, None)

    def _gather_into_new(self, tensor: torch.Tensor) -> torch.Tensor:
        m = tensor.numel()
        buffer = torch.empty(m * self._group_size, dtype=tensor.dtype, device=tensor.device)
        buffer[self._group_rank * m : (self._group_rank + 1) * m].copy_(tensor.reshape(-1))
        self._run(Collective.ALLGATHER, bytes_view(buffer), None, None)
        return buffer

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """Gather every rank's ``input_list`` into ``output_lists[rank]`` (torch's layout: one
        list per rank, one tensor per input), with one schedule run over all of them."""
        results = [t for outputs in output_lists for t in outputs]
        return self._complete(results, lambda: self._allgather_coalesced(output_lists, input_list))

    def _allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor]) -> None:
        error = self._coalesced_error(input_list)
        if error is None and len(output_lists) != self._group_size:
            error = f"expected {self._group_size} output lists (one per rank), got {len(output_lists)}"
        for r, outputs in enumerate(output_lists if error is None else []):
            if len(outputs) != len(input_list):
                error = f"output list {r} has {len(outputs)} tensors, expected {len(input_list)} (one per input)"
            else:
                error = next(filter(None, (same_numel_error([o], i) for o, i in zip(outputs, input_list))), None)
            if error is not None:
                break
        raw = [raw_bytes(t) for t in input_list] if error is None else []
        size_bytes = sum(b.numel() for b in raw)
        self._agree("allgather_coalesced", size_bytes, torch.uint8, -1, 0, error, tensor_layout(input_list))
        buffer = torch.empty(size_bytes * self._group_size, dtype=torch.uint8, device=input_list[0].device)
        torch.cat(raw, out=buffer[self._group_rank * size_bytes : (self._group_rank + 1) * size_bytes])
        self._run(Collective.ALLGATHER, buffer, None, None)
        for r, outputs in enumerate(output_lists):
            copy_bytes_into(buffer[r * size_bytes : (r + 1) * size_bytes], outputs)

    def _coalesced_error(self, tensors: Sequence[torch.Tensor]) -> str | None:
        """What is wrong with a list of inputs of a coalesced operation (one device), or None."""
        if not tensors:
            return "no tensors given"
        if len({t.device for t in tensors}) != 1:
            return "all tensors must be on one device"
        return next(filter(None, (self._validate([t]) for t in tensors)), None)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """One all-gather-into-tensor per pair."""
        return self._complete(outputs, lambda: [self._allgather_tensor(o, i) for o, i in zip(outputs, inputs)])

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None) -> TopoWork:
        """Reduce ``input_tensors[0][r]`` over ranks into rank ``r``'s ``output_tensors[0]``."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._complete(output_tensors, lambda: self._reduce_scatter_list(output_tensors, input_tensors, opts.reduceOp))

    def _reduce_scatter_list(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], op: Any) -> None:
        reduce, error = reduce_or_error(op)
        error = error or self._validate(output_tensors, reduce=reduce)
        if error is None:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self._group_size:
                error = f"expected one list of {self._group_size} input tensors"
            else:
                error = same_numel_error(input_tensors[0], output_tensors[0])
        output = output_tensors[0] if len(output_tensors) == 1 else torch.empty(0)
        self._agree("reduce_scatter", output.numel(), output.dtype, reduce.code if reduce else -1, 0, error)
        reduce = reduce or parse_reduce_op(op)  # _agree raised already when op is invalid
        buffer = torch.cat([t.reshape(-1) for t in input_tensors[0]])
        self._reduce_scatter_into(output, buffer, reduce)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> TopoWork:  # noqa: A002
        """Reduce ``input`` (``size`` shards) over ranks; rank ``r`` gets shard ``r`` in ``output``."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._complete([output], lambda: self._reduce_scatter_tensor(output, input, opts.reduceOp))

    def _reduce_scatter_tensor(self, output: torch.Tensor, tensor: torch.Tensor, op: Any) -> None:
        reduce, error = reduce_or_error(op)
        error = error or self._validate([output], reduce=reduce)
        if error is None:
            error = base_shape_error(tensor, output, self._group_size)
            if error is None and tensor.dtype != output.dtype:
                error = f"input dtype {tensor.dtype} differs from output dtype {output.dtype}"
        self._agree("reduce_scatter_tensor", output.numel(), output.dtype, reduce.code if reduce else -1, 0, error)
        reduce = reduce or parse_reduce_op(op)  # _agree raised already when op is invalid
        self._reduce_scatter_into(output, tensor.reshape(-1).clone(), reduce)

    def _reduce_scatter_into(self, output: torch.Tensor, buffer: torch.Tensor, reduce: ParsedReduce) -> None:
        m = output.numel()
        self._run(Collective.REDUCE_SCATTER, buffer, reduce, None)
        shard = buffer[self._group_rank * m : (self._group_rank + 1) * m]
        if reduce.average and m:
            shard.div_(self._group_size)
        output.copy_(shard.view(output.shape))

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """One reduce-scatter-tensor per pair."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._complete(
            outputs, lambda: [self._reduce_scatter_tensor(o, i, opts.reduceOp) for o, i in zip(outputs, inputs)]
        )

    # torch >= 2.13 names of the single-tensor forms (the underscore names are the older ones)
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> TopoWork:  # noqa: A002
        """Same as :meth:`_allgather_base` (``dist.all_gather_into_tensor``)."""
        return self._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> TopoWork:  # noqa: A002
        """Same as :meth:`_reduce_scatter_base` (``dist.reduce_scatter_tensor``)."""
        return self._reduce_scatter_base(output, input, opts)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """Same as :meth:`allgather_into_tensor_coalesced`."""
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """Same as :meth:`reduce_scatter_tensor_coalesced`."""
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def _root_error(self, root: int) -> str | None:
        if not 0 <= root < self._group_size:
            return f"root {root} is not a rank of this group of {self._group_size}"
        return None
