"""The symbolic verifier: hand-written schedules, each kind of error, the load measure, speed."""

from __future__ import annotations

import dataclasses
import json
import re
import time

import pytest

from tests.solver import helpers as H
from topocoll.errors import ScheduleError
from topocoll.solver.baselines import ring
from topocoll.solver.schedule import Chunk, Collective, Op, Schedule, Transfer
from topocoll.solver.verify import verify

CHAIN = H.gpu_chain(3)
RANKS = ("gpu0", "gpu1", "gpu2")


def _path(a: int, b: int) -> tuple[str, ...]:
    step = 1 if b > a else -1
    return tuple(f"gpu{i}" for i in range(a, b + step, step))


def _t(src: int, dst: int, chunk: int, op: Op) -> Transfer:
    return Transfer(src, dst, chunk, op, _path(src, dst))


def _sched(collective, steps, chunks=(Chunk(0, 0.0, 1.0),), root=None, digest=None) -> Schedule:
    return Schedule(
        collective, RANKS, root, CHAIN.digest() if digest is None else digest, tuple(chunks), tuple(tuple(s) for s in steps)
    )


R, C = Op.REDUCE, Op.COPY
THIRDS = tuple(Chunk(i, i / 3, 1 / 3) for i in range(3))


def test_hand_written_allreduce_is_valid():
    # reduce to the middle rank (both ends reduce into it in one step), then copy out
    sched = _sched(Collective.ALLREDUCE, [[_t(0, 1, 0, R), _t(2, 1, 0, R)], [_t(1, 0, 0, C), _t(1, 2, 0, C)]])
    result = verify(sched, CHAIN)
    assert result.ok, result.errors
    assert result.error_count == 0


def test_each_collective_has_its_postcondition():
    # reduce to root 1 is the first step of the allreduce above
    reduce_ok = _sched(Collective.REDUCE, [[_t(0, 1, 0, R), _t(2, 1, 0, R)]], root=1)
    assert verify(reduce_ok, CHAIN).ok
    # ... but it is not an allreduce
    bad = dataclasses.replace(reduce_ok, collective=Collective.ALLREDUCE, root=None)
    result = verify(bad, CHAIN)
    assert not result.ok and "rank 0 chunk 0 lacks the contributions of ranks 1, 2" in result.errors[0]
    # allgather: every rank starts with its third; swap with neighbours reading pre-step state
    ag = _sched(
        Collective.ALLGATHER,
        [[_t(0, 1, 0, C), _t(1, 0, 1, C), _t(1, 2, 1, C), _t(2, 1, 2, C)], [_t(1, 0, 2, C), _t(1, 2, 0, C)]],
        THIRDS,
    )
    assert verify(ag, CHAIN).ok
    # reduce-scatter: rank r needs chunk r reduced over everyone
    rs = _sched(
        Collective.REDUCE_SCATTER,
        [[_t(0, 2, 2, R), _t(2, 0, 0, R), _t(0, 1, 1, R)], [_t(2, 1, 1, R), _t(1, 0, 0, R), _t(1, 2, 2, R)]],
        THIRDS,
    )
    assert verify(rs, CHAIN).ok
    bc = _sched(Collective.BROADCAST, [[_t(2, 1, 0, C)], [_t(1, 0, 0, C)]], root=2)
    assert verify(bc, CHAIN).ok


def test_transfers_of_a_step_read_the_state_before_it():
    # rank 1 cannot forward in the step in which it receives
    sched = _sched(Collective.BROADCAST, [[_t(0, 1, 0, C), _t(1, 2, 0, C)]], root=0)
    result = verify(sched, CHAIN)
    assert not result.ok
    assert any("step 0 transfer 1 (1->2 chunk 0): rank 1 sends chunk 0 but holds nothing" in e for e in result.errors)


def test_double_counting_is_caught_across_and_within_steps():
    across = _sched(Collective.ALLREDUCE, [[_t(0, 1, 0, R)], [_t(0, 1, 0, R)]])
    assert any("counts the contributions of ranks 0 twice" in e for e in verify(across, CHAIN).errors)
    within = _sched(Collective.ALLREDUCE, [[_t(0, 1, 0, R), _t(0, 1, 0, R)]])
    assert any("also adds" in e and "transfer 0" in e for e in verify(within, CHAIN).errors)


def test_a_copy_and_another_write_in_one_step_conflict():
    sched = _sched(Collective.ALLREDUCE, [[_t(0, 1, 0, C), _t(2, 1, 0, R)]])
    assert any("one of them is a copy" in e for e in verify(sched, CHAIN).errors)


def test_paths_must_follow_links():
    bad = Transfer(0, 2, 0, C, ("gpu0", "gpu2"))
    result = verify(_sched(Collective.BROADCAST, [[bad]], root=0), CHAIN)
    assert any("hop gpu0->gpu2 is not a link" in e for e in result.errors)
    assert result.alpha_beta_time_s is None
    loop = Transfer(0, 1, 0, C, ("gpu0", "gpu1", "gpu2", "gpu1"))
    result = verify(_sched(Collective.BROADCAST, [[loop]], root=0), CHAIN)
    assert any("visits node gpu1 twice" in e for e in result.errors)


