"""All-to-all by routing: each pair's rows split over several paths, relays through other ranks.

A call of ``all_to_all_single`` (or the list form) on a topo group runs in three parts:

1. **Agree** (:func:`agree_counts`): every rank contributes its input and output split sizes
   through one gather on the inner backend, so that every rank holds the whole matrix of element
   counts and checks it the same way (rank j's output splits are column j of the inputs): a
   mismatch raises the same :class:`~topocoll.collectives.failure.AgreedError` on every rank.
2. **Plan** (:class:`AllToAllPlanner`): the traffic matrix is routed by
   :func:`topocoll.solver.traffic.route_fast` on rank 0, and the plan (for every pair, its chains
   of ranks and the share of the pair's bytes each carries) is broadcast; every rank caches it
   under the matrix quantised to :data:`QUANT_STEPS_PER_OCTAVE` steps per doubling, so that
   similar training steps reuse it without planning or broadcasting again.
3. **Move** (:func:`run_plan`): the shares become whole elements (largest remainder, the same on
   every rank), and hop by hop every rank posts its receives and sends through the inner
   backend's point-to-point messages; a relay keeps what it receives until its next hop.

Element counts, not bytes, are moved: every element arrives bit for bit, whatever its dtype.
"""

from __future__ import annotations

import math
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from topocoll.collectives.failure import AgreedError
from topocoll.collectives.tensor_views import is_packed, raw_bytes
from topocoll.errors import CollectiveError
from topocoll.solver import traffic
from topocoll.topo.model import Topology
from topocoll.topo.rails import Rails

__all__ = ["AllToAllCalls", "AllToAllPlanner", "Chain", "agree_counts", "element_splits", "run_plan", "split_counts"]

TAG_BASE = 1 << 20
"""Message tags of a routed all-to-all are ``TAG_BASE + chain index``: above the tags a program
of the scheduled collectives uses on its own inner group, and apart from small user tags."""

QUANT_STEPS_PER_OCTAVE = 4
"""Plan cache key: each pair's byte count as ``round(4 log2(bytes))``, so matrices within about
±9 % of each other pair by pair share a plan (its shares, not its counts)."""

ROUTED_MAX_RANKS = 128
"""Largest group whose CPU all-to-alls are routed: the candidate paths of 128 ranks take about a
second to make on a 2-core machine and a skewed plan about 0.6 s (``benchmarks/results/traffic_bench.md``);
a step of a larger CPU group would wait on planning longer than it gains."""

CACHE_SIZE = 64
"""Plans kept per group (least recently used dropped first)."""


@dataclass(frozen=True, slots=True)
class Chain:
    """``share`` of pair ``ranks[0] -> ranks[-1]``'s elements, relayed along ``ranks``; hop k goes
    on inner channel ``channels[k]`` (0: the group's own transport, r + 1: rail r's group, as
    :meth:`topocoll.topo.rails.Rails.channel_of` says; empty: all on 0)."""

    ranks: tuple[int, ...]
    share: float
    channels: tuple[int, ...] = ()

    def channel(self, hop: int) -> int:
        """The channel of hop ``hop``."""
        return self.channels[hop] if self.channels else 0


def agree_counts(
    gather: Any, rank: int, size: int, in_counts: Sequence[int], out_counts: Sequence[int], dtype_code: int, local_error: str | None = None
) -> np.ndarray:
    """Every rank's input counts as an ``size x size`` matrix (row i: what rank i sends to each).

    ``gather(tensor) -> list of tensors`` gathers one int64 tensor from every rank. A rank with
    bad arguments (``local_error``) still takes part, so that every rank raises.

    Raises
    ------
    AgreedError
        On every rank alike: bad arguments on some rank, dtypes that differ, or a rank whose
        output counts differ from what the others send it.
    """
    counts = [*in_counts, *out_counts] if local_error is None else [0] * (2 * size)
    mine = torch.tensor([dtype_code, 1 if local_error else 0, *counts], dtype=torch.int64)
    rows = [t.tolist() for t in gather(mine)]
    if local_error:
        raise AgreedError(f"rank {rank}: all_to_all: {local_error}")
    bad = [r for r, row in enumerate(rows) if row[1]]
    if bad:
        raise AgreedError(f"rank {rank}: all_to_all: invalid arguments on rank(s) {bad}")
    codes = [row[0] for row in rows]
    if len(set(codes)) > 1:
        raise AgreedError(f"rank {rank}: all_to_all: the ranks' tensors differ in dtype")
    sends = np.array([row[2 : 2 + size] for row in rows], dtype=np.int64)
    receives = np.array([row[2 + size :] for row in rows], dtype=np.int64)
    wrong = [j for j in range(size) if not np.array_equal(receives[j], sends[:, j])]
    if wrong:
        j = wrong[0]
        raise AgreedError(
            f"rank {rank}: all_to_all: rank {j} expects {receives[j].tolist()} elements from the ranks, "
            f"they send it {sends[:, j].tolist()}"
        )
    return sends


