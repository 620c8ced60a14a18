"""Every collective of the ``topo`` backend checked against another backend's, on every rank.

Run under ``torchrun`` (``scripts/gpu-check`` does): each rank makes a ``topo`` group and a
reference group (``nccl`` on CUDA, ``gloo`` with ``--device cpu``), runs allreduce, allgather,
reduce_scatter, broadcast and reduce on the same inputs through both, for several sizes, dtypes
and ops, also with ``async_op=True`` and the result used on another stream, and compares the
results exactly (integers) or to the reduction order's rounding (floats). Rank 0 prints one line
per case and the count of mismatches; the exit status is 1 when any rank saw one.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

import topocoll  # noqa: F401  (registers the "topo" backend)

SIZES = (1, 7, 1000, 1 << 16, (1 << 20) + 3)
DTYPES = (torch.float32, torch.int32, torch.bfloat16)
OPS = (dist.ReduceOp.SUM, dist.ReduceOp.MAX)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point:
        tolerance = 1e-2 if a.dtype == torch.bfloat16 else 1e-5
        return torch.allclose(a.float(), b.float(), rtol=tolerance, atol=tolerance)
    return torch.equal(a, b)


def make(rank: int, numel: int, dtype: torch.dtype, device: torch.device, salt: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * salt + rank)
    values = torch.randint(-50, 50, (numel,), generator=generator)
    return values.to(dtype).to(device)


def cases(rank: int, world: int, device: torch.device, topo, reference, sizes=SIZES):
    """(name, ok) for every case."""
    salt = 0
    for dtype in DTYPES:
        for numel in sizes:
            salt += 1
            where = f"{dtype} n={numel}"
            x = make(rank, numel, dtype, device, salt)
            for op in OPS:
                ours, theirs = x.clone(), x.clone()
                dist.all_reduce(ours, op=op, group=topo)
                dist.all_reduce(theirs, op=op, group=reference)
                yield f"allreduce {op} {where}", close(ours, theirs)
            # asynchronous: the result is consumed on another stream after wait()
            ours = x.clone()
            work = dist.all_reduce(ours, group=topo, async_op=True)
            side = torch.cuda.Stream(device) if device.type == "cuda" else None
            with torch.cuda.stream(side) if side is not None else _nothing():
                work.wait()
                doubled = ours * 2
            if side is not None:
                torch.cuda.current_stream(device).wait_stream(side)
            theirs = x.clone()
            dist.all_reduce(theirs, group=reference)
            yield f"allreduce async + other stream {where}", close(doubled, theirs * 2)
            outs = [torch.empty_like(x) for _ in range(world)]
            refs = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(outs, x, group=topo)
            dist.all_gather(refs, x, group=reference)
            yield f"allgather {where}", all(close(a, b) for a, b in zip(outs, refs))
            shards = [make(rank, numel, dtype, device, salt * 31 + j) for j in range(world)]
            out, ref = torch.empty_like(x), torch.empty_like(x)
            dist.reduce_scatter(out, [s.clone() for s in shards], group=topo)
            dist.reduce_scatter(ref, [s.clone() for s in shards], group=reference)
            yield f"reduce_scatter {where}", close(out, ref)
            root = world - 1
            ours, theirs = x.clone(), x.clone()
            dist.broadcast(ours, src=root, group=topo)
            dist.broadcast(theirs, src=root, group=reference)
            yield f"broadcast {where}", close(ours, theirs)
            ours, theirs = x.clone(), x.clone()
            dist.reduce(ours, dst=root, group=topo)
            dist.reduce(theirs, dst=root, group=reference)
            yield f"reduce {where}", rank != root or close(ours, theirs)
    dist.barrier(group=topo)
    yield "barrier", True


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="element counts to check (comma-separated)")
    args = parser.parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        reference_backend = "nccl"
    else:
        device, reference_backend = torch.device("cpu"), "gloo"
    dist.init_process_group("topo", device_id=device if device.type == "cuda" else None)
    reference = dist.new_group(backend=reference_backend)
    topo = dist.group.WORLD
    wrong = 0
    sizes = tuple(int(v) for v in args.sizes.split(","))
    for name, ok in cases(rank, world, device, topo, reference, sizes):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wrong += not ok
        if rank == 0 or not ok:
            print(f"rank {rank}: {'ok   ' if ok else 'WRONG'} {name}", flush=True)
    total = torch.tensor([wrong], device=device)
    dist.all_reduce(total, group=reference)
    if rank == 0:
        print(f"{world} rank(s) on {device.type}: {int(total.item())} mismatch(es)", flush=True)
    dist.destroy_process_group()
    return 1 if int(total.item()) else 0


if __name__ == "__main__":
    sys.exit(main())
