"""Topologies of known systems, built from their published architecture.

Each preset is a function returning a :class:`~topocoll.topo.model.Topology`; :data:`PRESETS`
maps a short name (``"dgx-h100"``) to a :class:`Preset` with a one-line description. The
cluster generator (:mod:`topocoll.topo.cluster`) places the same node layouts several times
under a prefix, so every layout is written once, as a function that adds one machine to a
:class:`~topocoll.topo.model.TopologyBuilder`.

Every bandwidth and latency comes from :mod:`topocoll.topo.bandwidth`; what this module adds
is the wiring (which part is connected to which, with how many links) and the generation of
each link, with its source.

Sources of the wiring
---------------------
DGX-1 (V100)
    NVIDIA, "NVIDIA DGX-1 With Tesla V100 System Architecture" (WP-08437-002), hybrid
    cube-mesh figure: 8 V100 with 6 NVLink 2 links each; within each group of four GPUs every
    pair is linked and two of the pairs are doubled, and each GPU has one or two links to its
    peer in the other group. Two PCIe Gen3 switches per socket, each holding two GPUs and one
    of the four EDR InfiniBand adapters; two Xeon E5-2698 v4 (Broadwell) sockets joined by QPI.
    The per-pair link counts are those ``nvidia-smi topo -m`` reports on a DGX-1V (NV1/NV2).
DGX-2
    NVIDIA, "NVIDIA DGX-2 System Architecture" and the NVSwitch whitepaper: 16 V100 on two
    baseboards; each baseboard carries 6 NVSwitch chips, every GPU has one NVLink to each of
    its board's 6 switches; of each switch's 18 ports, 8 go to GPUs and 8 to the matching
    switch of the other baseboard. Eight EDR adapters, two Xeon Platinum 8168 (Skylake).
DGX A100
    NVIDIA, "NVIDIA DGX A100 System Architecture" (WP-10083): 8 A100 with 12 NVLink 3 links,
    two to each of 6 NVSwitch chips; four PCIe Gen4 switches, each with two GPUs and two of the
    eight ConnectX-6 HDR 200 Gb/s adapters; two AMD EPYC 7742 sockets.
DGX H100
    NVIDIA, "NVIDIA DGX H100 System Architecture" / Hopper whitepaper: 8 H100 with 18 NVLink 4
    links to 4 NVSwitch chips (5, 4, 4 and 5 links per GPU); eight ConnectX-7 NDR 400 Gb/s
    adapters, each sharing a PCIe Gen5 switch with one GPU; two Xeon Platinum 8480C (Sapphire
    Rapids).
MI300X
    AMD, "AMD Instinct MI300X Platform" data sheet: 8 OAM GPUs fully connected by xGMI
    (7 links per GPU, one per peer), PCIe Gen5 x16 to the host; two EPYC sockets; eight
    400 Gb/s adapters, one per GPU.
PCIe box
    A generic 8-GPU server without NVLink: two PCIe Gen4 switches with four GPUs each, one per
    socket, each switch also holding one EDR adapter.

Simplifications: PCIe trees are drawn with one switch level (real systems often have two);
GPUs and NICs carry the NUMA node of their socket.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from topocoll.errors import TopologyError
from topocoll.topo import bandwidth as bw
from topocoll.topo.model import LinkKind, Node, NodeKind, Topology, TopologyBuilder

log = logging.getLogger(__name__)

#: NVLink pairs of the DGX-1V hybrid cube-mesh: (gpu, gpu, number of links).
DGX1_V100_NVLINKS: tuple[tuple[int, int, int], ...] = (
    (0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2),
    (1, 2, 2), (1, 3, 1), (1, 5, 2),
    (2, 3, 2), (2, 6, 1),
    (3, 7, 1),
    (4, 5, 1), (4, 6, 1), (4, 7, 2),
    (5, 6, 2), (5, 7, 1),
    (6, 7, 2),
)  # fmt: skip

#: NVLinks from every DGX H100 GPU to each of its 4 NVSwitch chips (18 in all).
DGX_H100_LINKS_PER_SWITCH: tuple[int, ...] = (5, 4, 4, 5)

#: NVLinks between matching NVSwitch chips of the two DGX-2 baseboards (8 of 18 ports).
DGX2_BASEBOARD_LINKS_PER_SWITCH = 8


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one machine of a preset goes inside a (possibly larger) builder.

    Parameters
    ----------
    builder : TopologyBuilder
        Receives the nodes and links.
    prefix : str
        Prepended to every node id (``""`` for a single machine, ``"n3."`` in a cluster).
    host_id : str, optional
        Stamped on every node of the machine.
    rank_base : int
        Rank of the machine's first GPU; GPU ``i`` gets ``rank_base + i``.
    """

    builder: TopologyBuilder
    prefix: str = ""
    host_id: str | None = None
    rank_base: int = 0

    def id(self, local: str) -> str:
        """The global id of the machine-local id ``local``."""
        return self.prefix + local

    def add(
        self,
        local: str,
        kind: NodeKind,
        *,
        gpu_index: int | None = None,
        numa: int | None = None,
        name: str | None = None,
        sm: int | None = None,
    ) -> str:
        """Add a node; GPUs pass their index on the machine (to get a rank) and their ``sm``."""
        rank = None if gpu_index is None else self.rank_base + gpu_index
        node = Node(self.id(local), kind, rank=rank, host_id=self.host_id, numa=numa, name=name, index=gpu_index, sm=sm)
        return self.builder.add_node(node).id

    def link(self, a: str, b: str, kind: LinkKind, per_link_bw_bytes_per_s: float, count: int = 1) -> None:
        """Add ``count`` parallel full-duplex links of ``kind`` between two local ids."""
        self.builder.add_link(
            self.id(a), self.id(b), kind, per_link_bw_bytes_per_s * count, bw.latency_s(kind), count=count
        )


