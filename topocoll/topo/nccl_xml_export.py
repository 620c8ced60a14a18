"""NCCL topology XML: export. :func:`to_nccl_xml` writes a file NCCL can load. Bandwidths are written back as
``link_speed``/``link_width`` and ``speed``; where those cannot express a figure exactly (and
for NVLinks, whose per-link figure depends on the GPU model) an extra
``topocoll_bw_bytes_per_s`` attribute holds it, and ``topocoll_latency_s`` a latency that is
not the default of its link kind; NCCL ignores attributes it does not know. A GPU's ``dev``
(its NVML index), ``sm`` and ``gdr`` and a port's ``gdr`` and ``speed`` are written where the
topology knows them; what it does not know is left out, and NCCL fills that in for the GPUs and
NICs it finds (a ``dev`` guessed from bus order would be wrong on a machine some of whose GPUs
the file leaves out). The topology's name and notes
travel as ``<!-- topocoll ... -->`` comments. So importing an exported file gives back the same
topology: the same canonical JSON text, name and notes included. NCCL XML describes one
machine: several hosts, host ranks, and xGMI, C2C or NVSwitch-to-NVSwitch links are refused.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from xml.etree import ElementTree

from topocoll.errors import FormatError
from topocoll.topo import bandwidth
from topocoll.topo.model import Link, LinkKind, Node, NodeKind, Topology, natural_key
from topocoll.topo.nccl_xml import (
    BRIDGE_CLASS,
    BW_ATTR,
    GPU_CLASS,
    HIDDEN_NVSWITCH_BUSID,
    LATENCY_ATTR,
    MARK,
    NAME_PREFIX,
    NIC_CLASS,
    NOTE_PREFIX,
    NVSWITCH_CLASS,
    encode_comment,
)

__all__ = ["to_nccl_xml"]

log = logging.getLogger(__name__)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))


def _set_latency(element: ElementTree.Element, link: Link) -> None:
    if link.latency_s != bandwidth.latency_s(link.kind):
        element.set(LATENCY_ATTR, repr(float(link.latency_s)))


def _set_pcie(element: ElementTree.Element, link: Link | None) -> None:
    """Write ``link_speed``/``link_width`` for the link to the parent (exact figures when needed)."""
    bw = link.bw_bytes_per_s if link is not None else None
    pair = bandwidth.pcie_link_for_bw(bw) if bw is not None else None
    generation, width = pair or (bandwidth.PCIE_DEFAULT_GENERATION, bandwidth.PCIE_DEFAULT_WIDTH)
    element.set("link_speed", f"{bandwidth.PCIE_RATE_GT_PER_S[generation]:.1f} GT/s PCIe")
    element.set("link_width", str(width))
    if pair is None and bw is not None:
        element.set(BW_ATTR, repr(float(bw)))
    if link is not None:
        _set_latency(element, link)


#: The names NCCL XML writes as ``<cpu vendor=...>`` (``/proc/cpuinfo`` vendor ids).
_CPU_VENDORS = ("GenuineIntel", "AuthenticAMD", "CentaurHauls", "Shanghai")
_CPU_NAME = re.compile(
    r"(?:(?P<vendor>%s)\b ?)?(?P<arch>x86_64|arm64|aarch64|ppc64le|ppc64)?(?: ?family (?P<familyid>\d+))?"
    r"(?: ?model (?P<modelid>\d+))?" % "|".join(_CPU_VENDORS)
)


def _cpu_attrs(node: Node, index: int) -> dict[str, str]:
    """``<cpu>`` attributes: ``numaid``, and those recovered from a name made by :func:`_cpu_name`."""
    attrs = {"numaid": str(node.numa if node.numa is not None else index)}
    match = _CPU_NAME.fullmatch(node.name or "")
    if match:
        attrs.update((key, value) for key, value in match.groupdict().items() if value)
        attrs = {key: attrs[key] for key in ("numaid", "arch", "vendor", "familyid", "modelid") if key in attrs}
    return attrs


def _set_smp(element: ElementTree.Element, topology: Topology, cpu_id: str) -> None:
    """Write the CPU's inter-socket figure when its vendor and model would not give it back."""
    figures = [
        topology.capacity(cpu_id, other)
        for other in topology.graph.successors(cpu_id)
        if topology.link(cpu_id, other).kind is LinkKind.SMP
    ]
    if not figures:
        return
    attrs = element.attrib
    implied = bandwidth.smp_bw_for_cpu(
        attrs.get("vendor"),
        int(attrs["familyid"]) if "familyid" in attrs else None,
        int(attrs["modelid"]) if "modelid" in attrs else None,
        attrs.get("arch"),
    )
    if implied != max(figures):
        element.set(BW_ATTR, repr(float(max(figures))))


