"""Topology of the machine we run on, and the fallback when nothing is known.

:func:`discover_host` reads this machine as NCCL reads it: the GPUs and their NVLinks through
NVML (the ``pynvml`` module of nvidia-ml-py), the PCIe tree, the NUMA nodes and the NICs from
sysfs, the CPU model from ``/proc/cpuinfo``. A machine without GPUs (or without a working
NVML) is its NUMA layout and NICs. :func:`flat_topology` is a star of CPU processes around one
hub, what every rank can assume about any machine.

This is the only module that reads the host's devices; everything it learns goes into the
returned :class:`~topocoll.topo.model.Topology`, and what it could not learn into its notes.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import platform
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topocoll.errors import TopologyError
from topocoll.topo import bandwidth as bw
from topocoll.topo.model import LinkKind, Node, NodeKind, Topology, TopologyBuilder, natural_key
from topocoll.topo.nccl_xml import parse_link_speed

log = logging.getLogger(__name__)

#: Id of the hub node of a flat topology.
FLAT_HUB_ID = "hub"


def flat_topology(
    world_size: int,
    bw_bytes_per_s: float = bw.SHM_BW_BYTES_PER_S,
    latency_s: float = bw.latency_s(LinkKind.SHM),
    name: str = "flat",
) -> Topology:
    """``world_size`` CPU processes joined through one shared-memory hub.

    Node ``"host{i}"`` (kind ``host``) carries rank ``i``; every host has a full-duplex
    ``shm`` link to the hub ``"hub"`` (kind ``cpu``). This is the topology to assume when
    nothing better is known: every pair of ranks is two equal hops apart.

    Parameters
    ----------
    world_size : int
        Number of ranks (>= 1).
    bw_bytes_per_s : float
        Bandwidth of each host-hub link, one direction. The default,
        :data:`topocoll.topo.bandwidth.SHM_BW_BYTES_PER_S` (12 GB/s), is NCCL's effective
        figure for paths through host memory; since all links are equal it only scales
        predicted times. Pass a measured value to predict real ones.
    latency_s : float
        Latency of each link (default: the shared-memory figure of the bandwidth table).
    name : str
        Name of the topology.

    Raises
    ------
    TopologyError
        ``world_size`` < 1 or a bandwidth/latency out of range.

    Examples
    --------
    >>> flat_topology(4).compute_nodes()
    ('host0', 'host1', 'host2', 'host3')
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise TopologyError(f"world_size must be an integer >= 1, got {world_size!r}")
    builder = TopologyBuilder(name=name)
    builder.add_node(Node(FLAT_HUB_ID, NodeKind.CPU, name="shared memory"))
    for rank in range(world_size):
        builder.add_node(Node(f"host{rank}", NodeKind.HOST, rank=rank))
        builder.add_link(f"host{rank}", FLAT_HUB_ID, LinkKind.SHM, bw_bytes_per_s, latency_s)
    builder.note("flat fallback: link bandwidth and latency are assumed, not measured")
    return builder.build()


def normalize_busid(busid: str | bytes) -> str:
    """A PCI bus id as sysfs writes it: lower case ``dddd:bb:dd.f``.

    NVML reports an 8-digit domain (``00000000:07:00.0``); sysfs uses 4 digits.
    """
    text = busid.decode() if isinstance(busid, bytes) else str(busid)
    text = text.strip().lower().rstrip("\x00")
    match = re.fullmatch(r"(?:([0-9a-f]+):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])", text)
    if not match:
        return text
    domain, bus, dev, fn = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"



# ------------------------------------------------------------------------------ discovery
#: Where ``discover_host`` looks, relative to the sysfs root.
_PCI_DEVICES = ("bus", "pci", "devices")
_NUMA_NODES = ("devices", "system", "node")
_INFINIBAND = ("class", "infiniband")
_NET = ("class", "net")

#: PCI class prefixes (the ``class`` file, ``0xCCSSPP``): network controllers, NVSwitches.
_NIC_CLASS_PREFIX = "0x02"
_NVSWITCH_CLASS_PREFIX = "0x0680"
_NVIDIA_VENDOR = "0x10de"

