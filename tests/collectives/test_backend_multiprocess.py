"""The "topo" backend with 4 real ranks in one launch: every operation and dtype against gloo,
DDP, errors, a rank that never arrives and a rank that dies."""

from __future__ import annotations

import pytest

from tests.collectives.harness import launch
from tests.collectives.workers import main_worker

WORLD = 4


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_topo_backend_matches_gloo_everywhere(tmp_path):
    reports = launch(main_worker, WORLD, tmp_path, 540)
    problems = [p for r in reports for p in r["problems"]]
    assert not problems, "\n".join(problems[:40])
    assert all(r["backend"] == "topo" for r in reports)
    # every rank checked the same large matrix
    assert min(r["checked"] for r in reports[:-1]) > 500
    for rank, report in enumerate(reports[:-1]):
        # group timeout 4 s: raised after it, not long after
        assert 3.5 <= report["never_arrives_s"] < 15, (rank, report["never_arrives_s"])
        assert report["dead_peer_s"] < 15, (rank, report["dead_peer_s"])
    assert reports[0]["ddp_max_diff"] < 1e-5