def test_digest_and_nodes_must_match_the_topology():
    sched = _sched(Collective.ALLREDUCE, [], digest="sha256:00")
    result = verify(sched, CHAIN)
    assert any("digest sha256:00" in e for e in result.errors)
    unstamped = _sched(Collective.ALLREDUCE, [[_t(0, 1, 0, R), _t(2, 1, 0, R)], [_t(1, 0, 0, C), _t(1, 2, 0, C)]], digest="")
    assert verify(unstamped, CHAIN).ok
    relay = H.relay_ring(3)
    wrong_kind = Schedule(Collective.ALLREDUCE, ("gpu0", "relay0"), None, "", (Chunk(0, 0.0, 1.0),), ())
    assert any("relay0 is a pcie_switch" in e for e in verify(wrong_kind, relay).errors)


def test_shards_must_not_straddle():
    halves = (Chunk(0, 0.0, 0.5), Chunk(1, 0.5, 0.5))
    sched = _sched(Collective.ALLGATHER, [], halves)
    assert any("straddles the boundary of rank 1's shard" in e for e in verify(sched, CHAIN).errors)


def test_errors_are_capped_but_counted():
    sched = _sched(Collective.ALLGATHER, [], THIRDS)
    result = verify(sched, CHAIN, max_errors=2)
    assert len(result.errors) == 2 and result.error_count == 6  # each rank lacks 2 of 3 chunks
    with pytest.raises(ScheduleError, match="and 5 more"):
        result.raise_if_failed()


def test_link_load_and_bandwidth_time_of_a_ring_on_an_nvswitch():
    topo = H.nvswitch_box(4)
    sched = ring(topo, Collective.ALLGATHER)
    size = 1e9
    result = verify(sched, topo, size_bytes=size)
    assert result.ok
    # each GPU sends 3 of the 4 shards through its NVLinks to the switch and receives 3
    port_bw = H.NVLINK_BW * H.NVLINKS_PER_GPU
    for gpu in topo.compute_nodes():
        assert result.link_load[(gpu, "nvswitch0")] == pytest.approx(0.75)
        assert result.link_load[("nvswitch0", gpu)] == pytest.approx(0.75)
    assert result.t_bw_s_per_byte == pytest.approx(0.75 / port_bw, rel=1e-6, abs=0)
    assert result.t_bw_s == pytest.approx(size * 0.75 / port_bw, rel=1e-6, abs=0)
    assert result.bottleneck_link is not None and "nvswitch0" in result.bottleneck_link
    # α-β: 3 steps of a quarter each, plus the two-hop latency per step
    lat = topo.path_latency_s(("gpu0", "nvswitch0", "gpu1"))
    assert result.alpha_beta_time_s == pytest.approx(3 * (size * 0.25 / port_bw + lat), rel=1e-6, abs=0)


def test_a_hundred_thousand_transfers_verify_quickly():
    topo = H.host_star(224)
    sched = ring(topo, Collective.ALLREDUCE)
    assert sched.transfer_count() == 2 * 223 * 224
    start = time.perf_counter()
    result = verify(sched, topo, size_bytes=1e9)
    elapsed = time.perf_counter() - start
    assert result.ok
    assert elapsed < 10.0  # a few seconds on a slow shared core



def test_1024_ranks_recursive_doubling_written_by_hand():
    big = H.host_star(1024)
    hosts = big.compute_nodes()
    steps = []
    dist = 1
    while dist < len(hosts):
        steps.append(
            tuple(Transfer(r, r ^ dist, 0, Op.REDUCE, (hosts[r], "sw0", hosts[r ^ dist])) for r in range(len(hosts)))
        )
        dist <<= 1
    sched = Schedule(Collective.ALLREDUCE, hosts, None, big.digest(), (Chunk(0, 0.0, 1.0),), tuple(steps))
    result = verify(sched, big)
    assert result.ok, result.errors
    # every host link carries the whole buffer once per step, each way
    assert result.link_load[(hosts[0], "sw0")] == pytest.approx(10.0)
    # one step short: everyone lacks half of the contributions
    short = dataclasses.replace(sched, steps=sched.steps[:-1])
    result = verify(short, big)
    assert result.error_count == 1024 and "lacks the contributions of ranks 512" in result.errors[0]


