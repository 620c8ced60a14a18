"""Rank bodies of the fault-injection tests: one rank misbehaves, every rank checks its results.

A scenario names a collective kind, a fault and a transport. Every rank runs a few collectives
of that kind on a fresh "topo" group; the faulty rank (the last) misbehaves at collective #2:

- ``late-before``: it calls the collective ``timeout + 1`` s late;
- ``late-header``: it publishes its argument header, then stalls ``timeout + 1`` s;
- ``late-after``: it stalls ``timeout + 1`` s after the header exchange, before any data;
- ``kill-setup``: it is killed (SIGKILL) while the group is being set up;
- ``kill-first``: it is killed at the start of collective #1;
- ``kill-data``: it is killed right after sending its first message of collective #2;
- ``mismatch``: it passes a tensor of another size to collective #2;
- ``bad-topology``: its ``TOPOCOLL_TOPOLOGY`` file is broken (the others' are fine);
- ``tamper-dst`` / ``tamper-copy`` / ``tamper-drop``: rank 0's planner hands out a schedule with
  a changed destination, a reduce turned into a copy, or a dropped step.

Inputs are a pure function of (rank, collective number), so every rank computes the right answer
itself. A rank records, for every call: ok and right, ok and WRONG, or the error and how long it
took. After the faults the ranks that are still alive destroy the group, count their threads and
the shared-memory files left, create a new group (recovery) and check that its collectives are
right.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import topocoll  # noqa: F401  (registers "topo")
from topocoll.collectives import executor as executor_module
from topocoll.collectives import shm as shm_module
from topocoll.collectives.backend import TOPOLOGY_ENV, TopoOptions
from topocoll.collectives.schedule_source import default_planner
from topocoll.solver.schedule import Op, Schedule, Transfer
from topocoll.topo.discover import flat_topology

KINDS = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "allgather_coalesced")
COLLECTIVES = 4
"""Collectives per group: #1 runs clean, #2 carries the fault, #3 and #4 show what follows."""
RECOVERY_RENDEZVOUS_S = 60.0
"""How long a rank waits for the others at the recovery group's rendezvous: they arrive once
they have seen the failure and destroyed the old group, which on a loaded 2-core machine takes
seconds beyond the group timeout."""
NUMEL = 4099
"""Elements per rank: odd, so chunks split unevenly; large enough for several messages."""


def _value(rank: int, k: int, numel: int) -> torch.Tensor:
    return torch.arange(numel, dtype=torch.int64) % 97 + 1000 * k + rank


def _expected(kind: str, rank: int, n: int, k: int, numel: int) -> list[torch.Tensor] | None:
    """What rank ``rank`` must hold after collective ``k`` (None: nothing defined, e.g. a
    non-root of reduce)."""
    values = [_value(r, k, numel) for r in range(n)]
    if kind == "allreduce":
        return [sum(values)]
    if kind == "broadcast":
        return [values[n - 1]]
    if kind == "reduce":
        return [sum(values)] if rank == 0 else None
    if kind == "allgather":
        return values
    if kind == "reduce_scatter":
        shards = [sum(_value(r, k, numel * n)[rank * numel : (rank + 1) * numel] for r in range(n))]
        return shards
    if kind == "allgather_coalesced":
        return [t for r in range(n) for t in (values[r], values[r][:7] * 3)]
    raise ValueError(kind)


def _call(kind: str, rank: int, n: int, k: int, numel: int, group) -> list[torch.Tensor]:
    """Run collective ``k`` of ``kind``; return what this rank holds afterwards."""
    x = _value(rank, k, numel)
    if kind == "allreduce":
        dist.all_reduce(x, group=group)
        return [x]
    if kind == "broadcast":
        dist.broadcast(x, src=n - 1, group=group)  # the faulty rank: it has data to send
        return [x]
    if kind == "reduce":
        dist.reduce(x, dst=0, group=group)
        return [x]
    if kind == "allgather":
        out = [torch.full((numel,), -1, dtype=torch.int64) for _ in range(n)]
        dist.all_gather(out, x, group=group)
        return out
    if kind == "reduce_scatter":
        big = _value(rank, k, numel * n)
        out = torch.full((numel,), -1, dtype=torch.int64)
        dist.reduce_scatter(out, list(big.chunk(n)), group=group)
        return [out]
    if kind == "allgather_coalesced":
        inputs = [x, x[:7] * 3]
        outs = [[torch.full_like(t, -1) for t in inputs] for _ in range(n)]
        dist.all_gather_coalesced(outs, inputs, group=group)
        return [t for per_rank in outs for t in per_rank]
    raise ValueError(kind)