def _check_exportable(topology: Topology) -> None:
    hosts = {n.host_id for n in topology.nodes if n.host_id is not None}
    if len(hosts) > 1:
        raise FormatError(
            f"topology {topology.name or '(unnamed)'} spans {len(hosts)} hosts; NCCL XML describes one machine"
        )
    for node in topology.nodes:
        if node.kind is NodeKind.HOST:
            raise FormatError(f"node {node.id} is a host (CPU rank) node, which NCCL XML cannot describe")
    allowed = {
        LinkKind.PCIE: None,
        LinkKind.SMP: {(NodeKind.CPU, NodeKind.CPU)},
        LinkKind.NVLINK: {(NodeKind.GPU, NodeKind.GPU), (NodeKind.GPU, NodeKind.NVSWITCH), (NodeKind.NVSWITCH, NodeKind.GPU)},
        LinkKind.NET: {(NodeKind.NIC, NodeKind.NET_SWITCH), (NodeKind.NET_SWITCH, NodeKind.NIC)},
    }
    for link in topology.links:
        kinds = (topology.node(link.src).kind, topology.node(link.dst).kind)
        if link.kind not in allowed:
            raise FormatError(f"link {link.src}->{link.dst} is {link.kind.value}, which NCCL XML cannot describe")
        pairs = allowed[link.kind]
        if pairs is not None and kinds not in pairs:
            raise FormatError(
                f"link {link.src}->{link.dst}: NCCL XML cannot describe {link.kind.value} links between "
                f"{kinds[0].value} and {kinds[1].value} nodes"
            )
        if link.kind is LinkKind.PCIE and NodeKind.NET_SWITCH in kinds:
            raise FormatError(f"link {link.src}->{link.dst}: PCIe to a net_switch cannot be written to NCCL XML")


def _pcie_tree(topology: Topology, roots: list[str]) -> dict[str, str]:
    """Parent of every node reachable from the CPUs over PCIe links (breadth first)."""
    parent: dict[str, str] = {}
    placed = set(roots)
    queue = deque(roots)
    while queue:
        here = queue.popleft()
        for other in sorted(topology.graph.successors(here), key=natural_key):
            if topology.link(here, other).kind is not LinkKind.PCIE:
                continue
            if other in placed:
                if parent.get(here) != other and parent.get(other) != here:
                    raise FormatError(
                        f"PCIe links {here}-{other} close a loop; NCCL XML needs the PCIe links to form a tree"
                    )
                continue
            placed.add(other)
            parent[other] = here
            queue.append(other)
    return parent


