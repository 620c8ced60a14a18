"""One cluster from the graphs of its machines, with every rank placed.

:func:`assemble_cluster` takes the graph of each machine (discovered there, or imported) and
where every rank runs (:class:`RankPlacement`), and returns the cluster the ranks see:

- A GPU rank runs on the GPU node with its bus id; a CPU rank becomes a ``host`` node
  ``proc<rank>`` joined by a shared-memory link to the CPU of its NUMA node. Compute nodes carry
  the ranks of the placement and no others.
- With one machine its node ids are kept (so the cluster of one machine is that machine's
  graph, ranked). With several, machine ``k``'s ids get the prefix ``n<k>.``, as in
  :func:`topocoll.topo.cluster.make_cluster`, and the machines are joined by a network:

  ``rail`` (the model when every machine has the same NICs, in the same order and speeds)
      NIC ``i`` of every machine goes to the switch of rail ``i``; rails meet only inside the
      machines, as in NVIDIA's rail-optimized reference designs.
  ``single-switch`` (the model otherwise)
      every NIC goes to one switch.

  The ``net<i>`` placeholders of a machine graph (where an imported NCCL file says a port is
  cabled, without saying to what) are replaced by these switches. A machine without NICs (a CPU
  host whose interfaces are virtual) reaches the network through its first CPU at
  :data:`SOCKET_DEFAULT_BW_BYTES_PER_S`, noted as assumed.

A cluster description file (JSON) overrides the model::

    {"format": "topocoll.cluster/1", "network": "rail", "nic_bw_bytes_per_s": 50e9}

``network`` is ``"rail"`` or ``"single-switch"``; ``nic_bw_bytes_per_s`` (optional) replaces
the speed of every NIC port, one direction (for NICs whose speed the machines do not report,
or to model a slower fabric). Unknown keys are errors, so a misspelt key is not ignored.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from topocoll import fileio
from topocoll.errors import FormatError, TopologyError
from topocoll.topo import bandwidth as bw
from topocoll.topo.model import LinkKind, Node, NodeKind, Topology, TopologyBuilder, natural_key

__all__ = [
    "CLUSTER_FORMAT",
    "ClusterDescription",
    "NetworkModel",
    "RankPlacement",
    "SOCKET_DEFAULT_BW_BYTES_PER_S",
    "assemble_cluster",
    "load_cluster_description",
]

CLUSTER_FORMAT = "topocoll.cluster/1"
"""``format`` of a cluster description file."""

SOCKET_DEFAULT_BW_BYTES_PER_S = bw.net_bw_bytes_per_s(10e9)
"""A machine without a NIC of its own reaches the others at 10 Gb/s: the speed NCCL's socket
transport assumes for an interface whose ``/sys/class/net/<if>/speed`` cannot be read."""

MAX_CLUSTER_FILE_BYTES = 1 << 20
"""Largest cluster description read (it is a few lines)."""


class NetworkModel(str, enum.Enum):
    """How the machines' NICs are joined."""

    RAIL = "rail"
    SINGLE_SWITCH = "single-switch"


@dataclass(frozen=True, slots=True)
class RankPlacement:
    """Where one rank runs.

    Parameters
    ----------
    rank : int
        The rank (the number its compute node carries).
    host : int
        Index of its machine in the ``hosts`` given to :func:`assemble_cluster`.
    busid : str, optional
        PCI bus id of its GPU; None for a CPU rank.
    numa : int, optional
        NUMA node of a CPU rank (None: the machine's first).
    """

    rank: int
    host: int
    busid: str | None = None
    numa: int | None = None


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    """What a cluster description file says (see the module documentation)."""

    network: NetworkModel | None = None
    nic_bw_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        value = self.nic_bw_bytes_per_s
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0):
            raise TopologyError(f"nic_bw_bytes_per_s must be a number > 0, got {value!r}")


def load_cluster_description(path: str | Path) -> ClusterDescription:
    """Read a cluster description file.

    Raises
    ------
    FormatError
        The file is not JSON, has another format, an unknown key or a bad value (the message
        names the file and the key).
    OSError
        The file cannot be read.
    """
    text = fileio.read_input(path, MAX_CLUSTER_FILE_BYTES, "cluster description")
    data = fileio.loads_json(text, str(path))
    if not isinstance(data, dict):
        raise FormatError(f"{path}: a cluster description is a JSON object, got {type(data).__name__}")
    if data.get("format") != CLUSTER_FORMAT:
        raise FormatError(f"{path}: format must be {CLUSTER_FORMAT!r}, got {data.get('format')!r}")
    unknown = sorted(set(data) - {"format", "network", "nic_bw_bytes_per_s"})
    if unknown:
        raise FormatError(f"{path}: unknown key {unknown[0]!r} (known: network, nic_bw_bytes_per_s)")
    network = data.get("network")
    try:
        model = NetworkModel(network) if network is not None else None
    except ValueError:
        raise FormatError(f"{path}: network must be 'rail' or 'single-switch', got {network!r}") from None
    try:
        return ClusterDescription(model, data.get("nic_bw_bytes_per_s"))
    except TopologyError as exc:
        raise FormatError(f"{path}: {exc}") from None


