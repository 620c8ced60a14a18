"""The shared-memory transport, with the ranks as threads of this process and the in-process
transport of :mod:`tests.collectives.fakes` carrying doorbells and acknowledgements."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from tests.collectives.fakes import Mailbox, Transport
from tests.collectives.handmade import direct, ring
from topocoll.collectives.executor import Executor, Reduction
from topocoll.collectives.lower import lower_all
from topocoll.collectives.shm import ShmTransport
from topocoll.solver.schedule import Collective

NODES = ("host0", "host1", "host2", "host3")
TIMEOUT = timedelta(seconds=5)


def make_transports(directories):
    """One ShmTransport per rank, built concurrently (the probe is collective)."""
    n = len(directories)
    box = Mailbox()
    store = dist.HashStore()
    store.set_timeout(TIMEOUT)
    transports = [None] * n
    errors = []

    def build(rank):
        try:
            transports[rank] = ShmTransport(Transport(box, rank), rank, n, store, TIMEOUT, directory=str(directories[rank]))
        except Exception as exc:  # collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=build, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return transports


def run(transports, schedule, buffers, reduction):
    programs = lower_all(schedule, buffers[0].numel())
    errors = []

    def body(rank):
        try:
            Executor(transports[rank], rank, TIMEOUT).run(programs[rank], buffers[rank], reduction)
        except Exception as exc:  # collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(len(buffers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors


@pytest.mark.parametrize("builder", [ring, direct])
def test_allreduce_through_shared_memory(tmp_path, builder):
    transports = make_transports([tmp_path] * 4)
    assert all(t.peers == frozenset(set(range(4)) - {r}) for r, t in enumerate(transports))
    for count in (37, 5000, 3):  # grows the arenas, then reuses them
        inputs = [torch.arange(count, dtype=torch.float64) * (r + 1) for r in range(4)]
        buffers = [t.clone() for t in inputs]
        run(transports, builder(Collective.ALLREDUCE, NODES), buffers, Reduction.SUM)
        for buffer in buffers:
            assert torch.equal(buffer, sum(inputs))
    # receivers unlink arenas once mapped; closing removes the rest
    for t in transports:
        t.close()
    assert list(tmp_path.iterdir()) == []


def test_peers_without_shared_memory_go_through_the_inner_transport(tmp_path):
    shared, apart = tmp_path / "shared", tmp_path / "apart"
    shared.mkdir()
    apart.mkdir()
    transports = make_transports([shared, shared, apart, shared])
    assert transports[2].peers == frozenset()
    assert transports[0].peers == frozenset({1, 3})
    inputs = [torch.randint(-50, 50, (1001,), dtype=torch.int32, generator=torch.Generator().manual_seed(r)) for r in range(4)]
    buffers = [t.clone() for t in inputs]
    run(transports, direct(Collective.ALLREDUCE, NODES), buffers, Reduction.MAX)
    expected = torch.stack(inputs).max(dim=0).values
    assert all(torch.equal(b, expected) for b in buffers)
    for t in transports:
        t.close()
    assert list(shared.iterdir()) == [] and list(apart.iterdir()) == []


def test_a_full_shared_memory_directory_falls_back_to_the_inner_transport(tmp_path, monkeypatch):
    import topocoll.collectives.shm as shm

    transports = make_transports([tmp_path] * 4)
    inputs = [torch.arange(300, dtype=torch.float32) + r for r in range(4)]
    buffers = [t.clone() for t in inputs]
    run(transports, direct(Collective.ALLREDUCE, NODES), buffers, Reduction.SUM)  # small arenas exist

    def no_space(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shm.os, "posix_fallocate", no_space)
    inputs = [torch.arange(5000, dtype=torch.float32) * (r + 1) for r in range(4)]  # needs larger ones
    buffers = [t.clone() for t in inputs]
    run(transports, direct(Collective.ALLREDUCE, NODES), buffers, Reduction.SUM)
    assert all(torch.equal(b, sum(inputs)) for b in buffers)
    for t in transports:
        t.close()
    assert list(tmp_path.iterdir()) == []


def test_a_doorbell_that_never_rings_times_out(tmp_path):
    from topocoll.errors import CollectiveError

    transports = make_transports([tmp_path] * 2)
    # Both ends agree from the program that rank 1's one message to rank 0 rings in shared memory.
    transports[0].begin_program([], incoming=[1])
    transports[1].begin_program([(0, 16)], incoming=[])
    target = torch.empty(4, dtype=torch.float32)
    work = transports[0].recv([target], 1, 1)
    with pytest.raises(CollectiveError, match="message 1 from rank 1"):
        work.wait(timedelta(seconds=0.2))
    # Once rank 1 sends, the same receive completes.
    transports[1].send([torch.arange(4, dtype=torch.float32)], 0, 1).wait()
    transports[0].recv([target], 1, 1).wait()
    assert torch.equal(target, torch.arange(4, dtype=torch.float32))
    for t in transports:
        t.close()
    assert list(tmp_path.iterdir()) == []


def _send_then_close(transport, done: threading.Event) -> None:
    transport.send([torch.arange(4, dtype=torch.float32)], 0, 1).wait()
    transport.close()  # the collective is over on this rank; the peer has not read yet
    done.set()


def test_closing_right_after_a_send_waits_until_the_receiver_took_the_message(tmp_path):
    transports = make_transports([tmp_path] * 2)
    transports[0].begin_program([], incoming=[1])
    transports[1].begin_program([(0, 16)], incoming=[])
    closed = threading.Event()
    sender = threading.Thread(target=_send_then_close, args=(transports[1], closed))
    sender.start()
    assert not closed.wait(0.3), "rank 1 closed (and removed its arena) before rank 0 read it"
    target = torch.empty(4, dtype=torch.float32)
    transports[0].recv([target], 1, 1).wait()
    assert torch.equal(target, torch.arange(4, dtype=torch.float32))
    assert closed.wait(TIMEOUT.total_seconds())
    sender.join()
    transports[0].close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("how", ["peer posted a failure", "closed without waiting"])
def test_closing_does_not_wait_for_a_peer_that_failed_or_when_told_not_to(tmp_path, how):
    import time

    from topocoll.collectives.failure import Failure, FailureKind

    transports = make_transports([tmp_path] * 2)
    transports[0].begin_program([], incoming=[1])
    transports[1].begin_program([(0, 16)], incoming=[])
    transports[1].send([torch.arange(4, dtype=torch.float32)], 0, 1).wait()
    began = time.monotonic()
    if how == "peer posted a failure":
        transports[0].post_failure(Failure(1, 0, 1, FailureKind.SILENT))
        transports[1].close()
    else:
        transports[1].close(wait_for_receivers=False)
    assert time.monotonic() - began < TIMEOUT.total_seconds() / 2
    transports[0].close()
    assert list(tmp_path.iterdir()) == []
