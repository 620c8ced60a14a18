"""Every bandwidth and latency figure topocoll assumes, with its source, in one place.

All bandwidths are bytes per second in one direction of one link; all latencies are seconds.
Importers and presets look figures up here and nowhere else; a measured topology (probing)
replaces them.

Sources
-------
NVLink
    NVIDIA architecture whitepapers: P100 (NVLink 1, 4 links, 160 GB/s bidirectional total:
    20 GB/s per link and direction), V100 (NVLink 2, 6 links, 300 GB/s total: 25 GB/s), A100
    (NVLink 3, 12 links, 600 GB/s total: 25 GB/s), H100 (NVLink 4, 18 links, 900 GB/s total:
    25 GB/s), B200 (NVLink 5, 18 links, 1.8 TB/s total: 50 GB/s).
NVLink-C2C
    NVIDIA Grace Hopper whitepaper: 900 GB/s bidirectional, so 450 GB/s per direction.
PCIe
    PCI-SIG base specifications: transfer rate per lane (GT/s) times encoding efficiency
    (8b/10b for Gen1/2, 128b/130b for Gen3-5, 242/256 FLIT for Gen6), divided by 8 bits.
xGMI / Infinity Fabric
    AMD Instinct data sheets: MI250X 100 GB/s peak bidirectional per link (50 GB/s per
    direction); MI300X 7 links, 896 GB/s aggregate, 128 GB/s bidirectional per link
    (64 GB/s per direction).
SMP (inter-socket)
    NCCL's effective figures (``src/graph/topo.h``: ``SKL_QPI_BW`` 10 GB/s for Intel
    Skylake and later, ``BDW_QPI_BW`` 6 GB/s for older Intel, ``SRP_QPI_BW`` 22 GB/s for
    Sapphire Rapids, ``AMD_BW`` 16 GB/s).
Network
    The NIC's reported speed: NCCL XML gives ``speed`` in Mbit/s; bytes/s = speed * 1e6 / 8.
    Named InfiniBand rates (4x ports) from the InfiniBand Trade Association roadmap: EDR
    100 Gb/s, HDR 200 Gb/s, NDR 400 Gb/s, XDR 800 Gb/s.
Shared memory (fallback)
    With nothing known about a host, ranks exchange data through host memory. NCCL models
    such paths with its effective PCIe figure (``PCI_BW`` 12 GB/s, "PCI Gen3 x16", in
    ``src/graph/topo.h``); we use the same figure. In a flat topology every link is equal, so
    the figure scales predicted times without changing which schedule is best; probing
    replaces it with a measured one.
Latency
    NCCL's per-hop hardware latencies of the LL protocol (``src/graph/tuning.cc``,
    ``hwLat``): NVLink 0.6 us, PCI 1.0 us, network 2.7 us (ring). Shared memory and loopback
    use the PCI figure, the closest NCCL class.
"""

from __future__ import annotations

import re

from topocoll.errors import TopologyError
from topocoll.topo.model import LinkKind
from topocoll.units import GB

US = 1e-6

#: NVLink bandwidth per link and direction, by NVLink generation.
NVLINK_BW_BYTES_PER_S: dict[int, float] = {1: 20 * GB, 2: 25 * GB, 3: 25 * GB, 4: 25 * GB, 5: 50 * GB}

#: NVLink generation by CUDA compute capability major*10+minor (``sm`` in NCCL XML).
NVLINK_GENERATION_BY_SM: dict[int, int] = {60: 1, 70: 2, 72: 2, 75: 2, 80: 3, 86: 3, 87: 3, 89: 4, 90: 4, 100: 5, 103: 5, 120: 5}

#: NVLink generation by GPU product family name (for text formats without ``sm``).
NVLINK_GENERATION_BY_NAME: tuple[tuple[str, int], ...] = (
    ("P100", 1),
    ("V100", 2),
    ("A100", 3),
    ("A800", 3),
    ("H100", 4),
    ("H800", 4),
    ("H200", 4),
    ("H20", 4),
    ("GH200", 4),
    ("B200", 5),
    ("B100", 5),
    ("GB200", 5),
)

#: NVLink-C2C bandwidth per direction.
C2C_BW_BYTES_PER_S = 450 * GB

#: PCIe per-lane transfer rate (GT/s) and encoding efficiency, by generation.
PCIE_RATE_GT_PER_S: dict[int, float] = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
PCIE_ENCODING: dict[int, float] = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}

#: xGMI bandwidth per link and direction, by AMD Instinct generation (product family).
XGMI_BW_BYTES_PER_S: dict[str, float] = {"MI250": 50 * GB, "MI300": 64 * GB}

#: Inter-socket bandwidth (NCCL's effective figures).
SMP_BW_BYTES_PER_S: dict[str, float] = {"intel": 10 * GB, "intel_old": 6 * GB, "intel_spr": 22 * GB, "amd": 16 * GB}