@dataclass(frozen=True, slots=True)
class Preset:
    """A known system: its name, a one-line description and how to lay it out.

    Parameters
    ----------
    name : str
        Registry key, e.g. ``"dgx-h100"``.
    description : str
        One line for ``topocoll topo list-presets``.
    gpus : int
        GPUs per machine.
    nics : int
        Network adapters per machine in the real system.
    nic_speed_bits_per_s : float
        Port speed of those adapters.
    layout : callable
        ``layout(placement, nics)`` adds one machine and returns the global ids of its NICs in
        order.
    """

    name: str
    description: str
    gpus: int
    nics: int
    nic_speed_bits_per_s: float
    layout: Callable[[Placement, int], tuple[str, ...]]

    @property
    def nic_bw_bytes_per_s(self) -> float:
        """Bandwidth of one of the system's network adapters, one direction."""
        return bw.net_bw_bytes_per_s(self.nic_speed_bits_per_s)

    def build(self, nics: int | None = None) -> Topology:
        """One machine of this preset as a topology (GPU ``i`` is ``"gpu{i}"``, rank ``i``).

        Parameters
        ----------
        nics : int, optional
            Number of network adapters (default: the system's own count).
        """
        builder = TopologyBuilder(name=self.name)
        nic_ids = self.layout(Placement(builder), self.nics if nics is None else _check_nics(nics))
        # Each port is cabled to a switch port the machine does not include, as in the NCCL XML
        # import: a net_switch "net<k>" per NIC, so the port speed is part of the topology.
        for nic in nic_ids:
            port = builder.add_node(Node("net" + nic[len("nic"):], NodeKind.NET_SWITCH))
            builder.add_link(nic, port.id, LinkKind.NET, self.nic_bw_bytes_per_s, bw.latency_s(LinkKind.NET))
        return builder.build()


def _check_nics(nics: int) -> int:
    if isinstance(nics, bool) or not isinstance(nics, int) or nics < 0:
        raise TopologyError(f"number of NICs must be an integer >= 0, got {nics!r}")
    return nics


# --------------------------------------------------------------------------- building blocks
def _host_side(
    p: Placement,
    *,
    switch_gpus: Sequence[Sequence[int]],
    switch_socket: Sequence[int],
    pcie_generation: int,
    cpu_family: str,
    cpu_name: str,
    nics: int,
    nic_name: str,
    gpu_name: str,
    gpu_sm: int | None = None,
) -> tuple[str, ...]:
    """CPUs, the SMP link, PCIe switches with their GPUs (added here) and NICs.

    ``gpu_sm`` is the GPU model's CUDA compute capability (NVIDIA's published table: V100 7.0,
    A100 8.0, H100 9.0), None for models without one.

    GPU ``g`` is ``"gpu{g}"``; NIC ``i`` sits under switch ``i * switches // nics`` so that the
    adapters spread evenly over the switches whatever their number.
    """
    sockets = max(switch_socket) + 1
    for s in range(sockets):
        p.add(f"cpu{s}", NodeKind.CPU, numa=s, name=cpu_name)
    for a in range(sockets):
        for b in range(a + 1, sockets):
            p.link(f"cpu{a}", f"cpu{b}", LinkKind.SMP, bw.SMP_BW_BYTES_PER_S[cpu_family])
    x16 = bw.pcie_bw_bytes_per_s(pcie_generation, 16)
    for s, (gpus, socket) in enumerate(zip(switch_gpus, switch_socket)):
        p.add(f"pcie_switch{s}", NodeKind.PCIE_SWITCH, numa=socket)
        p.link(f"pcie_switch{s}", f"cpu{socket}", LinkKind.PCIE, x16)
        for g in gpus:
            p.add(f"gpu{g}", NodeKind.GPU, gpu_index=g, numa=socket, name=gpu_name, sm=gpu_sm)
            p.link(f"gpu{g}", f"pcie_switch{s}", LinkKind.PCIE, x16)
    nic_ids = []
    switches = len(switch_gpus)
    for i in range(nics):
        s = i * switches // nics
        nic_ids.append(p.add(f"nic{i}", NodeKind.NIC, numa=switch_socket[s], name=nic_name))
        p.link(f"nic{i}", f"pcie_switch{s}", LinkKind.PCIE, x16)
    return tuple(nic_ids)


