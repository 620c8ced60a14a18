"""NCCL topology XML (``NCCL_TOPO_FILE`` / ``NCCL_TOPO_DUMP_FILE``): import and export.

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

Export (:func:`to_nccl_xml`) writes a file NCCL can load. Bandwidths are written back as
``link_speed``/``link_width`` and ``speed``; where those cannot express a figure exactly (and
for NVLinks, whose per-link figure depends on a GPU model the topology does not keep) an extra
``topocoll_bw_bytes_per_s`` attribute holds it, and ``topocoll_latency_s`` a latency that is
not the default of its link kind; NCCL ignores attributes it does not know. ``sm`` and ``dev``
are not written (NCCL fills them in from the GPUs it finds). The topology's name and notes
travel as ``<!-- topocoll ... -->`` comments. So importing an exported file gives back the same
topology: the same canonical JSON text, name and notes included. NCCL XML describes one
machine: several hosts, host ranks, and xGMI, C2C or NVSwitch-to-NVSwitch links are refused.
"""

from __future__ import annotations

import logging
import os
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from xml.etree import ElementTree
from xml.etree.ElementTree import ParseError

from defusedxml import DefusedXmlException, DTDForbidden
from defusedxml.ElementTree import DefusedXMLParser

from topocoll.errors import FormatError, TopologyError
from topocoll.topo import bandwidth
from topocoll.topo.model import Link, LinkKind, Node, NodeKind, Topology, TopologyBuilder, natural_key

log = logging.getLogger(__name__)

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
_MARK = "written by topocoll from a topocoll.topology/1 topology"
_NAME_PREFIX = "topocoll name: "
_NOTE_PREFIX = "topocoll note: "

# ------------------------------------------------------------------------------- safe reading

MAX_XML_DEPTH = 64
"""Deepest element nesting read.

The real files in ``tests/data/topologies`` nest at most 8 levels (``system``, ``cpu``, three
``pci`` bridges, the GPU's own ``pci``, ``gpu``, ``nvlink``); every PCIe switch adds two
``pci`` levels (upstream and downstream port), so 64 leaves room for about 28 switches in a
chain, more than any server has. It also bounds the importer's walk of the ``pci`` tree, which
recurses once per level, far inside Python's recursion limit (1000 by default)."""

MAX_XML_ATTRIBUTE_CHARS = 4096
"""Longest attribute value (and element or attribute name) read.

NCCL keeps attribute values in 256-byte buffers (``MAX_STR_LEN`` 255 in its
``src/graph/xml.h``), so a file NCCL reads or writes has none longer than 255 characters; the
longest in ``tests/data/topologies`` has 53. 4096 leaves room for hand-edited files and for
names that topocoll writes back (``<net name=...>``), and refuses a value that is only there
to fill memory."""

_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


@dataclass(slots=True)
class XmlElement:
    """One element: tag, attributes, child elements and the line it starts on."""

    tag: str
    attrs: dict[str, str]
    line: int
    children: list["XmlElement"] = field(default_factory=list)

    def find_all(self, tag: str) -> list["XmlElement"]:
        """Direct children named ``tag``, in document order."""
        return [child for child in self.children if child.tag == tag]

    def find(self, tag: str) -> "XmlElement | None":
        """The first direct child named ``tag``, or None."""
        found = self.find_all(tag)
        return found[0] if found else None


@dataclass(frozen=True, slots=True)
class XmlDocument:
    """A parsed document: the root element and the text of its comments, in order."""

    root: XmlElement
    comments: tuple[str, ...]


class _Refused(Exception):
    def __init__(self, line: int, reason: str) -> None:
        super().__init__(line, reason)
        self.line = line
        self.reason = reason


