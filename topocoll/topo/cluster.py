"""Multi-node clusters: several machines of a preset joined by a network.

:func:`make_cluster` places ``nodes`` copies of a preset (machine ``k`` gets the id prefix
``"n{k}."`` and ``host_id`` ``"n{k}"``, its GPUs the ranks ``k * gpus .. k * gpus + gpus - 1``,
so ranks are numbered node-major) and wires their NICs into one of three fabrics:

``rail`` (rail-optimized)
    NIC ``i`` of every machine goes to the leaf switch(es) of rail ``i``. When a rail fits in
    one switch, the rails are joined only inside the machines (traffic changes rail over
    NVLink/PCIe first); when it does not, the rail is split over several leaves and a spine
    layer joins every leaf of every rail.
``fat-tree``
    NICs fill leaf switches in node-major order, whatever their index, a machine's NICs on one
    leaf when they fit in its ports (as clusters are cabled: a leaf holds as many whole machines
    as it can, and no leaf is left with a few NICs of one machine); a spine layer joins the
    leaves when there is more than one.
``superpod`` (scalable units, after NVIDIA's DGX SuperPOD reference architecture)
    Machines come in scalable units of ``su_nodes`` (32 in the DGX H100 SuperPOD); inside a
    unit NIC ``i`` of every machine goes to the unit's rail-``i`` leaf, and a spine layer joins
    the leaves of all units, so traffic changes rail and unit in the network.

A leaf that needs uplinks splits its ports between machines and spines so that down ports /
up ports is about ``oversubscription``; the bandwidth of its trunk to each spine is then set
so that (bandwidth down) / (bandwidth up) is exactly ``oversubscription``. Two tiers: every
leaf has one trunk to every spine (a folded Clos), so the spine count equals a full leaf's
number of uplink ports. When there are more leaves than a spine has ports, a third tier is
added (``tiers``): leaves are grouped in pods of ``switch_radix // 2``, each pod with its own
spines (half their ports down, half up, non-blocking), and spine ``j`` of every pod reaches
core group ``j``. A core group is one node standing for the ``switch_radix // 2`` core
switches a spine's uplinks reach; its trunks carry the spine's whole uplink bandwidth, so every
cut of the fabric has its true capacity with ``switch_radix // 2`` times fewer core nodes.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from topocoll.errors import TopologyError
from topocoll.topo import bandwidth as bw
from topocoll.topo.model import LinkKind, Node, NodeKind, Topology, TopologyBuilder
from topocoll.topo.presets import Placement, Preset, get_preset

#: Ports of one network switch. NVIDIA Quantum-2 QM9700/QM9790 InfiniBand switches, the
#: building block of DGX H100 SuperPODs, have 64 NDR (400 Gb/s) ports.
DEFAULT_SWITCH_RADIX = 64


class Network(str, enum.Enum):
    """How the machines' NICs are wired together."""

    RAIL = "rail"
    FAT_TREE = "fat-tree"
    SUPERPOD = "superpod"


#: Machines per scalable unit of a SuperPOD: 32 DGX H100 (NVIDIA DGX SuperPOD reference
#: architecture, DGX H100 edition: 32 nodes, 256 GPUs per SU).
SUPERPOD_SU_NODES = 32


@dataclass(frozen=True, slots=True)
class _Leaf:
    id: str
    nics: tuple[str, ...]


