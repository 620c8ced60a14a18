"""Fault injection: a late, killed, mismatched or tampered rank never yields a wrong result.

Each scenario runs 3 real ranks (see :mod:`tests.collectives.faults`) with a short group
timeout and checks, on every rank and for every call: the right answer or an error, never a
wrong answer; an error within the timeout (plus the time the rank itself was late); after the
first failure every later call raises at once; after ``destroy_process_group`` no extra thread
and no shared-memory file is left; a new group gives right answers again.
"""

from __future__ import annotations

import json
import multiprocessing
import re
import time

import pytest

from tests.collectives.faults import COLLECTIVES, KINDS, fault_worker

WORLD = 3
TIMEOUT_S = 2.0
SLACK_S = 1.5
"""Time beyond the group timeout a failing call may take: the culprit search listens to the
peers' heartbeats for 0.25 s, and 3 ranks share 2 cores."""


@pytest.fixture(scope="module")
def context():
    """Processes forked from a server that imported torch and topocoll once: a launch costs a
    fork, not an interpreter start and a torch import per rank."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "topocoll", "tests.collectives.faults"])
    return ctx


def run_scenario(ctx, tmp_path, kind: str, fault: str, shared_memory: bool = True) -> list[dict]:
    outs = [tmp_path / f"rank{r}.json" for r in range(WORLD)]
    procs = [
        ctx.Process(
            target=fault_worker,
            args=(r, WORLD, str(tmp_path), str(outs[r]), kind, fault, TIMEOUT_S, shared_memory),
            daemon=True,
        )
        for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 90
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not hung, f"{kind}/{fault}: ranks {hung} hung"
    return [json.loads(o.read_text()) if o.exists() else None for o in outs]


def first_errors(reports: list[dict | None]) -> list[str]:
    """The first error of every rank that raised one."""
    return [next(c["error"] for c in r["calls"] if c["outcome"] == "error") for r in reports
            if r is not None and any(c["outcome"] == "error" for c in r["calls"])]


CULPRIT = re.compile(rf"rank {WORLD - 1} (did not arrive|stopped answering)")
"""How every rank must name the faulty (last) rank in its first error."""


def check(reports: list[dict | None], kind: str, fault: str, *, group_survives: bool = False) -> None:
    """Every surviving rank: no wrong result, errors within the timeout, nothing left behind,
    right answers after recovery; after the first failure, every call raises at once (unless
    ``group_survives``: errors every rank raises alike leave the group usable)."""
    killed = fault.startswith("kill")
    alive = reports[:-1] if killed else reports
    assert killed or reports[-1] is not None
    assert all(r is not None for r in alive), f"{kind}/{fault}: a surviving rank wrote no report"
    for report in alive:
        where = f"{kind}/{fault} rank {report['rank']}"
        assert not report["problems"], f"{where}: {report['problems']}"
        late = report["rank"] == WORLD - 1 and fault.startswith("late")
        limit_s = TIMEOUT_S + SLACK_S + (TIMEOUT_S + 1.0 if late else 0.0)
        failed = False
        for call in report["calls"]:
            assert call["outcome"] != "WRONG", f"{where}: collective #{call['k']} returned a wrong result"
            assert call["s"] < limit_s, f"{where}: collective #{call['k']} took {call['s']:.1f} s"
            if failed and not group_survives:  # after the first failure every call raises at once
                assert call["outcome"] == "error" and call["s"] < 0.5, f"{where}: #{call['k']} after a failure: {call}"
            failed = failed or call["outcome"] == "error"
        if "init_error" in report:  # a peer died while the group was being set up
            assert report["init_s"] < limit_s, f"{where}: set-up failed only after {report['init_s']:.1f} s"
        else:
            assert len(report["calls"]) == COLLECTIVES
        assert report.get("recovered") == [True, True], f"{where}: no right answers after recovery"
        assert report["threads_left"] == [], f"{where}: threads {report['threads_left']} left after destroy"
        assert report["shm_left"] == [], f"{where}: left {report['shm_left']} in shared memory"


LATE_AND_KILLED = ("late-before", "late-header", "late-after", "kill-first", "kill-data")
DATA_PHASE = ("late-after", "kill-data")
"""The faults that hit a collective's own program; the others strike before it, in the header
exchange that every collective shares (run for allreduce only: the suite must stay short)."""


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", KINDS)
def test_late_and_killed_ranks_never_give_a_wrong_result(context, tmp_path, kind):
    for fault in LATE_AND_KILLED if kind == "allreduce" else DATA_PHASE:
        workdir = tmp_path / fault
        workdir.mkdir()
        reports = run_scenario(context, workdir, kind, fault)
        check(reports, kind, fault)
        alive = reports[:-1] if fault.startswith("kill") else reports
        # collective #2 is where the fault is: every rank that got there failed it or was right,
        # and at least one rank saw the failure
        assert any(c["outcome"] == "error" for r in alive for c in r["calls"]), f"{kind}/{fault}: nobody noticed"
        # the rank that is really missing is named, never a live rank that waits for it too
        errors = first_errors(alive)
        assert all(CULPRIT.search(e) for e in errors), (kind, fault, errors)


#: Without shared memory the header exchange and the failure path are the same code for every
#: collective; these three cover a reduction, a rooted collective and a coalesced gather.
GLOO_ALONE_KINDS = ("allreduce", "reduce", "allgather_coalesced")


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", GLOO_ALONE_KINDS)
def test_faults_through_the_inner_backend_alone(context, tmp_path, kind):
    """Without shared memory, headers and data go through gloo: the same guarantees."""
    for fault in ("late-before", "late-after", "kill-first"):
        workdir = tmp_path / fault
        workdir.mkdir()
        reports = run_scenario(context, workdir, kind, fault, shared_memory=False)
        check(reports, kind, f"{fault} (gloo)")
        errors = first_errors(reports[:-1])
        assert len(errors) == WORLD - 1 and all(CULPRIT.search(e) for e in errors), (kind, fault, errors)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_rank_killed_during_set_up_fails_the_others_fast_and_leaves_nothing(context, tmp_path):
    reports = run_scenario(context, tmp_path, "allreduce", "kill-setup")
    assert reports[-1] is None
    check(reports, "allreduce", "kill-setup")
    assert all("init_error" in r for r in reports[:-1])


REDUCING = ("allreduce", "reduce", "reduce_scatter")


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", KINDS)
def test_mismatched_and_tampered_schedules_raise_on_every_rank(context, tmp_path, kind):
    faults = ["mismatch", "tamper-dst", "tamper-drop"] + (["tamper-copy"] if kind in REDUCING else [])
    for fault in faults:
        workdir = tmp_path / fault
        workdir.mkdir()
        reports = run_scenario(context, workdir, kind, fault)
        check(reports, kind, fault, group_survives=True)
        outcomes = [[c["outcome"] for c in r["calls"]] for r in reports]
        if fault == "mismatch":  # every rank raises at #2 alike; the group stays usable
            assert all(o == ["right", "error", "right", "right"] for o in outcomes), (kind, outcomes)
        else:  # rank 0 refuses the schedule before anything runs, and every rank says so
            assert all(o == ["error"] * COLLECTIVES for o in outcomes), (kind, fault, outcomes)
            errors = [c["error"] for r in reports for c in r["calls"]]
            assert all("not valid" in e for e in errors), (kind, fault, errors[:3])


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_rank_with_a_broken_topology_file_is_named_by_every_rank(context, tmp_path):
    reports = run_scenario(context, tmp_path, "allreduce", "bad-topology")
    check(reports, "allreduce", "bad-topology")
    faulty = reports[-1]["init_error"]
    assert "topology-2.json" in faulty and "Traceback" not in faulty, faulty
    for report in reports[:-1]:  # at once, not after a store timeout, and naming rank 2 and its reason
        assert report["init_s"] < TIMEOUT_S, report["init_s"]
        assert f"rank {WORLD - 1} could not load its topology" in report["init_error"], report["init_error"]
        assert "topology-2.json" in report["init_error"], report["init_error"]
