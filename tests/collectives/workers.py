"""Rank bodies of the multi-process tests (run in spawned processes, report through JSON).

Every scheduled operation is compared with gloo's own result on the same inputs: integers
bit-exact, floating point within the error of a different summation order. Each rank writes
``{"problems": {section: [...]}, "checked": n, ...}``; the test asserts each section has none.
"""

from __future__ import annotations

import json
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import topocoll  # noqa: F401  (registers "topo")
import topocoll.collectives  # noqa: F401
from topocoll.collectives.backend import TopoOptions, TopoProcessGroup
from topocoll.errors import CollectiveError
from tests.collectives.handmade import direct, hand_planner, hub_of

R = dist.ReduceOp
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
ALL = FLOATS + INTS + (torch.bool,)
SIZES = (0, 1, 5, 4099)

# Relative tolerance per dtype for sums over <= 4 ranks in another order: a few units in the last
# place of the type (float16 has a 10-bit mantissa, bfloat16 a 7-bit one).
RTOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 1e-5, torch.float64: 1e-12}


def ops_for(dtype: torch.dtype) -> tuple:
    if dtype in FLOATS:
        return (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG)
    return (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR)


def make_input(rank: int, dtype: torch.dtype, numel: int, seed: int) -> torch.Tensor:
    """Deterministic per (rank, case) data small enough that products do not overflow."""
    g = torch.Generator().manual_seed(seed * 97 + rank)
    if dtype is torch.bool:
        return torch.randint(0, 2, (numel,), generator=g).bool()
    if dtype in FLOATS:
        return (torch.rand(numel, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    low = 0 if dtype is torch.uint8 else -3
    return torch.randint(low, 4, (numel,), generator=g).to(dtype)


def same(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if dtype in RTOL:
        return torch.allclose(a.double(), b.double(), rtol=RTOL[dtype], atol=RTOL[dtype])
    return torch.equal(a, b)


def gloo_allreduce(t: torch.Tensor, op, group, n: int) -> None:
    if op == R.AVG:  # gloo has no AVG: sum, then divide
        dist.all_reduce(t, op=R.SUM, group=group)
        t.div_(n)
    else:
        dist.all_reduce(t, op=op, group=group)


class Checker:
    """Counts checks and keeps each failed one under the section it ran in (see :data:`SECTIONS`)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.section = "set-up"
        self.problems: dict[str, list[str]] = {}
        self.checked = 0

    def problem(self, text: str) -> None:
        self.problems.setdefault(self.section, []).append(f"rank {self.rank}: {text}")

    def expect(self, ok: bool, what: str) -> None:
        self.checked += 1
        if not ok:
            self.problem(what)

    def run(self, what: str, body) -> None:
        self.section = what
        try:
            body()
        except Exception as exc:  # report, keep going so every rank stays in step
            self.problem(f"{what}: {type(exc).__name__}: {exc}")


def gloo_view(x: torch.Tensor) -> torch.Tensor:
    """A copy gloo accepts: it has no int16 support, int32 arithmetic wraps to the same low bits."""
    return x.to(torch.int32) if x.dtype is torch.int16 else x.clone()


def matrix(checker: Checker, rank: int, n: int, topo, gloo) -> None:
    seed = 0
    for dtype in ALL:
        for numel in SIZES:
            where = f"{dtype} n={numel}"
            for op in ops_for(dtype):
                seed += 1
                x = make_input(rank, dtype, numel, seed)

                def allreduce_case(x=x, op=op):
                    ours, theirs = x.clone(), gloo_view(x)
                    dist.all_reduce(ours, op=op, group=topo)
                    gloo_allreduce(theirs, op, gloo, n)
                    checker.expect(same(ours, theirs.to(dtype), dtype), f"all_reduce {op} {where}")

                checker.run(f"all_reduce {op} {where}", allreduce_case)
            seed += 1
            x = make_input(rank, dtype, numel, seed)
            checker.run(f"broadcast {where}", lambda: broadcast_case(checker, x, n, topo, gloo, where))
            checker.run(f"reduce {where}", lambda: reduce_case(checker, rank, x, topo, gloo, where))
            checker.run(f"allgather {where}", lambda: allgather_case(checker, x, n, topo, gloo, where))
            shard_inputs = [make_input(rank, dtype, numel, seed * 13 + j) for j in range(n)]
            checker.run(f"reduce_scatter {where}", lambda: reduce_scatter_case(checker, shard_inputs, n, topo, gloo, where))


def broadcast_case(checker, x, n, topo, gloo, where) -> None:
    for root in (0, n - 1):
        ours, theirs = x.clone(), gloo_view(x)
        dist.broadcast(ours, src=root, group=topo)
        dist.broadcast(theirs, src=root, group=gloo)
        checker.expect(same(ours, theirs.to(x.dtype), x.dtype), f"broadcast root {root} {where}")


def reduce_case(checker, rank, x, topo, gloo, where) -> None:
    for op in (R.SUM, R.MAX) if x.dtype is not torch.bool else (R.MAX,):
        ours, theirs = x.clone(), gloo_view(x)
        dist.reduce(ours, dst=1, op=op, group=topo)
        dist.reduce(theirs, dst=1, op=op, group=gloo)
        if rank == 1:
            checker.expect(same(ours, theirs.to(x.dtype), x.dtype), f"reduce {op} {where}")
        else:
            checker.expect(torch.equal(ours, x), f"reduce changed a non-root input {where}")


def allgather_case(checker, x, n, topo, gloo, where) -> None:
    outs = [torch.empty_like(x) for _ in range(n)]
    refs = [torch.empty_like(gloo_view(x)) for _ in range(n)]
    dist.all_gather(outs, x, group=topo)
    dist.all_gather(refs, gloo_view(x), group=gloo)
    refs = [r.to(x.dtype) for r in refs]
    checker.expect(all(same(a, b, x.dtype) for a, b in zip(outs, refs)), f"all_gather {where}")
    big = torch.empty(n * x.numel(), dtype=x.dtype)
    dist.all_gather_into_tensor(big, x, group=topo)
    checker.expect(same(big, torch.cat(refs), x.dtype), f"all_gather_into_tensor {where}")


def reduce_scatter_case(checker, shard_inputs, n, topo, gloo, where) -> None:
    dtype = shard_inputs[0].dtype
    numel = shard_inputs[0].numel()
    rs_ops = (R.SUM, R.MAX) + ((R.AVG,) if dtype in FLOATS else ())
    if dtype is torch.bool:
        rs_ops = (R.MAX,)
    for op in rs_ops:
        out = torch.empty(numel, dtype=dtype)
        dist.reduce_scatter(out, [t.clone() for t in shard_inputs], op=op, group=topo)
        ref_list = [gloo_view(t) for t in shard_inputs]
        ref = torch.empty_like(ref_list[0])
        if op == R.AVG:  # gloo has no AVG: sum, then divide
            dist.reduce_scatter(ref, ref_list, op=R.SUM, group=gloo)
            ref.div_(n)
        else:
            dist.reduce_scatter(ref, ref_list, op=op, group=gloo)
        ref = ref.to(dtype)
        checker.expect(same(out, ref, dtype), f"reduce_scatter {op} {where}")
        out2 = torch.empty(numel, dtype=dtype)
        flat = torch.cat(shard_inputs)
        before = flat.clone()
        dist.reduce_scatter_tensor(out2, flat, op=op, group=topo)
        checker.expect(same(out2, ref, dtype), f"reduce_scatter_tensor {op} {where}")
        checker.expect(torch.equal(flat, before), f"reduce_scatter_tensor changed its input {where}")


def other_schedules(checker: Checker, rank: int, n: int, gloo) -> None:
    """The same operations over schedules of other shapes: the solver costed with NCCL's step
    overhead (deeper LP schedules), hand-written pipelined rings and chains, direct exchange; and
    the planner's schedules in data-flow order."""
    from topocoll.solver import plan

    def lp_nccl(topology, collective, ranks, root, size_bytes):
        return plan(topology, collective.value, list(ranks), root=root, size_bytes=size_bytes)

    def hand_direct(topology, collective, ranks, root, size_bytes):
        if collective.is_rooted:
            return hand_planner(topology, collective, ranks, root, size_bytes)
        return direct(collective, tuple(ranks), hub=hub_of(topology, ranks), digest=topology.digest())

    variants = (
        ("lp-nccl", TopoOptions(planner=lp_nccl)),
        ("hand", TopoOptions(planner=hand_planner)),
        ("direct", TopoOptions(planner=hand_direct)),
        ("plan over gloo", TopoOptions(shared_memory=False)),
        ("hand over gloo", TopoOptions(planner=hand_planner, shared_memory=False)),
        ("data-flow over gloo", TopoOptions(dataflow=True, shared_memory=False)),
    )
    for name, options in variants:
        group = dist.new_group(backend="topo", pg_options=options)
        seed = 1000
        for dtype in (torch.float32, torch.int32):
            for numel in (0, 1, 5, 4099, 1 << 16):
                seed += 1
                where = f"[{name}] {dtype} n={numel}"
                x = make_input(rank, dtype, numel, seed)
                for op in (R.SUM, R.MIN):
                    ours, theirs = x.clone(), x.clone()
                    dist.all_reduce(ours, op=op, group=group)
                    dist.all_reduce(theirs, op=op, group=gloo)
                    checker.expect(same(ours, theirs, dtype), f"all_reduce {op} {where}")
                checker.run(f"broadcast {where}", lambda: broadcast_case(checker, x, n, group, gloo, where))
                checker.run(f"reduce {where}", lambda: reduce_case(checker, rank, x, group, gloo, where))
                checker.run(f"allgather {where}", lambda: allgather_case(checker, x, n, group, gloo, where))
                shards = [make_input(rank, dtype, numel, seed * 13 + j) for j in range(n)]
                checker.run(f"reduce_scatter {where}", lambda: reduce_scatter_case(checker, shards, n, group, gloo, where))


def special_cases(checker: Checker, rank: int, n: int, topo, gloo) -> None:
    # a large float32 buffer (several chunks per rank in any schedule)
    x = make_input(rank, torch.float32, 1 << 18, 1)
    ours, theirs = x.clone(), x.clone()
    dist.all_reduce(ours, group=topo)
    dist.all_reduce(theirs, group=gloo)
    checker.expect(same(ours, theirs, torch.float32), "all_reduce 1 MiB float32")
    # messages cut into segments (exercises early reduction while later segments arrive)
    segmented = dist.new_group(backend="topo", pg_options=TopoOptions(segment_bytes=4096))
    ours = x.clone()
    dist.all_reduce(ours, group=segmented)
    checker.expect(same(ours, theirs, torch.float32), "all_reduce in 4 KiB segments")
    ours = x[:1000].clone().to(torch.int64)
    theirs = ours.clone()
    dist.reduce(ours, dst=2, op=R.MAX, group=segmented)
    dist.reduce(theirs, dst=2, op=R.MAX, group=gloo)
    if rank == 2:
        checker.expect(torch.equal(ours, theirs), "reduce in 4 KiB segments")
    # non-contiguous in place
    base = make_input(rank, torch.float64, 35, 2).view(5, 7)
    ours, theirs = base.clone().t(), base.clone().t()
    assert not ours.is_contiguous()
    dist.all_reduce(ours, group=topo)
    dist.all_reduce(theirs, group=gloo)
    checker.expect(same(ours, theirs, torch.float64), "all_reduce non-contiguous")
    ours, theirs = base.clone().t(), base.clone().t()
    dist.broadcast(ours, src=2, group=topo)
    dist.broadcast(theirs, src=2, group=gloo)
    checker.expect(same(ours, theirs, torch.float64), "broadcast non-contiguous")
    # multi-dimensional shapes through the tensor forms
    x = make_input(rank, torch.int32, 12, 3).view(3, 4)
    big = torch.empty(3 * n, 4, dtype=torch.int32)
    ref = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather_into_tensor(big, x, group=topo)
    dist.all_gather(ref, x, group=gloo)
    checker.expect(torch.equal(big, torch.cat(ref)), "all_gather_into_tensor 2-d")
    # in place: the input is this rank's shard of the output, as FSDP passes it
    big = torch.zeros(3 * n, 4, dtype=torch.int32)
    big[3 * rank : 3 * (rank + 1)].copy_(x)
    dist.all_gather_into_tensor(big, big[3 * rank : 3 * (rank + 1)], group=topo)
    checker.expect(torch.equal(big, torch.cat(ref)), "all_gather_into_tensor in place")
    # the input inside the output, but in the next rank's shard
    big = torch.zeros(3 * n, 4, dtype=torch.int32)
    elsewhere = big[3 * ((rank + 1) % n) : 3 * ((rank + 1) % n + 1)]
    elsewhere.copy_(x)
    dist.all_gather_into_tensor(big, elsewhere, group=topo)
    checker.expect(torch.equal(big, torch.cat(ref)), "all_gather_into_tensor from another shard of its output")
    # async op: wait and future
    x = make_input(rank, torch.float32, 1000, 4)
    ours, theirs = x.clone(), x.clone()
    work = dist.all_reduce(ours, group=topo, async_op=True)
    work.wait()
    dist.all_reduce(theirs, group=gloo)
    checker.expect(same(ours, theirs, torch.float32), "async all_reduce")
    fut_value = work.get_future().wait()
    checker.expect(len(fut_value) == 1 and fut_value[0] is not None and same(fut_value[0], theirs, torch.float32), "future value")
    # coalesced allreduce
    tensors = [make_input(rank, torch.float64, k, 10 + k) for k in (3, 0, 17)]
    ours = [t.clone() for t in tensors]
    theirs = [t.clone() for t in tensors]
    dist.all_reduce_coalesced(ours, group=topo)
    for t in theirs:
        dist.all_reduce(t, group=gloo)
    checker.expect(all(same(a, b, torch.float64) for a, b in zip(ours, theirs)), "all_reduce_coalesced")
    # delegated operations
    t = torch.full((4,), float(rank))
    if rank == 0:
        dist.send(t + 100, dst=1, group=topo)
    elif rank == 1:
        dist.recv(t, src=0, group=topo)
        checker.expect(torch.equal(t, torch.full((4,), 100.0)), "send/recv")
    dist.barrier(group=topo)
    out = torch.empty(n, dtype=torch.int64)
    dist.all_to_all_single(out, torch.arange(n, dtype=torch.int64) + 10 * rank, group=topo)
    checker.expect(torch.equal(out, torch.arange(n) * 10 + rank), "all_to_all_single")
    outs = [torch.empty(2, dtype=torch.int64) for _ in range(n)]
    dist.all_to_all(outs, [torch.tensor([rank, j]) for j in range(n)], group=topo)
    checker.expect(all(torch.equal(o, torch.tensor([j, rank])) for j, o in enumerate(outs)), "all_to_all list")
    gathered = [torch.empty(1) for _ in range(n)] if rank == 0 else None
    dist.gather(torch.tensor([float(rank)]), gathered, dst=0, group=topo)
    if rank == 0:
        checker.expect([float(g) for g in gathered] == [float(r) for r in range(n)], "gather")
    got = torch.empty(1)
    dist.scatter(got, [torch.tensor([float(r * 3)]) for r in range(n)] if rank == 0 else None, src=0, group=topo)
    checker.expect(float(got) == rank * 3.0, "scatter")


def errors(checker: Checker, rank: int, n: int, topo, gloo) -> None:
    # sizes that differ across ranks: every rank raises, and the group stays usable
    x = torch.ones(10 if rank == 0 else 12)
    try:
        dist.all_reduce(x, group=topo)
        checker.expect(False, "mismatched sizes did not raise")
    except CollectiveError as exc:
        checker.expect("element count differs" in str(exc), f"mismatched sizes message: {exc}")
    try:
        dist.all_reduce(torch.ones(4, dtype=torch.float32 if rank else torch.float64), group=topo)
        checker.expect(False, "mismatched dtypes did not raise")
    except CollectiveError as exc:
        checker.expect("dtype differs" in str(exc), f"mismatched dtypes message: {exc}")
    try:
        dist.all_reduce(torch.ones(4), op=R.BAND, group=topo)
        checker.expect(False, "bitwise float reduce did not raise")
    except CollectiveError as exc:
        checker.expect("invalid arguments" in str(exc) or "integer" in str(exc), f"band message: {exc}")
    # out of place: a failed all_gather_into_tensor leaves the output untouched
    out = torch.full((n * 3,), -1.0)
    try:
        dist.all_gather_into_tensor(out, torch.ones(3 if rank else 4), group=topo)
        checker.expect(False, "mismatched all_gather did not raise")
    except CollectiveError:
        checker.expect(bool((out == -1).all()), "failed all_gather wrote its output")
    work = dist.all_reduce(torch.ones(5 + rank), group=topo, async_op=True)
    try:
        work.wait()
        checker.expect(False, "async mismatched sizes: wait did not raise")
    except CollectiveError:
        checker.expect(not work.is_success(), "failed work reports success")
    y = torch.ones(6)
    dist.all_reduce(y, group=topo)
    checker.expect(torch.equal(y, torch.full((6,), float(n))), "group unusable after errors")


def subgroup(checker: Checker, rank: int, n: int) -> None:
    members = list(range(1, n))
    sub_topo = dist.new_group(members, backend="topo")
    sub_gloo = dist.new_group(members, backend="gloo")
    if rank in members:
        x = make_input(rank, torch.float32, 999, 5)
        ours, theirs = x.clone(), x.clone()
        dist.all_reduce(ours, group=sub_topo)
        dist.all_reduce(theirs, group=sub_gloo)
        checker.expect(same(ours, theirs, torch.float32), "sub-group all_reduce")
        nodes = sub_topo.nodes if isinstance(sub_topo, TopoProcessGroup) else None
        # the sub-group's own discovered machine: one process node per member, by group rank
        checker.expect(nodes == tuple(f"proc{i}" for i in range(len(members))), f"sub-group nodes {nodes}")


def ddp(checker: Checker, rank: int, topo, gloo) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    results = {}
    for name, group in (("topo", topo), ("gloo", gloo)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        wrapped = DDP(model, process_group=group)
        optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
        data = torch.Generator().manual_seed(rank)
        for _ in range(3):
            inputs = torch.randn(5, 8, generator=data)
            loss = wrapped(inputs).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        results[name] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    checker.expect(torch.allclose(results["topo"], results["gloo"], rtol=1e-5, atol=1e-6), "DDP parameters differ")
    return {"ddp_max_diff": float((results["topo"] - results["gloo"]).abs().max())}


SECTIONS = (
    "set-up",
    "matrix",
    "other schedules",
    "special cases",
    "errors",
    "subgroup",
    "ddp",
    "a rank that never arrives",
    "a rank that dies",
)
"""The parts of :func:`main_worker`, in order; a rank's problems are reported by part."""


def main_worker(rank: int, n: int, store_file: str, out_file: str) -> None:
    """The whole matrix, then the failure cases (the last rank stalls, then dies)."""
    report: dict = {}
    checker = Checker(rank)
    try:
        dist.init_process_group("topo", init_method=f"file://{store_file}", rank=rank, world_size=n, timeout=timedelta(seconds=60))
        topo = dist.group.WORLD
        gloo = dist.new_group(backend="gloo")
        short_never = dist.new_group(backend="topo", timeout=timedelta(seconds=4))
        short_dead = dist.new_group(backend="topo", timeout=timedelta(seconds=4))
        report["backend"] = dist.get_backend()
        checker.run("matrix", lambda: matrix(checker, rank, n, topo, gloo))
        checker.run("other schedules", lambda: other_schedules(checker, rank, n, gloo))
        checker.run("special cases", lambda: special_cases(checker, rank, n, topo, gloo))
        checker.run("errors", lambda: errors(checker, rank, n, topo, gloo))
        checker.run("subgroup", lambda: subgroup(checker, rank, n))
        checker.run("ddp", lambda: report.update(ddp(checker, rank, topo, gloo)))
        dist.barrier(group=gloo)
        checker.section = "a rank that never arrives"  # the others raise within the group timeout
        last = n - 1
        if rank == last:
            time.sleep(7)
        else:
            start = time.monotonic()
            try:
                dist.all_reduce(torch.ones(100), group=short_never)
                checker.expect(False, "all_reduce without the last rank returned")
            except CollectiveError:
                report["never_arrives_s"] = time.monotonic() - start
        report["problems"] = checker.problems
        report["checked"] = checker.checked
        if rank == last:  # a rank that dies: its report is complete, then it vanishes
            with open(out_file, "w") as f:
                json.dump(report, f)
            import os

            os._exit(0)
        checker.section = "a rank that dies"
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(100), group=short_dead)
            checker.expect(False, "all_reduce with a dead rank returned")
        except CollectiveError:
            report["dead_peer_s"] = time.monotonic() - start
    except Exception:
        checker.problem(traceback.format_exc())
    report["problems"] = checker.problems
    report["checked"] = checker.checked
    with open(out_file, "w") as f:
        json.dump(report, f)
