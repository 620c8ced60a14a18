"""Schedule sharing through a store, the Work handle, registration, and argument checks of a
one-rank group (all in this process)."""

from __future__ import annotations

import importlib
import json
import socket
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from tests.collectives.handmade import hand_planner, ring
from topocoll.collectives import BACKEND_NAME, TopoProcessGroup, TopoWork, register
from topocoll.collectives.failure import AgreedError
from topocoll.collectives.schedule_source import (
    ScheduleSource, announce_topology_error, check_digests, cuda_planner, default_planner, size_bucket,
)
from topocoll.errors import CollectiveError, ScaleError, SolverError
from topocoll.solver import plan
from topocoll.solver.schedule import NATIVE, Collective
from topocoll.topo.presets import build_preset
from topocoll.topo.discover import flat_topology
from topocoll.topo.model import NodeKind

NODES = ("host0", "host1", "host2")


def store(timeout_s: float = 2.0):
    s = dist.HashStore()
    s.set_timeout(timedelta(seconds=timeout_s))
    return s


class CountingPlanner:
    def __init__(self):
        self.calls = []

    def __call__(self, topology, collective, ranks, root, size_bytes):
        self.calls.append((collective, root, size_bytes))
        return hand_planner(topology, collective, ranks, root, size_bytes)


def test_size_buckets_are_powers_of_two_at_or_above():
    assert [size_bucket(s) for s in (0, 1, 2, 3, 4, 5, 1000, 1024, 1025)] == [1, 1, 2, 4, 4, 8, 1024, 1024, 2048]


def test_rank_zero_plans_once_per_bucket_and_others_read_the_store():
    topology = flat_topology(3)
    shared = store()
    planner = CountingPlanner()
    never = CountingPlanner()
    zero = ScheduleSource(topology, NODES, 0, shared, planner)
    one = ScheduleSource(topology, NODES, 1, shared, never)
    p0 = zero.program(Collective.ALLREDUCE, None, 300, 1200)
    p0_again = zero.program(Collective.ALLREDUCE, None, 250, 1000)  # same 1024 bucket, new count
    p1 = one.program(Collective.ALLREDUCE, None, 300, 1200)
    assert planner.calls == [(Collective.ALLREDUCE, None, 2048), (Collective.ALLREDUCE, None, 1024)]
    assert never.calls == []
    assert p0.rank == 0 and p1.rank == 1 and p0.count == 300 and p0_again.count == 250
    zero.program(Collective.BROADCAST, 2, 10, 40)
    assert planner.calls[-1] == (Collective.BROADCAST, 2, 64)
    assert one.program(Collective.BROADCAST, 2, 10, 40).collective is Collective.BROADCAST


def test_a_schedule_for_another_topology_is_refused():
    topology = flat_topology(3)
    shared = store()

    def wrong(topo, collective, ranks, root, size_bytes):
        return ring(collective, tuple(ranks), digest="sha256:" + "0" * 64)

    with pytest.raises(CollectiveError, match="topology"):
        ScheduleSource(topology, NODES, 0, shared, wrong).schedule(Collective.ALLGATHER, None, 64)
    with pytest.raises(CollectiveError, match="topology"):
        ScheduleSource(topology, NODES, 1, shared, wrong).schedule(Collective.ALLGATHER, None, 64)


def test_a_planner_failure_reaches_the_other_ranks():
    topology = flat_topology(3)
    shared = store()

    def failing(*args):
        raise SolverError("ranks cannot reach each other")

    with pytest.raises(CollectiveError, match="cannot reach"):
        ScheduleSource(topology, NODES, 0, shared, failing).schedule(Collective.ALLREDUCE, None, 8)
    with pytest.raises(CollectiveError, match="cannot reach"):
        ScheduleSource(topology, NODES, 2, shared, failing).schedule(Collective.ALLREDUCE, None, 8)


def _store_key(topology, collective: Collective, bucket: int) -> str:
    return f"schedule/{topology.digest()}/cpu/{collective.value}/None/{bucket}"