def _nvswitch_plane(p: Placement, gpus: Sequence[int], switches: Sequence[int], links_per_switch: Sequence[int], generation: int) -> None:
    per_link = bw.nvlink_bw_bytes_per_s(generation)
    for s in switches:
        if not p.builder.has_node(p.id(f"nvswitch{s}")):
            p.add(f"nvswitch{s}", NodeKind.NVSWITCH, name="NVSwitch")
    for g in gpus:
        for s, count in zip(switches, links_per_switch):
            p.link(f"gpu{g}", f"nvswitch{s}", LinkKind.NVLINK, per_link, count)


# ----------------------------------------------------------------------------- layouts
def _layout_dgx1_v100(p: Placement, nics: int) -> tuple[str, ...]:
    nic_ids = _host_side(
        p,
        switch_gpus=((0, 1), (2, 3), (4, 5), (6, 7)),
        switch_socket=(0, 0, 1, 1),
        pcie_generation=3,
        cpu_family="intel_old",
        cpu_name="Xeon E5-2698 v4",
        nics=nics,
        nic_name="ConnectX-4 EDR 100 Gb/s",
        gpu_name="Tesla V100-SXM2",
        gpu_sm=70,
    )
    per_link = bw.nvlink_bw_bytes_per_s(2)
    for a, b, count in DGX1_V100_NVLINKS:
        p.link(f"gpu{a}", f"gpu{b}", LinkKind.NVLINK, per_link, count)
    return nic_ids


def _layout_dgx2(p: Placement, nics: int) -> tuple[str, ...]:
    nic_ids = _host_side(
        p,
        switch_gpus=tuple((2 * s, 2 * s + 1) for s in range(8)),
        switch_socket=(0, 0, 0, 0, 1, 1, 1, 1),
        pcie_generation=3,
        cpu_family="intel",
        cpu_name="Xeon Platinum 8168",
        nics=nics,
        nic_name="ConnectX-5 EDR 100 Gb/s",
        gpu_name="Tesla V100-SXM3",
        gpu_sm=70,
    )
    for board in (0, 1):
        gpus = range(8 * board, 8 * board + 8)
        switches = range(6 * board, 6 * board + 6)
        _nvswitch_plane(p, gpus, switches, (1,) * 6, generation=2)
    per_link = bw.nvlink_bw_bytes_per_s(2)
    for s in range(6):
        p.link(f"nvswitch{s}", f"nvswitch{s + 6}", LinkKind.NVLINK, per_link, DGX2_BASEBOARD_LINKS_PER_SWITCH)
    return nic_ids


def _layout_dgx_a100(p: Placement, nics: int) -> tuple[str, ...]:
    nic_ids = _host_side(
        p,
        switch_gpus=((0, 1), (2, 3), (4, 5), (6, 7)),
        switch_socket=(0, 0, 1, 1),
        pcie_generation=4,
        cpu_family="amd",
        cpu_name="AMD EPYC 7742",
        nics=nics,
        nic_name="ConnectX-6 HDR 200 Gb/s",
        gpu_name="A100-SXM4",
        gpu_sm=80,
    )
    _nvswitch_plane(p, range(8), range(6), (2,) * 6, generation=3)
    return nic_ids


def _layout_dgx_h100(p: Placement, nics: int) -> tuple[str, ...]:
    nic_ids = _host_side(
        p,
        switch_gpus=tuple((g,) for g in range(8)),
        switch_socket=(0, 0, 0, 0, 1, 1, 1, 1),
        pcie_generation=5,
        cpu_family="intel_spr",
        cpu_name="Xeon Platinum 8480C",
        nics=nics,
        nic_name="ConnectX-7 NDR 400 Gb/s",
        gpu_name="H100-SXM5",
        gpu_sm=90,
    )
    _nvswitch_plane(p, range(8), range(4), DGX_H100_LINKS_PER_SWITCH, generation=4)
    return nic_ids