_BDF = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_HIDDEN_BUSID = re.compile(r"f+:f+:f+\.[0-9a-f]")

#: ``platform.machine()`` spellings and the ``arch`` NCCL writes for them.
_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64", "ppc64": "ppc64"}


@dataclass(frozen=True, slots=True)
class _Gpu:
    """What NVML says about one GPU."""

    index: int
    busid: str
    name: str | None
    sm: int | None
    nvlinks: tuple[tuple[str, str], ...]  # (remote bus id, "gpu"/"switch"/"unknown"/other) per active link


@dataclass(frozen=True, slots=True)
class _Port:
    """One network port: an InfiniBand port or a network interface of a PCI function."""

    name: str
    port: int
    busid: str
    speed_bits_per_s: float | None


class _Notes:
    """What discovery could not learn, in the order it found out."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, text: str) -> None:
        if text not in self.items:
            log.info("discovery: %s", text)
            self.items.append(text)


def discover_host(
    sysfs_root: str | Path = "/sys",
    proc_root: str | Path = "/proc",
    *,
    host_id: str | None = None,
    nvml: Any = None,
    arch: str | None = None,
) -> Topology:
    """The topology of this machine, read the way NCCL reads it.

    - **CPUs**: one ``cpu<n>`` per NUMA node in ``/sys/devices/system/node`` (one ``cpu0``
      when there is none), named from ``/proc/cpuinfo``; every pair is joined by an SMP link
      of NCCL's figure for the CPU model.
    - **GPUs** from NVML (``pynvml`` of nvidia-ml-py), ``gpu<i>`` with rank ``i`` in bus-id
      order (NVML's default). NVLinks follow NCCL's rules: every link index the library knows
      (``NVML_NVLINK_MAX_LINKS``), only links that can carry P2P traffic
      (``NVML_NVLINK_CAP_P2P_SUPPORTED``) and are up (the ``NVML_FI_DEV_NVLINK_GET_STATE``
      field on sm >= 90, ``nvmlDeviceGetNvLinkState`` before); the remote end is asked
      (``nvmlDeviceGetNvLinkRemoteDeviceType``): a GPU is joined directly, an NVSwitch becomes
      ``nvswitch<i>`` per bus id, and the all-``f`` bus id of switches a VM hides becomes one
      ``nvswitch`` without a bus id.
    - **The PCIe tree** from sysfs: every GPU, NIC and NVSwitch is joined to the PCIe switch
      above it, and each switch to the one above, up to the CPU of its NUMA node, as NCCL
      walks ``/sys/devices`` (two levels per switch: the downstream port is skipped, the
      upstream port is the switch); each link has the smaller of the device's and its port's
      ``max_link_speed`` x ``max_link_width``.
    - **NICs**: every PCI network controller, with its ports from ``/sys/class/infiniband``
      (active ports, rate) and ``/sys/class/net`` (interfaces of PCI devices without an
      InfiniBand device, speed); a card with several ports is a ``pcie_switch`` with one
      ``nic`` per port, each with a ``net`` link to a ``net<i>`` placeholder (as the NCCL XML
      importer does). Virtual interfaces (no PCI device) are left out.

    A machine without GPUs, or where NVML is missing or fails, is its NUMA layout and NICs.
    Whatever could not be learnt is in the notes (and logged as a warning); only programming
    errors propagate.

    Parameters
    ----------
    sysfs_root, proc_root : path
        Roots of sysfs and procfs (tests pass fake trees).
    host_id : str, optional
        ``host_id`` of every node (default: this machine's host name).
    nvml : module, optional
        The ``pynvml`` module to use (default: import it; tests pass one whose library is fake).
    arch : str, optional
        CPU architecture (default: ``platform.machine()``).

    Returns
    -------
    Topology
        Named ``discovered:<host_id>``.
    """
    sysfs, proc = Path(sysfs_root), Path(proc_root)
    host = host_id if host_id is not None else socket.gethostname()
    notes = _Notes()
    gpus = _nvml_gpus(nvml, notes)
    builder = TopologyBuilder(name=f"discovered:{host}")
    _Machine(sysfs, proc, host, arch or platform.machine(), notes, builder).build(gpus)
    for text in notes.items:
        builder.note(text)
    return builder.build()


# ------------------------------------------------------------------------------------ NVML
def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _nvml_gpus(nvml: Any, notes: _Notes) -> list[_Gpu]:
    """Every GPU NVML sees, sorted by bus id; [] (with a note) when NVML is not usable."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            notes.add("nvidia-ml-py (pynvml) is not installed: no GPUs discovered")
            return []
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        notes.add(f"NVML did not start ({exc}): no GPUs discovered")
        return []
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                gpus.append(_nvml_gpu(nvml, index))
            except nvml.NVMLError as exc:
                notes.add(f"GPU {index} (NVML index): {exc}; left out")
        return sorted(gpus, key=lambda gpu: gpu.busid)
    except nvml.NVMLError as exc:
        notes.add(f"NVML could not list the GPUs ({exc}): no GPUs discovered")
        return []
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:  # shutting down must not hide the result
            log.debug("nvmlShutdown failed: %s", exc)


def _optional(nvml: Any, call: Any, *args: Any) -> Any:
    """The result of an NVML query, or None when the device does not answer it."""
    try:
        return call(*args)
    except nvml.NVMLError as exc:  # NotSupported, InvalidArgument (no such link), ...
        log.debug("%s%s: %s", getattr(call, "__name__", call), args[1:], exc)
        return None


def _nvml_gpu(nvml: Any, index: int) -> _Gpu:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    busid = normalize_busid(nvml.nvmlDeviceGetPciInfo(handle).busId)
    capability = _optional(nvml, nvml.nvmlDeviceGetCudaComputeCapability, handle)
    sm = capability[0] * 10 + capability[1] if capability else None
    name = _optional(nvml, nvml.nvmlDeviceGetName, handle)
    links = []
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        p2p = _optional(nvml, nvml.nvmlDeviceGetNvLinkCapability, handle, link, nvml.NVML_NVLINK_CAP_P2P_SUPPORTED)
        if not p2p:
            continue
        if not _nvlink_active(nvml, handle, link, sm):
            continue
        remote = _optional(nvml, nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        if remote is None:
            continue
        kind = _optional(nvml, nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
        kinds = {
            nvml.NVML_NVLINK_DEVICE_TYPE_GPU: "gpu",
            nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH: "switch",
            nvml.NVML_NVLINK_DEVICE_TYPE_IBMNPU: "IBM NPU",
            nvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN: "unknown",
            None: "unknown",  # drivers without the call
        }
        links.append((normalize_busid(remote.busId), kinds.get(kind, f"type {kind}")))
    return _Gpu(index, busid, None if name is None else _text(name), sm, tuple(links))


#: Compute capability from which NVML reports link state only as a field value (NCCL's rule).
_FIELD_VALUE_SM = 90


def _nvlink_active(nvml: Any, handle: Any, link: int, sm: int | None) -> bool:
    if sm is not None and sm >= _FIELD_VALUE_SM:
        values = _optional(nvml, nvml.nvmlDeviceGetFieldValues, handle, [(nvml.NVML_FI_DEV_NVLINK_GET_STATE, link)])
        if not values or values[0].nvmlReturn != nvml.NVML_SUCCESS:
            return False
        return values[0].value.uiVal == nvml.NVML_FEATURE_ENABLED
    return _optional(nvml, nvml.nvmlDeviceGetNvLinkState, handle, link) == nvml.NVML_FEATURE_ENABLED


# ----------------------------------------------------------------------------------- sysfs
def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def _cpu_fields(proc: Path) -> dict[str, str]:
    """``vendor_id``, ``cpu family`` and ``model`` of the first processor in ``cpuinfo``."""
    fields: dict[str, str] = {}
    for line in (_read(proc / "cpuinfo") or "").splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        if key.strip() in ("vendor_id", "cpu family", "model"):
            fields.setdefault(key.strip(), value.strip())
    return fields


class _Machine:
    """One discovery: the sysfs tree read into ``builder``."""

    def __init__(self, sysfs: Path, proc: Path, host: str, arch: str, notes: _Notes, builder: TopologyBuilder):
        self.sysfs, self.proc, self.host, self.notes, self.builder = sysfs, proc, host, notes, builder
        self.arch = _ARCH.get(arch.lower(), arch)
        self.devices_root = os.path.realpath(sysfs / "devices")
        self.numas = self._numa_nodes()
        self.parent_of: dict[str, str] = {}  # node key -> parent key ("cpu<n>" or a bus id)
        self.pcie_bw: dict[str, float] = {}  # bus id -> bandwidth of its link upwards
        self.numa_of: dict[str, int] = {}  # bus id -> NUMA node of the CPU it hangs off

    # ------------------------------------------------------------------ CPUs and NUMA
    def _numa_nodes(self) -> list[int]:
        root = self.sysfs.joinpath(*_NUMA_NODES)
        try:
            names = [p.name for p in root.iterdir()]
        except OSError:
            names = []
        numas = sorted(int(name[4:]) for name in names if re.fullmatch(r"node[0-9]+", name))
        if not numas:
            self.notes.add("no NUMA nodes in sysfs: one CPU node assumed")
            return [0]
        return numas

    def _cpus(self) -> None:
        fields = _cpu_fields(self.proc)
        vendor = fields.get("vendor_id")
        family = int(fields["cpu family"]) if fields.get("cpu family", "").isdigit() else None
        model = int(fields["model"]) if fields.get("model", "").isdigit() else None
        parts = [vendor, self.arch]
        if family is not None:
            parts += ["family", str(family)]
        if model is not None:
            parts += ["model", str(model)]
        name = " ".join(p for p in parts if p) or None
        for numa in self.numas:
            self.builder.add_node(Node(f"cpu{numa}", NodeKind.CPU, host_id=self.host, numa=numa, name=name))
        if len(self.numas) < 2:
            return
        smp = bw.smp_bw_for_cpu(vendor, family, model, self.arch)
        if smp is None:
            smp = bw.SMP_BW_BYTES_PER_S[bw.SMP_DEFAULT_KEY]
            self.notes.add(
                f"CPU vendor unknown ({vendor!r} in cpuinfo): inter-socket bandwidth assumed {smp / bw.GB:g} GB/s"
            )
        self.builder.add_full_mesh([f"cpu{numa}" for numa in self.numas], LinkKind.SMP, smp, bw.latency_s(LinkKind.SMP))

    # ------------------------------------------------------------------------ PCIe tree
    def _path(self, busid: str) -> list[str] | None:
        """Components of a PCI device's real path below ``/sys/devices``, or None."""
        real = os.path.realpath(self.sysfs.joinpath(*_PCI_DEVICES, busid))
        relative = os.path.relpath(real, self.devices_root)
        if relative.startswith(os.pardir) or not os.path.isdir(real):
            return None
        return relative.split(os.sep)

    def _link_bw(self, device: Path, busid: str) -> float:
        """Smaller of the device's and its port's max speed x width (NCCL's rule)."""

        def lowest(name: str, parse: Any) -> float | None:
            values = [parse(_read(d / name)) for d in (device, device.parent)]
            known = [v for v in values if v]
            return min(known) if known else None

        rate = lowest("max_link_speed", parse_link_speed)
        width = lowest("max_link_width", lambda text: int(text) if text and text.isdigit() else None)
        if rate is None or width is None:
            self.notes.add(f"{busid}: PCIe max_link_speed/max_link_width not readable: assumed Gen3 x16 (NCCL's fallback)")
        generation = bw.pcie_generation_for_rate(rate) if rate is not None else bw.PCIE_DEFAULT_GENERATION
        return bw.pcie_bw_bytes_per_s(generation, int(width) if width is not None else bw.PCIE_DEFAULT_WIDTH)

    def place(self, busid: str) -> bool:
        """Record the PCIe path from ``busid`` up to its CPU; False when sysfs lacks the device."""
        if busid in self.parent_of:
            return True
        parts = self._path(busid)
        if parts is None or parts[-1] != busid:
            return False
        child, index = busid, len(parts) - 1
        while True:
            self.pcie_bw[child] = self._link_bw(Path(self.devices_root, *parts[: index + 1]), child)
            if index >= 2 and _BDF.fullmatch(parts[index - 1]) and _BDF.fullmatch(parts[index - 2]):
                parent = parts[index - 2]  # skip the downstream port: the upstream one is the switch
                self.parent_of[child] = parent
                if parent in self.parent_of:
                    return True
                child, index = parent, index - 2
                continue
            numa = _read_int(Path(self.devices_root, *parts[: index + 1], "numa_node"))
            if numa is None or numa not in self.numas:
                if len(self.numas) > 1:
                    self.notes.add(f"{child}: NUMA node unknown (sysfs numa_node missing or -1): placed on cpu{self.numas[0]}")
                numa = self.numas[0]
            self.parent_of[child] = f"cpu{numa}"
            return True

    def cpu_of(self, busid: str) -> str:
        """The CPU node a placed device hangs off."""
        key = busid
        while key in self.parent_of:
            key = self.parent_of[key]
        return key

    # --------------------------------------------------------------------- PCI devices
    def _pci_classes(self) -> dict[str, tuple[str, str]]:
        """(class, vendor) of every PCI device in sysfs, by bus id."""
        root = self.sysfs.joinpath(*_PCI_DEVICES)
        try:
            entries = sorted(p.name for p in root.iterdir())
        except OSError:
            self.notes.add(f"{root.relative_to(self.sysfs)} not readable: no PCI devices seen")
            return {}
        out = {}
        for busid in entries:
            pci_class = (_read(root / busid / "class") or "").lower()
            out[normalize_busid(busid)] = (pci_class, (_read(root / busid / "vendor") or "").lower())
        return out

    def _pci_of(self, link: Path) -> str | None:
        """Bus id of the PCI device at or above the sysfs directory ``link`` points to."""
        if not link.exists():
            return None
        for part in reversed(Path(os.path.realpath(link)).parts):
            if _BDF.fullmatch(part):
                return part
        return None

    def _ports(self) -> dict[str, list[_Port]]:
        """Network ports by PCI bus id: InfiniBand ports, then plain network interfaces."""
        found: dict[str, list[_Port]] = {}
        ib_root = self.sysfs.joinpath(*_INFINIBAND)
        for dev in sorted(ib_root.iterdir() if ib_root.is_dir() else [], key=lambda p: natural_key(p.name)):
            busid = self._pci_of(dev / "device")
            if busid is None:
                self.notes.add(f"InfiniBand device {dev.name} has no PCI device in sysfs: left out")
                continue
            port_dir = dev / "ports"
            numbers = sorted(int(p.name) for p in port_dir.iterdir() if p.name.isdigit()) if port_dir.is_dir() else []
            for number in numbers:
                state = _read(port_dir / str(number) / "state")
                if state is not None and not state.partition(":")[2].strip().upper().startswith("ACTIVE"):
                    self.notes.add(f"{dev.name} port {number} is {state.partition(':')[2].strip() or state}: left out")
                    continue
                match = re.match(r"\s*([0-9.]+)\s*Gb/sec", _read(port_dir / str(number) / "rate") or "")
                rate = float(match.group(1)) * 1e9 if match else None
                found.setdefault(busid, []).append(_Port(dev.name, number, busid, rate))
        with_ib = set(found)
        net_root = self.sysfs.joinpath(*_NET)
        for iface in sorted(net_root.iterdir() if net_root.is_dir() else [], key=lambda p: natural_key(p.name)):
            busid = self._pci_of(iface / "device")  # virtual interfaces (lo, bridges, veths) have none
            if busid is None or busid in with_ib:
                continue
            speed_mbit = _read_int(iface / "speed")  # -1 while the link is down, and on virtual NICs
            if speed_mbit is not None and speed_mbit > 0:
                rate = speed_mbit * 1e6
            elif _read(iface / "operstate") == "down":
                rate = None
            else:  # up but silent (virtio and other virtual NICs): what NCCL's socket transport assumes
                rate = bw.SOCKET_DEFAULT_SPEED_BITS_PER_S
                self.notes.add(
                    f"{iface.name}: network speed not readable: assumed {rate / 1e9:g} Gb/s (NCCL's socket default)"
                )
            found.setdefault(busid, []).append(_Port(iface.name, 1, busid, rate))
        return found

    # --------------------------------------------------------------------------- build
    def build(self, gpus: list[_Gpu]) -> None:
        """Add every node and link to the builder."""
        self._cpus()
        classes = self._pci_classes()
        ports = self._ports()
        gpu_busids = [gpu.busid for gpu in gpus]
        nics = sorted(set(ports) | {b for b, (c, _) in classes.items() if c.startswith(_NIC_CLASS_PREFIX)})
        nvswitch_pci = sorted(b for b, (c, _) in classes.items() if c.startswith(_NVSWITCH_CLASS_PREFIX))
        if not gpus:
            unseen = [b for b, (c, v) in classes.items() if c.startswith("0x03") and v == _NVIDIA_VENDOR]
            if unseen:
                self.notes.add(f"{len(unseen)} NVIDIA GPU(s) in sysfs ({', '.join(unseen[:4])}) but none from NVML: left out")
        for busid in gpu_busids:
            if not self.place(busid):
                self.notes.add(f"GPU {busid} not in sysfs: attached to cpu{self.numas[0]} by an assumed Gen3 x16 link")
                self.parent_of[busid] = f"cpu{self.numas[0]}"
                self.pcie_bw[busid] = bw.pcie_bw_bytes_per_s(bw.PCIE_DEFAULT_GENERATION, bw.PCIE_DEFAULT_WIDTH)
        for busid in nics + nvswitch_pci:
            self.place(busid)
        cards = [b for b in nics if len(ports.get(b, ())) > 1]
        devices = set(gpu_busids) | set(nics) | set(nvswitch_pci)
        switches = sorted({b for b in self.parent_of if b not in devices} | set(cards))
        ids = {busid: f"pcie_switch{i}" for i, busid in enumerate(switches)}
        ids.update({busid: f"gpu{i}" for i, busid in enumerate(gpu_busids)})
        nvswitch_ids, hidden_id = self._nvswitch_ids(gpus, nvswitch_pci)
        ids.update(nvswitch_ids)

        def up(busid: str) -> str:
            parent = self.parent_of[busid]
            return ids.get(parent, parent)

        for busid in switches:
            self._add(Node(ids[busid], NodeKind.PCIE_SWITCH, busid=busid), up(busid), self.pcie_bw[busid])
        for rank, (gpu, busid) in enumerate(zip(gpus, gpu_busids)):
            node = Node(ids[busid], NodeKind.GPU, rank=rank, busid=busid, name=gpu.name, index=gpu.index, sm=gpu.sm)
            self._add(node, up(busid), self.pcie_bw[busid])
        for busid in nvswitch_pci:
            if busid in self.parent_of:
                self._add(Node(ids[busid], NodeKind.NVSWITCH, busid=busid), up(busid), self.pcie_bw[busid])
        for busid, node_id in nvswitch_ids.items():
            if busid not in self.parent_of:
                self.builder.add_node(Node(node_id, NodeKind.NVSWITCH, host_id=self.host, busid=busid))
        if hidden_id is not None:
            self.builder.add_node(Node(hidden_id, NodeKind.NVSWITCH, host_id=self.host))
        self._add_nics(nics, ports, ids, up)
        self._add_nvlinks(gpus, ids, hidden_id)

    def _add(self, node: Node, parent: str, bw_bytes_per_s: float) -> None:
        """Add ``node`` (on this host, on its parent's NUMA node) and its PCIe link up."""
        numa = int(self.cpu_of(node.busid)[len("cpu"):]) if node.busid in self.parent_of else None
        node = dataclasses.replace(node, host_id=self.host, numa=numa)
        self.builder.add_node(node)
        self.builder.add_link(node.id, parent, LinkKind.PCIE, bw_bytes_per_s, bw.latency_s(LinkKind.PCIE))

    def _add_nics(self, nics: list[str], ports: dict[str, list[_Port]], ids: dict[str, str], up: Any) -> None:
        entries = []  # (bus id, port or None)
        for busid in nics:
            if busid not in self.parent_of:
                continue
            entries += [(busid, port) for port in ports.get(busid, [])] or [(busid, None)]
        entries.sort(key=lambda e: (e[0], natural_key(e[1].name if e[1] else ""), e[1].port if e[1] else 0))
        for index, (busid, port) in enumerate(entries):
            node_id = f"nic{index}"
            parent = ids[busid] if busid in ids else up(busid)  # a card with several ports is a switch
            self._add(Node(node_id, NodeKind.NIC, busid=busid, name=port.name if port else None), parent, self.pcie_bw[busid])
            if port is None or port.speed_bits_per_s is None:
                what = port.name if port else busid
                self.notes.add(f"{what}: link down or no speed readable: no network link added")
                continue
            net_id = f"net{index}"
            self.builder.add_node(Node(net_id, NodeKind.NET_SWITCH))
            self.builder.add_link(
                node_id, net_id, LinkKind.NET, bw.net_bw_bytes_per_s(port.speed_bits_per_s), bw.latency_s(LinkKind.NET)
            )

    def _nvswitch_ids(self, gpus: list[_Gpu], nvswitch_pci: list[str]) -> tuple[dict[str, str], str | None]:
        """Ids of the NVSwitches (by bus id) and of the hidden one, if any NVLink ends there."""
        gpu_busids = {gpu.busid for gpu in gpus}
        busids, hidden = set(nvswitch_pci), False
        for gpu in gpus:
            for remote, kind in gpu.nvlinks:
                if _HIDDEN_BUSID.fullmatch(remote):
                    hidden = True
                elif self._remote_kind(remote, kind, gpu_busids) == "switch":
                    busids.add(remote)
        ids = {busid: f"nvswitch{i}" for i, busid in enumerate(sorted(busids))}
        return ids, f"nvswitch{len(ids)}" if hidden else None

    def _remote_kind(self, remote: str, kind: str, gpu_busids: set[str]) -> str:
        """``gpu``, ``switch`` or what else NVML says is at the far end of an NVLink.

        Where the driver cannot say, a bus id of a GPU is that GPU and any other a switch (the
        only other NVLink ends on x86 machines).
        """
        if kind == "unknown":
            return "gpu" if remote in gpu_busids else "switch"
        return kind

    def _add_nvlinks(self, gpus: list[_Gpu], ids: dict[str, str], hidden_id: str | None) -> None:
        gpu_busids = {gpu.busid for gpu in gpus}
        latency = bw.latency_s(LinkKind.NVLINK)
        directed: dict[tuple[str, str], int] = {}
        per_link: dict[str, float] = {}
        for gpu in gpus:
            gid = ids[gpu.busid]
            if gpu.sm is not None:
                per_link[gid] = bw.nvlink_bw_bytes_per_s(bw.nvlink_generation_for_sm(gpu.sm))
            else:
                per_link[gid] = bw.nvlink_bw_bytes_per_s(bw.NVLINK_DEFAULT_GENERATION)
                if gpu.nvlinks:
                    self.notes.add(f"{gid}: compute capability unknown: NVLink generation {bw.NVLINK_DEFAULT_GENERATION} assumed")
            counts: dict[str, int] = {}
            for remote, kind in gpu.nvlinks:
                what = self._remote_kind(remote, kind, gpu_busids)
                if remote == gpu.busid:
                    self.notes.add(f"{gid}: an NVLink reports the GPU itself as its far end (a VM artifact): ignored")
                elif _HIDDEN_BUSID.fullmatch(remote) and hidden_id is not None:
                    counts[hidden_id] = counts.get(hidden_id, 0) + 1
                elif what == "gpu" and remote in gpu_busids:
                    directed[(gid, ids[remote])] = directed.get((gid, ids[remote]), 0) + 1
                elif what == "switch":
                    counts[ids[remote]] = counts.get(ids[remote], 0) + 1
                else:
                    self.notes.add(f"{gid}: NVLink to {remote} ({what}) is not a GPU or NVSwitch seen here: ignored")
            for switch, count in counts.items():
                self.builder.add_link(gid, switch, LinkKind.NVLINK, count * per_link[gid], latency, count)
        # each GPU reports its own end of a GPU-GPU link: one direction per report
        for (a, b), count in directed.items():
            self.builder.add_link(a, b, LinkKind.NVLINK, count * per_link[a], latency, count, duplex=(b, a) not in directed)
        if gpus and not directed and not any(gpu.nvlinks for gpu in gpus):
            self.notes.add("NVML reports no active NVLink")