def element_splits(chains: Sequence[Chain], count: int) -> list[int]:
    """Whole elements of each chain of one pair: ``share x count`` rounded by largest remainder
    (ties to the earlier chain), summing to ``count``. The same on every rank.

    Examples
    --------
    >>> element_splits([Chain((0, 1), 0.5), Chain((0, 2, 1), 0.5)], 5)
    [3, 2]
    """
    exact = [c.share * count for c in chains]
    whole = [math.floor(x) for x in exact]
    left = count - sum(whole)
    for k in sorted(range(len(chains)), key=lambda k: (-(exact[k] - whole[k]), k))[: max(left, 0)]:
        whole[k] += 1
    return whole


class AllToAllPlanner:
    """Routes of a group's all-to-alls: planned on rank 0, shared, cached by quantised matrix."""

    def __init__(self, topology: Topology, nodes: Sequence[str], rank: int, rails: Rails | None = None) -> None:
        self._topology = topology
        self._rails = rails
        self._nodes = tuple(nodes)
        self._rank = rank
        self._paths: traffic.PathSets | None = None
        self._one_path_only: bool | None = None
        self._cache: OrderedDict[tuple[int, ...], tuple[tuple[Chain, ...], ...]] = OrderedDict()

    @property
    def one_path_only(self) -> bool:
        """Whether the topology offers every pair just one path (a flat host, a star): routing
        then gains nothing over the inner backend's own all-to-all, which is cheaper to call.
        Groups over :data:`ROUTED_MAX_RANKS` are treated so too."""
        if self._one_path_only is None:  # asked on every call: decided once per group
            self._one_path_only = len(self._nodes) > ROUTED_MAX_RANKS or bool((np.diff(self._candidate_paths().first_path) <= 1).all())
        return self._one_path_only

    def _candidate_paths(self) -> traffic.PathSets:
        if self._paths is None:
            self._paths = traffic.candidate_paths(self._topology, self._nodes)
        return self._paths

    def chains(self, byte_matrix: np.ndarray, broadcast: Any) -> tuple[tuple[Chain, ...], ...]:
        """Every pair's chains (index ``src * n + dst``), from the cache or planned on rank 0 and
        broadcast (``broadcast(tensor)`` broadcasts a float64 tensor from rank 0 in place)."""
        key = tuple(int(round(QUANT_STEPS_PER_OCTAVE * math.log2(b))) if b > 0 else -(1 << 30) for b in byte_matrix.reshape(-1))
        found = self._cache.get(key)
        if found is not None:
            self._cache.move_to_end(key)
            return found
        n = len(self._nodes)
        encoded = self._plan(byte_matrix) if self._rank == 0 else None
        length = torch.tensor([0.0 if encoded is None else float(len(encoded))], dtype=torch.float64)
        broadcast(length)
        data = encoded if encoded is not None else torch.zeros(int(length.item()), dtype=torch.float64)
        broadcast(data)
        plan = _decode(data.tolist(), n)
        _check_plan(plan, byte_matrix, self._rank, 1 + (self._rails.count if self._rails else 0))
        self._cache[key] = plan
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return plan

    def _plan(self, byte_matrix: np.ndarray) -> torch.Tensor:
        routing = traffic.route_fast(self._candidate_paths(), byte_matrix)
        index = {node: r for r, node in enumerate(self._nodes)}
        words: list[float] = []
        for split in routing.splits:
            cuts = [k for k, v in enumerate(split.path) if v in index]  # where the path meets a rank
            ranks = [index[split.path[k]] for k in cuts]
            channels = [self._rails.channel_of(split.path[a : b + 1]) if self._rails else 0 for a, b in zip(cuts, cuts[1:])]
            share = split.bytes / byte_matrix[split.src, split.dst]
            words += [float(split.src * len(self._nodes) + split.dst), share, float(len(ranks)), *map(float, ranks), *map(float, channels)]
        return torch.tensor(words, dtype=torch.float64)


