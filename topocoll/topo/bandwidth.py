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
    Skylake and later, ``BDW_QPI_BW`` 6 GB/s for older Intel, ``AMD_BW`` 16 GB/s).
Network
    The NIC's reported speed: NCCL XML gives ``speed`` in Mbit/s; bytes/s = speed * 1e6 / 8.
Latency
    NCCL's per-hop hardware latencies of the LL protocol (``src/graph/tuning.cc``,
    ``hwLat``): NVLink 0.6 us, PCI 1.0 us, network 2.7 us (ring). Shared memory and loopback
    use the PCI figure, the closest NCCL class.
"""

from __future__ import annotations

import re

from topocoll.errors import TopologyError
from topocoll.topo.model import LinkKind

GB = 1e9  # nccl-tests and the vendors' whitepapers count GB as 1e9 bytes
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
SMP_BW_BYTES_PER_S: dict[str, float] = {"intel": 10 * GB, "intel_old": 6 * GB, "amd": 16 * GB}

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