@dataclass(frozen=True, slots=True)
class _Port:
    nic: str  # node id in the cluster
    bw_bytes_per_s: float | None


def _place_ranks(hosts: Sequence[Topology], ranks: Sequence[RankPlacement]) -> tuple[dict[tuple[int, str], int], list[RankPlacement]]:
    """(machine, GPU node) -> rank for the GPU ranks, and the CPU ranks."""
    on_gpu: dict[tuple[int, str], int] = {}
    cpu_ranks = []
    seen = set()
    for placement in ranks:
        if placement.rank in seen:
            raise TopologyError(f"rank {placement.rank} is placed twice")
        seen.add(placement.rank)
        if not 0 <= placement.host < len(hosts):
            raise TopologyError(f"rank {placement.rank}: machine {placement.host} is not among the {len(hosts)} given")
        host = hosts[placement.host]
        label = host.name or f"machine {placement.host}"
        if placement.busid is None:
            cpu_ranks.append(placement)
            continue
        gpus = {n.busid: n.id for n in host.nodes_of(NodeKind.GPU) if n.busid}
        node = gpus.get(placement.busid)
        if node is None:
            shown = ", ".join(sorted(gpus)[:8]) or "none"
            raise TopologyError(f"rank {placement.rank}: no GPU at {placement.busid} on {label} (it has {shown})")
        if (placement.host, node) in on_gpu:
            raise TopologyError(
                f"ranks {on_gpu[(placement.host, node)]} and {placement.rank} would both run on {node} "
                f"({placement.busid}) of {label}; give each rank its own GPU"
            )
        on_gpu[(placement.host, node)] = placement.rank
    return on_gpu, cpu_ranks


def _cpu_of(host: Topology, placement: RankPlacement) -> str:
    cpus = sorted(host.nodes_of(NodeKind.CPU), key=lambda n: (n.numa if n.numa is not None else -1, natural_key(n.id)))
    if not cpus:
        raise TopologyError(f"rank {placement.rank}: {host.name or 'its machine'} has no CPU node to run a process on")
    if placement.numa is None:
        return cpus[0].id
    for cpu in cpus:
        if cpu.numa == placement.numa:
            return cpu.id
    known = ", ".join(str(c.numa) for c in cpus)
    raise TopologyError(f"rank {placement.rank}: NUMA node {placement.numa} is not on {host.name or 'its machine'} (it has {known})")