def _tampered_planner(how: str):
    """A planner that breaks the default planner's schedule in one way."""

    def planner(topology, collective, ranks, root, size_bytes):
        good = default_planner(topology, collective, ranks, root, size_bytes)
        steps = [list(step) for step in good.steps]
        first = next(i for i, step in enumerate(steps) if step)
        last = max(i for i, step in enumerate(steps) if step)
        if how == "tamper-dst":  # a transfer of the last step delivers a final value: send it elsewhere
            t = steps[last][0]
            dst = next(r for r in range(len(ranks)) if r not in (t.src, t.dst))
            steps[last][0] = Transfer(t.src, dst, t.chunk, t.op, (ranks[t.src], *t.path[1:-1], ranks[dst]))
        elif how == "tamper-copy":
            where = next((i, j) for i, step in enumerate(steps) for j, x in enumerate(step) if x.op is Op.REDUCE)
            x = steps[where[0]][where[1]]
            steps[where[0]][where[1]] = Transfer(x.src, x.dst, x.chunk, Op.COPY, x.path)
        else:
            del steps[first]
        return Schedule(
            good.collective, good.ranks, good.root, good.topology_digest, good.chunks,
            tuple(tuple(step) for step in steps), f"{good.name}-{how}",
        )

    return planner


class _Injector:
    """Patches this process's transport so that the faulty rank misbehaves at collective #2."""

    def __init__(self, fault: str, timeout_s: float) -> None:
        self.fault = fault
        self.stall_s = timeout_s + 1.0
        self.sequence = 0
        self.active = True  # off for the recovery group

    def install(self) -> None:
        injector = self
        if self.fault == "kill-setup":
            original_probe = shm_module.ShmTransport._probe

            def probe(transport, store):
                if injector.active:
                        os.kill(os.getpid(), signal.SIGKILL)
                return original_probe(transport, store)

            shm_module.ShmTransport._probe = probe
        if self.fault == "late-header":
            original_exchange = shm_module.ShmTransport.exchange_header

            def exchange(transport, sequence, values, timeout):
                if sequence == 2 and injector.active:
                    # publish this rank's header, then stall before reading the others'
                    words = [sequence, *values, shm_module._checksum(sequence, values)]
                    transport._mailbox.write_words(shm_module._HEADER_SLOTS_AT + (sequence % 2) * shm_module._SLOT_BYTES, words)
                    time.sleep(injector.stall_s)
                return original_exchange(transport, sequence, values, timeout)

            shm_module.ShmTransport.exchange_header = exchange
        original_run = executor_module.Executor.run

        def run(executor, program, buffer, reduction, sequence=None):
            injector.sequence = sequence or 0
            if sequence == 2 and injector.fault == "late-after" and injector.active:
                time.sleep(injector.stall_s)
            return original_run(executor, program, buffer, reduction, sequence)

        executor_module.Executor.run = run
        if self.fault == "kill-data":
            original_send = shm_module.ShmTransport.send

            def send(transport, tensors, dst, tag):
                work = original_send(transport, tensors, dst, tag)
                if injector.sequence == 2 and injector.active:
                    work.wait()
                    os.kill(os.getpid(), signal.SIGKILL)
                return work

            shm_module.ShmTransport.send = send


