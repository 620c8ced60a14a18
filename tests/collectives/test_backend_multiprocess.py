"""The "topo" backend with 4 real ranks in one launch: every operation and dtype against gloo,
DDP, errors, a rank that never arrives and a rank that dies.

The ranks start once (4 imports of torch cost 10-20 s on 2 cores); each part of the run is a
test case of its own, so that a failure names its part."""

from __future__ import annotations

import pytest

from tests.collectives.harness import launch
from tests.collectives.workers import SECTIONS, main_worker

WORLD = 4

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return launch(main_worker, WORLD, tmp_path_factory.mktemp("backend"), 540)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("section", SECTIONS)
def test_topo_backend_matches_gloo(reports, section):
    problems = [p for r in reports for p in r["problems"].get(section, [])]
    assert not problems, "\n".join(problems[:40])


@pytest.mark.timeout(600)
def test_every_rank_ran_the_whole_matrix_on_topo(reports):
    assert all(r["backend"] == "topo" for r in reports)
    assert set().union(*(r["problems"] for r in reports)) <= set(SECTIONS)
    # every rank checked the same large matrix
    assert min(r["checked"] for r in reports[:-1]) > 500


@pytest.mark.timeout(600)
def test_a_missing_or_dead_rank_makes_the_others_raise_within_the_timeout(reports):
    for rank, report in enumerate(reports[:-1]):
        # group timeout 4 s: raised after it, not long after
        assert 3.5 <= report["never_arrives_s"] < 15, (rank, report["never_arrives_s"])
        assert report["dead_peer_s"] < 15, (rank, report["dead_peer_s"])


@pytest.mark.timeout(600)
def test_ddp_trains_the_same_parameters_as_on_gloo(reports):
    assert reports[0]["ddp_max_diff"] < 1e-5