def make_cluster(
    preset: str | Preset,
    nodes: int,
    nics_per_node: int | None = None,
    network: str | Network = Network.RAIL,
    nic_bw_bytes_per_s: float | None = None,
    oversubscription: float = 1.0,
    *,
    switch_radix: int = DEFAULT_SWITCH_RADIX,
    tiers: int | None = None,
    su_nodes: int = SUPERPOD_SU_NODES,
    name: str | None = None,
) -> Topology:
    """``nodes`` machines of ``preset`` joined by a rail-optimized, fat-tree or SuperPOD network.

    Parameters
    ----------
    preset : str or Preset
        Name in :data:`topocoll.topo.presets.PRESETS` (e.g. ``"dgx-h100"``) or a preset.
    nodes : int
        Number of machines (>= 1). One machine gives the plain preset, without network.
    nics_per_node : int, optional
        Network adapters per machine (default: the system's own count); also the number of
        rails of a rail-optimized network.
    network : {"rail", "fat-tree", "superpod"}
        The fabric (see the module documentation).
    nic_bw_bytes_per_s : float, optional
        Bandwidth of each NIC port, one direction (default: the system's adapters).
    oversubscription : float
        Ratio of a leaf's bandwidth towards the machines to its bandwidth towards the spines
        (>= 1; 1.0 = non-blocking). Only leaves that need spines have uplinks.
    switch_radix : int
        Ports per network switch (default :data:`DEFAULT_SWITCH_RADIX`).
    tiers : {None, 2, 3}
        Switch tiers above the machines where spines are needed: 2 (leaves and spines; a spine
        then stands for a group of switches when the leaves outnumber its ports), 3 (pods and
        core groups), or None: 3 exactly when the leaves outnumber a spine's ports.
    su_nodes : int
        Machines per scalable unit of a ``superpod`` network.
    name : str, optional
        Name of the topology (default: describes the cluster).

    Returns
    -------
    Topology
        Node ids ``"n{k}.gpu{i}"`` etc., network switches ``"leaf{j}"``, ``"spine{j}"`` (two
        tiers) or ``"pod{p}.spine{j}"`` and ``"core{j}"`` (three).

    Raises
    ------
    TopologyError
        Unknown preset, or a count/ratio/bandwidth out of range.

    Examples
    --------
    >>> topo = make_cluster("dgx-h100", nodes=4)
    >>> len(topo.compute_nodes())
    32
    """
    spec = get_preset(preset) if isinstance(preset, str) else preset
    nodes = _positive_int("nodes", nodes)
    switch_radix = _positive_int("switch_radix", switch_radix)
    if switch_radix < 2:
        raise TopologyError(f"switch_radix must be >= 2, got {switch_radix}")
    network = _network(network)
    nics = spec.nics if nics_per_node is None else _positive_int("nics_per_node", nics_per_node)
    if not (isinstance(oversubscription, (int, float)) and not isinstance(oversubscription, bool)) or not (
        math.isfinite(oversubscription) and oversubscription >= 1
    ):
        raise TopologyError(
            f"oversubscription must be a finite number >= 1 (leaf bandwidth down / up; 1 is non-blocking), got {oversubscription!r}"
        )
    if tiers is not None and (isinstance(tiers, bool) or tiers not in (2, 3)):
        raise TopologyError(f"tiers must be 2, 3 or None (as many as the switches need), got {tiers!r}")
    su_nodes = _positive_int("su_nodes", su_nodes)
    nic_bw = spec.nic_bw_bytes_per_s if nic_bw_bytes_per_s is None else nic_bw_bytes_per_s
    if isinstance(nic_bw, bool) or not isinstance(nic_bw, (int, float)) or not (math.isfinite(nic_bw) and nic_bw > 0):
        raise TopologyError(f"nic_bw_bytes_per_s must be a finite number > 0, got {nic_bw!r}")

    if nodes == 1:
        single = spec.build(nics)
        return Topology(single.nodes, single.links, name=name or spec.name, notes=single.notes)

    builder = TopologyBuilder(name=name or f"{spec.name} x{nodes} ({network.value}, {nics} NICs/node)")
    machine_nics = [
        spec.layout(Placement(builder, prefix=f"n{k}.", host_id=f"n{k}", rank_base=k * spec.gpus), nics)
        for k in range(nodes)
    ]
    split_ports = max(1, min(switch_radix - 1, math.floor(switch_radix * oversubscription / (1 + oversubscription))))
    if network is Network.RAIL:
        groups = [(f"rail {i}", [machine_nics[k][i] for k in range(nodes)]) for i in range(nics)]
        single_leaf_ok = all(len(members) <= switch_radix for _, members in groups) and tiers != 3
        down_ports = switch_radix if single_leaf_ok else split_ports
    elif network is Network.SUPERPOD:
        units = range(0, nodes, su_nodes)
        groups = [
            (f"unit {u // su_nodes} rail {i}", [machine_nics[k][i] for k in range(u, min(u + su_nodes, nodes))])
            for u in units
            for i in range(nics)
        ]
        if su_nodes > split_ports:
            raise TopologyError(
                f"su_nodes {su_nodes} does not fit a leaf: {switch_radix}-port switches at oversubscription "
                f"{oversubscription:g} have {split_ports} ports towards the machines"
            )
        single_leaf_ok = False  # rails and units meet in the spines
        down_ports = su_nodes
    else:
        groups = [("", [nic for per_machine in machine_nics for nic in per_machine])]
        single_leaf_ok = len(groups[0][1]) <= switch_radix and tiers != 3
        down_ports = switch_radix if single_leaf_ok else split_ports

    per_leaf = down_ports
    if network is Network.FAT_TREE and nics <= down_ports:
        per_leaf = down_ports // nics * nics  # whole machines per leaf
    leaves: list[_Leaf] = []
    for label, members in groups:
        for start in range(0, len(members), per_leaf):
            leaf_id = f"leaf{len(leaves)}"
            leaves.append(_Leaf(leaf_id, tuple(members[start : start + per_leaf])))
            builder.add_node(Node(leaf_id, NodeKind.NET_SWITCH, name=f"{label} leaf".strip()))
    net_latency = bw.latency_s(LinkKind.NET)
    for leaf in leaves:
        for nic in leaf.nics:
            builder.add_link(nic, leaf.id, LinkKind.NET, nic_bw, net_latency)

    if len(leaves) > 1 and not single_leaf_ok:
        uplinks = switch_radix - split_ports
        three = tiers == 3 or (tiers is None and len(leaves) > switch_radix)
        if three:
            _pods_and_cores(builder, leaves, uplinks, switch_radix, nic_bw, oversubscription, net_latency)
        else:
            _spines(builder, leaves, uplinks, nic_bw, oversubscription, net_latency)
            if len(leaves) > switch_radix:
                builder.note(
                    f"{len(leaves)} leaves exceed the {switch_radix} ports of one spine switch: "
                    "each spine here stands for a group of switches"
                )
    return builder.build()