def _check_plan(plan: Sequence[Sequence[Chain]], byte_matrix: np.ndarray, rank: int, channels: int) -> None:
    """Refuse a shared plan that would not deliver every pair's bytes: each chain must run from
    its pair's source to its destination over ranks and channels of the group, and each pair with
    traffic must have chains whose shares add up to one. (Every rank checks what rank 0 sent.)"""
    n = byte_matrix.shape[0]
    for pair, chains in enumerate(plan):
        src, dst = divmod(pair, n)
        if byte_matrix[src, dst] > 0 and src != dst and abs(sum(c.share for c in chains) - 1.0) > 1e-6:
            raise CollectiveError(f"rank {rank}: all_to_all: the shared plan moves {sum(c.share for c in chains):.6f} of rank {src} -> rank {dst}")
        for c in chains:
            if (
                len(c.ranks) < 2
                or (c.ranks[0], c.ranks[-1]) != (src, dst)
                or not all(0 <= r < n for r in c.ranks)
                or len(c.channels) not in (0, len(c.ranks) - 1)
                or not all(0 <= ch < channels for ch in c.channels)
            ):
                raise CollectiveError(f"rank {rank}: all_to_all: the shared plan has a bad chain {c} for rank {src} -> rank {dst}")


def _decode(words: Sequence[float], n: int) -> tuple[tuple[Chain, ...], ...]:
    chains: list[list[Chain]] = [[] for _ in range(n * n)]
    k = 0
    while k < len(words):
        pair, share, length = int(words[k]), words[k + 1], int(words[k + 2])
        ranks = tuple(int(r) for r in words[k + 3 : k + 3 + length])
        channels = tuple(int(c) for c in words[k + 3 + length : k + 2 + 2 * length])
        chains[pair].append(Chain(ranks, share, channels))
        k += 2 + 2 * length
    return tuple(tuple(c) for c in chains)


