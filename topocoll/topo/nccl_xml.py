"""NCCL topology XML (``NCCL_TOPO_FILE`` / ``NCCL_TOPO_DUMP_FILE``): import.

Import (:func:`parse_nccl_xml`) follows how NCCL itself reads the file (``src/graph/topo.cc``):

- ``<cpu>`` becomes a ``cpu`` node (``cpu<numaid>``, named from its vendor, arch, family and
  model); every pair of CPUs gets an ``smp`` link whose bandwidth depends on those, as in
  NCCL (:func:`bandwidth.smp_bw_for_cpu`).
- ``<pci>`` with a ``<gpu>`` child or a class ``0x03....`` is a GPU; with a ``<nic>`` child or a
  class ``0x02....`` a NIC; class ``0x0680..`` an NVSwitch; anything else (PCI bridges
  ``0x0604..``, host bridges, elements without a class) a ``pcie_switch``, as NCCL's class
  fallback does. Each ``<pci>`` is joined to its parent by a PCIe link of its own
  ``link_speed`` x ``link_width``; missing or unreadable values take NCCL's fallback (Gen3,
  x16) and a note.
- Every ``<net>`` (a network port) is a ``nic`` node named after the port; a NIC with several
  ports is a ``pcie_switch`` (its PCI device) with one ``nic`` per port behind it. The port
  speed (Mbit/s) becomes a ``net`` link to a ``net_switch`` node ``net<k>`` standing for the
  switch port it is cabled to, which the file does not describe (multi-node assembly joins
  those). ``<nic>`` directly under ``<cpu>`` (socket transports) attaches to that CPU.
- ``<nvlink target count tclass>`` joins a GPU to another GPU (by bus id), to an NVSwitch
  (``tclass 0x068000``; one ``nvswitch`` node per distinct bus id), or, for the all-``f`` target
  of VMs that hide the switches, to a single ``nvswitch`` node without a bus id. A target equal
  to the GPU's own bus id (another VM artifact) is ignored. Per-link bandwidth comes from the
  GPU's ``sm`` (:func:`bandwidth.nvlink_generation_for_sm`).

Node ids do not depend on the order of elements: GPUs (``gpu<i>``) are numbered by rank, then
bus id; NICs (``nic<i>``, with ``net<i>`` beyond them) by bus id and port name; PCIe switches
(``pcie_switch<i>``) and NVSwitches (``nvswitch<i>``) by bus id. Every node under a ``<cpu>``
carries its NUMA id. Everything the file does not say is recorded in :attr:`Topology.notes`,
and a malformed attribute is a :class:`FormatError` naming the file and line.

Export is :mod:`topocoll.topo.nccl_xml_export`; the safe reading of XML text is
:mod:`topocoll.topo.safe_xml`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from topocoll.errors import FormatError, TopologyError
from topocoll.topo import bandwidth
from topocoll.topo.model import LinkKind, Node, NodeKind, Topology, TopologyBuilder, natural_key
from topocoll.topo.safe_xml import XmlElement, read_xml

#: Extra attribute carrying an exact bandwidth (bytes/s, summed over ``count``) NCCL ignores.
BW_ATTR = "topocoll_bw_bytes_per_s"
#: Extra attribute carrying a latency (seconds) that differs from the default of its link kind.
LATENCY_ATTR = "topocoll_latency_s"
#: PCI class of NVSwitches in NCCL XML (``tclass`` of NVLinks to a switch).
NVSWITCH_CLASS = "0x068000"
GPU_CLASS = "0x030200"
NIC_CLASS = "0x020000"
BRIDGE_CLASS = "0x060400"
#: Bus id NCCL writes as NVLink target when the switch is not visible (VMs).
HIDDEN_NVSWITCH_BUSID = "fffffff:ff:ff.0"
#: First comment of files written by :func:`to_nccl_xml`: the name and notes that follow are the
#: topology's own, so the importer adds none of its own.
MARK = "written by topocoll from a topocoll.topology/1 topology"
NAME_PREFIX = "topocoll name: "
NOTE_PREFIX = "topocoll note: "

# ------------------------------------------------------------------------------ attribute helpers


def _busid(value: str | None) -> str | None:
    if value is None or not value.strip():
        return None
    return value.strip().lower()


def _int_attr(element: XmlElement, name: str, source: str, *, minimum: int | None = None) -> int | None:
    raw = element.attrs.get(name)
    if raw is None or raw.strip() == "":
        return None
    text = raw.strip()
    try:
        value = int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        raise FormatError(f"{source}: line {element.line}: <{element.tag}> {name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise FormatError(f"{source}: line {element.line}: <{element.tag}> {name}={raw!r} must be >= {minimum}")
    return value


def _flag_attr(element: XmlElement, name: str, source: str) -> bool | None:
    """A 0/1 attribute such as ``gdr`` as a bool (None when absent)."""
    value = _int_attr(element, name, source, minimum=0)
    if value is not None and value > 1:
        raise FormatError(f"{source}: line {element.line}: <{element.tag}> {name}=\"{value}\" must be 0 or 1")
    return None if value is None else bool(value)


def _latency_attr(element: XmlElement, source: str) -> float | None:
    raw = element.attrs.get(LATENCY_ATTR)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise FormatError(f"{source}: line {element.line}: <{element.tag}> {LATENCY_ATTR}={raw!r} must be a number >= 0")
    return value


def _float_attr(element: XmlElement, name: str, source: str) -> float | None:
    """A positive finite number, None when absent, FormatError when malformed."""
    raw = element.attrs.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise FormatError(f"{source}: line {element.line}: <{element.tag}> {name}={raw!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise FormatError(f"{source}: line {element.line}: <{element.tag}> {name}={raw!r} must be a finite number > 0")
    return value


_GT_PER_S = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*GT/s", re.IGNORECASE)


def parse_link_speed(text: str | None) -> float | None:
    """Per-lane rate in GT/s from a ``link_speed`` value, or None when it gives none.

    Accepts every spelling seen in real files: ``"16 GT/s"``, ``"16.0 GT/s PCIe"``,
    ``"32 GT/s PCIe/s"``, ``"2.5 GT/s"``; ``"Unknown"``, ``""`` and None give None.
    """
    match = _GT_PER_S.search(text or "")
    return float(match.group(1)) if match else None


def encode_comment(text: str) -> str:
    """Make ``text`` safe inside ``<!-- -->`` (reversibly: see :func:`decode_comment`)."""
    text = text.replace("&", "&amp;").replace("--", "-&#45;")
    return text[:-1] + "&#45;" if text.endswith("-") else text


def decode_comment(text: str) -> str:
    return text.replace("&#45;", "-").replace("&amp;", "&")


# ------------------------------------------------------------------------------------- import


@dataclass(slots=True, eq=False)
class _Device:
    """A device found while walking the ``<pci>`` tree, before ids are assigned."""

    kind: NodeKind
    line: int
    numa: int | None
    parent: "_Device | str"  # a device, or the id of a cpu node
    pcie_bw: float
    busid: str | None = None
    rank: int | None = None
    index: int | None = None
    sm: int | None = None
    gdr: bool | None = None
    name: str | None = None
    net_bw: float | None = None
    net_latency_s: float | None = None
    nvlinks: list[XmlElement] = field(default_factory=list)
    has_gpu_element: bool = False
    pcie_latency_s: float | None = None
    node_id: str = ""


class _Importer:
    """State of one import: devices found, notes, and the source name for errors."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.devices: list[_Device] = []
        self.cpu_attrs: dict[str, XmlElement] = {}
        self.problems: dict[str, list[str]] = {}
        self.socket_nets: dict[tuple[str | None, str | None], str] = {}
        self.nvlinked: set[str] = set()  # GPUs with at least one NVLink kept

    def problem(self, kind: str, detail: str) -> None:
        """Collect one instance of a note-worthy gap; :meth:`notes` summarizes them."""
        self.problems.setdefault(kind, []).append(detail)

    # --------------------------------------------------------------------- walking the tree
    def walk(self, system: XmlElement) -> None:
        cpus = system.find_all("cpu")
        numas = [_int_attr(cpu, "numaid", self.source) for cpu in cpus]
        use_numa = all(n is not None for n in numas) and len(set(numas)) == len(numas)
        for index, (cpu, numa) in enumerate(zip(cpus, numas)):
            cpu_id = f"cpu{numa if use_numa else index}"
            self.cpu_attrs[cpu_id] = cpu
            for child in cpu.children:
                if child.tag == "pci":
                    self.pci(child, cpu_id, numa)
                elif child.tag == "nic":
                    self.socket_nic(child, cpu_id, numa)

    def pcie_bw(self, element: XmlElement) -> float:
        exact = _float_attr(element, BW_ATTR, self.source)
        if exact is not None:
            return exact
        rate = parse_link_speed(element.attrs.get("link_speed"))
        if rate is None:
            given = element.attrs.get("link_speed")
            self.problem("speed", f"line {element.line} ({'missing' if given is None else repr(given)})")
            generation = bandwidth.PCIE_DEFAULT_GENERATION
        else:
            generation = bandwidth.pcie_generation_for_rate(rate)
        width = _int_attr(element, "link_width", self.source, minimum=0)
        if not width:
            self.problem("width", f"line {element.line}")
            width = bandwidth.PCIE_DEFAULT_WIDTH
        return bandwidth.pcie_bw_bytes_per_s(generation, width)

    def add(self, device: _Device) -> _Device:
        self.devices.append(device)
        return device

    def pci(self, element: XmlElement, parent: _Device | str, numa: int | None) -> None:
        busid = _busid(element.attrs.get("busid"))
        pci_class = element.attrs.get("class", "").strip().lower()
        bw = self.pcie_bw(element)
        latency = _latency_attr(element, self.source)
        gpu = element.find("gpu")
        nic = element.find("nic")

        def device(kind: NodeKind, up: _Device | str, line: int = element.line) -> _Device:
            return self.add(_Device(kind, line, numa, up, bw, busid, pcie_latency_s=latency))

        if gpu is not None or pci_class.startswith("0x03"):
            self.gpu(element, gpu, device(NodeKind.GPU, parent))
        elif nic is not None or pci_class.startswith("0x02"):
            nets = nic.find_all("net") if nic is not None else []
            if len(nets) <= 1:
                single = device(NodeKind.NIC, parent)
                if nets:
                    self.net(nets[0], single)
                else:
                    self.problem("nospeed", busid or f"line {element.line}")
            else:
                self.problem("multiport", f"{busid} ({len(nets)} ports)")
                card = device(NodeKind.PCIE_SWITCH, parent)
                for net in nets:
                    self.net(net, device(NodeKind.NIC, card, net.line))
        elif pci_class.startswith("0x0680"):
            device(NodeKind.NVSWITCH, parent)
        else:
            if not pci_class:
                self.problem("noclass", busid or f"line {element.line}")
            switch = device(NodeKind.PCIE_SWITCH, parent)
            for child in element.find_all("pci"):
                self.pci(child, switch, numa)

    def gpu(self, element: XmlElement, gpu: XmlElement | None, device: _Device) -> None:
        """Fill a GPU device from its ``<gpu>`` child (absent in partial files)."""
        if gpu is None:
            self.problem("nogpu", device.busid or f"line {element.line}")
            return
        device.has_gpu_element = True
        device.line = gpu.line
        device.rank = _int_attr(gpu, "rank", self.source, minimum=0)
        device.index = _int_attr(gpu, "dev", self.source, minimum=0)
        device.sm = _int_attr(gpu, "sm", self.source, minimum=1)
        device.gdr = _flag_attr(gpu, "gdr", self.source)
        device.nvlinks = gpu.find_all("nvlink")

    def net(self, net: XmlElement, device: _Device) -> None:
        device.name = net.attrs.get("name") or None
        device.gdr = _flag_attr(net, "gdr", self.source)
        exact = _float_attr(net, BW_ATTR, self.source)
        try:
            speed = float(net.attrs.get("speed", ""))
        except ValueError:
            speed = None  # missing or unreadable: NCCL would ask the network plugin
        if speed is not None and not 0 < speed < float("inf"):
            speed = None
        device.net_latency_s = _latency_attr(net, self.source)
        if exact is not None:
            device.net_bw = exact
        elif speed is not None:
            device.net_bw = bandwidth.net_bw_bytes_per_s(speed * 1e6)
        else:
            self.problem("nospeed", device.name or f"line {net.line}")

    def socket_nic(self, nic: XmlElement, cpu_id: str, numa: int | None) -> None:
        for net in nic.find_all("net"):
            key = (net.attrs.get("name"), net.attrs.get("dev"))
            if key in self.socket_nets:
                self.problem("dupnet", f"{key[0]} ({self.socket_nets[key]})")
                continue
            self.socket_nets[key] = cpu_id
            bw = bandwidth.pcie_bw_bytes_per_s(bandwidth.PCIE_DEFAULT_GENERATION, bandwidth.PCIE_DEFAULT_WIDTH)
            self.problem("socket", net.attrs.get("name") or f"line {net.line}")
            self.net(net, self.add(_Device(NodeKind.NIC, net.line, numa, cpu_id, bw)))

    # -------------------------------------------------------------------------- ids and notes
    def assign_ids(self) -> None:
        def of(kind: NodeKind) -> list[_Device]:
            return [d for d in self.devices if d.kind is kind]

        seen: dict[int, _Device] = {}
        for device in of(NodeKind.GPU):
            if device.rank is not None:
                if device.rank in seen:
                    raise FormatError(
                        f"{self.source}: line {device.line}: <gpu rank=\"{device.rank}\">: rank {device.rank} "
                        f"already used by the GPU on line {seen[device.rank].line}"
                    )
                seen[device.rank] = device
        orders = {
            NodeKind.GPU: lambda d: (d.rank is None, d.rank or 0, d.busid is None, d.busid or "", d.line),
            NodeKind.NIC: lambda d: (d.busid is None, d.busid or "", natural_key(d.name or ""), d.line),
            NodeKind.PCIE_SWITCH: lambda d: (d.busid is None, d.busid or "", d.line),
        }
        prefixes = {NodeKind.GPU: "gpu", NodeKind.NIC: "nic", NodeKind.PCIE_SWITCH: "pcie_switch"}
        for kind, key in orders.items():
            for index, device in enumerate(sorted(of(kind), key=key)):
                device.node_id = f"{prefixes[kind]}{index}"

    def notes(self) -> list[str]:
        texts = {
            "speed": "PCIe link_speed missing or unreadable for {n} element(s) ({items}): assumed "
            "8 GT/s (Gen3), NCCL's fallback",
            "width": "PCIe link_width missing or 0 for {n} element(s) ({items}): assumed x16, NCCL's fallback",
            "noclass": "{n} <pci> element(s) without a class ({items}): kept as PCIe switches, as NCCL does",
            "nogpu": "{n} GPU(s) without a <gpu> element ({items}): rank, compute capability and NVLinks unknown",
            "nospeed": "{n} NIC(s) without a network speed ({items}): no network link added",
            "multiport": "{n} NIC(s) with several ports ({items}): one nic node per port behind a "
            "pcie_switch node standing for the card",
            "socket": "{n} network interface(s) outside any PCI device ({items}): attached to their CPU by "
            "a default PCIe link (Gen3 x16)",
            "dupnet": "{n} network interface(s) listed again under another CPU ({items}): kept once, under "
            "the first CPU",
            "selflink": "{n} NVLink(s) whose target is the GPU itself ({items}, a VM artifact): ignored",
            "hidden": "NVSwitch not visible (NVLink target {items}, as in VMs): modeled as one nvswitch node "
            "without a bus id",
            "unknowntarget": "{n} NVLink target(s) not in the file ({items}): ignored",
            "nosm": "{n} GPU(s) with NVLinks but no sm ({items}): NVLink generation "
            f"{bandwidth.NVLINK_DEFAULT_GENERATION} assumed",
            "smp": "CPU vendor unknown for {items}: inter-socket bandwidth assumed "
            f"{bandwidth.SMP_BW_BYTES_PER_S[bandwidth.SMP_DEFAULT_KEY] / bandwidth.GB:g} GB/s",
        }
        out = []
        for kind, template in texts.items():
            items = self.problems.get(kind)
            if items:
                unique = sorted(set(items), key=natural_key)
                shown = ", ".join(unique[:4]) + (", ..." if len(unique) > 4 else "")
                out.append(template.format(n=len(items), items=shown))
        return out