def test_schedules_are_kept_per_device_type():
    """CPU and CUDA tensors get schedules from their own planner (each weighs its own step
    overhead) under their own store keys; rank 1 fetches each from rank 0."""
    topology = flat_topology(3)
    shared = store()
    asked = []

    def planner_for(device):
        def planner(topo, collective, ranks, root, size_bytes):
            asked.append(device)
            return hand_planner(topo, collective, ranks, root, size_bytes)

        return planner

    zero = ScheduleSource(topology, NODES, 0, shared, planner_for("cpu"), cuda_planner=planner_for("cuda"))
    one = ScheduleSource(topology, NODES, 1, shared, planner_for("cpu"), cuda_planner=planner_for("cuda"))
    zero.schedule(Collective.ALLREDUCE, None, 8, "cpu")
    zero.schedule(Collective.ALLREDUCE, None, 8, "cuda")
    assert asked == ["cpu", "cuda"]
    assert shared.check([f"schedule/{topology.digest()}/cuda/allreduce/None/8"])
    assert one.schedule(Collective.ALLREDUCE, None, 8, "cuda").name == "hand-ring"
    assert asked == ["cpu", "cuda"]  # rank 1 fetched, never planned
    with pytest.raises(CollectiveError, match="no planner for xpu tensors"):
        one.schedule(Collective.ALLREDUCE, None, 8, "xpu")


@pytest.mark.parametrize("change", ["destination", "reduce-to-copy", "dropped-step", "no-digest"])
def test_a_tampered_schedule_in_the_store_is_refused_by_the_rank_that_reads_it(change):
    topology = flat_topology(3)
    shared = store()
    good = hand_planner(topology, Collective.ALLREDUCE, NODES, None, 8).to_json_dict()
    if change == "destination":  # the last step delivers a final value: it goes to the wrong rank
        transfer = good["steps"][-1][0]
        transfer["dst"] = next(r for r in range(3) if r not in (transfer["src"], transfer["dst"]))
        transfer["path"] = [transfer["path"][0], transfer["path"][1], NODES[transfer["dst"]]]
    elif change == "reduce-to-copy":
        next(t for step in good["steps"] for t in step if t["op"] == "reduce")["op"] = "copy"
    elif change == "dropped-step":
        del good["steps"][0]
    else:
        good["topology_digest"] = ""
    shared.set(_store_key(topology, Collective.ALLREDUCE, 8), json.dumps({"schedule": good}))
    reader = ScheduleSource(topology, NODES, 1, shared, hand_planner)
    with pytest.raises(CollectiveError, match="not valid" if change != "no-digest" else "no topology digest"):
        reader.schedule(Collective.ALLREDUCE, None, 8)


def test_a_custom_planners_invalid_schedule_is_refused_on_rank_zero_and_the_others_are_told():
    topology = flat_topology(3)
    shared = store()

    def dropping(topo, collective, ranks, root, size_bytes):
        good = hand_planner(topo, collective, ranks, root, size_bytes)
        return type(good)(good.collective, good.ranks, good.root, good.topology_digest, good.chunks, good.steps[1:], "dropped")

    with pytest.raises(AgreedError, match="not valid"):
        ScheduleSource(topology, NODES, 0, shared, dropping).schedule(Collective.ALLREDUCE, None, 8)
    with pytest.raises(AgreedError, match="not valid"):
        ScheduleSource(topology, NODES, 2, shared, dropping).schedule(Collective.ALLREDUCE, None, 8)


def test_a_schedule_is_verified_once_however_often_it_is_needed(monkeypatch):
    import importlib

    verify_module = importlib.import_module("topocoll.solver.verify")  # the module, not the function

    calls = []
    real = verify_module.verify
    monkeypatch.setattr(verify_module, "verify", lambda *a, **k: calls.append(1) or real(*a, **k))
    source = ScheduleSource(flat_topology(3), NODES, 0, store(), hand_planner)
    for count in (10, 11, 300, 301):  # two size buckets of the same hand-made schedule
        source.program(Collective.ALLREDUCE, None, count, 4 * count)
    assert len(calls) == 1


def test_a_rank_whose_topology_failed_is_named_by_the_others():
    shared = store()
    announce_topology_error(shared, 2, "bad.json: line 1: not JSON")
    shared.set("topology_digest/1", flat_topology(3).digest())
    with pytest.raises(CollectiveError, match=r"rank 2 could not load its topology: bad.json: line 1: not JSON"):
        check_digests(shared, 0, 3, flat_topology(3).digest())