def run_plan(
    backends: Sequence[Any],
    rank: int,
    chains: Sequence[Sequence[Chain]],
    counts: np.ndarray,
    send: torch.Tensor,
    receive: torch.Tensor,
    timeout: timedelta,
    rounds: bool = True,
) -> None:
    """Move ``send`` (this rank's blocks, destination by destination) into ``receive`` (blocks by
    source) along ``chains``, hop by hop, with the point-to-point messages of ``backends[c]``
    for a hop on channel c.

    ``counts[i][j]`` elements go from rank i to rank j; ``send`` and ``receive`` are 1-D.

    With ``rounds`` (the default) each hop runs in ``n - 1`` rounds: in round k every rank sends
    only to rank ``+k`` and receives only from rank ``-k`` (mod n), so that each NIC carries one
    connection each way per channel at a time. Measured on the emulated ``multi-rail`` cluster
    (tbf-shaped links, 32 MiB per rank, two runs each): all pairs at once reached 47-48 % of the
    matrix's bound under uniform traffic and 61 % under Zipf(1.2); rounds reached 83-86 % and
    87-89 %. Two TCP connections each way through one shaped link carry two thirds of it, one
    each way nearly all (README, "Emulated hosts").
    """
    n = counts.shape[0]
    in_offset = np.concatenate([[0], np.cumsum(counts[rank])])
    out_offset = np.concatenate([[0], np.cumsum(counts[:, rank])])
    pieces = []  # (chain id, ranks, offset in the pair block, elements)
    for pair in range(n * n):
        src, dst = divmod(pair, n)
        if counts[src, dst] == 0 or not chains[pair]:
            if counts[src, dst] and src != dst:
                raise CollectiveError(f"rank {rank}: all_to_all: no route planned for rank {src} -> rank {dst}")
            continue
        offset = 0
        for chain, elements in zip(chains[pair], element_splits(chains[pair], int(counts[src, dst]))):
            if elements:
                pieces.append((len(pieces), chain, src, dst, offset, elements))
            offset += elements
    if counts[rank, rank]:
        receive[out_offset[rank] : out_offset[rank] + counts[rank, rank]] = send[in_offset[rank] : in_offset[rank] + counts[rank, rank]]
    held: dict[int, torch.Tensor] = {}
    hops = max((len(p[1].ranks) - 1 for p in pieces), default=0)
    for hop, shift in ((h, k) for h in range(hops) for k in (range(1, n) if rounds else [None])):
        receives, sends = [], []
        for piece_id, chain, src, dst, offset, elements in pieces:
            ranks = chain.ranks
            if hop >= len(ranks) - 1:
                continue
            sender, receiver = ranks[hop], ranks[hop + 1]
            if shift is not None and (receiver - sender) % n != shift:
                continue  # not this round's peers
            backend = backends[chain.channel(hop)]
            if receiver == rank:
                if receiver == dst:
                    target = receive[out_offset[src] + offset : out_offset[src] + offset + elements]
                else:
                    target = held[piece_id] = torch.empty(elements, dtype=send.dtype)
                receives.append(backend.recv([target], sender, TAG_BASE + piece_id))
            if sender == rank:
                data = send[in_offset[dst] + offset : in_offset[dst] + offset + elements] if hop == 0 else held.pop(piece_id)
                sends.append(backend.send([data.contiguous()], receiver, TAG_BASE + piece_id))
        for work in receives + sends:
            work.wait(timeout)


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors lie on one storage (an in-place all-to-all)."""
    return a.numel() > 0 and b.numel() > 0 and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def split_counts(tensor: torch.Tensor, splits: Sequence[int], size: int, what: str) -> tuple[list[int], str | None]:
    """Elements per rank of ``tensor`` cut along dim 0 by ``splits`` (rows; empty: equal parts),
    or an error message."""
    rows = tensor.shape[0] if tensor.dim() else 1
    per_row = tensor.numel() // rows if rows else 0
    if not splits:
        if rows % size:
            return [], f"the {what} has {rows} rows, not a multiple of the group size {size} (give split sizes)"
        return [rows // size * per_row] * size, None
    if len(splits) != size:
        return [], f"{len(splits)} {what} split sizes for a group of {size}"
    if any(int(s) < 0 for s in splits):
        return [], f"negative {what} split sizes {list(splits)}"
    if sum(int(s) for s in splits) != rows:
        return [], f"the {what} split sizes {list(splits)} add up to {sum(splits)}, the {what} has {rows} rows"
    return [int(s) * per_row for s in splits], None


class AllToAllCalls:
    """``alltoall_base`` / ``all_to_all_single`` and the list form on a topo group (a part of
    :class:`~topocoll.collectives.process_group.TopoProcessGroup`): CPU tensors are routed
    (:func:`agree_counts`, :class:`AllToAllPlanner`, :func:`run_plan`) where the topology offers
    some pair more than one path; otherwise, and for CUDA tensors, the inner backend's own
    all-to-all runs."""

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # noqa: A002
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Any:
        """All-to-all of one tensor (``dist.all_to_all_single``), even or uneven splits. One
        tensor as input and output works too (gloo's own returns wrong blocks then): the input is
        copied aside first."""
        if output.device.type == "cpu" and _shares_memory(output, input):
            input = input.clone()  # noqa: A001  (blocks still to be sent must survive the receives)
        if output.device.type != "cpu" or input.device.type != "cpu" or self._a2a().one_path_only:
            return self._other([input]).alltoall_base(output, input, output_split_sizes, input_split_sizes, opts or dist.AllToAllOptions())
        body = lambda: self._routed_alltoall(output, input, list(output_split_sizes), list(input_split_sizes))  # noqa: E731
        return self._complete([output], body, scheduled=False)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # noqa: A002
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Any:
        """Same as :meth:`alltoall_base` (``dist.all_to_all_single``)."""
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """All-to-all of tensor lists (``dist.all_to_all``): tensor j of the input goes to rank j."""
        if any(t.device.type != "cpu" for t in [*output_tensors, *input_tensors]):
            return self._other(input_tensors).alltoall(output_tensors, input_tensors, opts or dist.AllToAllOptions())
        return self._complete(output_tensors, lambda: self._alltoall_list(output_tensors, input_tensors), scheduled=False)

    def _alltoall_list(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor]) -> None:
        n = self._group_size
        error = None
        if len(output_tensors) != n or len(input_tensors) != n:
            error = f"all_to_all needs {n} input and {n} output tensors, got {len(input_tensors)} and {len(output_tensors)}"
        elif len({t.dtype for t in [*output_tensors, *input_tensors]}) != 1:
            error = "all_to_all tensors must share one dtype"
        if error is not None:  # every rank must still take part in the agreement
            empty = torch.empty(0, dtype=torch.uint8)
            self._routed_alltoall(empty, empty, [], [], error)
            return
        send = torch.cat([t.reshape(-1) for t in input_tensors])
        receive = torch.empty(sum(t.numel() for t in output_tensors), dtype=send.dtype)
        out_counts, in_counts = [t.numel() for t in output_tensors], [t.numel() for t in input_tensors]
        if self._a2a().one_path_only:
            self._other(input_tensors).alltoall_base(receive, send, out_counts, in_counts, dist.AllToAllOptions()).wait(self._timeout)
        else:
            self._routed_alltoall(receive, send, out_counts, in_counts)
        offset = 0
        for out in output_tensors:
            out.copy_(receive[offset : offset + out.numel()].view(out.shape))
            offset += out.numel()

    def _routed_alltoall(
        self, output: torch.Tensor, input: torch.Tensor, out_splits: list[int], in_splits: list[int], error: str | None = None  # noqa: A002
    ) -> None:
        n, rank = self._group_size, self._group_rank
        in_counts, out_counts = [], []
        if error is None and output.dtype != input.dtype:
            error = f"input {input.dtype} and output {output.dtype} differ"
        if error is None:
            in_counts, error = split_counts(input, in_splits, n, "input")
        if error is None:
            out_counts, error = split_counts(output, out_splits, n, "output")
        itemsize = input.element_size()
        backend = self._other([input])

        def gather(tensor: torch.Tensor) -> list[torch.Tensor]:
            outputs = [torch.empty_like(tensor) for _ in range(n)]
            backend.allgather([outputs], [tensor]).wait(self._timeout)
            return outputs

        def broadcast(tensor: torch.Tensor) -> None:
            options = dist.BroadcastOptions()
            options.rootRank = 0
            backend.broadcast([tensor], options).wait(self._timeout)

        code = zlib.crc32(str(input.dtype).encode()) & 0x7FFFFFFF
        counts = agree_counts(gather, rank, n, [c * itemsize for c in in_counts], [c * itemsize for c in out_counts], code, error)
        send = raw_bytes(input)
        direct = is_packed(output) and output.numel() > 0
        receive = output.view(-1).view(torch.uint8) if direct else torch.empty(output.numel() * itemsize, dtype=torch.uint8)
        if n > 1 and counts.any():
            chains = self._a2a().chains(counts.astype(float), broadcast)
        else:
            chains = ((),) * (n * n)
        if all(len(c) <= 1 and all(len(chain.ranks) == 2 and chain.channel(0) == 0 for chain in c) for c in chains):
            # the plan is one direct path per pair on the group's own transport: what the inner
            # backend's all-to-all does in one call (the same decision on every rank: the plan is shared)
            options = dist.AllToAllOptions()
            backend.alltoall_base(receive, send, counts[:, rank].tolist(), counts[rank].tolist(), options).wait(self._timeout)
        else:
            run_plan([backend, *self._rail_groups], rank, chains, counts, send, receive, self._timeout)
        if not direct and output.numel():
            output.copy_(receive.view(output.dtype).view(output.shape))

    def _a2a(self) -> AllToAllPlanner:
        """The group's all-to-all planner, made on first use (for the topology planned on now)."""
        if self._a2a_planner is None:
            rails = self._rails if self._rail_groups else None  # steer hops onto their rails only where rail groups exist
            self._a2a_planner = AllToAllPlanner(self._topology, self._schedules.nodes, self._group_rank, rails)
        return self._a2a_planner