# ------------------------------------------------------------------------------ all-to-all
# On the chain gpu0 - gpu1 - gpu2, rank 0 sends 2 MB to rank 1 and 4 MB to rank 2 (relayed by
# rank 1, in two halves), rank 1 sends 1 MB to rank 0.
MATRIX = ((0.0, 2e6, 4e6), (1e6, 0.0, 0.0), (0.0, 0.0, 0.0))
PAIR_CHUNKS = (Chunk(0, 0.0, 1.0, 0, 1), Chunk(1, 0.0, 0.5, 0, 2), Chunk(2, 0.5, 0.5, 0, 2), Chunk(3, 0.0, 1.0, 1, 0))
RELAYED = (
    [_t(0, 1, 0, C), _t(0, 1, 1, C), _t(0, 1, 2, C), _t(1, 0, 3, C)],
    [_t(1, 2, 1, C), _t(1, 2, 2, C)],
)


def _alltoall(steps, chunks=PAIR_CHUNKS, matrix=MATRIX) -> Schedule:
    return Schedule(Collective.ALLTOALL, RANKS, None, CHAIN.digest(), tuple(chunks), tuple(tuple(s) for s in steps), "hand", matrix)


def test_hand_written_alltoall_with_a_relay_is_valid_and_weighs_chunks_by_their_pair():
    schedule = _alltoall(RELAYED)
    assert schedule.reference_bytes == 6e6  # rank 0 sends the most
    result = verify(schedule, CHAIN, size_bytes=6e6)
    assert result.ok, result.errors
    # gpu0 -> gpu1 carries all 6 MB rank 0 sends, gpu1 -> gpu2 the 4 MB relayed, gpu1 -> gpu0 1 MB
    bw = CHAIN.capacity("gpu0", "gpu1")
    assert result.link_load[("gpu0", "gpu1")] == pytest.approx(1.0)
    assert result.link_load[("gpu1", "gpu2")] == pytest.approx(4 / 6)
    assert result.link_load[("gpu1", "gpu0")] == pytest.approx(1 / 6)
    assert result.t_bw_s == pytest.approx(6e6 / bw, rel=1e-6, abs=0)
    assert result.bottleneck_link == ("gpu0", "gpu1")


@pytest.mark.parametrize(
    ("steps", "fragment"),
    [
        ((RELAYED[1], RELAYED[0]), "rank 1 sends chunk 1 but holds nothing for it"),
        ((RELAYED[0], RELAYED[1][:1]), "rank 2 never receives chunk 2 (of rank 0 -> rank 2)"),
        ((*RELAYED, [_t(1, 2, 1, C)]), "rank 2 receives 2 times chunk 1"),
        (([*RELAYED[0][:3], _t(1, 0, 3, R)], RELAYED[1]), "an all-to-all only copies"),
        (([*RELAYED[0], _t(0, 1, 0, C)], RELAYED[1]), "rank 1 chunk 0 is also written by transfer 0 of this step"),
    ],
    ids=["relay-before-it-holds", "lost-piece", "delivered-twice", "reduce", "two-writes-in-a-step"],
)
def test_alltoall_errors_are_named(steps, fragment):
    result = verify(_alltoall(steps), CHAIN)
    assert not result.ok
    assert any(fragment in e for e in result.errors), result.errors


@pytest.mark.parametrize(
    ("chunks", "matrix", "fragment"),
    [
        (PAIR_CHUNKS[:2] + PAIR_CHUNKS[3:], MATRIX, "rank 0 -> rank 2: chunks end at 0.5"),
        (PAIR_CHUNKS[:3], MATRIX, "rank 1 -> rank 0 has 1e+06 bytes and no chunks"),
        ((*PAIR_CHUNKS[:3], Chunk(3, 0.0, 1.0)), MATRIX, "chunk 3 must name its pair"),
        (PAIR_CHUNKS, MATRIX[:2], "matrix_bytes must be 3 x 3"),
        (PAIR_CHUNKS, ((0.0, 2e6, 4e6), (1e6, 0.0, 0.0), (0.0, -1.0, 0.0)), "matrix_bytes[2][1] = -1.0"),
        ((*PAIR_CHUNKS, Chunk(4, 0.0, 1.0, 2, 0)), MATRIX, "chunk 4 is of rank 2 -> rank 0, which has no bytes"),
    ],
)
def test_alltoall_records_refuse_blocks_that_are_not_tiled(chunks, matrix, fragment):
    with pytest.raises(ScheduleError, match=re.escape(fragment)):
        _alltoall(RELAYED[:1], chunks, matrix)


def test_pairs_and_matrices_belong_to_alltoall_only():
    with pytest.raises(ScheduleError, match="only an all-to-all carries a traffic matrix"):
        Schedule(Collective.ALLGATHER, RANKS, None, "", THIRDS, (), "", MATRIX)
    with pytest.raises(ScheduleError, match="chunks name no pair"):
        _sched(Collective.ALLREDUCE, [], chunks=(Chunk(0, 0.0, 1.0, 0, 1),))


def test_alltoall_schedule_json_round_trip():
    schedule = _alltoall(RELAYED)
    again = Schedule.from_json(schedule.to_json(), "a2a.json")
    assert again == schedule
    assert json.loads(schedule.to_json())["chunks"][1] == {"id": 1, "offset": 0.0, "size": 0.5, "src": 0, "dst": 2}