def assemble_cluster(
    hosts: Sequence[Topology],
    *,
    ranks: Sequence[RankPlacement],
    network: ClusterDescription | None = None,
    name: str | None = None,
) -> Topology:
    """The cluster of ``hosts`` with ``ranks`` placed (see the module documentation).

    Parameters
    ----------
    hosts : sequence of Topology
        One graph per machine.
    ranks : sequence of RankPlacement
        Where every rank runs.
    network : ClusterDescription, optional
        Overrides the network model.
    name : str, optional
        Name of the result (default: the machine's name, or ``"cluster of <n> machines"``).

    Raises
    ------
    TopologyError
        A GPU rank whose bus id is not on its machine, two ranks on one GPU, a NUMA node the
        machine lacks, or no machine.
    """
    if not hosts:
        raise TopologyError("a cluster needs at least one machine")
    on_gpu, cpu_ranks = _place_ranks(hosts, ranks)
    several = len(hosts) > 1
    builder = TopologyBuilder(name=name or (f"cluster of {len(hosts)} machines" if several else hosts[0].name))
    ports: list[list[_Port]] = []
    override = network.nic_bw_bytes_per_s if network else None
    for k, host in enumerate(hosts):
        prefix = f"n{k}." if several else ""
        placeholders = {n.id for n in host.nodes_of(NodeKind.NET_SWITCH)} if several else set()
        for note in host.notes:
            builder.note(f"{prefix}{note}" if several else note)
        for node in host.nodes:
            if node.id in placeholders:
                continue
            rank = on_gpu.get((k, node.id)) if node.kind is NodeKind.GPU else None
            builder.add_node(dataclasses.replace(node, id=prefix + node.id, rank=rank))
        speeds: dict[str, float] = {}
        for link in host.links:
            if link.dst in placeholders:
                speeds[link.src] = link.bw_bytes_per_s
            if link.src in placeholders or link.dst in placeholders:
                continue
            builder.add_link(prefix + link.src, prefix + link.dst, link.kind, link.bw_bytes_per_s, link.latency_s, count=link.count, duplex=False)
        nics = sorted((n for n in host.nodes_of(NodeKind.NIC)), key=lambda n: natural_key(n.id))
        ports.append([_Port(prefix + n.id, override or speeds.get(n.id)) for n in nics])
        for placement in (p for p in cpu_ranks if p.host == k):
            proc = f"{prefix}proc{placement.rank}"
            cpu = _cpu_of(host, placement)
            numa = host.node(cpu).numa
            builder.add_node(Node(proc, NodeKind.HOST, placement.rank, host.node(cpu).host_id, numa, name=f"process of rank {placement.rank}"))
            # NCCL's figure for paths through host memory (as the flat topology uses)
            builder.add_link(proc, prefix + cpu, LinkKind.SHM, bw.SHM_BW_BYTES_PER_S, bw.latency_s(LinkKind.SHM))
    if several:
        _join(builder, hosts, ports, network.network if network else None, override)
    return builder.build()


def _join(
    builder: TopologyBuilder,
    hosts: Sequence[Topology],
    ports: list[list[_Port]],
    model: NetworkModel | None,
    override: float | None,
) -> None:
    """Wire the machines' NICs to network switches (``override``: the speed of every port)."""
    latency = bw.latency_s(LinkKind.NET)
    for k, host in enumerate(hosts):
        if ports[k]:
            continue
        cpus = sorted(host.nodes_of(NodeKind.CPU), key=lambda n: natural_key(n.id))
        if not cpus:
            raise TopologyError(f"{host.name or f'machine {k}'} has neither a NIC nor a CPU to reach the network through")
        nic = f"n{k}.socket"
        builder.add_node(Node(nic, NodeKind.NIC, host_id=cpus[0].host_id, numa=cpus[0].numa, name="socket interface"))
        builder.add_link(nic, f"n{k}.{cpus[0].id}", LinkKind.PCIE, bw.pcie_bw_bytes_per_s(bw.PCIE_DEFAULT_GENERATION, bw.PCIE_DEFAULT_WIDTH), bw.latency_s(LinkKind.PCIE))
        ports[k] = [_Port(nic, override or SOCKET_DEFAULT_BW_BYTES_PER_S)]
        if override is None:
            builder.note(
                f"n{k} has no NIC of its own: it reaches the network through a socket interface assumed at "
                f"{SOCKET_DEFAULT_BW_BYTES_PER_S * 8 / 1e9:g} Gb/s"
            )
    unknown = sorted({p.nic for host_ports in ports for p in host_ports if p.bw_bytes_per_s is None})
    if unknown:
        builder.note(f"port speed unknown for {', '.join(unknown[:4])}{' ...' if len(unknown) > 4 else ''}: assumed 10 Gb/s (socket default)")
    shapes = {tuple(p.bw_bytes_per_s for p in host_ports) for host_ports in ports}
    if model is None:
        model = NetworkModel.RAIL if len(shapes) == 1 else NetworkModel.SINGLE_SWITCH
        builder.note(
            f"network not described: modelled as {model.value}"
            + (" (every machine has the same NICs)" if model is NetworkModel.RAIL else " (the machines' NICs differ)")
        )
    if model is NetworkModel.RAIL and len({len(p) for p in ports}) != 1:
        raise TopologyError("a rail network needs the same number of NICs on every machine; use network 'single-switch'")
    switches: dict[str, str] = {}
    for host_ports in ports:
        for i, port in enumerate(host_ports):
            switch = f"rail{i}" if model is NetworkModel.RAIL else "switch"
            if switch not in switches:
                switches[switch] = switch
                builder.add_node(Node(switch, NodeKind.NET_SWITCH, name=f"rail {i} switch" if model is NetworkModel.RAIL else "network switch"))
            speed = port.bw_bytes_per_s if port.bw_bytes_per_s is not None else SOCKET_DEFAULT_BW_BYTES_PER_S
            builder.add_link(port.nic, switch, LinkKind.NET, speed, latency)

