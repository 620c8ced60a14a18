"""The ring order every baseline lays its positions in: neighbouring positions close in the topology."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from topocoll.solver.routing import RouteTable, route_table
from topocoll.topo.model import Topology


#: Up to this many ranks the ring order is found by trying every ring ((N-1)! orders: 5040).
EXHAUSTIVE_RING_MAX_RANKS = 8


#: Up to this many ranks a nearest-neighbour tour is tried too (needs all N^2 routes).
GREEDY_RING_MAX_RANKS = 64


def ring_order(
    topology: Topology,
    ranks: Sequence[str],
    routes: RouteTable | None = None,
    base_load: Mapping[tuple[str, str], float] | None = None,
) -> tuple[int, ...]:
    """A ring through all ranks that loads the topology's links as little as possible.

    The score of a ring (every hop routed by the widest-path rule, each carrying the same
    data) is ``max over links e of (base_load(e) + hops using e) / bw(e)``, i.e. its bandwidth
    time per byte on top of what other rings already put there, then its summed hop latency.
    Up to :data:`EXHAUSTIVE_RING_MAX_RANKS` ranks every ring is scored; above, the best of the
    rank order, the rank order grouped by ``host_id`` (with every host's ranks rotated by each
    amount when ``base_load`` is given, so that rings cross between hosts at other ranks), and
    (up to :data:`GREEDY_RING_MAX_RANKS`) a nearest-neighbour tour over the widest routes.

    Parameters
    ----------
    topology : Topology
    ranks : sequence of str
        Node ids.
    routes : RouteTable, optional
        A table covering ``ranks`` (built when omitted).
    base_load : mapping of (src, dst) to float, optional
        Hops other rings already route over each link, in the same units.

    Returns
    -------
    tuple of int
        Rank indices in ring order, starting with rank 0.
    """
    nodes = tuple(ranks)
    n = len(nodes)
    if n <= 2:
        return tuple(range(n))
    routes = routes or route_table(topology, nodes)
    hop_links: dict[tuple[int, int], tuple[tuple[tuple[str, str], ...], float]] = {}

    def hop(a: int, b: int) -> tuple[tuple[tuple[str, str], ...], float]:
        entry = hop_links.get((a, b))
        if entry is None:
            path = routes.path(nodes[a], nodes[b])
            entry = (tuple(zip(path, path[1:])), topology.path_latency_s(path))
            hop_links[(a, b)] = entry
        return entry

    bw = {(link.src, link.dst): link.bw_bytes_per_s for link in topology.links}
    base = base_load or {}

    def score(order: Sequence[int]) -> tuple[float, float]:
        count: dict[tuple[str, str], float] = {}
        latency_s = 0.0
        for i in range(n):
            links, lat = hop(order[i], order[(i + 1) % n])
            latency_s += lat
            for link in links:
                count[link] = count.get(link, base.get(link, 0.0)) + 1
        return max(c / bw[link] for link, c in count.items()), latency_s

    if n <= EXHAUSTIVE_RING_MAX_RANKS:
        candidates = ((0, *rest) for rest in itertools.permutations(range(1, n)))
    else:
        candidates = [tuple(range(n)), _host_grouped(topology, nodes)]
        if base_load:
            candidates += _host_rotations(topology, nodes)
        if n <= GREEDY_RING_MAX_RANKS:
            candidates.append(_nearest_neighbour(routes, nodes))
    best = min(candidates, key=score)
    return tuple(best)


def _host_grouped(topology: Topology, nodes: tuple[str, ...]) -> tuple[int, ...]:
    groups = topology.ranks_by_host(nodes)
    return tuple(r for group in groups for r in group)


def _host_rotations(topology: Topology, nodes: tuple[str, ...]) -> list[tuple[int, ...]]:
    """The host-grouped ring with every host's ranks rotated by 1, 2, ... (as rank 0 first)."""
    groups = topology.ranks_by_host(nodes)
    longest = max(len(g) for g in groups)
    rings = []
    for shift in range(1, longest):
        order = [r for g in groups for r in (g[shift % len(g):] + g[: shift % len(g)])]
        start = order.index(0)
        rings.append(tuple(order[start:] + order[:start]))
    return rings


def _nearest_neighbour(routes: RouteTable, nodes: tuple[str, ...]) -> tuple[int, ...]:
    order = [0]
    left = set(range(1, len(nodes)))
    while left:
        here = nodes[order[-1]]

        def key(r: int) -> tuple[float, int, float, int]:
            route = routes.route(here, nodes[r])
            return (-route.bw_bytes_per_s, route.hops, route.latency_s, r)

        nxt = min(left, key=key)
        order.append(nxt)
        left.discard(nxt)
    return tuple(order)