def _cpu_name(cpu: XmlElement) -> str | None:
    attrs = cpu.attrs
    parts = [attrs.get("vendor"), attrs.get("arch")]
    if attrs.get("familyid"):
        parts += ["family", attrs["familyid"]]
    if attrs.get("modelid"):
        parts += ["model", attrs["modelid"]]
    text = " ".join(p.strip() for p in parts if p and p.strip())
    return text or None


def _cpu_smp_bw(cpu: XmlElement, source: str) -> float | None:
    """Inter-socket figure of a ``<cpu>``: the exact one we wrote, else NCCL's for its model."""
    exact = _float_attr(cpu, BW_ATTR, source)
    if exact is not None:
        return exact
    return bandwidth.smp_bw_for_cpu(
        cpu.attrs.get("vendor"),
        _int_attr(cpu, "familyid", source),
        _int_attr(cpu, "modelid", source),
        cpu.attrs.get("arch"),
    )


@dataclass(frozen=True, slots=True)
class _Carried:
    """What a file written by :func:`to_nccl_xml` says about its topology."""

    ours: bool
    name: str
    notes: tuple[str, ...]


def _carried(comments: Iterable[str]) -> _Carried:
    ours, name, notes = False, "", []
    for comment in comments:
        text = comment.strip()
        if text == MARK:
            ours = True
        elif text.startswith(NAME_PREFIX):
            name = decode_comment(text[len(NAME_PREFIX):])
        elif text.startswith(NOTE_PREFIX):
            notes.append(decode_comment(text[len(NOTE_PREFIX):]))
    return _Carried(ours, name, tuple(notes))