def test_a_schedule_never_published_times_out_with_collective_error():
    with pytest.raises(CollectiveError, match="never published"):
        ScheduleSource(flat_topology(3), NODES, 1, store(0.2), hand_planner).schedule(Collective.ALLREDUCE, None, 8)


def test_digest_check_compares_every_rank():
    shared = store()
    shared.set("topology_digest/1", "sha256:other")
    shared.set("topology_digest/2", flat_topology(3).digest())
    with pytest.raises(CollectiveError, match=r"ranks \[1\]"):
        check_digests(shared, 0, 3, flat_topology(3).digest())
    same = store()
    for r in (1, 2):
        same.set(f"topology_digest/{r}", "sha256:x")
    check_digests(same, 0, 3, "sha256:x")


def test_work_keeps_the_error_for_wait_and_future():
    error = CollectiveError("boom")
    work = TopoWork([torch.ones(1)], error)
    with pytest.raises(CollectiveError, match="boom"):
        work.wait()
    with pytest.raises(CollectiveError, match="boom"):
        work.get_future().wait()
    assert work.is_completed() and not work.is_success()
    ok = TopoWork([torch.ones(2)])
    assert ok.wait() and ok.is_success()
    assert torch.equal(ok.get_future().wait()[0], torch.ones(2))


def test_registration_is_idempotent():
    register()
    register()
    assert BACKEND_NAME in dist.Backend.backend_list
    assert dist.Backend.TOPO == "topo"


@pytest.fixture
def solo():
    return TopoProcessGroup(store(), 0, 1, timedelta(seconds=5), planner=hand_planner)


def _opts(kind, op):
    opts = kind()
    opts.reduceOp = op
    return opts


def test_one_rank_group_returns_inputs_and_checks_arguments(solo):
    x = torch.arange(6.0)
    solo.allreduce([x], _opts(dist.AllreduceOptions, dist.ReduceOp.AVG)).wait()
    assert torch.equal(x, torch.arange(6.0))
    out = torch.empty(6)
    solo._allgather_base(out, x).wait()
    assert torch.equal(out, x)
    with pytest.raises(CollectiveError, match="integer"):
        solo.allreduce([x], _opts(dist.AllreduceOptions, dist.ReduceOp.BXOR)).wait()
    with pytest.raises(CollectiveError, match="AVG"):
        solo.allreduce([torch.ones(3, dtype=torch.int32)], _opts(dist.AllreduceOptions, dist.ReduceOp.AVG)).wait()
    with pytest.raises(CollectiveError, match="exactly one tensor"):
        solo.allreduce([x, x], dist.AllreduceOptions()).wait()
    with pytest.raises(CollectiveError, match="elements"):
        solo._allgather_base(torch.empty(5), x).wait()
    with pytest.raises(CollectiveError, match="root"):
        opts = dist.BroadcastOptions()
        opts.rootRank = 3
        solo.broadcast([x], opts).wait()
    with pytest.raises(CollectiveError, match="not supported"):
        solo.allreduce([torch.ones(2, dtype=torch.uint16)], dist.AllreduceOptions()).wait()
    # a failed out-of-place call leaves the output alone
    out = torch.full((6,), -1.0)
    solo._allgather_base(out, torch.ones(7)).get_future()
    assert bool((out == -1).all())
    assert solo.getBackendName() == "topo"
    # no topology given: this machine was discovered, the rank is a process on its CPU
    assert solo.nodes == ("proc0",)
    assert solo.topology.node("proc0").host_id == socket.gethostname()
    assert solo.topology.node("proc0").kind is NodeKind.HOST


def test_the_group_answers_for_its_per_device_backends_as_c10d_asks(solo):
    """init_process_group(device_id=cuda:N) asks pg._get_backend(device).supports_splitting."""
    cpu = solo._get_backend(torch.device("cpu"))
    assert isinstance(cpu, dist.ProcessGroupGloo)
    assert cpu.supports_splitting in (True, False)
    assert solo._get_backend(torch.device("cpu", 0)) is cpu
    with pytest.raises(RuntimeError, match="device type meta"):
        solo._get_backend(torch.device("meta"))
    if not torch.cuda.is_available():
        # c10d's callers (process group uid, abort, split source) catch RuntimeError
        with pytest.raises(RuntimeError, match="CUDA"):
            solo._get_backend(torch.device("cuda", 0))
        assert dist.distributed_c10d._get_process_group_uid(solo) == -1


