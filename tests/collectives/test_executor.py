"""The executor with an in-process transport (:mod:`tests.collectives.fakes`): one thread per
rank, messages through a mailbox."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch

from tests.collectives.fakes import Mailbox, Transport
from tests.collectives.handmade import chain, direct, ring, two_rail_broadcast
from topocoll.collectives.executor import Executor, Reduction, check_reduction, combine
from topocoll.collectives.lower import lower_all
from topocoll.errors import CollectiveError
from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer

NODES = ("host0", "host1", "host2", "host3")


def in_threads(body, n: int, join_s: float = 60.0) -> None:
    """Run ``body(rank)`` for ranks 0..n-1, one thread each, and wait for them."""
    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)


def run_all(schedule, buffers, reduction, timeout_s=5.0, skip_rank=None):
    """Run every rank's program in its own thread; returns the exceptions by rank."""
    programs = lower_all(schedule, buffers[0].numel())
    box = Mailbox()
    errors = {}

    def body(rank):
        try:
            Executor(Transport(box, rank), rank, timedelta(seconds=timeout_s)).run(programs[rank], buffers[rank], reduction)
        except Exception as exc:  # collected for the assertions
            errors[rank] = exc

    threads = [threading.Thread(target=body, args=(r,)) for r in range(len(buffers)) if r != skip_rank]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return errors


def reference(inputs, reduction):
    result = inputs[0].clone()
    for other in inputs[1:]:
        combine(reduction, result, other)
    return result


@pytest.mark.parametrize(
    "reduction,dtype",
    [
        (Reduction.SUM, torch.int64),
        (Reduction.PRODUCT, torch.int32),
        (Reduction.MIN, torch.float32),
        (Reduction.MAX, torch.int8),
        (Reduction.BAND, torch.int16),
        (Reduction.BOR, torch.uint8),
        (Reduction.BXOR, torch.int64),
        (Reduction.MAX, torch.bool),
    ],
)
@pytest.mark.parametrize("builder", [ring, direct])
def test_allreduce_schedules_reduce_with_every_op(reduction, dtype, builder):
    g = torch.Generator().manual_seed(7)
    inputs = [torch.randint(0, 5, (37,), generator=g).to(dtype) for _ in NODES]
    expected = reference(inputs, reduction)  # independent: fold the inputs in rank order
    buffers = [t.clone() for t in inputs]
    assert run_all(builder(Collective.ALLREDUCE, NODES), buffers, reduction) == {}
    for buffer in buffers:
        assert torch.equal(buffer, expected)


def test_reduce_and_broadcast_chains():
    inputs = [torch.arange(10, dtype=torch.float64) * (r + 1) for r in range(4)]
    buffers = [t.clone() for t in inputs]
    assert run_all(chain(Collective.REDUCE, NODES, 2), buffers, Reduction.SUM) == {}
    assert torch.equal(buffers[2], sum(inputs))
    buffers = [t.clone() for t in inputs]
    assert run_all(chain(Collective.BROADCAST, NODES, 3), buffers, None) == {}
    assert all(torch.equal(b, inputs[3]) for b in buffers)


def test_a_step_reads_the_values_from_before_it():
    # rank 0 adds its chunk into rank 1 while rank 1 copies its own chunk to rank 0:
    # each must see the other's original value
    schedule = Schedule(
        Collective.ALLREDUCE,
        ("a", "b"),
        None,
        "",
        (Chunk(0, 0.0, 1.0),),
        ((Transfer(0, 1, 0, Op.REDUCE, ("a", "b")), Transfer(1, 0, 0, Op.COPY, ("b", "a"))),),
    )
    buffers = [torch.tensor([1.0, 2.0]), torch.tensor([10.0, 20.0])]
    assert run_all(schedule, buffers, Reduction.SUM) == {}
    assert buffers[0].tolist() == [10.0, 20.0]
    assert buffers[1].tolist() == [11.0, 22.0]


