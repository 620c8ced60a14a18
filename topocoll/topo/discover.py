"""Topology of the machine we run on, and the fallback when nothing is known.

:func:`discover_host` reads the GPUs and their NVLinks through NVML (the ``pynvml`` module of
nvidia-ml-py), the NUMA node of every PCI device from sysfs, and InfiniBand adapters from
``/sys/class/infiniband``. It returns ``None`` when NVML is not installed, does not start, or
sees no GPU; callers then use :func:`flat_topology`, a star of CPU processes around one hub,
which is what every rank can assume about any machine.

This is the only module that reads the host; everything it learns goes into the returned
:class:`~topocoll.topo.model.Topology`, and what it could not learn goes into its notes.
"""

from __future__ import annotations

import importlib
import logging
import math
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topocoll.errors import TopologyError
from topocoll.topo import bandwidth as bw
from topocoll.topo.model import LinkKind, Node, NodeKind, Topology, TopologyBuilder

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


@dataclass(frozen=True, slots=True)
class _Gpu:
    index: int
    busid: str
    name: str
    sm: int | None
    pcie_generation: int | None
    pcie_width: int | None
    nvlinks: tuple[str, ...]  # remote busid of each active link


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


def discover_host(sysfs_root: str | Path = "/sys", host_id: str | None = None) -> Topology | None:
    """The GPU topology of this machine from NVML and sysfs, or ``None`` when unknown.

    GPUs become ``"gpu{i}"`` with rank ``i`` (NVML index order); an NVLink whose remote end is
    another GPU joins the two directly (parallel links merged with a count), any other remote
    end (an NVSwitch, possibly reported with a placeholder bus id) becomes an ``nvswitch`` node
    per distinct remote bus id. Each GPU hangs off the CPU of its NUMA node with a PCIe link of
    its maximum generation and width (idle GPUs train their links down, so the current values
    understate them); CPUs of different NUMA nodes are joined by an SMP link. InfiniBand
    adapters found in sysfs become NICs on the CPU of their NUMA node.

    Parameters
    ----------
    sysfs_root : path
        Root of the sysfs tree (tests pass a fake one).
    host_id : str, optional
        ``host_id`` of every node (default: this machine's host name).

    Returns
    -------
    Topology or None
        ``None`` when nvidia-ml-py is not installed, NVML fails to start, or there is no GPU.
    """
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        log.info("nvidia-ml-py (pynvml) is not installed; no GPU discovery")
        return None
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError and its many subclasses, or a missing library
        log.info("NVML did not start (%s); no GPU discovery", exc)
        return None
    try:
        gpus = _read_gpus(nvml)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception as exc:  # shutting down must not hide the result
            log.debug("nvmlShutdown failed: %s", exc)
    if not gpus:
        log.info("NVML reports no GPU")
        return None
    return _assemble(gpus, Path(sysfs_root), host_id if host_id is not None else socket.gethostname())


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _optional(call: Any, *args: Any) -> Any:
    """The result of an NVML query, or None when the device does not support it."""
    try:
        return call(*args)
    except Exception as exc:  # NVMLError_NotSupported and friends
        log.debug("%s%s failed: %s", getattr(call, "__name__", call), args, exc)
        return None


