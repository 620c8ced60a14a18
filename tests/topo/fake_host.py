"""A fake machine for discovery tests: a sysfs tree, a ``/proc/cpuinfo`` and an NVML library.

:func:`host_from_nccl_xml` builds the machine an NCCL topology file describes, the way Linux
and the driver would show it:

- every ``<pci>`` becomes a device directory under ``/sys/devices`` with its ``class``,
  ``vendor``, ``max_link_speed``, ``max_link_width`` and ``numa_node``, behind a (generated)
  port between it and its parent, as PCIe switches appear in sysfs (upstream port, downstream
  port, device); ``/sys/bus/pci/devices/<busid>`` links to it;
- every ``<net>`` becomes an InfiniBand device (``/sys/class/infiniband/<name>``, an active port
  with its rate) or, for Ethernet names, a network interface (``/sys/class/net/<name>``, its
  speed); ``<net>`` outside any PCI device becomes a virtual interface (no ``device`` link);
- every ``<cpu>`` a NUMA node, the first one's vendor/family/model the ``cpuinfo``;
- every GPU an NVML device answering the file's NVLinks.

The NVML part is the real ``pynvml`` module of nvidia-ml-py (a private copy, so tests do not
share its caches) whose C library is replaced by :class:`FakeNvmlLibrary`: the Python wrappers,
their argument handling, ctypes structures, return types and ``NVMLError_*`` classes are the
real ones; only the C functions they call are ours, and they answer as the driver does
(``NVML_ERROR_INVALID_ARGUMENT`` past the last link, ``NVML_ERROR_NOT_SUPPORTED`` for the link
state of sm >= 90 GPUs, which answer through field values).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from xml.etree import ElementTree

SUCCESS = 0
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_GPU_IS_LOST = 15
NVSWITCH_CLASS = "0x068000"
DEVICE_TYPE_GPU, DEVICE_TYPE_SWITCH, DEVICE_TYPE_UNKNOWN = 0x00, 0x02, 0xFF


@dataclass
class FakeLink:
    """One NVLink as the driver reports it."""

    remote_busid: str  # NVML spelling, e.g. "00000000:07:00.0"
    remote_type: int
    p2p: bool = True
    active: bool = True


@dataclass
class FakeGpu:
    """One GPU as NVML reports it."""

    busid: str  # sysfs spelling, "0000:07:00.0"
    sm: int | None
    name: str = "NVIDIA Fake GPU"
    links: list[FakeLink] = field(default_factory=list)
    lost: bool = False  # nvmlDeviceGetHandleByIndex fails with GPU_IS_LOST


def nvml_busid(busid: str) -> str:
    """A bus id as NVML writes it: 8-digit upper-case domain (``00000000:07:00.0``)."""
    domain, bus, rest = busid.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"


class FakeNvmlLibrary:
    """Stands for ``libnvidia-ml.so``: the C functions pynvml calls, on ctypes arguments.

    Functions named in ``missing`` do not exist (an old driver): pynvml then raises
    ``NVMLError_FunctionNotFound``. ``init_error`` makes ``nvmlInitWithFlags`` fail.
    """

    def __init__(self, gpus: list[FakeGpu], *, field_values_from_sm: int = 90, missing=(), init_error=None):
        self.gpus = sorted(gpus, key=lambda g: g.busid)  # NVML enumerates in PCI order
        self.field_values_from_sm = field_values_from_sm
        self.missing = set(missing)
        self.init_error = init_error
        self.calls: list[str] = []
        self._structs = [ctypes.c_int(i) for i in range(len(self.gpus))]

    def __getattr__(self, name):
        if name.startswith("_") or name in self.missing or not hasattr(type(self), "c_" + name):
            raise AttributeError(name)
        method = getattr(self, "c_" + name)

        def call(*args):
            self.calls.append(name)
            return method(*args)

        return call

    # -- helpers
    def _gpu(self, handle) -> FakeGpu:
        index = ctypes.cast(handle, ctypes.POINTER(ctypes.c_int)).contents.value
        return self.gpus[index]

    def _link(self, handle, link) -> FakeLink | None:
        link = int(getattr(link, "value", link))
        links = self._gpu(handle).links
        return links[link] if 0 <= link < len(links) else None

    # -- the C API
    def c_nvmlInitWithFlags(self, flags):
        return self.init_error if self.init_error is not None else SUCCESS

    def c_nvmlShutdown(self):
        return SUCCESS

    def c_nvmlErrorString(self, result):
        return f"fake NVML error {int(getattr(result, 'value', result))}".encode()

    def c_nvmlDeviceGetCount_v2(self, count_ref):
        count_ref._obj.value = len(self.gpus)
        return SUCCESS

    def c_nvmlDeviceGetHandleByIndex_v2(self, index, device_ref):
        index = index.value
        if not 0 <= index < len(self.gpus):
            return ERROR_INVALID_ARGUMENT
        if self.gpus[index].lost:
            return ERROR_GPU_IS_LOST
        pointer = ctypes.cast(ctypes.pointer(self._structs[index]), type(device_ref._obj))
        device_ref._obj.contents = pointer.contents
        return SUCCESS

    def c_nvmlDeviceGetPciInfo_v3(self, handle, info_ref):
        busid = nvml_busid(self._gpu(handle).busid)
        info_ref._obj.busId = busid
        info_ref._obj.busIdLegacy = busid[4:]
        return SUCCESS

    def c_nvmlDeviceGetName(self, handle, buffer, length):
        buffer.value = self._gpu(handle).name.encode()
        return SUCCESS

    def c_nvmlDeviceGetCudaComputeCapability(self, handle, major_ref, minor_ref):
        sm = self._gpu(handle).sm
        if sm is None:
            return ERROR_NOT_SUPPORTED
        major_ref._obj.value, minor_ref._obj.value = divmod(sm, 10)
        return SUCCESS

    def c_nvmlDeviceGetNvLinkCapability(self, handle, link, capability, result_ref):
        found = self._link(handle, link)
        if found is None:
            return ERROR_INVALID_ARGUMENT
        result_ref._obj.value = 1 if found.p2p else 0
        return SUCCESS

    def c_nvmlDeviceGetNvLinkState(self, handle, link, result_ref):
        sm = self._gpu(handle).sm
        if sm is not None and sm >= self.field_values_from_sm:
            return ERROR_NOT_SUPPORTED
        found = self._link(handle, link)
        if found is None:
            return ERROR_INVALID_ARGUMENT
        result_ref._obj.value = 1 if found.active else 0
        return SUCCESS

    def c_nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle, link, info_ref):
        found = self._link(handle, link)
        if found is None:
            return ERROR_INVALID_ARGUMENT
        info_ref._obj.busId = found.remote_busid
        return SUCCESS

    def c_nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link, type_ref):
        found = self._link(handle, link)
        if found is None:
            return ERROR_INVALID_ARGUMENT
        type_ref._obj.value = found.remote_type
        return SUCCESS

    def c_nvmlDeviceGetFieldValues(self, handle, count, values_ref):
        from_sm = self.field_values_from_sm
        sm = self._gpu(handle).sm
        for value in values_ref._obj[: count.value]:
            found = self._link(handle, value.scopeId)
            if value.fieldId != 165 or sm is None or sm < from_sm or found is None:  # NVML_FI_DEV_NVLINK_GET_STATE
                value.nvmlReturn = ERROR_NOT_SUPPORTED
                continue
            value.nvmlReturn = SUCCESS
            value.valueType = 1  # NVML_VALUE_TYPE_UNSIGNED_INT
            value.value.uiVal = 1 if found.active else 0
        return SUCCESS


def gpus_from_nvml_record(record: dict) -> list[FakeGpu]:
    """The GPUs of a machine's NVML record (``scripts/nvml_record.py``), to replay its answers.

    A link exists where the P2P capability query answered; it is active where the link-state
    field value (or, on older GPUs, the state call) said enabled.
    """
    gpus = []
    for gpu in record["gpus"]:
        links = []
        for link in gpu["links"]:
            if isinstance(link["p2p"], dict):  # {"error": ...}: the driver knows no such link
                continue
            field = link["state_field"]
            if isinstance(field, list) and field[0]["return"] == SUCCESS:
                active = bool(field[0]["uiVal"])
            else:
                active = link["state"] == 1
            links.append(FakeLink(link["remote_pci"], link["remote_type"], bool(link["p2p"]), active))
        major, minor = gpu["cuda_compute_capability"]
        domain, bus, rest = gpu["busid"].split(":")
        busid = f"{int(domain, 16):04x}:{bus.lower()}:{rest.lower()}"
        gpus.append(FakeGpu(busid, major * 10 + minor, gpu["name"], links))
    return gpus


def fake_pynvml(library: FakeNvmlLibrary) -> ModuleType:
    """A private copy of the real ``pynvml`` module whose C library is ``library``."""
    spec = importlib.util.find_spec("pynvml")
    module = importlib.util.module_from_spec(spec)
    previous = sys.modules.get("pynvml")
    sys.modules["pynvml"] = module  # the module looks itself up there while it loads
    try:
        spec.loader.exec_module(module)
    finally:
        if previous is None:
            del sys.modules["pynvml"]
        else:
            sys.modules["pynvml"] = previous
    module.nvmlLib = library
    return module


# ----------------------------------------------------------------------------------- sysfs
@dataclass
class FakeHost:
    """Roots of a fake machine and the pieces discovery reads."""

    sysfs: Path
    proc: Path
    arch: str | None
    library: FakeNvmlLibrary

    @property
    def nvml(self) -> ModuleType:
        return fake_pynvml(self.library)


_ETHERNET = re.compile(r"(eth|en|bond|ib\d|em|p\d)", re.IGNORECASE)


class _SysfsWriter:
    def __init__(self, root: Path):
        self.sysfs = root
        self.devices = root / "devices"
        self.bus = root / "bus" / "pci" / "devices"
        self.bus.mkdir(parents=True)
        self.used: set[str] = set()
        self.generated = 0

    def port_busid(self) -> str:
        while True:
            self.generated += 1
            busid = f"fffe:{self.generated // 32:02x}:{self.generated % 32:02x}.0"
            if busid not in self.used:
                self.used.add(busid)
                return busid

    def device(self, parent: Path, busid: str, attrs: dict[str, str], numa: int | None) -> Path:
        path = parent / busid
        path.mkdir(parents=True)
        for name, attr in (("class", "class"), ("vendor", "vendor"), ("max_link_speed", "link_speed"), ("max_link_width", "link_width")):
            if attrs.get(attr):
                (path / name).write_text(attrs[attr] + "\n")
        (path / "numa_node").write_text(f"{-1 if numa is None else numa}\n")
        link = self.bus / busid
        if not link.exists():
            os.symlink(os.path.relpath(path, self.bus), link)
        return path

    def net(self, net: ElementTree.Element, device: Path | None) -> None:
        name = net.get("name")
        speed = net.get("speed")
        if device is not None and not _ETHERNET.match(name):
            port = net.get("port") or "1"
            ports = self.sysfs / "class" / "infiniband" / name / "ports" / port
            ports.mkdir(parents=True)
            (ports / "state").write_text("4: ACTIVE\n")
            if speed:
                (ports / "rate").write_text(f"{float(speed) / 1000:g} Gb/sec (4X)\n")
            target = ports.parents[1] / "device"
        else:
            iface = self.sysfs / "class" / "net" / name
            iface.mkdir(parents=True, exist_ok=True)
            if speed:
                (iface / "speed").write_text(f"{int(float(speed))}\n")
            target = iface / "device" if device is not None else None
        if target is not None and not target.exists():
            os.symlink(os.path.relpath(device, target.parent), target)


def _pci(writer: _SysfsWriter, element: ElementTree.Element, parent_dir: Path, numa: int | None, gpus: list) -> None:
    busid = element.get("busid").strip().lower()
    writer.used.add(busid)
    port = writer.device(parent_dir, writer.port_busid(), {"class": "0x060400", "link_speed": element.get("link_speed"), "link_width": element.get("link_width")}, numa)
    path = writer.device(port, busid, dict(element.attrib), numa)
    gpu = element.find("gpu")
    if gpu is not None or (element.get("class") or "").startswith("0x03"):
        gpus.append((busid, gpu))
    nic = element.find("nic")
    if nic is not None:
        for net in nic.findall("net"):
            writer.net(net, path)
    for child in element.findall("pci"):
        _pci(writer, child, path, numa, gpus)


def _fake_gpus(found: list, gpu_busids: set[str]) -> list[FakeGpu]:
    gpus = []
    for busid, gpu in found:
        sm = int(gpu.get("sm")) if gpu is not None and gpu.get("sm") else None
        links = []
        for nvlink in gpu.findall("nvlink") if gpu is not None else []:
            target = nvlink.get("target").strip().lower()
            if target in gpu_busids:
                kind = DEVICE_TYPE_GPU
            elif (nvlink.get("tclass") or "").lower() == NVSWITCH_CLASS:
                kind = DEVICE_TYPE_SWITCH
            else:
                kind = DEVICE_TYPE_UNKNOWN
            links += [FakeLink(nvml_busid(target), kind)] * int(nvlink.get("count") or 1)
        gpus.append(FakeGpu(busid, sm, links=links))
    return gpus


def _number(text: str) -> int:
    return int(text, 16) if text.lower().startswith("0x") else int(text)


def host_from_nccl_xml(xml_text: str, root: Path, **library_options) -> FakeHost:
    """Write the machine ``xml_text`` (an NCCL topology file) describes under ``root``."""
    system = ElementTree.fromstring(xml_text)
    writer = _SysfsWriter(root / "sys")
    found: list = []
    cpus = system.findall("cpu")
    for index, cpu in enumerate(cpus):
        numa = int(cpu.get("numaid")) if cpu.get("numaid") is not None else index
        node = writer.sysfs / "devices" / "system" / "node" / f"node{numa}"
        node.mkdir(parents=True, exist_ok=True)
        (node / "cpulist").write_text(f"{numa}\n")
        root_bus = writer.devices / f"pci{index:04x}:00"
        for child in cpu:
            if child.tag == "pci":
                _pci(writer, child, root_bus, numa, found)
            elif child.tag == "nic":
                for net in child.findall("net"):
                    if not (writer.sysfs / "class" / "net" / net.get("name")).exists():
                        writer.net(net, None)
    proc = root / "proc"
    proc.mkdir()
    first = cpus[0] if cpus else None
    lines = []
    if first is not None and first.get("vendor"):
        lines.append(f"vendor_id\t: {first.get('vendor')}")
    for key, attr in (("cpu family\t", "familyid"), ("model\t\t", "modelid")):
        if first is not None and first.get(attr):
            lines.append(f"{key}: {_number(first.get(attr))}")
    (proc / "cpuinfo").write_text("processor\t: 0\n" + "\n".join(lines) + "\n\n")
    gpu_busids = {busid for busid, _ in found}
    library = FakeNvmlLibrary(_fake_gpus(found, gpu_busids), **library_options)
    return FakeHost(writer.sysfs, proc, first.get("arch") if first is not None else None, library)