def test_a_missing_peer_raises_collective_error_naming_the_step():
    buffers = [torch.ones(8) for _ in NODES]
    errors = run_all(ring(Collective.ALLREDUCE, NODES), buffers, Reduction.SUM, timeout_s=0.5, skip_rank=2)
    assert set(errors) == {0, 1, 3}
    assert all(isinstance(e, CollectiveError) for e in errors.values())
    assert "step" in str(errors[3]) and "rank 2" in str(errors[3])


def test_reducing_program_without_a_reduction_is_refused():
    buffers = [torch.ones(8) for _ in NODES]
    errors = run_all(ring(Collective.ALLREDUCE, NODES), buffers, None)
    assert set(errors) == {0, 1, 2, 3}
    assert "no reduction" in str(errors[0])


def test_buffer_must_match_the_program():
    program = lower_all(ring(Collective.ALLREDUCE, NODES), 8)[0]
    executor = Executor(Transport(Mailbox(), 0), 0, timedelta(seconds=1))
    with pytest.raises(CollectiveError, match="8 elements"):
        executor.run(program, torch.ones(9), Reduction.SUM)


def test_scratch_is_reused_and_grows():
    executor = Executor(Transport(Mailbox(), 0), 0, timedelta(seconds=1))
    first = executor.scratch(torch.float32, torch.device("cpu"), 10)
    assert executor.scratch(torch.float32, torch.device("cpu"), 5) is first
    assert executor.scratch(torch.float32, torch.device("cpu"), 11).numel() == 11
    assert executor.scratch(torch.int8, torch.device("cpu"), 3) is not first


def test_bitwise_reductions_of_floats_are_refused():
    with pytest.raises(CollectiveError, match="integer"):
        check_reduction(Reduction.BXOR, torch.float16)
    check_reduction(Reduction.BXOR, torch.bool)
    check_reduction(Reduction.MIN, torch.bfloat16)