#: Port speed of the named InfiniBand rates (4x ports), bits per second.
IB_SPEED_BITS_PER_S: dict[str, float] = {"EDR": 100e9, "HDR": 200e9, "NDR": 400e9, "XDR": 800e9}

#: Bandwidth assumed for a shared-memory link when nothing better is known (NCCL's PCI_BW).
SHM_BW_BYTES_PER_S = 12 * GB

#: Per-link latency by link kind.
LATENCY_S: dict[LinkKind, float] = {
    LinkKind.NVLINK: 0.6 * US,
    LinkKind.C2C: 0.6 * US,
    LinkKind.XGMI: 0.6 * US,
    LinkKind.PCIE: 1.0 * US,
    LinkKind.SMP: 1.0 * US,
    LinkKind.SHM: 1.0 * US,
    LinkKind.LOOPBACK: 1.0 * US,
    LinkKind.NET: 2.7 * US,
}


def nvlink_bw_bytes_per_s(generation: int) -> float:
    """Bandwidth of one NVLink of ``generation`` (1-5), one direction."""
    try:
        return NVLINK_BW_BYTES_PER_S[generation]
    except KeyError:
        raise TopologyError(f"unknown NVLink generation {generation}; known: 1-5") from None


def nvlink_generation_for_sm(sm: int) -> int:
    """NVLink generation of a GPU with compute capability ``sm`` (e.g. 80 for A100).

    Unknown values map to the newest generation not newer than the GPU.
    """
    known = [s for s in NVLINK_GENERATION_BY_SM if s <= sm]
    if not known:
        return 1
    return NVLINK_GENERATION_BY_SM[max(known)]


def nvlink_generation_for_name(name: str, default: int = 2) -> int:
    """NVLink generation from a product name such as ``Tesla V100-SXM2-16GB``."""
    upper = name.upper()
    best = None
    for family, generation in NVLINK_GENERATION_BY_NAME:
        if re.search(rf"(?<![A-Z0-9]){family}(?![0-9])", upper):
            if best is None or len(family) > len(best[0]):
                best = (family, generation)
    return best[1] if best else default


def pcie_bw_bytes_per_s(generation: int, width: int) -> float:
    """Bandwidth of a PCIe link of ``generation`` and ``width`` lanes, one direction."""
    if generation not in PCIE_RATE_GT_PER_S:
        raise TopologyError(f"unknown PCIe generation {generation}; known: 1-6")
    if width < 1:
        raise TopologyError(f"PCIe width must be >= 1 lane, got {width}")
    return PCIE_RATE_GT_PER_S[generation] * 1e9 * PCIE_ENCODING[generation] / 8 * width


def pcie_generation_for_rate(gt_per_s: float) -> int:
    """PCIe generation whose per-lane rate is ``gt_per_s`` (nearest match)."""
    return min(PCIE_RATE_GT_PER_S, key=lambda g: abs(PCIE_RATE_GT_PER_S[g] - gt_per_s))


#: Speed NCCL's socket transport assumes for an interface whose ``/sys/class/net/<if>/speed``
#: is unreadable or not positive, as virtual NICs report (``ncclSocketGetSpeed``: 10000 Mb/s).
SOCKET_DEFAULT_SPEED_BITS_PER_S = 10e9


def net_bw_bytes_per_s(speed_bits_per_s: float) -> float:
    """Bytes per second of a network port reporting ``speed_bits_per_s``."""
    if not speed_bits_per_s > 0:
        raise TopologyError(f"network speed must be > 0 bit/s, got {speed_bits_per_s}")
    return speed_bits_per_s / 8


def xgmi_bw_bytes_per_s(family: str = "MI300") -> float:
    """Bandwidth of one xGMI link of an AMD Instinct ``family``, one direction."""
    try:
        return XGMI_BW_BYTES_PER_S[family]
    except KeyError:
        raise TopologyError(f"unknown xGMI family {family!r}; known: {', '.join(XGMI_BW_BYTES_PER_S)}") from None


def latency_s(kind: LinkKind) -> float:
    """Default one-hop latency of a link of ``kind``."""
    return LATENCY_S[kind]


# ------------------------------------------------------------------------------------------
# Defaults and look-ups used by the file importers (NCCL XML, nvidia-smi, rocm-smi).

#: PCIe link assumed when a file gives no (or an unreadable) speed or width. NCCL does the same:
#: ``kvDictPciGen`` in ``src/graph/topo.cc`` falls back to 60 (x100 Mbit/s per lane, i.e.
#: 8 GT/s, Gen3) and ``ncclTopoAddPci`` replaces a width of 0 by 16 lanes.
PCIE_DEFAULT_GENERATION = 3
PCIE_DEFAULT_WIDTH = 16

#: Lane counts tried, in order, when a bandwidth is turned back into ``link_width``: x16 first
#: because GPUs and NICs use it (the PCI-SIG base specification allows x1 to x32).
PCIE_WIDTHS_PREFERRED: tuple[int, ...] = (16, 8, 4, 32, 2, 1)

