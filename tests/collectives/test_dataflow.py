"""Data-flow order (:mod:`topocoll.collectives.dataflow`): every order its dependencies allow
computes the collective, and a rank forwards what arrived without waiting for unrelated messages.

The first tests replay lowered programs of real schedules in random orders: at each turn one
rank posts its next message (if what it waits for happened), a posted receive whose send is
posted takes the data (reading the sender's buffer at that moment, so a send overwritten too
early shows), or an arrived receive is applied (if what it waits for happened). The result must
be the collective's, computed from the inputs.
"""

from __future__ import annotations

import random
import threading
from datetime import timedelta

import numpy as np
import pytest
import torch

from tests.collectives.fakes import Mailbox, Transport
from tests.collectives.handmade import chain, direct, ring
from topocoll.collectives.dataflow import Event, dataflow_plan
from topocoll.collectives.executor import Executor, Reduction
from topocoll.collectives.lower import lower_all
from topocoll.solver import baselines, plan_collective
from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer
from topocoll.topo.discover import flat_topology
from topocoll.topo.presets import build_preset

NODES = ("host0", "host1", "host2", "host3")
COUNT = 61  # elements: uneven chunk boundaries


def _schedules() -> dict[str, Schedule]:
    flat = flat_topology(4)
    ranks = flat.compute_nodes()
    dgx1 = build_preset("dgx1-v100")
    five = [f"gpu{i}" for i in range(5)]
    lp = plan_collective(dgx1, Collective.ALLREDUCE, five, size_bytes=64 << 20)
    return {
        "ring-allreduce": ring(Collective.ALLREDUCE, NODES, pieces=3),
        "direct-allreduce": direct(Collective.ALLREDUCE, NODES),
        "chain-broadcast": chain(Collective.BROADCAST, NODES, 2),
        "recursive-doubling-allreduce": baselines.recursive_doubling(flat, Collective.ALLREDUCE, list(ranks)),
        "double-binary-tree-allreduce": baselines.double_binary_tree(flat, Collective.ALLREDUCE, list(ranks)),
        "lp-pipeline4-allreduce-5-gpus": lp.candidate("lp-pipeline4").schedule,
        "lp-allgather-dgx1": plan_collective(dgx1, Collective.ALLGATHER, five).candidate("lp").schedule,
        "ring-reduce-scatter": ring(Collective.REDUCE_SCATTER, NODES, pieces=2),
    }


SCHEDULES = _schedules()


def _inputs(schedule: Schedule) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    return [rng.integers(0, 1000, COUNT) for _ in schedule.ranks]