def _trunk_bw(leaf: _Leaf, nic_bw: float, oversubscription: float, uplinks: int) -> float:
    """Bandwidth of one of ``leaf``'s ``uplinks`` trunks: its machines' bandwidth / oversubscription."""
    return len(leaf.nics) * nic_bw / (oversubscription * uplinks)


def _spines(builder: TopologyBuilder, leaves: list[_Leaf], uplinks: int, nic_bw: float, oversubscription: float, latency_s: float) -> None:
    """Two tiers: ``uplinks`` spines, every leaf joined to every spine."""
    for s in range(uplinks):
        builder.add_node(Node(f"spine{s}", NodeKind.NET_SWITCH, name="spine"))
    for leaf in leaves:
        trunk_bw = _trunk_bw(leaf, nic_bw, oversubscription, uplinks)
        for s in range(uplinks):
            builder.add_link(leaf.id, f"spine{s}", LinkKind.NET, trunk_bw, latency_s)


def _pods_and_cores(
    builder: TopologyBuilder,
    leaves: list[_Leaf],
    uplinks: int,
    switch_radix: int,
    nic_bw: float,
    oversubscription: float,
    latency_s: float,
) -> None:
    """Three tiers: pods of ``switch_radix // 2`` leaves with ``uplinks`` spines each, and spine
    ``j`` of every pod joined to core group ``j`` by the spine's whole down bandwidth."""
    per_pod = max(1, switch_radix // 2)
    for j in range(uplinks):
        builder.add_node(Node(f"core{j}", NodeKind.NET_SWITCH, name=f"core group ({per_pod} switches)"))
    for p, start in enumerate(range(0, len(leaves), per_pod)):
        pod = leaves[start : start + per_pod]
        down_bw = [0.0] * uplinks
        for j in range(uplinks):
            builder.add_node(Node(f"pod{p}.spine{j}", NodeKind.NET_SWITCH, name=f"pod {p} spine"))
        for leaf in pod:
            trunk_bw = _trunk_bw(leaf, nic_bw, oversubscription, uplinks)
            for j in range(uplinks):
                builder.add_link(leaf.id, f"pod{p}.spine{j}", LinkKind.NET, trunk_bw, latency_s)
                down_bw[j] += trunk_bw
        for j in range(uplinks):
            builder.add_link(f"pod{p}.spine{j}", f"core{j}", LinkKind.NET, down_bw[j], latency_s)


def _positive_int(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TopologyError(f"{what} must be an integer >= 1, got {value!r}")
    return value


def _network(value: str | Network) -> Network:
    try:
        return Network(value)
    except ValueError:
        raise TopologyError(f"unknown network {value!r}; use one of: {', '.join(n.value for n in Network)}") from None
