"""Lowering without processes: programs are run by a message-passing simulator here and must
reach each collective's postcondition computed directly from the inputs."""

from __future__ import annotations

import numpy as np
import pytest

from tests.collectives.handmade import chain, direct, ring, two_rail_broadcast
from topocoll.collectives.lower import FIRST_TAG, RankProgram, lower, lower_all
from topocoll.errors import ScheduleError
from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer

NODES4 = ("host0", "host1", "host2", "host3")


def simulate(programs: tuple[RankProgram, ...], buffers: list[np.ndarray]) -> list[np.ndarray]:
    """Run every rank's program with asynchronous sends and blocking step completion.

    A rank posts the sends of its current step (snapshotting the data then, as the step
    semantics demands), and completes the step once every message it waits for has arrived.
    Returns the final buffers; fails on a deadlock or a message nobody receives.
    """
    buffers = [b.copy() for b in buffers]
    mailbox: dict[tuple[int, int, int], np.ndarray] = {}
    position = [0] * len(programs)
    posted = [False] * len(programs)
    progress = True
    while progress:
        progress = False
        for rank, program in enumerate(programs):
            if position[rank] == len(program.steps):
                continue
            step = program.steps[position[rank]]
            if not posted[rank]:
                for send in step.sends:
                    key = (rank, send.peer, send.tag)
                    assert key not in mailbox, f"duplicate message {key}"
                    mailbox[key] = buffers[rank][send.start : send.stop].copy()
                posted[rank] = True
                progress = True
            for recv in step.recvs:
                if not recv.after_step:  # isolated: may be applied while the step's sends still read
                    others = [(m.start, m.stop) for m in step.sends]
                    others += [(m.start, m.stop) for m in step.recvs if m is not recv and Op.COPY in (m.op, recv.op)]
                    assert all(recv.stop <= a or b <= recv.start for a, b in others), f"unsafe early receive {recv}"
            if all((r.peer, rank, r.tag) in mailbox for r in step.recvs):
                scratch = np.zeros(program.scratch_elements, dtype=buffers[rank].dtype)
                applied = []
                for recv in step.recvs:
                    data = mailbox.pop((recv.peer, rank, recv.tag))
                    assert data.size == recv.numel, "sender and receiver disagree on a message size"
                    if recv.scratch_start is None:
                        buffers[rank][recv.start : recv.stop] = data
                    else:
                        scratch[recv.scratch_start : recv.scratch_start + recv.numel] = data
                        applied.append(recv)
                for recv in applied:
                    data = scratch[recv.scratch_start : recv.scratch_start + recv.numel]
                    if recv.op is Op.COPY:
                        buffers[rank][recv.start : recv.stop] = data
                    else:
                        buffers[rank][recv.start : recv.stop] += data
                position[rank] += 1
                posted[rank] = False
                progress = True
    assert all(position[r] == len(p.steps) for r, p in enumerate(programs)), "deadlock"
    assert not mailbox, f"messages never received: {sorted(mailbox)}"
    return buffers