def _is_hidden_target(busid: str) -> bool:
    return re.fullmatch(r"f+:f+:f+\.[0-9a-f]", busid) is not None


def parse_nccl_xml(text: str, source: str = "<nccl-xml>") -> Topology:
    """Import an NCCL topology XML file.

    Parameters
    ----------
    text : str
        The file's content.
    source : str
        File name, used in every error and as the topology name (its base name), except in
        files written by :func:`to_nccl_xml`, which carry the topology's name and notes.

    Returns
    -------
    Topology
        Partial files give partial topologies; :attr:`Topology.notes` lists what is missing.

    Raises
    ------
    FormatError
        Malformed XML, DTD/entity declarations, a graph file (``<graphs>``), another root
        element, or malformed attributes; the message names the file and line.
    TopologyError
        The content violates the model (e.g. duplicate ranks); the message names the file.

    See Also
    --------
    topocoll.topo.nccl_xml_export.to_nccl_xml : the export it round-trips with.
    topocoll.topo.io.load_topology : any topology file, its format told from its content.

    Examples
    --------
    >>> topo = parse_nccl_xml('<system version="1"><cpu numaid="0"><pci busid="0000:01:00.0" '
    ...     'class="0x030200" link_speed="16 GT/s" link_width="16"><gpu dev="0" sm="80" rank="0"/>'
    ...     '</pci></cpu></system>', "one.xml")
    >>> [n.id for n in topo.nodes]
    ['cpu0', 'gpu0']
    """
    document = read_xml(text, source)
    root = document.root
    if root.tag == "graphs":
        raise FormatError(
            f"{source}: line {root.line}: this is an NCCL graph file (<graphs>: the rings/trees NCCL chose, "
            "NCCL_GRAPH_FILE), not a topology; use the NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE XML instead"
        )
    if root.tag != "system":
        raise FormatError(f"{source}: line {root.line}: root element is <{root.tag}>, expected <system> (NCCL topology XML)")
    carried = _carried(document.comments)
    importer = _Importer(source)
    importer.walk(root)
    importer.assign_ids()

    builder = TopologyBuilder(carried.name if carried.ours else os.path.basename(source))
    try:
        _build(importer, builder)
    except TopologyError as exc:
        raise TopologyError(f"{source}: {exc}") from None
    for note in carried.notes if carried.ours else importer.notes() + _missing(importer):
        builder.note(note)
    return builder.build(source)


