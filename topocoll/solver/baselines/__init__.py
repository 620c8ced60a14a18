"""Baseline schedules in topocoll's IR: ring, double binary tree, hierarchical, recursive doubling.

Each builder takes a topology, a collective, the ranks (topology node ids; rank i runs on
``ranks[i]``) and, for broadcast and reduce, the root rank; it returns a
:class:`~topocoll.solver.schedule.Schedule` stamped with the topology's digest, every hop routed
by :func:`topocoll.solver.routing.widest_path`'s rule. All five collectives are supported by
every builder, over any subset of ranks of any topology; where an algorithm has no natural
form for a collective, the builder says which schedule it returns instead.

Rank placement. The algorithms place ranks on *positions* (ring positions, tree positions,
butterfly positions). All of them use the best ring order (:func:`ring_order`) as the
position order, so that neighbouring positions are close in the topology, as NCCL lays its
trees and rings over the same intra-node chains.

Pipelining. ``nchunks`` splits the data a chain or tree moves into that many pieces, sent one
step apart. Under the α-β model a pipeline of depth D with k pieces takes ``(D + k − 1)``
steps of ``1/k`` of the data; the default ``k = D`` keeps the fill/drain overhead below a
factor 2 of the bandwidth term while keeping the number of transfers at ``O(N·D)``.
"""

from __future__ import annotations

from collections.abc import Callable

from topocoll.solver.baselines.double_binary_tree import double_binary_tree
from topocoll.solver.baselines.hierarchical import hierarchical
from topocoll.solver.baselines.multichannel_ring import multichannel_ring, weighted_rings
from topocoll.solver.baselines.ordering import EXHAUSTIVE_RING_MAX_RANKS, GREEDY_RING_MAX_RANKS, ring_order
from topocoll.solver.baselines.recursive_doubling import recursive_doubling
from topocoll.solver.baselines.ring import rank_order_ring, ring
from topocoll.solver.schedule import Schedule

__all__ = [
    "BASELINES",
    "EXHAUSTIVE_RING_MAX_RANKS",
    "GREEDY_RING_MAX_RANKS",
    "double_binary_tree",
    "hierarchical",
    "multichannel_ring",
    "rank_order_ring",
    "recursive_doubling",
    "ring",
    "ring_order",
    "weighted_rings",
]

#: The baselines by name, for the CLI and the benchmark; all share the signature
#: ``(topology, collective, ranks=None, root=None, nchunks=None, routes=None) -> Schedule``.
BASELINES: dict[str, Callable[..., Schedule]] = {
    "ring": ring,
    "multichannel_ring": multichannel_ring,
    "double_binary_tree": double_binary_tree,
    "hierarchical": hierarchical,
    "recursive_doubling": recursive_doubling,
}
