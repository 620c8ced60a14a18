"""What a collective may be asked for: the one check of ranks and root.

Every entry point of the solver (the cut bound, synthesis, the planner, the baselines) and the
commands over them validate a request here, so that one mistake gets one message and one error
type wherever it is made.
"""

from __future__ import annotations

from collections.abc import Sequence

from topocoll.errors import RequestError
from topocoll.solver.schedule import Collective
from topocoll.topo.model import Topology

__all__ = ["check_request"]


def check_request(
    topology: Topology, collective: Collective, ranks: Sequence[str], root: int | None, *, min_ranks: int = 2
) -> tuple[str, ...]:
    """Validate a request for ``collective`` over ``ranks``; returns the ranks as a tuple.

    Parameters
    ----------
    topology : Topology
    collective : Collective
    ranks : sequence of str
        Topology nodes of the ranks, in rank order.
    root : int or None
        The root rank of broadcast and reduce (ignored for the other collectives).
    min_ranks : int
        Fewest ranks accepted: 2 for the bound and synthesis, 1 for the baselines (a world of
        one has a trivial schedule).

    Returns
    -------
    tuple of str

    Raises
    ------
    RequestError
        An all-to-all (routed from its traffic matrix by :mod:`topocoll.solver.traffic`), too few ranks, repeated ranks, rank nodes that are not GPUs or hosts, or (for broadcast
        and reduce) a root that is not one of the ranks.
    TopologyError
        A rank that is not a node of the topology.

    See Also
    --------
    topocoll.solver.bound.cut_bound, topocoll.solver.planner.plan_collective,
    topocoll.solver.baselines.BASELINES : the entry points that check with it.

    Examples
    --------
    >>> from topocoll.topo.discover import flat_topology
    >>> check_request(flat_topology(3), Collective.BROADCAST, ["host0", "host1"], root=1)
    ('host0', 'host1')
    >>> check_request(flat_topology(3), Collective.BROADCAST, ["host0", "host1"], root=2)
    Traceback (most recent call last):
    ...
    topocoll.errors.RequestError: broadcast: root must be a rank in 0..1, got 2
    """
    ranks = tuple(ranks)
    if collective.is_routed:
        raise RequestError(f"{collective.value} moves a traffic matrix, it is routed, not synthesized: use 'topocoll route'")
    if len(ranks) < min_ranks:
        raise RequestError(f"a collective needs at least {min_ranks} rank{'s' if min_ranks > 1 else ''}, got {len(ranks)}")
    if len(set(ranks)) != len(ranks):
        raise RequestError("ranks must be distinct topology nodes")
    for r, node_id in enumerate(ranks):
        node = topology.node(node_id)
        if not node.kind.is_compute:
            raise RequestError(f"rank {r}: node {node_id} is a {node.kind.value}, not a gpu or host")
    if collective.is_rooted and (isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < len(ranks)):
        raise RequestError(f"{collective.value}: root must be a rank in 0..{len(ranks) - 1}, got {root!r}")
    return ranks