def _expected(schedule: Schedule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The collective's result per rank from the inputs (-1 where it is unspecified)."""
    n = len(inputs)
    total = sum(inputs)
    shard = [(round(r * COUNT / n), round((r + 1) * COUNT / n)) for r in range(n)]
    c = schedule.collective
    if c is Collective.ALLREDUCE:
        return [total] * n
    if c is Collective.BROADCAST:
        return [inputs[schedule.root]] * n
    if c is Collective.ALLGATHER:
        gathered = np.concatenate([inputs[r][a:b] for r, (a, b) in enumerate(shard)])
        return [gathered] * n
    if c is Collective.REDUCE_SCATTER:  # only a rank's own shard is specified
        return [np.where((np.arange(COUNT) >= a) & (np.arange(COUNT) < b), total, -1) for a, b in shard]
    raise AssertionError(c)


def _replay(schedule: Schedule, seed: int, max_message_elements: int | None = None, planner=dataflow_plan) -> list[np.ndarray]:
    """Run every rank's data-flow plan in a random order its dependencies allow."""
    rng = random.Random(seed)
    programs = lower_all(schedule, COUNT, max_message_elements=max_message_elements)
    plans = [planner(p) for p in programs]
    buffers = [x.copy() for x in _inputs(schedule)]
    scratch = [np.zeros(max(p.scratch_elements, 1), dtype=np.int64) for p in plans]
    happened = [set() for _ in plans]
    position = [0] * len(plans)
    sends = {}  # (src, dst, tag) -> index of the send at src
    posted_recvs = []  # (rank, index)
    arrived = []  # (rank, index) of receives into scratch not applied yet
    while True:
        actions = []
        for r, plan in enumerate(plans):
            if position[r] < len(plan.messages) and all(e in happened[r] for e in plan.messages[position[r]].post_after):
                actions.append(("post", r, position[r]))
        for r, m in posted_recvs:
            recv = plans[r].messages[m].recv
            if (recv.peer, r, recv.tag) in sends:
                actions.append(("take", r, m))
        for r, m in arrived:
            if all(e in happened[r] for e in plans[r].messages[m].apply_after):
                actions.append(("apply", r, m))
        if not actions:
            break
        kind, r, m = rng.choice(actions)
        message = plans[r].messages[m]
        if kind == "post":
            position[r] += 1
            if message.send is not None:
                sends[(r, message.send.peer, message.send.tag)] = m
            else:
                posted_recvs.append((r, m))
        elif kind == "take":
            recv = message.recv
            posted_recvs.remove((r, m))
            s = sends.pop((recv.peer, r, recv.tag))
            send = plans[recv.peer].messages[s].send
            data = buffers[recv.peer][send.start : send.stop].copy()  # read now: the sender must not have overwritten it
            happened[recv.peer].add((Event.DONE, s))
            happened[r].add((Event.DONE, m))
            if message.scratch_start is None:
                buffers[r][recv.start : recv.stop] = data
                happened[r].add((Event.APPLIED, m))
            elif not recv.after_step and recv.op is Op.REDUCE and rng.random() < 0.5:
                buffers[r][recv.start : recv.stop] += data  # as a transport that reduces in place
                happened[r].add((Event.APPLIED, m))
            else:
                scratch[r][message.scratch_start : message.scratch_start + recv.numel] = data
                arrived.append((r, m))
        else:
            arrived.remove((r, m))
            recv = message.recv
            data = scratch[r][message.scratch_start : message.scratch_start + recv.numel]
            if recv.op is Op.COPY:
                buffers[r][recv.start : recv.stop] = data
            else:
                buffers[r][recv.start : recv.stop] += data
            happened[r].add((Event.APPLIED, m))
    assert all(position[r] == len(p.messages) for r, p in enumerate(plans)), "stuck: some message never became ready"
    assert not posted_recvs and not arrived and not sends
    return buffers


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_order_the_plan_allows_computes_the_collective(name, seed):
    schedule = SCHEDULES[name]
    got = _replay(schedule, seed, max_message_elements=7 if seed % 2 else None)
    for r, (have, want) in enumerate(zip(got, _expected(schedule, _inputs(schedule)))):
        specified = want >= 0
        np.testing.assert_array_equal(have[specified], want[specified], err_msg=f"{name}, rank {r}")


def test_a_plan_without_write_after_read_waits_corrupts_and_the_replay_sees_it():
    """The replay is strict enough: drop the waits for sends still reading, and it finds wrong results."""
    import dataclasses

    # recursive doubling: a rank adds its next partner's data into the range it just sent, data
    # that does not depend on the first partner having taken it
    schedule = SCHEDULES["recursive-doubling-allreduce"]

    def careless(program):
        plan = dataflow_plan(program)
        sends = {i for i, m in enumerate(plan.messages) if m.send is not None}

        def keep(events):
            return tuple(e for e in events if not (e[0] is Event.DONE and e[1] in sends))

        stripped = tuple(dataclasses.replace(m, post_after=keep(m.post_after), apply_after=keep(m.apply_after)) for m in plan.messages)
        return dataclasses.replace(plan, messages=stripped)

    expected = _expected(schedule, _inputs(schedule))
    wrong = [seed for seed in range(40) if any(not np.array_equal(h, w) for h, w in zip(_replay(schedule, seed, planner=careless), expected))]
    assert wrong, "no order exposed the missing waits"


def test_a_forwarded_chunk_waits_only_for_its_own_arrival():
    # step 0: rank 0 -> rank 1 chunk 0, rank 2 -> rank 1 chunk 1; step 1: rank 1 -> rank 3 chunk 0
    chunks = (Chunk(0, 0.0, 0.5), Chunk(1, 0.5, 0.5))
    hub = "hub"
    t = lambda s, d, c: Transfer(s, d, c, Op.COPY, (NODES[s], hub, NODES[d]))  # noqa: E731
    schedule = Schedule(Collective.BROADCAST, NODES, 0, "", chunks, ((t(0, 1, 0), t(2, 1, 1)), (t(1, 3, 0),)))
    (program,) = lower_all(schedule, 8, ranks=(1,))
    messages = dataflow_plan(program).messages
    forward = next(i for i, m in enumerate(messages) if m.send is not None)
    from_rank_0 = next(i for i, m in enumerate(messages) if m.recv is not None and m.recv.peer == 0)
    assert messages[forward].post_after == ((Event.DONE, from_rank_0),)


class _HeldTransport(Transport):
    """Rank 2 sends only once rank 3 has its chunk: a lock-step rank 1 would wait for rank 2's
    message before forwarding rank 0's, and nothing would move."""

    def __init__(self, box, rank, released):
        super().__init__(box, rank)
        self._released = released

    def send(self, tensors, dst, tag):
        if self._rank == 2:
            self._released.wait(5.0)
        return super().send(tensors, dst, tag)

    def recv(self, tensors, src, tag):
        work = super().recv(tensors, src, tag)
        if self._rank == 3:
            release = self._released

            class _Releasing:
                def wait(self, timeout=None):
                    work.wait(timeout)
                    release.set()

                def is_completed(self):
                    return work.is_completed()

            return _Releasing()
        return work


@pytest.mark.parametrize("dataflow", [True, False])
def test_the_executor_forwards_before_an_unrelated_message_arrives(dataflow):
    chunks = (Chunk(0, 0.0, 0.5), Chunk(1, 0.5, 0.5))
    t = lambda s, d, c: Transfer(s, d, c, Op.COPY, (NODES[s], "hub", NODES[d]))  # noqa: E731
    # rank 1 gets chunk 0 from rank 0 and chunk 1 from rank 2 in step 1, and forwards chunk 0 in step 2
    steps = ((t(0, 2, 1),), (t(0, 1, 0), t(2, 1, 1)), (t(1, 3, 0), t(1, 2, 0), t(2, 3, 1)))
    schedule = Schedule(Collective.BROADCAST, NODES, 0, "", chunks, steps)
    programs = lower_all(schedule, 8)
    box, released = Mailbox(), threading.Event()
    buffers = [torch.arange(8, dtype=torch.int64) * (r == 0) for r in range(4)]
    errors = {}

    def body(rank):
        try:
            executor = Executor(_HeldTransport(box, rank, released), rank, timedelta(seconds=2), dataflow=dataflow)
            executor.run(programs[rank], buffers[rank], Reduction.SUM)
        except Exception as exc:  # collected for the assertions
            errors[rank] = exc

    threads = [threading.Thread(target=body, args=(r,)) for r in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    if dataflow:
        assert errors == {}
        assert all(torch.equal(b, torch.arange(8)) for b in buffers)
    else:
        assert errors, "lock step should have stalled on rank 2's held message"