def _missing(importer: _Importer) -> list[str]:
    """Notes for what a partial file leaves out altogether."""
    gpus = [d for d in importer.devices if d.kind is NodeKind.GPU]
    notes = []
    if not gpus:
        notes.append("no GPUs in the file")
    bare = [d.node_id for d in gpus if d.has_gpu_element and d.node_id not in importer.nvlinked]
    if bare:
        shown = ", ".join(sorted(bare, key=natural_key)[:4]) + (", ..." if len(bare) > 4 else "")
        notes.append(
            f"no NVLinks listed for {len(bare)} GPU(s) ({shown}): joined by PCIe only "
            "(NCCL adds NVLinks it finds at run time)"
        )
    if not any(d.kind is NodeKind.NIC for d in importer.devices):
        notes.append("no NICs in the file")
    return notes


def _build(importer: _Importer, builder: TopologyBuilder) -> None:
    source = importer.source
    pcie_latency = bandwidth.latency_s(LinkKind.PCIE)
    for cpu_id, cpu in importer.cpu_attrs.items():
        numa = _int_attr(cpu, "numaid", source)
        builder.add_node(Node(cpu_id, NodeKind.CPU, numa=numa, name=_cpu_name(cpu)))
    # NVSwitches: listed as <pci> devices, or only seen as NVLink targets.
    gpus = [d for d in importer.devices if d.kind is NodeKind.GPU]
    gpu_by_busid = {d.busid: d for d in gpus if d.busid}
    switch_busids = {d.busid for d in importer.devices if d.kind is NodeKind.NVSWITCH and d.busid}
    hidden = False
    for gpu in gpus:
        for link in gpu.nvlinks:
            target = _busid(link.attrs.get("target")) or ""
            if target in gpu_by_busid or target == gpu.busid:
                continue
            if _is_hidden_target(target):
                hidden = True
            elif link.attrs.get("tclass", "").strip().lower() == NVSWITCH_CLASS:
                switch_busids.add(target)
    nvswitch_ids = {busid: f"nvswitch{i}" for i, busid in enumerate(sorted(switch_busids))}
    hidden_id = f"nvswitch{len(nvswitch_ids)}"
    for busid, node_id in nvswitch_ids.items():
        builder.add_node(Node(node_id, NodeKind.NVSWITCH, busid=busid))
    if hidden:
        builder.add_node(Node(hidden_id, NodeKind.NVSWITCH))
    for device in importer.devices:
        if device.kind is NodeKind.NVSWITCH:
            device.node_id = nvswitch_ids[device.busid] if device.busid else hidden_id

    for device in importer.devices:
        if device.kind is not NodeKind.NVSWITCH:
            builder.add_node(
                Node(
                    device.node_id,
                    device.kind,
                    rank=device.rank,
                    numa=device.numa,
                    busid=device.busid,
                    name=device.name,
                    index=device.index,
                    sm=device.sm,
                    gdr=device.gdr,
                )
            )
        parent = device.parent if isinstance(device.parent, str) else device.parent.node_id
        latency = pcie_latency if device.pcie_latency_s is None else device.pcie_latency_s
        builder.add_link(device.node_id, parent, LinkKind.PCIE, device.pcie_bw, latency)
        if device.net_bw is not None:
            net_id = "net" + device.node_id[len("nic"):]
            builder.add_node(Node(net_id, NodeKind.NET_SWITCH))
            latency = bandwidth.latency_s(LinkKind.NET) if device.net_latency_s is None else device.net_latency_s
            builder.add_link(device.node_id, net_id, LinkKind.NET, device.net_bw, latency)

    _add_smp_links(importer, builder)
    _add_nvlinks(importer, builder, gpu_by_busid, nvswitch_ids, hidden_id)


