"""Routed all-to-all on the topo backend, 3 real ranks: bit-equal to gloo's for uneven splits and
every dtype, the list form, async, relays through a rank where a link is slow, and bad splits
raising on every rank; the pure parts (element splits, agreement) alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.collectives.alltoall_worker import rank_main
from tests.collectives.harness import launch
from topocoll.collectives.alltoall import Chain, agree_counts, element_splits, split_counts
from topocoll.collectives.failure import AgreedError


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_routed_all_to_all_matches_gloo(tmp_path):
    reports = launch(rank_main, 3, tmp_path, 240)
    problems = [p for r in reports for p in r["problems"]]
    assert not problems, "\n".join(problems[:20])
    assert min(r["checked"] for r in reports) >= 10


def test_element_splits_add_up_and_follow_the_shares():
    chains = [Chain((0, 1), 0.6), Chain((0, 2, 1), 0.3), Chain((0, 3, 1), 0.1)]
    for count in (0, 1, 7, 10, 1001):
        parts = element_splits(chains, count)
        assert sum(parts) == count
        assert all(abs(p - c.share * count) < 1 for p, c in zip(parts, chains))


def _gatherer(rows):
    return lambda mine: [torch.tensor(r, dtype=torch.int64) for r in rows]


def test_agreement_reads_the_matrix_and_refuses_what_does_not_match():
    # rank 0 sends [0, 5], rank 1 sends [7, 0]; each receives what the other sends
    rows = [[9, 0, 0, 5, 0, 7], [9, 0, 7, 0, 5, 0]]
    assert agree_counts(_gatherer(rows), 0, 2, [0, 5], [0, 7], 9).tolist() == [[0, 5], [7, 0]]
    wrong = [[9, 0, 0, 5, 0, 7], [9, 0, 7, 0, 4, 0]]
    with pytest.raises(AgreedError, match=r"rank 1 expects \[4, 0\] elements from the ranks, they send it \[5, 0\]"):
        agree_counts(_gatherer(wrong), 0, 2, [0, 5], [0, 7], 9)
    flagged = [[9, 0, 0, 5, 0, 7], [9, 1, 0, 0, 0, 0]]
    with pytest.raises(AgreedError, match=r"invalid arguments on rank\(s\) \[1\]"):
        agree_counts(_gatherer(flagged), 0, 2, [0, 5], [0, 7], 9)
    dtypes = [[9, 0, 0, 5, 0, 7], [8, 0, 7, 0, 5, 0]]
    with pytest.raises(AgreedError, match="differ in dtype"):
        agree_counts(_gatherer(dtypes), 0, 2, [0, 5], [0, 7], 9)


@pytest.mark.parametrize(
    ("rows", "splits", "expected", "error"),
    [
        (6, [], [6, 6, 6], None),  # 6 rows of 3 elements, equal parts of 2 rows
        (6, [1, 2, 3], [3, 6, 9], None),
        (7, [], [], "not a multiple"),
        (6, [1, 2], [], "2 input split sizes"),
        (6, [4, -1, 3], [], "negative"),
        (6, [1, 1, 1], [], "add up to 3"),
    ],
)
def test_split_counts(rows, splits, expected, error):
    counts, message = split_counts(torch.zeros(rows, 3), splits, 3, "input")
    assert counts == expected
    assert (message is None) if error is None else (error in message)


def test_a_shared_plan_that_would_lose_bytes_is_refused():
    from topocoll.collectives.alltoall import _check_plan
    from topocoll.errors import CollectiveError

    matrix = np.array([[0.0, 8.0], [0.0, 0.0]])
    good = ((), (Chain((0, 1), 1.0),), (), ())
    _check_plan(good, matrix, 0, 1)
    with pytest.raises(CollectiveError, match="moves 0.500000 of rank 0 -> rank 1"):
        _check_plan(((), (Chain((0, 1), 0.5),), (), ()), matrix, 0, 1)
    with pytest.raises(CollectiveError, match="bad chain"):
        _check_plan(((), (Chain((1, 0), 1.0),), (), ()), matrix, 0, 1)
    with pytest.raises(CollectiveError, match="bad chain"):
        _check_plan(((), (Chain((0, 1), 1.0, (2,)),), (), ()), matrix, 0, 1)


class _Counting:
    """A fake transport that records, per rank, the most peers it had sends in flight to."""

    def __init__(self, transport, busiest):
        self._transport, self._busiest, self._in_flight = transport, busiest, {}

    def send(self, tensors, dst, tag):
        work = self._transport.send(tensors, dst, tag)
        self._in_flight[tag] = dst
        rank = self._transport._rank
        self._busiest[rank] = max(self._busiest.get(rank, 0), len(set(self._in_flight.values())))
        counting = self

        class _Work:
            def wait(self, timeout=None):
                done = work.wait(timeout)
                counting._in_flight.pop(tag, None)
                return done

        return _Work()

    def recv(self, tensors, src, tag):
        return self._transport.recv(tensors, src, tag)


@pytest.mark.parametrize("rounds, most_peers", [(True, 1), (False, 3)])
def test_rounds_keep_one_peer_per_rank_at_a_time(rounds, most_peers):
    """In rounds every rank sends to one peer at a time (rank + k in round k), relays included,
    and every block still arrives where it belongs."""
    import threading
    from datetime import timedelta

    from tests.collectives.fakes import Mailbox, Transport
    from topocoll.collectives.alltoall import run_plan

    n = 4
    counts = np.array([[(1 + src + 2 * dst) * (src != dst) + 3 * (src == dst) for dst in range(n)] for src in range(n)])
    # every pair direct, except 0 -> 2 half through rank 1 and 3 -> 1 all through rank 0
    chains = [() if s == d else (Chain((s, d), 1.0),) for s in range(n) for d in range(n)]
    chains[0 * n + 2] = (Chain((0, 2), 0.5), Chain((0, 1, 2), 0.5))
    chains[3 * n + 1] = (Chain((3, 0, 1), 1.0),)
    box, busiest, results, errors = Mailbox(), {}, {}, []

    def rank_main(rank):
        try:
            send = torch.cat([torch.full((int(counts[rank, d]),), float(100 * rank + d)) for d in range(n)])
            receive = torch.full((int(counts[:, rank].sum()),), -1.0)
            run_plan([_Counting(Transport(box, rank), busiest)], rank, chains, counts, send, receive, timedelta(seconds=10), rounds=rounds)
            results[rank] = receive
        except Exception as exc:  # reported below, with the rank
            errors.append(f"rank {rank}: {exc!r}")

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    for rank in range(n):
        expected = torch.cat([torch.full((int(counts[s, rank]),), float(100 * s + rank)) for s in range(n)])
        assert torch.equal(results[rank], expected)
    assert max(busiest.values()) == most_peers
