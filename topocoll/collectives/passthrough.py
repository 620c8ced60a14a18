"""What a topo group hands to its inner backend as it is: point-to-point messages, gather,
scatter, the barrier and gloo's monitored barrier (:class:`InnerBackendCalls`, a part of
:class:`~topocoll.collectives.process_group.TopoProcessGroup`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from topocoll.collectives.work import TopoWork


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