def _add_smp_links(importer: _Importer, builder: TopologyBuilder) -> None:
    cpus = list(importer.cpu_attrs.items())
    default = bandwidth.SMP_BW_BYTES_PER_S[bandwidth.SMP_DEFAULT_KEY]
    figures = {}
    for cpu_id, cpu in cpus:
        figure = _cpu_smp_bw(cpu, importer.source)
        if figure is None and len(cpus) > 1:
            importer.problem("smp", cpu_id)
        figures[cpu_id] = figure if figure is not None else default
    builder.add_full_mesh([cpu_id for cpu_id, _ in cpus], LinkKind.SMP, figures, bandwidth.latency_s(LinkKind.SMP))


def _add_nvlinks(importer, builder, gpu_by_busid, nvswitch_ids, hidden_id) -> None:
    source = importer.source
    directed: dict[tuple[str, str], tuple[float, int, float]] = {}
    for gpu in (d for d in importer.devices if d.kind is NodeKind.GPU):
        if gpu.sm is None and any(BW_ATTR not in link.attrs for link in gpu.nvlinks):
            importer.problem("nosm", gpu.node_id)
        generation = (
            bandwidth.nvlink_generation_for_sm(gpu.sm) if gpu.sm is not None else bandwidth.NVLINK_DEFAULT_GENERATION
        )
        for link in gpu.nvlinks:
            target = _busid(link.attrs.get("target"))
            if target is None:
                raise FormatError(f"{source}: line {link.line}: <nvlink> has no target")
            count = _int_attr(link, "count", source, minimum=1) or 1
            bw = _float_attr(link, BW_ATTR, source) or count * bandwidth.nvlink_bw_bytes_per_s(generation)
            latency = _latency_attr(link, source)
            latency = bandwidth.latency_s(LinkKind.NVLINK) if latency is None else latency
            if target == gpu.busid:
                importer.problem("selflink", f"{gpu.node_id} line {link.line}")
            elif target in gpu_by_busid:
                importer.nvlinked.add(gpu.node_id)
                key = (gpu.node_id, gpu_by_busid[target].node_id)
                old_bw, old_count, old_latency = directed.get(key, (0.0, 0, 0.0))
                directed[key] = (old_bw + bw, old_count + count, max(old_latency, latency))
            elif target in nvswitch_ids or _is_hidden_target(target):
                if _is_hidden_target(target):
                    importer.problem("hidden", target)
                importer.nvlinked.add(gpu.node_id)
                switch = nvswitch_ids.get(target, hidden_id)
                builder.add_link(gpu.node_id, switch, LinkKind.NVLINK, bw, latency, count)
            else:
                importer.problem("unknowntarget", target)
    for (a, b), (bw, count, latency) in directed.items():
        builder.add_link(a, b, LinkKind.NVLINK, bw, latency, count, duplex=(b, a) not in directed)