def _shown(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters for an error message."""
    return text if len(text) <= limit else text[:limit] + "..."


def _blank_comments(text: str) -> str:
    """``text`` with comments blanked out, newlines kept (offsets still map to lines)."""
    return _COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


class _TreeTarget:
    """Builds :class:`XmlElement` trees with line numbers from the parser's events, refusing
    nesting and names or values beyond the limits as soon as they appear."""

    def __init__(self) -> None:
        self.line_of = lambda: 0  # set to the parser's current line once it exists
        self.stack: list[XmlElement] = []
        self.roots: list[XmlElement] = []
        self.comments: list[str] = []

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        line = self.line_of()
        if len(self.stack) >= MAX_XML_DEPTH:
            raise _Refused(line, f"<{_shown(tag)}> is nested deeper than {MAX_XML_DEPTH} levels")
        for piece in (tag, *attrs, *attrs.values()):
            if len(piece) > MAX_XML_ATTRIBUTE_CHARS:
                raise _Refused(
                    line,
                    f"<{_shown(tag)}>: a name or attribute value of {len(piece):,} characters "
                    f"(at most {MAX_XML_ATTRIBUTE_CHARS:,}): {_shown(piece)!r}",
                )
        element = XmlElement(tag, dict(attrs), line)
        (self.stack[-1].children if self.stack else self.roots).append(element)
        self.stack.append(element)

    def end(self, _tag: str) -> None:
        self.stack.pop()

    def comment(self, text: str) -> None:
        self.comments.append(text)

    def close(self) -> None:
        return None


def read_xml(text: str, source: str) -> XmlDocument:
    """Parse ``text`` safely, keeping element line numbers and comments.

    The parser is defusedxml's: a ``<!DOCTYPE`` (and so any entity declaration) or an external
    reference is refused where the parser meets it, so nothing is expanded and nothing outside
    the text is read. Elements nested deeper than :data:`MAX_XML_DEPTH` and attribute values
    longer than :data:`MAX_XML_ATTRIBUTE_CHARS` are refused as soon as the parser meets them, so
    the tree handed to the importer is bounded in depth.

    Parameters
    ----------
    text : str
        The document.
    source : str
        File name used in error messages.

    Returns
    -------
    XmlDocument

    Raises
    ------
    FormatError
        ``"SOURCE: line L: ..."`` for malformed XML, declarations, nesting too deep and
        attribute values too long.
    """
    target = _TreeTarget()
    parser = DefusedXMLParser(target=target, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    target.line_of = lambda: parser.parser.CurrentLineNumber
    try:
        parser.feed(text)
        parser.close()
    except ParseError as exc:
        line = exc.position[0]
        raise FormatError(f"{source}: line {line}: malformed XML: {str(exc).split(':', 1)[0]}") from None
    except DTDForbidden:
        raise FormatError(
            f"{source}: line {target.line_of()}: <!DOCTYPE ...> declarations are refused (no entity expansion, no external entities)"
        ) from None
    except DefusedXmlException as exc:  # entity declarations and external references
        raise FormatError(f"{source}: line {target.line_of()}: refused: {exc}") from None
    except _Refused as exc:
        raise FormatError(f"{source}: line {exc.line}: {exc.reason}") from None
    if not target.roots:
        raise FormatError(f"{source}: line 1: malformed XML: no element found")
    return XmlDocument(target.roots[0], tuple(target.comments))


def root_tag(text: str) -> str | None:
    """Name of the first element of ``text``, found without parsing (for format sniffing)."""
    match = re.search(r"<(?![!?/])\s*([A-Za-z_][\w.-]*)", _blank_comments(text))
    return match.group(1) if match else None


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


def _encode_comment(text: str) -> str:
    """Make ``text`` safe inside ``<!-- -->`` (reversibly: see :func:`_decode_comment`)."""
    text = text.replace("&", "&amp;").replace("--", "-&#45;")
    return text[:-1] + "&#45;" if text.endswith("-") else text


def _decode_comment(text: str) -> str:
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
    sm: int | None = None
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
        device.sm = _int_attr(gpu, "sm", self.source, minimum=0)
        device.nvlinks = gpu.find_all("nvlink")

    def net(self, net: XmlElement, device: _Device) -> None:
        device.name = net.attrs.get("name") or None
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
        if text == _MARK:
            ours = True
        elif text.startswith(_NAME_PREFIX):
            name = _decode_comment(text[len(_NAME_PREFIX):])
        elif text.startswith(_NOTE_PREFIX):
            notes.append(_decode_comment(text[len(_NOTE_PREFIX):]))
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
                Node(device.node_id, device.kind, rank=device.rank, numa=device.numa, busid=device.busid, name=device.name)
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


# ------------------------------------------------------------------------------------- export


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
    head = [f"<!-- {_MARK} -->"]
    if topology.name:
        head.append(f"<!-- {_NAME_PREFIX}{_encode_comment(topology.name)} -->")
    head += [f"<!-- {_NOTE_PREFIX}{_encode_comment(note)} -->" for note in topology.notes]
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
        if node.rank is None and not links:
            return
        gpu = ElementTree.SubElement(pci, "gpu")
        if node.rank is not None:
            gpu.set("rank", str(node.rank))
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