#: NVLink generation assumed by text formats that give a link count (``NV4``) but no GPU model.
#: Generations 2, 3 and 4 (V100, A100, H100) share the 25 GB/s per-link figure of
#: :data:`NVLINK_BW_BYTES_PER_S`, so the choice among them does not change any bandwidth.
NVLINK_DEFAULT_GENERATION = 3

#: The most NVLinks one GPU has: 18 on H100 and B200 (NVIDIA H100 and Blackwell whitepapers).
#: More links than this between one GPU and its peers means the links go through NVSwitches.
MAX_NVLINKS_PER_GPU = 18

#: xGMI family by AMD Instinct product name (MI308X and MI325X are MI300-series, CDNA 3 parts).
XGMI_FAMILY_BY_NAME: tuple[tuple[str, str], ...] = (
    ("MI210", "MI250"),
    ("MI250", "MI250"),
    ("MI300", "MI300"),
    ("MI308", "MI300"),
    ("MI325", "MI300"),
)

#: xGMI family assumed when the text names no product (the newest family in the table).
XGMI_DEFAULT_FAMILY = "MI300"

#: Intel family 6 models from which NCCL (``ncclTopoGetInterCpuBw`` and the CPU model
#: detection in ``src/graph/topo.cc``) uses its Skylake figure (0x55) and its Sapphire Rapids
#: figure (0x8F).
INTEL_FAMILY = 6
INTEL_SKYLAKE_FIRST_MODEL = 0x55
INTEL_SAPPHIRE_RAPIDS_FIRST_MODEL = 0x8F

#: Inter-socket bandwidth of non-x86 CPUs by ``arch`` (NCCL ``src/graph/topo.h``: ``P9_BW`` 32 GB/s
#: for POWER, ``ARM_BW`` 6 GB/s for Arm); NCCL uses them whatever the vendor.
SMP_BW_BY_ARCH_BYTES_PER_S: dict[str, float] = {"ppc64": 32 * GB, "ppc64le": 32 * GB, "arm64": 6 * GB, "aarch64": 6 * GB}

#: Inter-socket figure assumed when the CPU vendor is unknown: NCCL's Skylake-and-later Intel
#: figure, the most common server CPU in published topology files.
SMP_DEFAULT_KEY = "intel"


def smp_bw_for_cpu(
    vendor: str | None, family: int | None = None, model: int | None = None, arch: str | None = None
) -> float | None:
    """Inter-socket bandwidth for a CPU as NCCL XML describes it, or None when unknown.

    Parameters
    ----------
    vendor : str or None
        ``GenuineIntel`` or ``AuthenticAMD`` (the ``vendor`` attribute of ``<cpu>``).
    family, model : int, optional
        ``familyid`` and ``modelid``; they tell Intel generations apart.
    arch : str, optional
        ``arch`` attribute (``x86_64``, ``arm64``, ``ppc64``); POWER and Arm have their own figures.

    Returns
    -------
    float or None
        Bytes per second in one direction, following NCCL's choice of figure; None for
        vendors NCCL has no figure for (the caller picks a default and says so).
    """
    if arch is not None and arch.strip().lower() in SMP_BW_BY_ARCH_BYTES_PER_S:
        return SMP_BW_BY_ARCH_BYTES_PER_S[arch.strip().lower()]
    if vendor is None:
        return None
    key = vendor.strip().lower()
    if "amd" in key:
        return SMP_BW_BYTES_PER_S["amd"]
    if "intel" in key:
        if family == INTEL_FAMILY and model is not None:
            if model >= INTEL_SAPPHIRE_RAPIDS_FIRST_MODEL and "intel_spr" in SMP_BW_BYTES_PER_S:
                return SMP_BW_BYTES_PER_S["intel_spr"]
            if model < INTEL_SKYLAKE_FIRST_MODEL:
                return SMP_BW_BYTES_PER_S["intel_old"]
        return SMP_BW_BYTES_PER_S["intel"]
    return None


def pcie_link_for_bw(bw_bytes_per_s: float) -> tuple[int, int] | None:
    """The (generation, width) whose bandwidth is exactly ``bw_bytes_per_s``, or None.

    Several pairs can share a figure (Gen4 x8 equals Gen3 x16); the widest usual width wins,
    following :data:`PCIE_WIDTHS_PREFERRED`, then the newest generation.
    """
    for width in PCIE_WIDTHS_PREFERRED:
        for generation in sorted(PCIE_RATE_GT_PER_S, reverse=True):
            if pcie_bw_bytes_per_s(generation, width) == bw_bytes_per_s:
                return generation, width
    return None


def xgmi_family_for_name(text: str) -> str | None:
    """xGMI family (a key of :data:`XGMI_BW_BYTES_PER_S`) named anywhere in ``text``, or None."""
    upper = text.upper()
    for product, family in XGMI_FAMILY_BY_NAME:
        if re.search(rf"(?<![A-Z0-9]){product}", upper):
            return family
    return None
