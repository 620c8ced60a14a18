"""The ``Work`` handle :class:`~topocoll.collectives.backend.TopoProcessGroup` returns.

``torch.distributed`` hands the caller a ``Work`` for every collective; ``wait()`` must raise the
failure of the operation. A work built with ``_create_work_from_future`` drops errors
(``wait()`` returns True after a failure), so topocoll subclasses ``dist._Work`` and keeps the
outcome itself. A failure is raised, with its own type and message, by :meth:`TopoWork.wait`,
and set on the future that :meth:`TopoWork.get_future` returns.

A collective on CPU tensors runs on the group's communication thread: the handle comes back at
once, *pending* (:meth:`TopoWork.pending`), and :meth:`TopoWork.wait` blocks until the thread
has run it. Others run before the handle is made, which is then complete.

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

import concurrent.futures
import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from topocoll.errors import CollectiveError

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
        self._pending: concurrent.futures.Future | None = None
        if error is None:
            self._future.set_result(self._result)
        else:
            self._error = _rebuildable(error)
            self._future.set_exception(self._fresh_error())

    @classmethod
    def pending(cls, result: list[torch.Tensor], outcome: concurrent.futures.Future) -> TopoWork:
        """A handle for an operation still queued or running; ``outcome`` resolves to the
        finished operation's own (complete) :class:`TopoWork`.

        Parameters
        ----------
        result : list of torch.Tensor
        outcome : concurrent.futures.Future
        """
        work = cls.__new__(cls)
        dist._Work.__init__(work)
        work._result = list(result)
        work._event = None
        work._error = None
        work._future = torch.futures.Future()
        work._pending = outcome
        work._settled = threading.Event()
        outcome.add_done_callback(work._settle)
        return work

    def _settle(self, outcome: concurrent.futures.Future) -> None:
        """Take the finished operation's outcome (on the thread that finished it)."""
        if outcome.cancelled():
            self._event, self._error = None, (CollectiveError, "the operation was cancelled: its group was aborted")
        else:
            done: TopoWork = outcome.result()  # the thread's body catches everything into a handle
            self._event, self._error = done._event, done._error
        self._settled.set()  # before the future's callbacks run: they may wait() on this handle
        if self._error is None:
            self._future.set_result(self._result)
        else:
            self._future.set_exception(self._fresh_error())

    def _finish(self, timeout: timedelta | None) -> None:
        """Block until a pending operation is done (or ``timeout`` passes: raise)."""
        if self._pending is None:
            return
        limit = None if timeout is None or timeout == timedelta(0) else timeout.total_seconds()  # 0: torch's "no timeout"
        if not self._settled.wait(limit):
            raise RuntimeError(f"the operation did not complete within {timeout}")

    def _fresh_error(self) -> BaseException:
        assert self._error is not None
        kind, message = self._error
        return kind(message)

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Return True, or raise the operation's exception (a new instance each time).

        On CUDA tensors the current stream of the result's device waits for the operation.
        """
        self._finish(timeout)
        if self._error is not None:
            raise self._fresh_error()
        if self._event is not None:
            self._event.wait(torch.cuda.current_stream(self._result[0].device))
        return True

    def is_completed(self) -> bool:
        """True once the operation is done."""
        if self._pending is not None and not self._settled.is_set():
            return False
        return self._event is None or bool(self._event.query())

    def is_success(self) -> bool:
        """Whether the operation succeeded (False while it is still pending)."""
        return self._error is None and self.is_completed()

    def get_future(self) -> torch.futures.Future:
        """A future of the result tensors, or of the exception; completed once the operation is."""
        return self._future

    def result(self) -> list[torch.Tensor]:
        """The result tensors (waits for a pending operation; raises its exception when it failed)."""
        self._finish(None)
        if self._error is not None:
            raise self._fresh_error()
        return self._result

    def synchronize(self) -> None:
        """Block the host until the operation is done, its GPU work included."""
        self._finish(None)
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