def to_nccl_xml(topology: Topology) -> str:
    """Write ``topology`` as NCCL topology XML (loadable with ``NCCL_TOPO_FILE``).

    Parameters
    ----------
    topology : Topology
        One machine: cpu, pcie_switch, gpu, nic, nvswitch nodes; pcie, nvlink, smp and net
        links. A topology imported from NCCL XML exports to a file that imports back to the
        same topology (same JSON text).

    Returns
    -------
    str
        The XML text.

    Raises
    ------
    FormatError
        The topology holds what NCCL XML cannot say (several hosts, host ranks, xGMI/C2C/shm
        links, PCIe links that do not form a tree).

    See Also
    --------
    parse_nccl_xml : topocoll.topo.nccl_xml.parse_nccl_xml, the import it round-trips with.
    """
    _check_exportable(topology)
    cpus = [n.id for n in topology.nodes_of(NodeKind.CPU)]
    system = ElementTree.Element("system", version="1")
    synthetic_cpu = None
    if not cpus:
        synthetic_cpu = ElementTree.SubElement(system, "cpu", numaid="0")
    parent = _pcie_tree(topology, cpus)
    children: dict[str, list[str]] = {}
    for child, up in parent.items():
        children.setdefault(up, []).append(child)
    orphans = [
        n.id
        for n in topology.nodes
        if n.kind in (NodeKind.GPU, NodeKind.NIC, NodeKind.PCIE_SWITCH) and n.id not in parent
    ]
    if orphans:
        log.warning("no PCIe path to a CPU for %s; written under the first CPU", ", ".join(orphans))
    nic_order = {
        n.id: i
        for i, n in enumerate(sorted(topology.nodes_of(NodeKind.NIC), key=lambda n: natural_key(n.id)))
    }
    writer = _Writer(topology, children, parent, nic_order)
    for index, cpu_id in enumerate(cpus):
        element = ElementTree.SubElement(system, "cpu", _cpu_attrs(topology.node(cpu_id), index))
        _set_smp(element, topology, cpu_id)
        writer.children_of(element, cpu_id)
        if cpu_id == cpus[0]:
            for orphan in orphans:
                writer.device(element, orphan)
    if synthetic_cpu is not None:
        for orphan in orphans:
            writer.device(synthetic_cpu, orphan)
    ElementTree.indent(system, space="  ")
    head = [f"<!-- {MARK} -->"]
    if topology.name:
        head.append(f"<!-- {NAME_PREFIX}{encode_comment(topology.name)} -->")
    head += [f"<!-- {NOTE_PREFIX}{encode_comment(note)} -->" for note in topology.notes]
    body = ElementTree.tostring(system, encoding="unicode").replace(" />", "/>")  # NCCL's own spelling
    return "\n".join(head + [body]) + "\n"


