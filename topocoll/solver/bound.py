"""The cut bound: the fastest any schedule can run a collective on a topology.

For allgather of a total output of ``M`` bytes over ``N`` ranks (DESIGN.md, "Measures")::

    T >= (M / N) * max over node sets S holding a rank of |ranks outside S| / B_in(S)

Equivalently, a per-rank shard rate ``x`` (bytes/s of each rank's shard) is feasible iff for
every rank ``v`` a max-flow from a super source ``s`` (an arc ``s -> u`` of capacity ``x`` to
every rank ``u``) to ``v`` carries ``N * x``: a cut separating ``s`` from ``v`` with ``S`` on
``v``'s side has capacity ``B_in(S) + x * |ranks in S|``. We find the largest feasible ``x`` by
a Dinkelbach iteration: start from the single-rank cuts, and whenever some ``v`` falls short,
read the violated set ``S`` off the residual graph and set ``x = B_in(S) / |ranks outside S|``.
``x`` only decreases and each step lands on a real cut, so the result is exact after a few
max-flows per rank. Reduce-scatter is the same on the reversed graph; the allreduce reference
is reduce-scatter plus allgather. Broadcast from a root is bounded by the smallest max-flow
from the root to any rank (reduce: on the reversed graph).

Compute nodes that are not among the ranks are left out of the graph: no program runs on them,
so nothing can be forwarded through them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from topocoll.errors import SolverError
from topocoll.solver.link_arrays import link_arrays
from topocoll.solver.request import check_request
from topocoll.solver.schedule import Collective
from topocoll.topo.model import LinkKind, NodeKind, Topology

#: Integer capacities handed to the max-flow code are scaled so the largest is this big;
#: scipy's max-flow works on 32-bit integers, and 1e9 keeps the relative rounding below 1e-8.
_INT_SCALE_MAX = 1_000_000_000
#: Relative slack when comparing a max-flow value to a demand (covers the integer rounding).
_REL_TOL = 1e-7


@dataclass(frozen=True, slots=True)
class Bound:
    """The cut bound of one collective on one set of ranks.

    Attributes
    ----------
    collective : Collective
    ranks : tuple of str
        Topology nodes of the ranks.
    time_per_byte_s : float
        Lower bound on the time per byte of the collective's size ``M`` (total output for
        allgather, total input for reduce-scatter, the buffer for the others).
    bottleneck : tuple of str
        The binding node set ``S`` (for allreduce: of the allgather half), sorted.
    root : int or None
    """

    collective: Collective
    ranks: tuple[str, ...]
    time_per_byte_s: float
    bottleneck: tuple[str, ...]
    root: int | None = None

    def time_s(self, size_bytes: float) -> float:
        """Least possible bandwidth time for a collective of ``size_bytes``."""
        return self.time_per_byte_s * size_bytes

    @property
    def algbw_bytes_per_s(self) -> float:
        """The best algorithm bandwidth (size / time) any schedule can reach."""
        return 1.0 / self.time_per_byte_s


class _FlowNetwork:
    """The topology (minus non-rank compute nodes) as arrays, ready for repeated max-flows."""

    def __init__(self, topology: Topology, ranks: Sequence[str], reverse: bool) -> None:
        arrays = link_arrays(topology, ranks, reverse)
        self.names = arrays.names
        self.src, self.dst, self.cap, self.ranks = arrays.src, arrays.dst, arrays.cap, arrays.ranks
        self.n = arrays.n

    def in_capacity(self, members: np.ndarray) -> float:
        """``B_in(S)`` for the boolean membership vector ``members`` of S."""
        crossing = ~members[self.src] & members[self.dst]
        return float(self.cap[crossing].sum())

    def max_flow(self, source_caps: dict[int, float], sink: int) -> tuple[float, float, np.ndarray]:
        """Max-flow from a super source (arcs to ``source_caps``' keys) to ``sink``.

        Returns the flow value (in bytes/s), the largest error the integer rounding of the
        capacities can cause in it, and the source side of a minimum cut as a boolean vector
        over the network's nodes (the super source excluded).
        """
        s = self.n
        extra_dst = np.fromiter(source_caps.keys(), dtype=np.int64, count=len(source_caps))
        extra_cap = np.fromiter(source_caps.values(), dtype=float, count=len(source_caps))
        all_src = np.concatenate([self.src, np.full(len(extra_dst), s, dtype=np.int64)])
        all_dst = np.concatenate([self.dst, extra_dst])
        all_cap = np.concatenate([self.cap, extra_cap])
        # No flow exceeds what leaves the super source, and no arc its capacity: scaled so that
        # the larger of the two is _INT_SCALE_MAX, every flow fits scipy's 32-bit integers. (Scaling
        # by the sum of all capacities instead left a NIC of an 8192-GPU cluster a few thousand
        # units and let a 22 % shortfall at a machine's NICs pass as rounding.)
        largest = max(float(all_cap.max(initial=0.0)), float(extra_cap.sum()))
        # No capacity at all (ranks cut off from each other): any finite scale gives flow 0.
        scale = _INT_SCALE_MAX / largest if largest > 0 else 1.0
        int_cap = np.floor(all_cap * scale).astype(np.int32)
        graph = csr_matrix((int_cap, (all_src, all_dst)), shape=(s + 1, s + 1))
        graph.sum_duplicates()
        result = maximum_flow(graph, s, sink, method="dinic")
        # scipy returns an antisymmetric flow, so cap - flow is the residual in both directions.
        residual = (graph - result.flow).tocsr()
        residual.data[residual.data < 0] = 0
        residual.eliminate_zeros()
        reach = np.zeros(s + 1, dtype=bool)
        reach[breadth_first_order(residual, s, directed=True, return_predecessors=False)] = True
        # The integer min cut is the one found; rounding took less than one unit off each of its arcs.
        crossing = int((reach[all_src] & ~reach[all_dst]).sum())
        return result.flow_value / scale, crossing / scale, reach[:s]


def _shard_rate(topology: Topology, ranks: tuple[str, ...], reverse: bool) -> tuple[float, tuple[str, ...]]:
    """Largest feasible shard rate ``x`` and the binding set (see the module docstring)."""
    net = _FlowNetwork(topology, ranks, reverse)
    n_ranks = len(ranks)
    # Start from the single-rank cuts S = {v}: x <= B_in({v}) / (N - 1).
    best_x, best_set = math.inf, ()
    for v in net.ranks:
        members = np.zeros(net.n, dtype=bool)
        members[v] = True
        x = net.in_capacity(members) / (n_ranks - 1)
        if x < best_x:
            best_x, best_set = x, (net.names[v],)
    if best_x <= 0:
        raise SolverError(f"rank {best_set[0]} has no links {'out' if reverse else 'in'}: it cannot take part")
    for v in net.ranks:
        while True:
            flow, slack, source_side = net.max_flow({int(u): best_x for u in net.ranks}, int(v))
            if flow >= n_ranks * best_x * (1 - _REL_TOL) - slack:
                break
            members = ~source_side  # S: the sink's side
            outside = int((~members[net.ranks]).sum())
            if outside == 0:
                break  # only the rounding made this cut look short
            cut_x = net.in_capacity(members) / outside
            if cut_x <= 0:
                a, b = (net.names[v], ranks[0]) if not reverse else (ranks[0], net.names[v])
                raise SolverError(f"ranks {a} and {b} cannot exchange data in this topology")
            if cut_x >= best_x * (1 - _REL_TOL):
                break  # rounding noise, not a tighter cut
            best_x = cut_x
            best_set = tuple(sorted(net.names[i] for i in np.flatnonzero(members)))
    return best_x, best_set


def _broadcast_rate(topology: Topology, ranks: tuple[str, ...], root: int, reverse: bool) -> tuple[float, tuple[str, ...]]:
    net = _FlowNetwork(topology, ranks, reverse)
    root_index = int(net.ranks[root])
    best, best_set = math.inf, ()
    for v in net.ranks:
        if int(v) == root_index:
            continue
        # the root's own out-capacity: no flow from it is larger
        flow, _, source_side = net.max_flow({root_index: float(net.cap[net.src == root_index].sum())}, int(v))
        if flow <= 0:
            raise SolverError(f"rank {net.names[v]} cannot be reached from root {ranks[root]}")
        if flow < best:
            best = flow
            best_set = tuple(sorted(net.names[i] for i in np.flatnonzero(~source_side)))
    return best, best_set


def cut_bound(topology: Topology, collective: Collective, ranks: Sequence[str], root: int | None = None) -> Bound:
    """The cut bound of ``collective`` over ``ranks`` on ``topology``.

    Parameters
    ----------
    topology : Topology
    collective : Collective
    ranks : sequence of str
        Topology nodes (gpu or host), one per rank, in rank order.
    root : int, optional
        Root rank for broadcast and reduce.

    Returns
    -------
    Bound

    Raises
    ------
    SolverError
        Fewer than 2 ranks, non-compute rank nodes, a root outside the ranks, or ranks that
        cannot reach each other.
    TopologyError
        A rank that is not a node of the topology.

    See Also
    --------
    topocoll.solver.verify.verify : a schedule's bandwidth time, to set beside the bound.
    topocoll.solver.synthesize.synthesize : schedules that reach it.

    Examples
    --------
    Two GPUs joined by one 25 GB/s link each way: an allgather of 2 GB moves 1 GB each way.

    >>> from topocoll.topo.model import TopologyBuilder, Node, NodeKind, LinkKind
    >>> b = TopologyBuilder()
    >>> _ = b.add_node(Node("gpu0", NodeKind.GPU)); _ = b.add_node(Node("gpu1", NodeKind.GPU))
    >>> b.add_link("gpu0", "gpu1", LinkKind.NVLINK, 25e9)
    >>> cut_bound(b.build(), Collective.ALLGATHER, ["gpu0", "gpu1"]).time_s(2e9)
    0.04
    """
    ranks = check_request(topology, collective, ranks, root)
    n = len(ranks)
    if collective.is_rooted:
        rate, binding = _broadcast_rate(topology, ranks, root, reverse=collective is Collective.REDUCE)
        return Bound(collective, ranks, 1.0 / rate, binding, root)
    if collective is Collective.ALLGATHER:
        x, binding = _shard_rate(topology, ranks, reverse=False)
        return Bound(collective, ranks, 1.0 / (n * x), binding)
    if collective is Collective.REDUCE_SCATTER:
        x, binding = _shard_rate(topology, ranks, reverse=True)
        return Bound(collective, ranks, 1.0 / (n * x), binding)
    gather = cut_bound(topology, Collective.ALLGATHER, ranks)
    # On a full-duplex graph the reversed graph is the graph: reduce-scatter's bound is allgather's.
    scatter = gather if topology.is_symmetric() else cut_bound(topology, Collective.REDUCE_SCATTER, ranks)
    return Bound(collective, ranks, gather.time_per_byte_s + scatter.time_per_byte_s, gather.bottleneck)


def bound_time_s(
    topology: Topology, collective: Collective, ranks: Sequence[str], size_bytes: float, root: int | None = None
) -> float:
    """Shorthand: the bound's time for ``size_bytes`` (see :func:`cut_bound`)."""
    return cut_bound(topology, collective, ranks, root).time_s(size_bytes)


#: NVLink SHARP (NVLS), the reduction inside third-generation NVSwitches, serves GPUs of compute
#: capability 9.0 (Hopper) and later; NCCL offers its NVLS algorithms from there on.
NVLS_MIN_SM = 90


@dataclass(frozen=True, slots=True)
class InNetworkBound:
    """The least time of an allreduce whose reduction happens inside the switches (NVLS).

    Point-to-point schedules cannot use it, so the cut bound does not limit it: a collective
    library that reduces in the switch may run faster than :func:`cut_bound` allows.

    Attributes
    ----------
    collective : Collective
    ranks : tuple of str
    time_per_byte_s : float
        Least time per byte of the buffer.
    gpu_bw_bytes_per_s : float
        The narrowest rank's NVLink bandwidth to the switches, each way.
    mechanism : str
        ``"NVLS"``.
    """

    collective: Collective
    ranks: tuple[str, ...]
    time_per_byte_s: float
    gpu_bw_bytes_per_s: float
    mechanism: str = "NVLS"

    def time_s(self, size_bytes: float) -> float:
        """Least possible bandwidth time for ``size_bytes``."""
        return self.time_per_byte_s * size_bytes

    @property
    def algbw_bytes_per_s(self) -> float:
        """The best algorithm bandwidth with in-switch reduction."""
        return 1.0 / self.time_per_byte_s


def in_network_bound(topology: Topology, collective: Collective, ranks: Sequence[str]) -> InNetworkBound | None:
    """The bound of an allreduce reduced inside NVSwitches (NVLS), where the ranks can use it.

    With NVLS every byte of every GPU's buffer goes up to the switch once (the switch reads it
    for the reduction of its shard) and every reduced byte comes down to every GPU once (the
    switch multicasts it); each GPU also fetches its own reduced shard and stores it back. So
    each GPU's NVLinks carry ``S (1 + 1/N)`` each way, and ``T >= S (1 + 1/N) / B`` with ``B``
    the narrowest rank's NVLink bandwidth to the switches: a bus bandwidth of up to
    ``2 (N - 1) / (N + 1) B``, where point-to-point schedules reach at most ``B``.

    Parameters
    ----------
    topology : Topology
    collective : Collective
    ranks : sequence of str
        Rank nodes.

    Returns
    -------
    InNetworkBound or None
        None unless the collective is an allreduce over two or more GPUs whose compute
        capability is known and at least :data:`NVLS_MIN_SM`, all joined by NVLink to the same
        NVSwitches (one machine's NVLink domain).

    Examples
    --------
    >>> from topocoll.topo.presets import build_preset
    >>> h100 = build_preset("dgx-h100")
    >>> nvls = in_network_bound(h100, Collective.ALLREDUCE, h100.compute_nodes())
    >>> round(nvls.gpu_bw_bytes_per_s / 1e9), nvls.mechanism
    (450, 'NVLS')
    >>> in_network_bound(build_preset("dgx-a100"), Collective.ALLREDUCE, build_preset("dgx-a100").compute_nodes()) is None
    True
    """
    ranks = tuple(ranks)
    if collective is not Collective.ALLREDUCE or len(ranks) < 2:
        return None
    switches = {n.id for n in topology.nodes if n.kind is NodeKind.NVSWITCH}
    domain: frozenset[str] | None = None
    narrowest = math.inf
    for rank in ranks:
        node = topology.node(rank)
        if node.kind is not NodeKind.GPU or node.sm is None or node.sm < NVLS_MIN_SM:
            return None
        up = {link.dst: link.bw_bytes_per_s for link in topology.links if link.src == rank and link.kind is LinkKind.NVLINK and link.dst in switches}
        down = {link.src: link.bw_bytes_per_s for link in topology.links if link.dst == rank and link.kind is LinkKind.NVLINK and link.src in switches}
        reached = frozenset(up)
        if not reached or reached != frozenset(down) or (domain is not None and reached != domain):
            return None
        domain = reached
        narrowest = min(narrowest, sum(up.values()), sum(down.values()))
    n = len(ranks)
    return InNetworkBound(collective, ranks, (1 + 1 / n) / narrowest, narrowest)