def _read_gpus(nvml: Any) -> list[_Gpu]:
    gpus = []
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        pci = nvml.nvmlDeviceGetPciInfo(handle)
        busid = normalize_busid(getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", ""))
        capability = _optional(nvml.nvmlDeviceGetCudaComputeCapability, handle)
        sm = capability[0] * 10 + capability[1] if capability else None
        remotes = []
        for link in range(max_links):
            state = _optional(nvml.nvmlDeviceGetNvLinkState, handle, link)
            if state is None:
                continue
            if state != enabled:
                continue
            remote = _optional(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            if remote is not None:
                remotes.append(normalize_busid(getattr(remote, "busId", "")))
        gpus.append(
            _Gpu(
                index=index,
                busid=busid,
                name=_text(_optional(nvml.nvmlDeviceGetName, handle) or "GPU"),
                sm=sm,
                pcie_generation=_optional(nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
                pcie_width=_optional(nvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
                nvlinks=tuple(remotes),
            )
        )
    return gpus


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _numa_of(sysfs: Path, busid: str) -> int | None:
    value = _read_int(sysfs / "bus" / "pci" / "devices" / busid / "numa_node")
    return value if value is not None and value >= 0 else None


def _inter_socket_bw() -> tuple[float, str]:
    """Inter-socket bandwidth for this machine's CPUs (from ``/proc/cpuinfo``) and its basis."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("vendor_id", "cpu family", "model") and key not in fields:
                fields[key] = value.strip()
            if not line.strip() and fields:
                break
    except OSError:
        pass
    vendor = fields.get("vendor_id")
    family = int(fields["cpu family"]) if fields.get("cpu family", "").isdigit() else None
    model = int(fields["model"]) if fields.get("model", "").isdigit() else None
    value = bw.smp_bw_for_cpu(vendor, family, model)
    if value is None:
        return bw.SMP_BW_BYTES_PER_S[bw.SMP_DEFAULT_KEY], f"unknown CPU vendor {vendor!r}: {bw.SMP_DEFAULT_KEY} figure"
    return value, f"table figure for {vendor}"


def _assemble(gpus: list[_Gpu], sysfs: Path, host_id: str) -> Topology:
    builder = TopologyBuilder(name=f"discovered:{host_id}")
    gpu_by_busid = {gpu.busid: f"gpu{gpu.index}" for gpu in gpus}
    numa_of_gpu = {gpu.index: _numa_of(sysfs, gpu.busid) for gpu in gpus}
    if any(numa is None for numa in numa_of_gpu.values()):
        builder.note("NUMA node unknown for some GPUs (sysfs numa_node missing or -1): placed on cpu0")
    nics = _read_ib_nics(sysfs)
    sockets = sorted({numa or 0 for numa in numa_of_gpu.values()} | {nic[2] or 0 for nic in nics})
    for s in sockets:
        builder.add_node(Node(f"cpu{s}", NodeKind.CPU, host_id=host_id, numa=s))
    if len(sockets) > 1:
        smp_bw, basis = _inter_socket_bw()
        builder.note(f"inter-socket bandwidth not measured ({basis})")
        for i, a in enumerate(sockets):
            for b in sockets[i + 1 :]:
                builder.add_link(f"cpu{a}", f"cpu{b}", LinkKind.SMP, smp_bw, bw.latency_s(LinkKind.SMP))

    switch_ids: dict[str, str] = {}
    for gpu in gpus:
        gid = f"gpu{gpu.index}"
        numa = numa_of_gpu[gpu.index]
        builder.add_node(Node(gid, NodeKind.GPU, rank=gpu.index, host_id=host_id, numa=numa, busid=gpu.busid, name=gpu.name))
        if gpu.pcie_generation in bw.PCIE_RATE_GT_PER_S and gpu.pcie_width:
            pcie = bw.pcie_bw_bytes_per_s(gpu.pcie_generation, gpu.pcie_width)
        else:
            pcie = bw.pcie_bw_bytes_per_s(3, 16)
            builder.note(f"{gid}: PCIe generation/width not reported; assumed Gen3 x16")
        builder.add_link(gid, f"cpu{numa or 0}", LinkKind.PCIE, pcie, bw.latency_s(LinkKind.PCIE))

    for gpu in gpus:
        if not gpu.nvlinks:
            continue
        if gpu.sm is not None:
            per_link = bw.nvlink_bw_bytes_per_s(bw.nvlink_generation_for_sm(gpu.sm))
        else:
            per_link = bw.nvlink_bw_bytes_per_s(bw.nvlink_generation_for_name(gpu.name))
        gid = f"gpu{gpu.index}"
        for remote in gpu.nvlinks:
            peer = gpu_by_busid.get(remote)
            if peer is not None:
                if peer == gid:
                    builder.note(f"{gid}: an NVLink reports the GPU itself as remote end; ignored")
                    continue
                # each GPU reports its own end of the link: add one direction per report
                builder.add_link(gid, peer, LinkKind.NVLINK, per_link, bw.latency_s(LinkKind.NVLINK), duplex=False)
                continue
            if remote not in switch_ids:
                switch_ids[remote] = f"nvswitch{len(switch_ids)}"
                builder.add_node(Node(switch_ids[remote], NodeKind.NVSWITCH, host_id=host_id, busid=remote, name="NVSwitch"))
            builder.add_link(gid, switch_ids[remote], LinkKind.NVLINK, per_link, bw.latency_s(LinkKind.NVLINK))

    for index, (dev, busid, numa, rate_bits_per_s, pcie) in enumerate(nics):
        nid = f"nic{index}"
        label = dev if rate_bits_per_s is None else f"{dev} {rate_bits_per_s / 1e9:g} Gb/s"
        builder.add_node(Node(nid, NodeKind.NIC, host_id=host_id, numa=numa, busid=busid, name=label))
        if pcie is None:
            pcie = bw.pcie_bw_bytes_per_s(3, 16)
            builder.note(f"{nid} ({dev}): PCIe speed/width not readable; assumed Gen3 x16")
        builder.add_link(nid, f"cpu{numa or 0}", LinkKind.PCIE, pcie, bw.latency_s(LinkKind.PCIE))
        if rate_bits_per_s is None:
            builder.note(f"{nid} ({dev}): port rate not readable")
    if not switch_ids and not any(gpu.nvlinks for gpu in gpus):
        builder.note("NVML reports no active NVLink")
    builder.note("PCIe switches are not walked: GPUs and NICs hang directly off their NUMA node's CPU")
    return builder.build()


def _read_ib_nics(sysfs: Path) -> list[tuple[str, str | None, int | None, float | None, float | None]]:
    """(device, busid, numa, port rate bits/s, PCIe bandwidth) of each InfiniBand adapter."""
    root = sysfs / "class" / "infiniband"
    if not root.is_dir():
        return []
    found = []
    for dev in sorted(root.iterdir(), key=lambda p: p.name):
        device = dev / "device"
        busid = normalize_busid(device.resolve().name) if device.exists() else None
        numa = _read_int(device / "numa_node")
        numa = numa if numa is not None and numa >= 0 else None
        rate = None
        try:
            match = re.match(r"\s*([\d.]+)\s*Gb/sec", (dev / "ports" / "1" / "rate").read_text())
            rate = float(match.group(1)) * 1e9 if match else None
        except OSError:
            pass
        pcie = _pcie_of(device)
        found.append((dev.name, busid, numa, rate, pcie))
    return found


def _pcie_of(device: Path) -> float | None:
    """PCIe bandwidth of a device from its sysfs ``max_link_speed``/``max_link_width``."""
    try:
        speed = (device / "max_link_speed").read_text()
        width = int((device / "max_link_width").read_text().strip())
        gt = float(re.match(r"\s*([\d.]+)", speed).group(1))  # type: ignore[union-attr]
        if width >= 1 and math.isfinite(gt):
            return bw.pcie_bw_bytes_per_s(bw.pcie_generation_for_rate(gt), width)
    except (OSError, ValueError, AttributeError):
        pass
    return None
