"""Probing over real gloo groups (one thread per rank): every rank gets the same calibration,
and a rank that never comes makes the others raise within the timeout."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from tests.collectives.test_executor import _gloo_groups
from tests.topo.test_calibrate import UNIFORM, build
from topocoll.collectives.probe import ProbeSettings, run_probe
from topocoll.errors import CollectiveError
from topocoll.topo.model import LinkKind

NODES = ("h0", "h1", "h2")
SETTINGS = ProbeSettings(target_s=0.02, initial_bytes=1 << 16, max_bytes=1 << 20, latency_rounds=3)


def topology():
    hosts, switches, links = UNIFORM
    return build(hosts[:3], switches, links[:3])


def run_ranks(ranks, timeout_s=20.0):
    groups = _gloo_groups(3)
    topo = topology()
    results, errors = {}, {}

    def body(rank):
        try:
            results[rank] = run_probe([groups[rank]], rank, topo, NODES, None, timedelta(seconds=timeout_s), SETTINGS)
        except Exception as exc:  # collected for the assertions
            errors[rank] = exc

    threads = [threading.Thread(target=body, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return topo, results, errors


@pytest.mark.timeout(120)
def test_every_rank_computes_the_same_calibration():
    topo, results, errors = run_ranks(range(3))
    assert not errors, errors
    first = results[0]
    assert all(r.topology.digest() == first.topology.digest() for r in results.values())
    # 6 pairs, and an incast and an outcast per host
    assert first.notes[0] == "calibrated from 12 probe experiment(s)"
    # on loopback no link limits anything real; what matters here is that rates arrived
    assert first.measured and all(rate > 0 for rate in first.measured.values())
    assert all(l.latency_s > 0 for l in first.topology.links if l.kind is LinkKind.NET)


@pytest.mark.timeout(60)
def test_a_rank_that_never_comes_makes_the_others_raise():
    _, results, errors = run_ranks((0, 1), timeout_s=2.0)
    assert not results
    assert set(errors) == {0, 1} and all(isinstance(e, CollectiveError) for e in errors.values())


def test_rates_are_taken_over_the_window_all_flows_run():
    """Flow 0 takes 1 s for its 16 pieces; flow 1 runs at half its rate until then (8 pieces),
    then alone at full speed. Over the common window of 1 s: 16 and 8 pieces' worth."""
    import torch

    from topocoll.collectives.probe import PIECES, window_rates

    size = 16 * 1000
    fast = [(k + 1) / PIECES for k in range(PIECES)]
    slow = [2 * (k + 1) / PIECES for k in range(8)] + [1 + (k + 1) / PIECES for k in range(8)]
    rates = window_rates(torch.tensor([fast, slow], dtype=torch.float64), (size, size))
    assert rates == pytest.approx((size / 1.0, size / 2 / 1.0))


def test_flows_of_their_own_sizes_are_rated_by_their_own_pieces():
    """Flow 0 sends 16 kB in 1 s; flow 1 sends 4 kB in 1 s too (a quarter of the rate): over the
    common window of 1 s each is rated by its own bytes."""
    import torch

    from topocoll.collectives.probe import PIECES, window_rates

    steady = [(k + 1) / PIECES for k in range(PIECES)]
    rates = window_rates(torch.tensor([steady, steady], dtype=torch.float64), (16_000, 4_000))
    assert rates == pytest.approx((16_000.0, 4_000.0))