class _Writer:
    """Writes nodes as ``<pci>`` elements under their PCIe parent."""

    def __init__(self, topology: Topology, children, parent, nic_order) -> None:
        self.topology = topology
        self.children = children
        self.parent = parent
        self.nic_order = nic_order
        # Nodes without a bus id get made-up ones in domain fffe, increasing with the node id,
        # so that the importer (which orders nodes by bus id) gives them back their ids.
        kinds = (NodeKind.GPU, NodeKind.NIC, NodeKind.PCIE_SWITCH, NodeKind.NVSWITCH)
        anonymous = [n.id for n in topology.nodes if n.kind in kinds and not n.busid]
        self.synthetic = {
            node_id: f"fffe:{count // 256:02x}:{count % 256:02x}.0" for count, node_id in enumerate(anonymous, start=1)
        }

    def busid(self, node: Node) -> str:
        """The node's bus id, or the made-up one."""
        return node.busid or self.synthetic[node.id]

    def switch_busid(self, node: Node) -> str:
        """An NVSwitch's bus id; a single switch without one is the hidden switch of VMs."""
        hidden = [n for n in self.topology.nodes_of(NodeKind.NVSWITCH) if not n.busid]
        return HIDDEN_NVSWITCH_BUSID if hidden == [node] else self.busid(node)

    def up_link(self, node_id: str) -> Link | None:
        up = self.parent.get(node_id)
        return self.topology.link(node_id, up) if up is not None else None

    def children_of(self, element: ElementTree.Element, node_id: str) -> None:
        kids = sorted(self.children.get(node_id, []), key=natural_key)
        sockets = [k for k in kids if self.topology.node(k).kind is NodeKind.NIC and not self.topology.node(k).busid]
        for kid in kids:
            if kid not in sockets:
                self.device(element, kid)
        if sockets and self.topology.node(node_id).kind is NodeKind.CPU:
            nic = ElementTree.SubElement(element, "nic")
            for kid in sockets:
                self.net(nic, self.topology.node(kid), port=0)
        elif sockets:
            for kid in sockets:
                self.device(element, kid)

    def device(self, element: ElementTree.Element, node_id: str) -> None:
        node = self.topology.node(node_id)
        pci = ElementTree.SubElement(element, "pci", busid=self.busid(node))
        if node.kind is NodeKind.GPU:
            pci.set("class", GPU_CLASS)
            _set_pcie(pci, self.up_link(node_id))
            self.gpu(pci, node)
        elif node.kind is NodeKind.NIC:
            pci.set("class", NIC_CLASS)
            _set_pcie(pci, self.up_link(node_id))
            if self.net_bw(node) is not None or node.name:
                self.net(ElementTree.SubElement(pci, "nic"), node, port=1)
        elif node.kind is NodeKind.NVSWITCH:
            pci.set("class", NVSWITCH_CLASS)
            _set_pcie(pci, self.up_link(node_id))
        else:
            kids = sorted(self.children.get(node_id, []), key=natural_key)
            ports = [self.topology.node(k) for k in kids]
            if len(ports) > 1 and all(p.kind is NodeKind.NIC and p.busid == node.busid for p in ports):
                pci.set("class", NIC_CLASS)
                _set_pcie(pci, self.up_link(node_id))
                nic = ElementTree.SubElement(pci, "nic")
                for port, kid in enumerate(ports, start=1):
                    self.net(nic, kid, port)
                return
            pci.set("class", BRIDGE_CLASS)
            _set_pcie(pci, self.up_link(node_id))
            self.children_of(pci, node_id)

    def gpu(self, pci: ElementTree.Element, node: Node) -> None:
        links = [
            self.topology.link(node.id, other)
            for other in sorted(self.topology.graph.successors(node.id), key=natural_key)
            if self.topology.link(node.id, other).kind is LinkKind.NVLINK
        ]
        gpu = ElementTree.SubElement(pci, "gpu")
        if node.index is not None:
            gpu.set("dev", str(node.index))
        if node.sm is not None:
            gpu.set("sm", str(node.sm))
        if node.rank is not None:
            gpu.set("rank", str(node.rank))
        if node.gdr is not None:
            gpu.set("gdr", str(int(node.gdr)))
        for link in links:
            target = self.topology.node(link.dst)
            if target.kind is NodeKind.NVSWITCH:
                busid, tclass = self.switch_busid(target), NVSWITCH_CLASS
            else:
                busid, tclass = self.busid(target), GPU_CLASS
            attrs = {"target": busid, "count": str(link.count), "tclass": tclass, BW_ATTR: repr(float(link.bw_bytes_per_s))}
            _set_latency(ElementTree.SubElement(gpu, "nvlink", attrs), link)

    def net_links(self, node: Node) -> list[Link]:
        return [
            self.topology.link(node.id, other)
            for other in self.topology.graph.successors(node.id)
            if self.topology.link(node.id, other).kind is LinkKind.NET
        ]

    def net_bw(self, node: Node) -> float | None:
        links = self.net_links(node)
        return sum(link.bw_bytes_per_s for link in links) if links else None

    def net(self, nic: ElementTree.Element, node: Node, port: int) -> None:
        bw = self.net_bw(node)
        net = ElementTree.SubElement(nic, "net", name=node.name or node.id, dev=str(self.nic_order[node.id]))
        if bw is not None:
            speed = bw * 8 / 1e6
            net.set("speed", _number(speed))
            if bandwidth.net_bw_bytes_per_s(float(net.get("speed")) * 1e6) != bw:
                net.set(BW_ATTR, repr(float(bw)))
        net.set("port", str(port))
        net.set("latency", "0")
        links = self.net_links(node)
        if links:
            _set_latency(net, links[0])
        if node.gdr is not None:
            net.set("gdr", str(int(node.gdr)))
