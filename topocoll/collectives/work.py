"""The ``Work`` handle :class:`~topocoll.collectives.backend.TopoProcessGroup` returns.

``torch.distributed`` hands the caller a ``Work`` for every collective; ``wait()`` must raise the
failure of the operation. A work built with ``_create_work_from_future`` drops errors
(``wait()`` returns True after a failure), so topocoll subclasses ``dist._Work`` and keeps the
outcome itself. Operations run to completion before the handle is returned, so the handle is
always complete; a failure is raised, with its own type and message, by :meth:`TopoWork.wait`,
and set on the future that :meth:`TopoWork.get_future` returns.

The handle keeps only the failure's type and message and raises a fresh exception at every
``wait()``: a stored exception would keep its traceback, whose frames hold the process group,
its inner gloo groups (threads, sockets) and its shared memory alive after
``destroy_process_group``, for as long as the caller holds the handle.

On CUDA tensors the host has only *enqueued* the operation when the handle comes back (the GPU
orders it on the stream that was current, see :meth:`Executor._wait
<topocoll.collectives.executor.Executor._wait>`); the handle then holds a CUDA event recorded
after the operation, and behaves as NCCL's: :meth:`TopoWork.wait` makes the caller's current
stream wait for it (the host goes on), :meth:`TopoWork.synchronize` blocks the host until it
is done, :meth:`TopoWork.is_completed` asks the event.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["TopoWork"]


class TopoWork(dist._Work):
    """A completed operation: its result tensors, or the exception that ended it.

    Parameters
    ----------
    result : list of torch.Tensor
        The tensors that hold the result (the value of :meth:`get_future`).
    error : BaseException or None
        The failure, raised by :meth:`wait`.
    event : torch.cuda.Event, optional
        Recorded after the operation's GPU work (CUDA tensors only).
    """

    def __init__(self, result: list[torch.Tensor], error: BaseException | None = None, event: Any = None) -> None:
        super().__init__()
        self._result = list(result)
        self._event = event if error is None else None
        self._error: tuple[type[BaseException], str] | None = None
        self._future: torch.futures.Future = torch.futures.Future()
        if error is None:
            self._future.set_result(self._result)
        else:
            self._error = _rebuildable(error)
            self._future.set_exception(self._fresh_error())

    def _fresh_error(self) -> BaseException:
        assert self._error is not None
        kind, message = self._error
        return kind(message)

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Return True, or raise the operation's exception (a new instance each time).

        On CUDA tensors the current stream of the result's device waits for the operation.
        """
        if self._error is not None:
            raise self._fresh_error()
        if self._event is not None:
            self._event.wait(torch.cuda.current_stream(self._result[0].device))
        return True

    def is_completed(self) -> bool:
        """True once the operation is done (on CPU tensors, always: it ran before the handle was made)."""
        return self._event is None or bool(self._event.query())

    def is_success(self) -> bool:
        """Whether the operation succeeded."""
        return self._error is None

    def get_future(self) -> torch.futures.Future:
        """A completed future holding the result tensors, or the exception."""
        return self._future

    def result(self) -> list[torch.Tensor]:
        """The result tensors (raises the operation's exception when it failed)."""
        if self._error is not None:
            raise self._fresh_error()
        return self._result

    def synchronize(self) -> None:
        """Block the host until the operation's GPU work is done (CPU tensors: nothing to do)."""
        if self._event is not None:
            self._event.synchronize()


def _rebuildable(error: BaseException) -> tuple[type[BaseException], str]:
    """The type and message to raise ``error`` again from; RuntimeError when its type cannot be
    made from a message alone."""
    kind: type[BaseException] = type(error)
    message = str(error)
    try:
        kind(message)
    except Exception:  # a constructor with other arguments: keep the message, not the type
        kind = RuntimeError
    return kind, message