def _layout_pcie_8gpu(p: Placement, nics: int) -> tuple[str, ...]:
    return _host_side(
        p,
        switch_gpus=((0, 1, 2, 3), (4, 5, 6, 7)),
        switch_socket=(0, 1),
        pcie_generation=4,
        cpu_family="intel",
        cpu_name="Xeon (2 sockets)",
        nics=nics,
        nic_name="EDR 100 Gb/s",
        gpu_name="PCIe GPU",
    )


def _layout_mi300x(p: Placement, nics: int) -> tuple[str, ...]:
    nic_ids = _host_side(
        p,
        switch_gpus=tuple((g,) for g in range(8)),
        switch_socket=(0, 0, 0, 0, 1, 1, 1, 1),
        pcie_generation=5,
        cpu_family="amd",
        cpu_name="AMD EPYC 9004",
        nics=nics,
        nic_name="400 Gb/s",
        gpu_name="AMD Instinct MI300X",
    )
    per_link = bw.xgmi_bw_bytes_per_s("MI300")
    for a in range(8):
        for b in range(a + 1, 8):
            p.link(f"gpu{a}", f"gpu{b}", LinkKind.XGMI, per_link)
    return nic_ids


def _preset(name: str, description: str, gpus: int, nics: int, rate: str, layout: Callable[[Placement, int], tuple[str, ...]]) -> Preset:
    return Preset(name, description, gpus, nics, bw.IB_SPEED_BITS_PER_S[rate], layout)


#: Every preset by name (read-only).
PRESETS: Mapping[str, Preset] = MappingProxyType(
    {
        p.name: p
        for p in (
            _preset("dgx1-v100", "NVIDIA DGX-1 (V100): 8 GPUs, NVLink 2 hybrid cube-mesh (6 links/GPU), 4x EDR", 8, 4, "EDR", _layout_dgx1_v100),
            _preset("dgx2", "NVIDIA DGX-2: 16 V100, 12 NVSwitches on two baseboards (6 links/GPU), 8x EDR", 16, 8, "EDR", _layout_dgx2),
            _preset("dgx-a100", "NVIDIA DGX A100: 8 GPUs, 6 NVSwitches (12 NVLink 3 links/GPU), 8x HDR 200G", 8, 8, "HDR", _layout_dgx_a100),
            _preset("dgx-h100", "NVIDIA DGX H100: 8 GPUs, 4 NVSwitch chips (18 NVLink 4 links/GPU), 8x NDR 400G", 8, 8, "NDR", _layout_dgx_h100),
            _preset("pcie-8gpu", "8 PCIe GPUs without NVLink under two PCIe Gen4 switches, two sockets, 2x EDR", 8, 2, "EDR", _layout_pcie_8gpu),
            _preset("mi300x", "AMD MI300X-class: 8 GPUs, all-to-all xGMI (1 link per pair), 8x 400G", 8, 8, "NDR", _layout_mi300x),
        )
    }
)


def get_preset(name: str) -> Preset:
    """The preset called ``name``.

    Raises
    ------
    TopologyError
        No such preset; the message lists the known names.
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise TopologyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None


def build_preset(name: str, nics: int | None = None) -> Topology:
    """One machine of preset ``name`` (see :meth:`Preset.build`)."""
    return get_preset(name).build(nics)


def dgx1_v100() -> Topology:
    """NVIDIA DGX-1 with 8 V100: NVLink 2 hybrid cube-mesh, 4 PCIe switches, 2 sockets, 4 NICs."""
    return build_preset("dgx1-v100")


def dgx2() -> Topology:
    """NVIDIA DGX-2: 16 V100, 12 NVSwitches on two joined baseboards, 8 NICs."""
    return build_preset("dgx2")


def dgx_a100() -> Topology:
    """NVIDIA DGX A100: 8 A100, 6 NVSwitches, 4 PCIe switches shared by GPU and NIC pairs."""
    return build_preset("dgx-a100")


def dgx_h100() -> Topology:
    """NVIDIA DGX H100: 8 H100, 4 NVSwitch chips (5/4/4/5 links per GPU), 8 NDR NICs."""
    return build_preset("dgx-h100")


def pcie_8gpu() -> Topology:
    """An 8-GPU PCIe server: no NVLink, two PCIe switches, two sockets."""
    return build_preset("pcie-8gpu")


def mi300x() -> Topology:
    """An AMD MI300X-class node: 8 GPUs joined all-to-all by xGMI."""
    return build_preset("mi300x")
