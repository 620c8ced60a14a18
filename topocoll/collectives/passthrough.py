"""What a topo group hands to its inner backend as it is: point-to-point messages, gather,
scatter, all-to-all, the barrier and gloo's monitored barrier (:class:`InnerBackendCalls`, a part of
:class:`~topocoll.collectives.process_group.TopoProcessGroup`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from topocoll.collectives.tensor_views import scatter_copy
from topocoll.collectives.work import TopoWork
from topocoll.errors import CollectiveError


class InnerBackendCalls:
    """The operations a topo group delegates, explicitly, to the inner backend of the tensors'
    device (``_other``): torch calls every one of them on the group, and a method torch finds
    missing fails with "No backend type associated" instead of reaching the inner group."""

    # ------------------------------------------------------------------ handed to the inner backend
    def barrier(self, opts: Any = None) -> Any:
        """Barrier of the inner backend, after every earlier collective of this rank completed.

        CPU collectives complete before they return; CUDA ones are only enqueued, so the GPU
        work of this group is finished first (as NCCL's barrier does), and once the barrier
        returns every rank's earlier collectives are done.
        """
        self._drain()
        unusable = self._unusable()
        if unusable is not None:
            return TopoWork([], unusable)
        if self._cuda_device is not None:
            torch.cuda.synchronize(self._cuda_device)
        options = dist.BarrierOptions()
        options.timeout = self._timeout
        return self._cpu_sched.barrier(options)

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> Any:
        """gloo's monitored barrier on the inner group: names the ranks that did not arrive.

        ``dist.monitored_barrier`` refuses every backend not named "gloo" before it reaches a
        group, so call this method on the group (``dist.group.WORLD.monitored_barrier(...)``).
        """
        self._drain()
        unusable = self._unusable()
        if unusable is not None:
            raise unusable
        if self._cuda_device is not None:
            torch.cuda.synchronize(self._cuda_device)
        return self._cpu_sched.monitored_barrier(timeout or self._timeout, wait_all_ranks=wait_all_ranks)

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> Any:  # noqa: N803
        """Inner backend's send."""
        return self._other(tensors).send(tensors, dstRank, tag)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> Any:  # noqa: N803
        """Inner backend's receive."""
        return self._other(tensors).recv(tensors, srcRank, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        """Inner backend's receive from any rank."""
        return self._other(tensors).recv_anysource(tensors, tag)

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """Inner backend's gather."""
        return self._other(input_tensors).gather(output_tensors, input_tensors, opts or dist.GatherOptions())

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None) -> Any:
        """Inner backend's scatter."""
        return self._other(output_tensors).scatter(output_tensors, input_tensors, opts or dist.ScatterOptions())

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # noqa: A002
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Any:
        """Inner backend's all-to-all of one tensor."""
        return self._other([input]).alltoall_base(
            output, input, output_split_sizes, input_split_sizes, opts or dist.AllToAllOptions()
        )

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: Any = None) -> TopoWork:
        """All-to-all of tensor lists, through the inner backend's single-tensor all-to-all."""
        return self._complete(output_tensors, lambda: self._alltoall(output_tensors, input_tensors))

    def _alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor]) -> None:
        if len(output_tensors) != self._group_size or len(input_tensors) != self._group_size:
            raise CollectiveError(f"rank {self._group_rank}: alltoall needs {self._group_size} input and output tensors")
        if len({t.dtype for t in list(output_tensors) + list(input_tensors)}) != 1:
            raise CollectiveError(f"rank {self._group_rank}: alltoall tensors must share one dtype")
        send = torch.cat([t.reshape(-1) for t in input_tensors])
        receive = torch.empty(sum(t.numel() for t in output_tensors), dtype=send.dtype, device=send.device)
        work = self._other(input_tensors).alltoall_base(
            receive, send, [t.numel() for t in output_tensors], [t.numel() for t in input_tensors], dist.AllToAllOptions()
        )
        work.wait(self._timeout)
        scatter_copy(receive, output_tensors)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # noqa: A002
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Any:
        """Same as :meth:`alltoall_base` (``dist.all_to_all_single``)."""
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)
