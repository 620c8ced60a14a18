"""The part of a topology a collective may use, as index arrays for the numeric solvers.

A collective over some ranks may route through every forwarding node (switches, NICs, CPUs,
PCIe bridges) and through its own ranks, but not through compute nodes that are not among
them. The cut bound (max-flows) and the tree packing (shortest arborescences) both start from
that restriction as arrays of arcs; this is the one place it is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from topocoll.topo.model import Topology

__all__ = ["LinkArrays", "link_arrays"]


@dataclass(frozen=True, slots=True, eq=False)
class LinkArrays:
    """The kept nodes and the links between them.

    Attributes
    ----------
    names : tuple of str
        Node ids in index order: every node that is not a compute node, and the ranks.
    index : dict of str to int
        Position of each kept node in ``names``.
    src, dst : numpy.ndarray of int64
        Ends of each kept link, as indices (swapped when made with ``reverse``).
    cap : numpy.ndarray of float
        Bandwidth of each kept link, bytes/s.
    ranks : numpy.ndarray of int64
        Index of each rank, in rank order.
    """

    names: tuple[str, ...]
    index: dict[str, int]
    src: np.ndarray
    dst: np.ndarray
    cap: np.ndarray
    ranks: np.ndarray

    @property
    def n(self) -> int:
        """Number of kept nodes."""
        return len(self.names)


def link_arrays(topology: Topology, ranks: Sequence[str], reverse: bool = False) -> LinkArrays:
    """``topology`` without the compute nodes outside ``ranks``, as arrays of arcs.

    Parameters
    ----------
    topology : Topology
    ranks : sequence of str
        Rank nodes, in rank order.
    reverse : bool
        Swap every arc's ends (reduce-scatter and reduce work on the reversed graph).

    Returns
    -------
    LinkArrays

    Raises
    ------
    TopologyError
        A rank that is not a node of the topology.

    Examples
    --------
    >>> from topocoll.topo.discover import flat_topology
    >>> arrays = link_arrays(flat_topology(3), ["host0", "host2"])
    >>> "host1" in arrays.index, arrays.n, len(arrays.src)
    (False, 3, 4)
    """
    rank_set = set(ranks)
    for node_id in ranks:
        topology.node(node_id)  # raises for unknown nodes
    names = tuple(n.id for n in topology.nodes if not n.kind.is_compute or n.id in rank_set)
    index = {node_id: i for i, node_id in enumerate(names)}
    src, dst, cap = [], [], []
    for link in topology.links:
        if link.src in index and link.dst in index:
            a, b = index[link.src], index[link.dst]
            src.append(b if reverse else a)
            dst.append(a if reverse else b)
            cap.append(link.bw_bytes_per_s)
    return LinkArrays(
        names=names,
        index=index,
        src=np.asarray(src, dtype=np.int64),
        dst=np.asarray(dst, dtype=np.int64),
        cap=np.asarray(cap, dtype=float),
        ranks=np.asarray([index[r] for r in ranks], dtype=np.int64),
    )