def _gloo_groups(n: int):
    """Real gloo backends for ``n`` ranks of this process (one thread each builds its own)."""
    import torch.distributed as dist

    store = dist.HashStore()
    groups = [None] * n

    def build(rank):
        groups[rank] = dist.ProcessGroupGloo(store, rank, n, timedelta(seconds=10))

    threads = [threading.Thread(target=build, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(g is not None for g in groups)
    return groups


@pytest.mark.parametrize("builder", [ring, direct])
def test_the_grouped_step_code_of_accelerators_runs_on_a_real_gloo_backend(builder):
    """The step code CUDA tensors take (NCCL), on CPU: the calls go to a real c10d ``Backend``
    object, so a wrong signature (``_start_coalescing(device)`` on a Backend, whose binding takes
    none) or a call gloo lacks fails here, not first on a GPU."""
    groups = _gloo_groups(4)
    assert not any(g.supports_coalescing for g in groups)  # gloo: one Work per message
    count = 1001
    inputs = [torch.arange(count, dtype=torch.int64) * (r + 1) - r for r in range(4)]
    buffers = [t.clone() for t in inputs]
    programs = lower_all(builder(Collective.ALLREDUCE, NODES), count)
    errors = {}

    def body(rank):
        try:
            Executor(groups[rank], rank, timedelta(seconds=10), grouped=True).run(programs[rank], buffers[rank], Reduction.SUM)
        except Exception as exc:  # collected for the assertion
            errors[rank] = exc

    in_threads(body, 4)
    assert not errors, errors
    assert all(torch.equal(b, sum(inputs)) for b in buffers)


class _CoalescingGloo:
    """A real gloo backend that claims to coalesce: the executor then makes the calls it makes on
    NCCL, and gloo's own binding checks their signatures."""

    supports_coalescing = True

    def __init__(self, inner):
        self._inner = inner

    def _start_coalescing(self, *args):
        return self._inner._start_coalescing(*args)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_coalescing_calls_match_the_backend_binding():
    (group,) = _gloo_groups(1)
    program = lower_all(direct(Collective.ALLREDUCE, ("host0", "host1")), 8)[0]
    # gloo's binding takes the call (no TypeError for a device argument) and answers that it
    # does not coalesce: the call the executor makes is the one the Backend API has
    with pytest.raises(CollectiveError, match="does not implement startCoalescing"):
        Executor(_CoalescingGloo(group), 0, timedelta(seconds=2), grouped=True).run(program, torch.ones(8), Reduction.SUM)


def test_messages_go_on_the_channel_their_rail_names():
    """Channel 0 is the executor's transport, channel r + 1 the transport of rail r: a message
    on rail 1 must travel through the third transport and no other."""
    rails, schedule = two_rail_broadcast(first=0.25)
    programs = lower_all(schedule, 8, rails=rails)
    boxes = [Mailbox() for _ in range(3)]
    sent = {c: [] for c in range(3)}

    class Counting(Transport):
        def __init__(self, box, rank, channel):
            super().__init__(box, rank)
            self.channel = channel

        def send(self, tensors, dst, tag):
            sent[self.channel].append(tensors[0].numel())
            return super().send(tensors, dst, tag)

    buffers = [torch.arange(8.0), torch.zeros(8)]
    errors = {}

    def body(rank):
        transports = [Counting(box, rank, c) for c, box in enumerate(boxes)]
        try:
            Executor(transports[0], rank, timedelta(seconds=5), channels=transports[1:]).run(programs[rank], buffers[rank], None)
        except Exception as exc:  # collected for the assertion
            errors[rank] = exc

    in_threads(body, 2)
    assert not errors, errors
    assert sent == {0: [], 1: [2], 2: [6]}
    assert torch.equal(buffers[1], torch.arange(8.0))
    with pytest.raises(CollectiveError, match="rails this executor has no groups for"):
        Executor(Transport(boxes[0], 0), 0, timedelta(seconds=1)).run(programs[0], torch.ones(8), None)


@pytest.mark.parametrize(
    "collective,reduction,root",
    [(Collective.ALLREDUCE, Reduction.SUM, None), (Collective.ALLREDUCE, Reduction.MAX, None),
     (Collective.ALLREDUCE, Reduction.BXOR, None), (Collective.ALLGATHER, None, None),
     (Collective.REDUCE_SCATTER, Reduction.SUM, None), (Collective.REDUCE_SCATTER, Reduction.MIN, None),
     (Collective.BROADCAST, None, 1), (Collective.REDUCE, Reduction.SUM, 2)],
)
def test_run_native_hands_the_collective_to_a_real_gloo_backend(collective, reduction, root):
    """A schedule named native runs as the inner backend's own collective, on the buffer a
    schedule would run on: allreduce in place, allgather from this rank's shard in place in the
    output, reduce-scatter into this rank's shard of the input, broadcast and reduce in place at
    the root."""
    n, shard = 3, 337
    groups = _gloo_groups(n)
    inputs = [torch.randint(0, 1000, (n * shard,), generator=torch.Generator().manual_seed(r), dtype=torch.int64) for r in range(n)]
    buffers = [t.clone() for t in inputs]
    mine = [slice(r * shard, (r + 1) * shard) for r in range(n)]
    if collective is Collective.ALLGATHER:  # every other shard is garbage before
        for r, b in enumerate(buffers):
            mask = torch.ones(n * shard, dtype=torch.bool)
            mask[mine[r]] = False
            b[mask] = -1
        expected = [torch.cat([inputs[r][mine[r]] for r in range(n)])] * n
    elif collective is Collective.BROADCAST:
        expected = [inputs[root]] * n
    elif collective is Collective.REDUCE_SCATTER:  # only this rank's shard is defined after
        total = reference(inputs, reduction)
        expected = [torch.cat([total[mine[r]] if q == r else inputs[r][mine[q]] for q in range(n)]) for r in range(n)]
    elif collective is Collective.REDUCE:  # only the root's buffer is defined after
        expected = {root: reference(inputs, reduction)}
    else:
        expected = [reference(inputs, reduction)] * n
    errors = {}

    def body(rank):
        try:
            Executor(groups[rank], rank, timedelta(seconds=10), native=groups[rank]).run_native(
                collective, buffers[rank], reduction, n, sequence=1, root=root
            )
        except Exception as exc:  # collected for the assertion
            errors[rank] = exc

    in_threads(body, n)
    assert not errors, errors
    if collective is Collective.REDUCE_SCATTER:
        assert all(torch.equal(b[mine[r]], expected[r][mine[r]]) for r, b in enumerate(buffers))
    elif collective is Collective.REDUCE:
        assert torch.equal(buffers[root], expected[root])
    else:
        assert all(torch.equal(b, e) for b, e in zip(buffers, expected))


def test_run_native_refuses_what_the_inner_backend_does_not_run():
    groups = _gloo_groups(1)
    with pytest.raises(CollectiveError, match="broadcast is not run by the inner backend"):  # no root
        Executor(groups[0], 0, timedelta(seconds=1), native=groups[0]).run_native(Collective.BROADCAST, torch.zeros(4), None, 1)
    with pytest.raises(CollectiveError, match="reduce_scatter is not run by the inner backend"):  # no reduction
        Executor(groups[0], 0, timedelta(seconds=1), native=groups[0]).run_native(Collective.REDUCE_SCATTER, torch.zeros(4), None, 1)
    with pytest.raises(CollectiveError, match="no inner backend"):
        Executor(groups[0], 0, timedelta(seconds=1)).run_native(Collective.ALLREDUCE, torch.zeros(4), Reduction.SUM, 1)


@pytest.mark.parametrize("collective", [Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCE_SCATTER], ids=lambda c: c.value)
def test_forwarded_pieces_arrive_whole_on_a_real_gloo_backend(collective):
    """The two-hop schedule of the MI300X preset (parts of shards forwarded by a rank that got
    them straight, reduce-scatter parts added in by a forwarder before they reach the owner)
    run by the executor on 8 real gloo backends gives the collective's result."""
    from topocoll.solver.direct import two_hop
    from topocoll.topo.presets import build_preset

    schedule = two_hop(build_preset("mi300x"), collective)
    n, shard = 8, 1009

    def owner(t):
        return int(schedule.chunks[t.chunk].offset * n + 1e-9)

    transfers = [t for step in schedule.steps for t in step]
    # some pieces take two hops: copied on by a rank other than their shard's owner, or added
    # into a rank other than their owner
    assert any(t.src != owner(t) if t.op is Op.COPY else t.dst != owner(t) for t in transfers)
    groups = _gloo_groups(n)
    g = torch.Generator().manual_seed(3)
    inputs = [torch.randint(-50, 50, (n * shard,), generator=g, dtype=torch.int64) for _ in range(n)]
    buffers = [t.clone() for t in inputs]
    programs = lower_all(schedule, n * shard)
    errors = {}

    def body(rank):
        try:
            Executor(groups[rank], rank, timedelta(seconds=20)).run(programs[rank], buffers[rank], Reduction.SUM)
        except Exception as exc:  # collected for the assertion
            errors[rank] = exc

    in_threads(body, n)
    assert not errors, errors
    total = sum(inputs)
    mine = [slice(r * shard, (r + 1) * shard) for r in range(n)]
    for r, buffer in enumerate(buffers):
        if collective is Collective.ALLREDUCE:
            assert torch.equal(buffer, total)
        elif collective is Collective.ALLGATHER:
            assert torch.equal(buffer, torch.cat([inputs[q][mine[q]] for q in range(n)]))
        else:
            assert torch.equal(buffer[mine[r]], total[mine[r]])
