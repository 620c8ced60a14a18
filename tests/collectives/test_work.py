"""``TopoWork``: a failed operation's handle raises a fresh error and keeps nothing else alive."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from topocoll.collectives.failure import FailedError, Failure, FailureKind
from topocoll.collectives.work import TopoWork
from topocoll.errors import CollectiveError


class _Owner:
    """Stands for the process group: what a failing frame holds."""


def _failing_work() -> tuple[TopoWork, weakref.ref]:
    owner = _Owner()

    def body(group: _Owner) -> None:
        raise CollectiveError("rank 1: allreduce: collective #3 failed")

    try:
        body(owner)
    except CollectiveError as exc:
        work = TopoWork([torch.zeros(2)], exc)
    return work, weakref.ref(owner)


def test_wait_raises_a_fresh_error_every_time_with_type_and_message():
    work, _ = _failing_work()
    with pytest.raises(CollectiveError, match="collective #3 failed") as first:
        work.wait()
    with pytest.raises(CollectiveError, match="collective #3 failed") as second:
        work.wait()
    assert first.value is not second.value
    assert not work.is_success() and work.is_completed()
    with pytest.raises(CollectiveError):
        work.get_future().wait()


def test_a_failed_handle_does_not_keep_the_failing_frames_alive():
    work, owner = _failing_work()
    gc.collect()
    assert owner() is None, "the handle keeps the failing call's frames (and the group) alive"
    with pytest.raises(CollectiveError):
        work.wait()


def test_a_failure_is_raised_again_as_a_collective_error_naming_the_culprit():
    failure = Failure(2, 0, 1, FailureKind.ABSENT, "rank 0 waited 1 s for rank(s) [1]")
    work = TopoWork([], FailedError("rank 0: " + failure.describe(), failure))
    with pytest.raises(CollectiveError, match=r"collective #2 failed: rank 1 did not arrive \(rank 0 waited 1 s"):
        work.wait()


def test_a_successful_handle():
    result = [torch.ones(3)]
    work = TopoWork(result)
    assert work.wait() and work.is_success()
    assert work.get_future().wait()[0] is result[0]


class _StubEvent:
    """Stands for ``torch.cuda.Event`` (no CUDA here): records what the handle asks of it."""

    def __init__(self, done: bool):
        self.done, self.calls = done, []

    def wait(self, stream):
        self.calls.append(("wait", stream))

    def query(self):
        self.calls.append(("query",))
        return self.done

    def synchronize(self):
        self.calls.append(("synchronize",))


def test_cuda_handle_orders_the_callers_stream(monkeypatch):
    """As NCCL's Work: wait() makes the current stream wait (no host block), synchronize()
    blocks the host, is_completed() asks the event; a failed handle raises and has no event."""
    streams = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: streams.append(device) or "stream")
    event = _StubEvent(done=False)
    result = [torch.zeros(2)]
    work = TopoWork(result, event=event)
    assert work.is_completed() is False
    assert work.wait() is True
    work.synchronize()
    assert event.calls == [("query",), ("wait", "stream"), ("synchronize",)]
    assert streams == [result[0].device]
    failed = TopoWork(result, RuntimeError("boom"), event=_StubEvent(done=False))
    assert failed.is_completed() is True
    with pytest.raises(RuntimeError, match="boom"):
        failed.wait()


# ----------------------------------------------------------------------------- pending handles
def _pending(pool, body):
    result = [torch.zeros(2)]
    return TopoWork.pending(result, pool.submit(body, result)), result


def test_a_pending_handle_completes_when_the_thread_has_run_the_operation():
    import concurrent.futures
    import threading
    from datetime import timedelta

    go = threading.Event()

    def body(result):
        go.wait(10)
        result[0].fill_(7)
        return TopoWork(result)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        work, result = _pending(pool, body)
        assert not work.is_completed() and not work.is_success()
        with pytest.raises(RuntimeError, match="did not complete within"):
            work.wait(timedelta(milliseconds=50))
        seen = []
        work.get_future().then(lambda fut: seen.append(work.wait()))  # a callback may wait()
        go.set()
        assert work.wait() is True
        assert torch.equal(result[0], torch.full((2,), 7.0))
        assert work.is_completed() and work.is_success()
        assert work.get_future().wait()[0] is result[0]
    assert seen == [True]


def test_a_pending_handle_raises_the_operations_failure_and_a_cancelled_one_says_so():
    import concurrent.futures
    import threading

    def failing(result):
        return TopoWork(result, CollectiveError("rank 0: broadcast: collective #2 failed"))

    gate, running = threading.Event(), threading.Event()

    def block():
        running.set()
        return gate.wait(10)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        work, _ = _pending(pool, failing)
        with pytest.raises(CollectiveError, match="collective #2 failed"):
            work.wait()
        assert not work.is_success()
        with pytest.raises(CollectiveError, match="collective #2 failed"):
            work.get_future().wait()
        blocker = pool.submit(block)
        assert running.wait(10)  # the thread holds the blocker, so only `queued` is cancelled
        queued, _ = _pending(pool, lambda result: TopoWork(result))
        pool.shutdown(wait=False, cancel_futures=True)
        gate.set()
        blocker.result()
    with pytest.raises(CollectiveError, match="cancelled"):
        queued.wait()