def inputs(n: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(count * 31 + n)
    return [rng.integers(-1000, 1000, size=count, dtype=np.int64) for _ in range(n)]


SIZES = [0, 1, 3, 7, 8, 16, 101]


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("count", SIZES)
def test_ring_allreduce_reaches_the_sum(n, count):
    nodes = NODES4[:n] if n <= 4 else None
    data = inputs(n, count)
    final = simulate(lower_all(ring(Collective.ALLREDUCE, nodes), count), data)
    expected = sum(data)
    for buffer in final:
        np.testing.assert_array_equal(buffer, expected)


@pytest.mark.parametrize("count_per_rank", [0, 1, 2, 5])
def test_ring_reduce_scatter_and_allgather(count_per_rank):
    n = 3
    count = n * count_per_rank
    data = inputs(n, count)
    final = simulate(lower_all(ring(Collective.REDUCE_SCATTER, NODES4[:n]), count), data)
    total = sum(data)
    for r in range(n):
        shard = slice(r * count_per_rank, (r + 1) * count_per_rank)
        np.testing.assert_array_equal(final[r][shard], total[shard])
    # allgather: rank r contributes its own shard; everyone ends with the concatenation
    shards = [d[r * count_per_rank : (r + 1) * count_per_rank] for r, d in enumerate(data)]
    starting = []
    for r in range(n):
        buffer = np.full(count, -7, dtype=np.int64)
        buffer[r * count_per_rank : (r + 1) * count_per_rank] = shards[r]
        starting.append(buffer)
    final = simulate(lower_all(ring(Collective.ALLGATHER, NODES4[:n]), count), starting)
    for buffer in final:
        np.testing.assert_array_equal(buffer, np.concatenate(shards))


@pytest.mark.parametrize("root", [0, 2])
@pytest.mark.parametrize("count", [0, 2, 13, 64])
def test_chain_broadcast_and_reduce(root, count):
    n = 4
    data = inputs(n, count)
    final = simulate(lower_all(chain(Collective.BROADCAST, NODES4, root), count), data)
    for buffer in final:
        np.testing.assert_array_equal(buffer, data[root])
    final = simulate(lower_all(chain(Collective.REDUCE, NODES4, root), count), data)
    np.testing.assert_array_equal(final[root], sum(data))


def test_contiguous_transfers_to_one_peer_are_merged():
    pieces = 4
    schedule = ring(Collective.ALLREDUCE, NODES4[:2], pieces=pieces)
    program = lower(schedule, 0, 800)
    # each step moves one shard = `pieces` contiguous chunks to the one peer: one message
    assert all(len(step.sends) == 1 and len(step.recvs) == 1 for step in program.steps)
    assert program.steps[0].sends[0].numel == 400
    assert schedule.transfer_count() == 2 * 2 * pieces


def test_tiny_buffers_skip_empty_chunks_on_both_sides():
    schedule = ring(Collective.ALLREDUCE, NODES4, pieces=2)  # 8 chunks
    programs = lower_all(schedule, 3)
    sends = sum(len(s.sends) for p in programs for s in p.steps)
    recvs = sum(len(s.recvs) for p in programs for s in p.steps)
    assert sends == recvs
    assert all(m.numel > 0 for p in programs for s in p.steps for m in s.sends + s.recvs)
    assert all(not p.steps for p in lower_all(schedule, 0))


def test_swap_in_one_step_sends_the_old_values():
    # both ranks send chunk 0 to the other in the same step: each must end with the other's
    schedule = Schedule(
        Collective.ALLGATHER,
        ("a", "b"),
        None,
        "",
        (Chunk(0, 0.0, 0.5), Chunk(1, 0.5, 0.5)),
        ((Transfer(0, 1, 0, Op.COPY, ("a", "b")), Transfer(1, 0, 0, Op.COPY, ("b", "a"))),),
    )
    programs = lower_all(schedule, 4)
    assert programs[0].steps[0].recvs[0].scratch_start == 0
    final = simulate(programs, [np.array([1, 2, 3, 4]), np.array([5, 6, 7, 8])])
    np.testing.assert_array_equal(final[0], [5, 6, 3, 4])
    np.testing.assert_array_equal(final[1], [1, 2, 7, 8])


def test_copy_into_untouched_range_goes_straight_to_the_buffer():
    program = lower(ring(Collective.ALLGATHER, NODES4[:3]), 1, 30)
    assert all(r.scratch_start is None for s in program.steps for r in s.recvs)
    assert program.scratch_elements == 0


def test_tags_number_the_messages_of_each_pair():
    programs = lower_all(ring(Collective.ALLREDUCE, NODES4), 64)
    tags = [s.tag for step in programs[0].steps for s in step.sends]
    assert tags == [FIRST_TAG + k for k in range(2 * (4 - 1))]


def test_element_boundaries_follow_round_offset_times_count():
    schedule = ring(Collective.ALLGATHER, NODES4[:3], pieces=1)  # chunks of 1/3
    program = lower(schedule, 0, 10)
    first = program.steps[0].sends[0]
    assert (first.start, first.stop) == (0, round(10 / 3))


def test_bad_rank_and_count_raise():
    schedule = ring(Collective.ALLREDUCE, NODES4[:2])
    with pytest.raises(ScheduleError, match="rank 5"):
        lower(schedule, 5, 10)
    with pytest.raises(ScheduleError, match="count"):
        lower(schedule, 0, -1)


def test_lowering_is_pure():
    schedule = ring(Collective.ALLREDUCE, NODES4)
    before = schedule.to_json()
    assert lower_all(schedule, 77) == lower_all(schedule, 77)
    assert schedule.to_json() == before


@pytest.mark.parametrize("count", [1, 9, 100, 1001])
@pytest.mark.parametrize("segment", [1, 7, 64])
def test_segmented_messages_still_reach_the_sum(count, segment):
    data = inputs(4, count)
    programs = lower_all(ring(Collective.ALLREDUCE, NODES4, pieces=1), count, max_message_elements=segment)
    assert all(m.numel <= segment for p in programs for s in p.steps for m in s.sends + s.recvs)
    for buffer in simulate(programs, data):
        np.testing.assert_array_equal(buffer, sum(data))
    final = simulate(lower_all(chain(Collective.REDUCE, NODES4, 1), count, max_message_elements=segment), data)
    np.testing.assert_array_equal(final[1], sum(data))


def test_segments_are_near_equal():
    program = lower(ring(Collective.ALLGATHER, NODES4[:2], pieces=1), 0, 20, max_message_elements=4)
    sizes = [s.numel for s in program.steps[0].sends]
    assert sorted(sizes) == [3, 3, 4]  # 10 elements -> 3 pieces of at most 4
    with pytest.raises(ScheduleError, match="max_message_elements"):
        lower(ring(Collective.ALLGATHER, NODES4[:2]), 0, 20, max_message_elements=0)


def test_reduces_from_several_peers_into_one_range_apply_early():
    program = lower(direct(Collective.REDUCE_SCATTER, NODES4), 0, 40)
    (step,) = program.steps
    assert len(step.recvs) == 3 and all(r.op is Op.REDUCE and not r.after_step for r in step.recvs)
    assert program.scratch_elements == 3 * 10


def test_transfers_carry_the_channel_of_their_rail_and_rails_are_never_merged():
    """Two halves of one buffer from rank 0 to rank 1, one over each rail: without rails they
    merge into one message; with them they are two, on channels 1 and 2, tagged in order."""
    rails, schedule = two_rail_broadcast()
    plain = lower_all(schedule, 10)
    assert [(s.start, s.stop, s.channel) for s in plain[0].steps[0].sends] == [(0, 10, 0)]
    sender, receiver = lower_all(schedule, 10, rails=rails)
    assert [(s.start, s.stop, s.tag, s.channel) for s in sender.steps[0].sends] == [
        (0, 5, FIRST_TAG, 1), (5, 10, FIRST_TAG + 1, 2)]
    assert [(r.start, r.stop, r.tag, r.channel) for r in receiver.steps[0].recvs] == [
        (0, 5, FIRST_TAG, 1), (5, 10, FIRST_TAG + 1, 2)]
    out = simulate((sender, receiver), [np.arange(10.0), np.zeros(10)])
    assert np.array_equal(out[1], np.arange(10.0))
