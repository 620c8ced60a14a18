"""Import the matrix printed by ``nvidia-smi topo -m``.

The matrix says, for every pair of GPUs and NICs, what connects them:

======  ====================================================================
``X``   the device itself
``NV#`` a bonded set of ``#`` NVLinks
``PIX`` at most one PCIe bridge (the two share a PCIe switch)
``PXB`` several PCIe bridges, without the host bridge (switches under a common switch)
``PHB`` a PCIe host bridge (the CPU's root complex)
``NODE`` the interconnect between host bridges within one NUMA node
``SYS`` the SMP interconnect between NUMA nodes (QPI/UPI/Infinity Fabric); older
        drivers print ``SOC``
======  ====================================================================

From it :func:`parse_nvidia_smi` builds a plausible structure: one ``cpu`` node per NUMA node
(from the ``NUMA Affinity`` column, else from distinct ``CPU Affinity`` values, else from which
devices are not ``SYS`` apart), joined by ``smp`` links; a ``pcie_switch`` for every group of
devices that are ``PIX`` to each other, and a parent switch above groups that are ``PXB``;
everything else hangs off its CPU. ``NV#`` pairs become NVLinks, or, when every GPU pair shows
the same count and a GPU could not have that many links (more than
:data:`bandwidth.MAX_NVLINKS_PER_GPU`), links to one ``nvswitch`` node. The matrix tells no
PCIe speeds, NIC speeds, bus ids or ranks: the notes of the result say what was assumed. The
``GPU NUMA ID`` column (the GPU's own memory node on coherent systems) is read but not used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import networkx as nx

from topocoll.errors import FormatError
from topocoll.topo import bandwidth
from topocoll.topo.model import LinkKind, Node, NodeKind, Topology, TopologyBuilder

RELATIONS = ("X", "NV#", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC")
_CELL = re.compile(r"X|SYS|SOC|NODE|PHB|PXB|PIX|NV(\d+)")
_AFFINITY_HEADERS = (("CPU", "Affinity"), ("NUMA", "Affinity"), ("GPU", "NUMA", "ID"))
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_GPU_NAME = re.compile(r"^\s*GPU\s*(\d+)\s*:\s*(.+?)\s*(?:\(UUID:.*)?$")


@dataclass(slots=True)
class SmiMatrix:
    """The parsed text: device columns, relation cells and affinity columns per row."""

    devices: list[str]
    cells: dict[str, list[str]]
    affinity: dict[str, dict[str, str]]
    nic_names: dict[str, str] = field(default_factory=dict)
    gpu_names: dict[int, str] = field(default_factory=dict)


def _split_header(tokens: list[str]) -> tuple[list[str], list[str]]:
    """Device columns and affinity column names of a header line."""
    devices: list[str] = []
    extras: list[str] = []
    i = 0
    while i < len(tokens):
        for words in _AFFINITY_HEADERS:
            if tuple(tokens[i:i + len(words)]) == words:
                extras.append(" ".join(words))
                i += len(words)
                break
        else:
            if extras:
                extras.append(tokens[i])
            else:
                devices.append(tokens[i])
            i += 1
    return devices, extras


def read_matrix(text: str, source: str) -> SmiMatrix:
    """Parse the table part of ``nvidia-smi topo -m`` output (tolerant of damaged whitespace).

    Raises
    ------
    FormatError
        No header with ``GPU0``, a row with too few cells or an unknown relation; the
        message names the file and line.
    """
    devices: list[str] | None = None
    extras: list[str] = []
    cells: dict[str, list[str]] = {}
    affinity: dict[str, dict[str, str]] = {}
    nic_names: dict[str, str] = {}
    gpu_names: dict[int, str] = {}
    in_legend = False
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.rstrip(":") in ("Legend", "NIC Legend"):
            in_legend = True
            continue
        legend = _NIC_LEGEND.match(line)
        if legend:
            nic_names[legend.group(1)] = legend.group(2)
            continue
        named = _GPU_NAME.match(line)
        if named and devices is None:
            gpu_names[int(named.group(1))] = named.group(2)
            continue
        if in_legend:
            continue
        tokens = stripped.split()
        if devices is None:
            if "GPU0" in tokens and not any(_CELL.fullmatch(t) for t in tokens):
                devices, extras = _split_header(tokens)
            continue
        if tokens[0] not in devices:
            continue
        row = tokens[1:]
        if len(row) < len(devices):
            raise FormatError(
                f"{source}: line {number}: row {tokens[0]} has {len(row)} cells, expected {len(devices)} "
                f"(one per column: {' '.join(devices)})"
            )
        for column, cell in zip(devices, row):
            if not _CELL.fullmatch(cell):
                raise FormatError(
                    f"{source}: line {number}: unknown relation {cell!r} between {tokens[0]} and {column} "
                    f"(known: {', '.join(RELATIONS)})"
                )
        cells[tokens[0]] = row[: len(devices)]
        affinity[tokens[0]] = dict(zip(extras, row[len(devices):]))
    if devices is None:
        raise FormatError(f"{source}: no nvidia-smi topo -m header (a line naming GPU0, GPU1, ...) found")
    missing = [d for d in devices if d not in cells]
    if missing:
        raise FormatError(f"{source}: no matrix row for {', '.join(missing)}")
    return SmiMatrix(devices, cells, affinity, nic_names, gpu_names)


def _relation(matrix: SmiMatrix, a: str, b: str) -> str:
    return matrix.cells[a][matrix.devices.index(b)]


def _numa_of(matrix: SmiMatrix, notes: list[str]) -> dict[str, int | None]:
    """NUMA node of every device (see the module docstring for the order of evidence)."""
    rows = matrix.affinity
    numa: dict[str, int | None] = {}
    for device in matrix.devices:
        value = rows[device].get("NUMA Affinity", "")
        numa[device] = int(value) if value.isdigit() else None
    if not any(v is not None for v in numa.values()):
        groups: dict[str, int] = {}
        for device in matrix.devices:
            value = rows[device].get("CPU Affinity", "")
            if value and value != "N/A":
                numa[device] = groups.setdefault(value, len(groups))
        if groups:
            notes.append("NUMA nodes numbered by distinct CPU Affinity values (no NUMA Affinity column)")
    if not any(v is not None for v in numa.values()):
        near = nx.Graph()
        near.add_nodes_from(matrix.devices)
        for a in matrix.devices:
            for b in matrix.devices:
                if _relation(matrix, a, b) in ("PIX", "PXB", "PHB", "NODE"):
                    near.add_edge(a, b)
        components = sorted(nx.connected_components(near), key=lambda c: min(map(matrix.devices.index, c)))
        for index, component in enumerate(components):
            for device in component:
                numa[device] = index
        notes.append("no affinity columns: NUMA nodes guessed from which devices are not SYS apart")
    for device in matrix.devices:  # NIC rows carry no affinity: take a PCIe-near GPU's
        if numa[device] is None:
            for other in matrix.devices:
                if numa[other] is not None and _relation(matrix, device, other) in ("PIX", "PXB", "PHB", "NODE"):
                    numa[device] = numa[other]
                    break
    known = {v for v in numa.values() if v is not None}
    for device in matrix.devices:
        if numa[device] is None:
            numa[device] = min(known) if known else 0
            notes.append(f"{device}: NUMA node unknown, attached to NUMA node {numa[device]}")
    return numa


def _groups(members: list, related) -> list[list]:
    """Connected groups of ``members`` under the symmetric predicate ``related``."""
    graph = nx.Graph()
    graph.add_nodes_from(range(len(members)))
    for i in range(len(members)):
        for j in range(i + 1, len(members)):
            if related(members[i], members[j]):
                graph.add_edge(i, j)
    return [[members[i] for i in sorted(c)] for c in sorted(nx.connected_components(graph), key=min)]


def parse_nvidia_smi(text: str, source: str = "<nvidia-smi>") -> Topology:
    """Import ``nvidia-smi topo -m`` output.

    Parameters
    ----------
    text : str
        The output, as printed or as pasted in documents (a leading comment line, lost
        indentation, tabs, the legend, an ``NIC Legend`` and ``nvidia-smi -L`` lines are fine).
    source : str
        File name for errors; its base name names the topology.

    Returns
    -------
    Topology
        GPUs ``gpu<i>`` (from the ``GPU<i>`` columns), NICs ``nic<k>`` in column order, cpu,
        pcie_switch and nvswitch nodes as guessed; the notes list every guess.

    Raises
    ------
    FormatError
        The text is not such a matrix, or a row is damaged beyond repair.

    Examples
    --------
    >>> topo = parse_nvidia_smi("GPU0 GPU1 CPU Affinity\\nGPU0 X NV2 0-7\\nGPU1 NV2 X 0-7\\n", "t.txt")
    >>> topo.link("gpu0", "gpu1").count
    2
    """
    matrix = read_matrix(text, source)
    notes: list[str] = []
    gpus = [d for d in matrix.devices if re.fullmatch(r"GPU\d+", d)]
    nics = [d for d in matrix.devices if d not in gpus]
    ids = {d: f"gpu{d[3:]}" for d in gpus} | {d: f"nic{k}" for k, d in enumerate(nics)}
    numa = _numa_of(matrix, notes)
    builder = TopologyBuilder(os.path.basename(source))

    generation = bandwidth.nvlink_generation_for_name(text, default=0)
    if generation == 0:
        generation = bandwidth.NVLINK_DEFAULT_GENERATION
        notes.append(f"no GPU model in the text: NVLink generation {generation} assumed")
    else:
        notes.append(f"NVLink generation {generation} taken from the GPU model named in the text")
    pcie_bw = bandwidth.pcie_bw_bytes_per_s(bandwidth.PCIE_DEFAULT_GENERATION, bandwidth.PCIE_DEFAULT_WIDTH)
    pcie_lat = bandwidth.latency_s(LinkKind.PCIE)
    notes.append("PCIe generation and width are not in nvidia-smi output: Gen3 x16 assumed (NCCL's fallback)")

    add_sockets(builder, numa.values(), notes)
    for device in matrix.devices:
        kind = NodeKind.GPU if device in gpus else NodeKind.NIC
        name = matrix.gpu_names.get(int(device[3:])) if kind is NodeKind.GPU else matrix.nic_names.get(device, device)
        index = int(device[len("GPU"):]) if kind is NodeKind.GPU else None
        builder.add_node(Node(ids[device], kind, numa=numa[device], name=name, index=index))
    if nics:
        notes.append("NIC speeds are not in nvidia-smi output: no network links added")

    _add_pcie_tree(matrix, numa, ids, builder, pcie_bw, pcie_lat, notes)
    _add_nvlinks(matrix, gpus, ids, builder, generation, notes)
    for note in notes:
        builder.note(note)
    return builder.build(source)


def _add_pcie_tree(matrix, numa, ids, builder, pcie_bw, pcie_lat, notes) -> None:
    switches = 0
    hidden_by_nvlink = False
    for value in sorted(set(numa.values())):
        members = [d for d in matrix.devices if numa[d] == value]
        leaves = _groups(members, lambda a, b: _relation(matrix, a, b) == "PIX")
        units = _groups(leaves, lambda g, h: any(_relation(matrix, a, b) == "PXB" for a in g for b in h))
        for unit in units:
            upstream = f"cpu{value}"
            if len(unit) > 1:
                upstream = f"pcie_switch{switches}"
                switches += 1
                builder.add_node(Node(upstream, NodeKind.PCIE_SWITCH, numa=value))
                builder.add_link(upstream, f"cpu{value}", LinkKind.PCIE, pcie_bw, pcie_lat)
            for leaf in unit:
                parent = upstream
                if len(leaf) > 1:
                    parent = f"pcie_switch{switches}"
                    switches += 1
                    builder.add_node(Node(parent, NodeKind.PCIE_SWITCH, numa=value))
                    builder.add_link(parent, upstream, LinkKind.PCIE, pcie_bw, pcie_lat)
                for device in leaf:
                    builder.add_link(ids[device], parent, LinkKind.PCIE, pcie_bw, pcie_lat)
        for a in members:
            for b in members:
                if a != b and _relation(matrix, a, b).startswith("NV"):
                    hidden_by_nvlink = True
    if switches:
        notes.append("PCIe switches inferred from PIX (same switch) and PXB (switches under a common switch)")
    if hidden_by_nvlink:
        notes.append(
            "nvidia-smi shows NV# instead of the PCIe relation for NVLink pairs: PCIe switches they share may be missing"
        )


def _add_nvlinks(matrix, gpus, ids, builder, generation, notes) -> None:
    per_link = bandwidth.nvlink_bw_bytes_per_s(generation)
    latency = bandwidth.latency_s(LinkKind.NVLINK)
    counts: dict[tuple[str, str], int] = {}
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            forward, backward = _relation(matrix, a, b), _relation(matrix, b, a)
            if forward.startswith("NV") or backward.startswith("NV"):
                count_ab = int(forward[2:]) if forward.startswith("NV") else 0
                count_ba = int(backward[2:]) if backward.startswith("NV") else 0
                if count_ab != count_ba:
                    notes.append(f"{a}/{b}: matrix not symmetric ({forward} vs {backward}): the smaller count kept")
                count = min(count_ab, count_ba) or max(count_ab, count_ba)
                counts[(a, b)] = count
    pairs = len(gpus) * (len(gpus) - 1) // 2
    values = set(counts.values())
    if len(gpus) > 2 and len(counts) == pairs and len(values) == 1:
        (count,) = values
        if count * (len(gpus) - 1) > bandwidth.MAX_NVLINKS_PER_GPU:
            builder.add_node(Node("nvswitch0", NodeKind.NVSWITCH))
            for gpu in gpus:
                builder.add_link(ids[gpu], "nvswitch0", LinkKind.NVLINK, count * per_link, latency, count)
            notes.append(
                f"every GPU pair shows NV{count}, more links than a GPU has: modeled as {count} NVLinks from each "
                "GPU to one nvswitch node"
            )
            return
    for (a, b), count in counts.items():
        builder.add_link(ids[a], ids[b], LinkKind.NVLINK, count * per_link, latency, count)


def add_sockets(builder: TopologyBuilder, numa_nodes: Iterable[int], notes: list[str]) -> list[int]:
    """Add one ``cpu<numa>`` node per NUMA node, all pairs joined by SMP links.

    Text formats do not name the CPU model, so the inter-socket bandwidth is the default one
    of :mod:`topocoll.topo.bandwidth`, and a note says so. Returns the sorted NUMA ids.
    """
    cpus = sorted(set(numa_nodes))
    for value in cpus:
        builder.add_node(Node(f"cpu{value}", NodeKind.CPU, numa=value))
    smp_bw = bandwidth.SMP_BW_BYTES_PER_S[bandwidth.SMP_DEFAULT_KEY]
    builder.add_full_mesh([f"cpu{value}" for value in cpus], LinkKind.SMP, smp_bw, bandwidth.latency_s(LinkKind.SMP))
    if len(cpus) > 1:
        notes.append(f"CPU model unknown: inter-socket bandwidth assumed {smp_bw / bandwidth.GB:g} GB/s")
    return cpus
