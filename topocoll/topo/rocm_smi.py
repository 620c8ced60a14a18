"""Import the output of ``rocm-smi --showtopo`` (AMD Instinct GPUs).

The output holds up to four sections: ``Weight between two GPUs``, ``Hops between two GPUs``,
``Link Type between two GPUs`` (``XGMI`` or ``PCIE`` per pair) and ``Numa Nodes``
(``GPU[i] : (Topology) Numa Node: n``). :func:`parse_rocm_smi` makes a ``gpu<i>`` node per
GPU, a ``cpu<n>`` node per NUMA node (joined by ``smp`` links), a PCIe link from every GPU to
its NUMA node's CPU, and an ``xgmi`` link for every pair whose link type is ``XGMI`` and whose
hop count (when given) is 1. xGMI bandwidth comes from :func:`bandwidth.xgmi_bw_bytes_per_s`
for the product family named in the text, else the default family (with a note). The weight
matrix (a relative cost) is read but not needed.
"""

from __future__ import annotations

import os
import re

from topocoll.errors import FormatError
from topocoll.topo import bandwidth
from topocoll.topo.model import LinkKind, Node, NodeKind, Topology, TopologyBuilder
from topocoll.topo.nvidia_smi import add_sockets

_SECTIONS = {"weight": "Weight between", "hops": "Hops between", "type": "Link Type between", "numa": "Numa Nodes"}
_NUMA_LINE = re.compile(r"^\s*GPU\[(\d+)\]\s*:\s*\(Topology\)\s*Numa Node\s*:\s*(-?\d+)", re.IGNORECASE)


def _read_sections(text: str, source: str) -> tuple[dict[str, dict[str, list[str]]], list[str], dict[int, int]]:
    """Matrices by section, the GPU column names, and the NUMA node of each GPU."""
    matrices: dict[str, dict[str, list[str]]] = {}
    columns: list[str] = []
    numa: dict[int, int] = {}
    section = None
    for number, line in enumerate(text.splitlines(), start=1):
        for key, title in _SECTIONS.items():
            if title.lower() in line.lower():
                section = key
                break
        else:
            match = _NUMA_LINE.match(line)
            if match:
                numa[int(match.group(1))] = int(match.group(2))
                continue
            tokens = line.split()
            if section in (None, "numa") or not tokens:
                continue
            if all(re.fullmatch(r"GPU\d+", t) for t in tokens):
                columns = tokens
                continue
            if re.fullmatch(r"GPU\d+", tokens[0]) and columns:
                if len(tokens) - 1 != len(columns):
                    raise FormatError(
                        f"{source}: line {number}: row {tokens[0]} has {len(tokens) - 1} values, expected {len(columns)}"
                    )
                matrices.setdefault(section, {})[tokens[0]] = tokens[1:]
    return matrices, columns, numa


def parse_rocm_smi(text: str, source: str = "<rocm-smi>") -> Topology:
    """Import ``rocm-smi --showtopo`` output.

    Parameters
    ----------
    text : str
        The output (banner lines, warnings and a leading comment line are ignored).
    source : str
        File name for errors; its base name names the topology.

    Returns
    -------
    Topology

    Raises
    ------
    FormatError
        No link-type matrix, damaged rows, or an unknown link type.
    """
    matrices, columns, numa = _read_sections(text, source)
    types = matrices.get("type")
    if not types:
        raise FormatError(f"{source}: no 'Link Type between two GPUs' matrix found (rocm-smi --showtopo output)")
    gpus = [c for c in columns if c in types]
    hops = matrices.get("hops", {})
    notes: list[str] = []
    builder = TopologyBuilder(os.path.basename(source))
    family = bandwidth.xgmi_family_for_name(text)
    if family is None:
        family = bandwidth.XGMI_DEFAULT_FAMILY
        notes.append(f"no AMD Instinct model in the text: xGMI links of the {family} family assumed")
    else:
        notes.append(f"xGMI bandwidth of the {family} family, named in the text")
    xgmi_bw = bandwidth.xgmi_bw_bytes_per_s(family)

    numa_of = {}
    for gpu in gpus:
        value = numa.get(int(gpu[3:]), -1)
        if value < 0:
            notes.append(f"{gpu}: NUMA node unknown, attached to NUMA node 0")
            value = 0
        numa_of[gpu] = value
    add_sockets(builder, numa_of.values() or [0], notes)
    pcie_bw = bandwidth.pcie_bw_bytes_per_s(bandwidth.PCIE_DEFAULT_GENERATION, bandwidth.PCIE_DEFAULT_WIDTH)
    notes.append("PCIe generation and width are not in rocm-smi --showtopo output: Gen3 x16 assumed")
    for gpu in gpus:
        node_id = f"gpu{gpu[3:]}"
        builder.add_node(Node(node_id, NodeKind.GPU, numa=numa_of[gpu], index=int(gpu[len("GPU"):])))
        builder.add_link(node_id, f"cpu{numa_of[gpu]}", LinkKind.PCIE, pcie_bw, bandwidth.latency_s(LinkKind.PCIE))

    for i, a in enumerate(gpus):
        for j, b in enumerate(gpus):
            if j <= i:
                continue
            kind = types[a][columns.index(b)].upper()
            if kind in ("0", "N/A", "PCIE"):
                continue
            if kind != "XGMI":
                raise FormatError(f"{source}: unknown link type {kind!r} between {a} and {b} (known: XGMI, PCIE)")
            hop = hops.get(a, [None] * len(columns))[columns.index(b)]
            if hop is not None and hop != "1":
                notes.append(f"{a}/{b}: XGMI over {hop} hops, so no direct link")
                continue
            builder.add_link(f"gpu{a[3:]}", f"gpu{b[3:]}", LinkKind.XGMI, xgmi_bw, bandwidth.latency_s(LinkKind.XGMI))
    for note in notes:
        builder.note(note)
    return builder.build(source)