def _threads() -> list[str]:
    """Names of this process's threads."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:
            pass  # ended meanwhile
    return sorted(names)


def _new_threads(before: list[str]) -> list[str]:
    after = _threads()
    for name in before:
        if name in after:
            after.remove(name)
    return after


def _shm_files(directory: str = shm_module.SHM_DIRECTORY) -> list[str]:
    return sorted(f for f in os.listdir(directory) if f.startswith("topocoll-"))


def fault_worker(rank: int, n: int, workdir: str, out_file: str, kind: str, fault: str, timeout_s: float, shared_memory: bool) -> None:
    """One rank of one scenario (see the module docstring); writes its report to ``out_file``."""
    report: dict = {"rank": rank, "calls": [], "problems": []}
    faulty = rank == n - 1
    timeout = timedelta(seconds=timeout_s)
    (torch.ones(1 << 22) + 1).sum()  # start torch's own worker threads before counting
    threads_before = _threads()
    report["shm_before"] = _shm_files()

    def save() -> None:
        with open(out_file, "w") as f:
            json.dump(report, f)

    try:
        injector = _Injector(fault, timeout_s)
        if faulty and fault in ("late-header", "late-after", "kill-setup", "kill-data"):
            injector.install()
        planner = _tampered_planner(fault) if fault.startswith("tamper") else None
        options = TopoOptions(topology=flat_topology(n), planner=planner, shared_memory=shared_memory)
        if fault == "bad-topology":  # every rank reads $TOPOCOLL_TOPOLOGY; the faulty rank's file is broken
            path = os.path.join(workdir, f"topology-{rank}.json")
            with open(path, "w") as f:
                f.write('{"nodes": [' if faulty else flat_topology(n).to_json())
            os.environ[TOPOLOGY_ENV] = path
            options = TopoOptions(shared_memory=shared_memory)
        store = dist.FileStore(os.path.join(workdir, "store"), n)
        store.set_timeout(timeout)
        start = time.monotonic()
        try:
            dist.init_process_group("topo", store=store, rank=rank, world_size=n, timeout=timeout, pg_options=options)
        except Exception as exc:  # a peer died during set-up: this rank's set-up fails, fast
            report["init_error"] = f"{type(exc).__name__}: {exc}"
            report["init_s"] = time.monotonic() - start
            # torch counted the group that failed to start (its name, hence its store prefix, is
            # a counter that only destroy_process_group resets): start the recovery group's
            # count where the ranks whose set-up succeeded will start theirs
            dist.distributed_c10d._world.group_count = 0
        else:
            dist.barrier()  # every rank is set up before the faulty one misbehaves
        prefix = "topocoll-"  # set-up failed: no group name was agreed, any file would be a leak
        if "init_error" not in report:
            prefix = dist.group.WORLD._shm._prefix + "-" if dist.group.WORLD._shm is not None else prefix
            for k in range(1, COLLECTIVES + 1):
                if faulty and k == 1 and fault == "kill-first":
                    os.kill(os.getpid(), signal.SIGKILL)
                if faulty and k == 2 and fault == "late-before":
                    time.sleep(timeout_s + 1.0)
                numel = NUMEL + 5 if (faulty and k == 2 and fault == "mismatch") else NUMEL
                start = time.monotonic()
                try:
                    got = _call(kind, rank, n, k, numel, None)
                except Exception as exc:
                    report["calls"].append({"k": k, "outcome": "error", "s": time.monotonic() - start, "error": f"{type(exc).__name__}: {exc}"})
                    continue
                want = _expected(kind, rank, n, k, NUMEL)
                right = want is None or (len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want)))
                report["calls"].append({"k": k, "outcome": "right" if right else "WRONG", "s": time.monotonic() - start})
            dist.destroy_process_group()
        # leave nothing behind: threads and shared memory back to where they were
        gc.collect()
        report["threads_left"] = _new_threads(threads_before)
        report["shm_left"] = [f for f in _shm_files() if f.startswith(prefix) and f not in report["shm_before"]]
        # recovery: a new group on a new store gives right answers again
        injector.active = False
        survivors = n - 1 if fault.startswith("kill") else n
        recovery = dist.FileStore(os.path.join(workdir, "store-recovery"), survivors)
        recovery.set_timeout(timedelta(seconds=RECOVERY_RENDEZVOUS_S))
        if rank < survivors:
            dist.init_process_group(
                "topo", store=recovery, rank=rank, world_size=survivors, timeout=timeout,
                pg_options=TopoOptions(topology=flat_topology(survivors), shared_memory=shared_memory),
            )
            for k in (5, 6):
                got = _call(kind, rank, survivors, k, NUMEL, None)
                want = _expected(kind, rank, survivors, k, NUMEL)
                right = want is None or all(torch.equal(a, b) for a, b in zip(got, want))
                report.setdefault("recovered", []).append(right)
            dist.destroy_process_group()
    except Exception:
        import traceback

        report["problems"].append(f"rank {rank}: {traceback.format_exc()}")
    save()