def test_import_order_and_cost_of_registration():
    import subprocess
    import sys

    after_torch = "import torch, topocoll, torch.distributed as dist; print('TOPO' in dist.Backend._plugins)"
    bare = "import sys, topocoll; print('torch' in sys.modules)"
    outputs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout.strip()
        for code in (after_torch, bare)
    ]
    assert outputs == ["True", "False"]  # registered after torch; a bare import does not load torch


def test_without_shared_memory_a_broken_rank_tells_its_peers_through_the_header_channel():
    """Two ranks as threads, gloo only. Rank 0's planner has a bug: rank 0's collective fails
    and breaks its group; rank 1 raises the same error rank 0 published. At the next collective
    rank 1's header exchange receives rank 0's abort header instead of waiting out the timeout."""
    shared = store(10.0)
    timeout = timedelta(seconds=10)
    outcomes: dict[int, list] = {0: [], 1: []}
    both_done = threading.Barrier(2, timeout=30)  # rank 0 stays alive (a rank that leaves closes its sockets)

    def buggy(topology, collective, ranks, root, size_bytes):
        raise KeyError("a planner bug")

    def rank_body(rank: int) -> None:
        group = TopoProcessGroup(shared, rank, 2, timeout, topology=flat_topology(2), planner=buggy, shared_memory=False)
        for _ in range(2):
            start = time.monotonic()
            try:
                group.allreduce([torch.ones(8)]).wait()
                outcomes[rank].append(("ok", time.monotonic() - start))
            except CollectiveError as exc:
                outcomes[rank].append((type(exc).__name__, str(exc), time.monotonic() - start))
        both_done.wait()
        group.shutdown()

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(len(outcomes[r]) == 2 for r in (0, 1)), outcomes
    (first0, second0), (first1, second1) = outcomes[0], outcomes[1]
    assert "a planner bug" in first0[1] and "a planner bug" in first1[1]
    assert first1[0] == "AgreedError"  # rank 1 read rank 0's published error: still in step
    assert second0[0] == "GroupBrokenError" and "collective #1 failed: it failed on rank 0" in second0[1]
    assert "collective #1 failed: it failed on rank 0" in second1[1], second1
    assert second1[2] < 5.0, f"rank 1 waited {second1[2]:.1f} s instead of reading the abort header"


@pytest.mark.parametrize("planner", [default_planner, cuda_planner])
def test_past_the_planners_scale_a_collective_goes_to_the_inner_backend(planner, monkeypatch):
    """The verifier's memory limit, lowered so that 8 GPUs exceed it as 8192 do, makes the
    planner refuse the scale; the backend's planners then name the inner backend's own
    collective, which the other ranks read without verifying it."""
    monkeypatch.setattr(importlib.import_module("topocoll.solver.verify"), "VERIFY_MEMORY_LIMIT_BYTES", 1.0)
    topology = build_preset("dgx-h100")
    gpus = topology.compute_nodes()
    with pytest.raises(ScaleError, match="needs about .* of memory"):
        plan(topology, "allreduce", list(gpus))
    shared = store()
    for collective, root in ((Collective.ALLREDUCE, None), (Collective.REDUCE_SCATTER, None), (Collective.BROADCAST, 3)):
        schedule = planner(topology, collective, gpus, root, 1 << 20)
        assert (schedule.name, schedule.collective, schedule.ranks, schedule.root) == (NATIVE, collective, gpus, root)
        assert schedule.topology_digest == topology.digest()
        zero = ScheduleSource(topology, gpus, 0, shared, planner)
        one = ScheduleSource(topology, gpus, 1, shared, hand_planner)
        assert zero.schedule(collective, root, 1 << 20).name == one.schedule(collective, root, 1 << 20).name == NATIVE
    with pytest.raises(SolverError, match="root"):  # other refusals stand
        planner(topology, Collective.BROADCAST, gpus, 9, 1 << 20)
