"""Collectives the planner hands back to gloo: three machines of one process each on one
switch, where gloo's own ring takes the routes the planner's ring would."""

from __future__ import annotations

import pytest

from tests.collectives.harness import launch
from tests.collectives.native_worker import native_worker


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_gloo_runs_its_own_allreduce_and_allgather_and_the_results_are_its(tmp_path):
    reports = launch(native_worker, 3, tmp_path, 240)
    problems = [p for r in reports for p in r["problems"]]
    assert not problems, "\n".join(problems)
    for report in reports:
        assert report["schedules"]["allreduce"] == "native"
        assert report["schedules"]["allgather"] == "native"
        assert report["schedules"]["reduce_scatter"] != "native"  # gloo has no ring for it


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_past_the_planners_scale_every_collective_is_gloos_own(tmp_path):
    """Where the planner refuses the scale (here by a verifier memory limit of one byte), the
    group runs all five collectives with the inner backend's own instead of failing."""
    reports = launch(native_worker, 3, tmp_path, 240, 1.0)
    problems = [p for r in reports for p in r["problems"]]
    assert not problems, "\n".join(problems)
    for report in reports:
        assert set(report["schedules"].values()) == {"native"}, report["schedules"]
