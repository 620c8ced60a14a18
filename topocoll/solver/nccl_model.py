"""What NCCL's own collectives take on a topology: a closed-form model of its algorithms.

NCCL chooses, per call, one algorithm (ring, tree, NVLS, NVLS-tree, PAT) and one protocol (LL,
LL128, Simple), each pair with a latency and a bandwidth; the call takes
``latency + size / algbw``. This module predicts those pairs from topocoll's graph, so that a
schedule can be compared with what NCCL would really do, not with a weaker baseline:

* **bandwidth** comes from the graph (:func:`nccl_view`): what rings reach inside a machine (a
  GPU's NVLinks to its NVSwitches, else the rings over its NVLink mesh or PCIe tree), what a
  machine reaches of the network (the NICs nearest its ranks), and the in-switch reduction of
  third-generation NVSwitches (NVLS); each algorithm reaches a *calibrated* share of its limit
  (:class:`Calibration`);
* **protocols** scale it as NCCL's tuner does: LL carries 8 bytes per 16 (half the bandwidth,
  capped), LL128 120 bytes per 128;
* **latency** is NCCL's published base latency per algorithm and protocol plus its per-hop
  latency per link type (NVLink, PCIe, network) times the hops the algorithm takes, all times a
  *calibrated* factor (NVLS's in-switch latency its own), and the network's own latency per hop
  between machines, one for LL and LL128 and one for Simple (twice the first unless known:
  Simple sends, then flushes);
* **NVLS's chunks**: NVLS moves a message in chunks that NCCL halves for smaller messages
  (:func:`nvls_chunk_bytes`), each at a *calibrated* cost beyond its bytes, so its bandwidth
  grows in steps up to 1 GiB (:class:`NvlsChunks`);
* **the host's cost per call** (*calibrated*, by GPU generation) overlaps with the device's
  work: nccl-tests, like a training step, issues its calls back to back on a stream and waits
  once, so a call takes the longer of the host's cost and the device's time, not their sum
  (:meth:`NcclEstimate.time_s`).

The model takes NCCL to run the fastest algorithm and protocol (its tuner aims at that; taking
the one NCCL's own uncalibrated figures rank first put 91 of the tables' 101 sizes within 15 %
and 84 held out, against 93 and 82). ``NCCL_ALGO`` (:func:`nccl_algorithms`) restricts the
choice as it restricts NCCL's (:func:`nccl_time`).

The figures marked "NCCL" below are the constants of NCCL's tuning model
(``src/graph/tuning.cc``, NCCL 2.30); the calibrated ones were fitted to the nccl-tests tables
committed in ``tests/data/topologies`` by ``benchmarks/nccl_tables.py``, whose report
(``benchmarks/results/nccl_tables.md``) shows every prediction against its measurement.

All functions are pure; times are in seconds and bandwidths in bytes per second.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from topocoll.errors import SolverError
from topocoll.solver.schedule import Collective
from topocoll.topo.model import LinkKind, NodeKind, Topology

log = logging.getLogger(__name__)

#: NVLS (reduction inside the NVSwitch) needs compute capability 9.0 or later.
NVLS_MIN_SM = 90
#: LL128 is used by default only over NVLink from Volta on (NCCL enables it on SM70+ NVLink paths).
LL128_MIN_SM = 70

US = 1e-6
GB = 1e9


class Algorithm(str, enum.Enum):
    """NCCL's algorithms for the collectives topocoll models."""

    RING = "ring"
    TREE = "tree"
    NVLS = "nvls"
    NVLS_TREE = "nvls_tree"
    PAT = "pat"


class Protocol(str, enum.Enum):
    """NCCL's wire protocols: LL (8-byte flag+data stores), LL128 (128-byte lines), Simple."""

    LL = "LL"
    LL128 = "LL128"
    SIMPLE = "Simple"


#: NCCL: base latency per algorithm and protocol (LL, LL128, Simple), in seconds.
BASE_LATENCY_S = {
    Algorithm.TREE: (6.8 * US, 14.0 * US, 8.4 * US),
    Algorithm.RING: (6.6 * US, 14.0 * US, 8.4 * US),
    Algorithm.NVLS: (0.0, 0.0, 0.0),
    Algorithm.NVLS_TREE: (0.0, 0.0, 0.0),
    Algorithm.PAT: (8.0 * US, 8.0 * US, 8.0 * US),
}
#: NCCL: latency per hop by link type, algorithm and protocol (LL, LL128, Simple), in seconds.
HOP_LATENCY_S = {
    "nvlink": {
        Algorithm.TREE: (0.6 * US, 1.25 * US, 4.0 * US),
        Algorithm.RING: (0.6 * US, 1.9 * US, 3.4 * US),
        Algorithm.NVLS: (0.0, 0.0, 25.0 * US),
        Algorithm.NVLS_TREE: (0.0, 0.0, 25.0 * US),
    },
    "pcie": {
        Algorithm.TREE: (1.0 * US, 1.9 * US, 4.0 * US),
        Algorithm.RING: (1.0 * US, 2.5 * US, 5.7 * US),
    },
    "net": {
        Algorithm.TREE: (5.0 * US, 8.5 * US, 14.0 * US),
        Algorithm.RING: (2.7 * US, 4.0 * US, 14.0 * US),
        Algorithm.NVLS: (0.0, 0.0, 18.0 * US),
        Algorithm.NVLS_TREE: (0.0, 0.0, 20.9 * US),
        Algorithm.PAT: (0.0, 0.0, 14.0 * US),
    },
}
#: NCCL: PAT (allgather and reduce-scatter with one GPU per machine) reaches 3/4 of the rings'
#: bandwidth, pays a network hop's latency / 3.5 per level of its log2 tree and 2.8 us per rank.
PAT_BW_FACTOR = 0.75
PAT_LEVEL_LATENCY_DIVISOR = 3.5
PAT_RANK_LATENCY_S = 2.8 * US
#: NCCL runs PAT from compute capability 6.0 (it needs CUDA atomics).
PAT_MIN_SM = 60
#: NCCL: the share of the link bandwidth each protocol carries as data: LL sends 4 bytes of data
#: with every 4-byte flag, LL128 120 bytes with every 128 (NCCL's tuner uses 0.92 for it).
PROTOCOL_BW_FACTOR = {Protocol.LL: 0.5, Protocol.LL128: 0.92, Protocol.SIMPLE: 1.0}
#: NCCL: the most bus bandwidth LL reaches, by GPU generation on one machine (``llMaxBws``), and
#: across machines (by CPU, Intel's figures: 2 machines, more).
LL_MAX_BUSBW_ONE_MACHINE = {70: 39.0 * GB, 80: 87.7 * GB, 90: 141.0 * GB, 100: 282.0 * GB}
LL_MAX_BUSBW_NETWORK = (39.0 * GB, 20.4 * GB)
#: NCCL: the channels NVLS runs on (``NCCL_NVLS_NCHANNELS``' default, ``src/transport/nvls.cc``);
#: each serves one head per GPU of the machine, so ``NVLS_CHANNELS * GPUs`` pieces move at once.
NVLS_CHANNELS = 16
#: NCCL: NVLS's largest chunk, and the rule that halves it for smaller messages (``enqueue.cc``,
#: the same from 2.18 to 2.20): below ``factor * ops * chunk`` bytes the chunk becomes ``to``.
NVLS_MAX_CHUNK_BYTES = 128 * 1024
NVLS_CHUNK_STEPS = ((64, 64 * 1024), (8, 32 * 1024), (2, 16 * 1024))


def nvls_chunk_bytes(size_bytes: float, concurrent_ops: int) -> int:
    """The chunk NCCL's NVLS cuts a ``size_bytes`` message into, with ``concurrent_ops`` pieces
    (channel and head pairs) in flight.

    Examples
    --------
    >>> [nvls_chunk_bytes(s, 128) >> 10 for s in (1 << 30, (1 << 30) - 1, 64 << 20, 8 << 20, 1 << 20)]
    [128, 64, 64, 32, 16]
    """
    chunk = NVLS_MAX_CHUNK_BYTES
    for factor, smaller in NVLS_CHUNK_STEPS:
        if size_bytes < factor * concurrent_ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


@dataclass(frozen=True, slots=True)
class Calibration:
    """The model's fitted parameters (see the module docstring for where they come from).

    Attributes
    ----------
    call_overhead_s : dict of int to float
        The host's cost of one collective call by GPU generation (the compute capability
        rounded down to a multiple of 10): NCCL's enqueue, the kernel launch, the benchmark's
        loop. It overlaps with the device's work on the calls before (see
        :meth:`NcclEstimate.time_s`), so it sets a floor, not an addend. The tables that fix it
        ran ``all_reduce_perf -g 8``, one thread issuing the call on all eight GPUs; a process
        per GPU, as torch.distributed runs, issues one GPU's share.
    ring_efficiency : float
        Share of the ring's limit (the narrowest GPU's bandwidth) that NCCL's ring reaches; the
        chains of its trees inside a machine, made of the same copies, reach it too.
    nvls_efficiency : float
        Share of the in-switch limit that NVLS reaches.
    network_efficiency : float
        Share of a machine's network bandwidth that traffic between machines reaches.
    latency_scale : float
        Factor on NCCL's published base and per-hop latencies (its tuner's figures, not
        measurements): what the tables show of them on real machines, launch included.
    nvls_latency_scale : float
        The same for NVLS's latency inside the switch (NCCL's 25 us), which the tables show
        nearer its published figure than the rest.
    nvls_chunk_s : float
        NVLS's cost per chunk: each piece in flight moves its share of the message in chunks
        (:func:`nvls_chunk_bytes`), and each chunk costs this beyond its bytes, so NVLS's
        bandwidth grows in steps with the message as its chunks do.
    """

    call_overhead_s: dict[int, float]
    ring_efficiency: float
    nvls_efficiency: float
    network_efficiency: float
    latency_scale: float = 1.0
    nvls_latency_scale: float = 1.0
    nvls_chunk_s: float = 0.0

    def overhead_s(self, sm: int | None) -> float:
        """The host's cost per call for GPUs of compute capability ``sm`` (the nearest known)."""
        generation = 10 * ((sm or 0) // 10)
        known = sorted(self.call_overhead_s)
        return self.call_overhead_s[min(known, key=lambda g: (abs(g - generation), -g))]


#: The calibration fitted by ``benchmarks/nccl_tables.py`` (its report gives every residual).
CALIBRATION = Calibration(
    call_overhead_s={80: 43.565 * US, 90: 30.370 * US},
    ring_efficiency=0.736,
    nvls_efficiency=0.743,
    network_efficiency=0.915,
    latency_scale=2.308,
    nvls_latency_scale=1.219,
    nvls_chunk_s=6.952 * US,
)


@dataclass(frozen=True, slots=True)
class NcclView:
    """What NCCL's tuner sees of a set of ranks: counts, generations and the narrowest links.

    Attributes
    ----------
    ranks : int
    machines : int
    sm : int or None
        The lowest compute capability among the ranks (None where unknown).
    intra : str
        ``"nvlink"`` when every GPU has NVLinks inside its machine, else ``"pcie"``.
    gpu_bw_bytes_per_s : float
        The most bus bandwidth rings reach inside the narrowest machine: a GPU's NVLinks to the
        NVSwitches, else the rings over the graph's NVLink mesh or PCIe tree (infinite with one
        GPU per machine).
    network_bw_bytes_per_s : float or None
        The narrowest machine's network bandwidth NCCL can use, each way: its NICs nearest the
        machine's ranks (None on one machine).
    nvls : bool
        Whether every machine's GPUs share NVSwitches that reduce (compute capability >= 9.0).
    network_latency_s : float
        Latency of the network between machines beyond NCCL's per-hop figure (0 when unknown),
        as LL and LL128 pay it once per hop.
    network_simple_latency_s : float or None
        What the Simple protocol pays per hop between machines beyond NCCL's figure. None: twice
        ``network_latency_s`` (the data, then the flush that makes it visible to the GPU). A
        transport that stages each of Simple's chunks (hundreds of KiB) through the host's TCP
        stack pays far more than a small message's latency; the tables show it (fitted per
        table, as ``network_latency_s`` is).
    network_rdma : bool
        Whether the network reaches GPU memory directly (GPUDirect RDMA). Without it NCCL keeps
        LL128 inside machines.
    """

    ranks: int
    machines: int
    sm: int | None
    intra: str
    gpu_bw_bytes_per_s: float
    network_bw_bytes_per_s: float | None
    nvls: bool
    network_latency_s: float = 0.0
    network_rdma: bool = True
    network_simple_latency_s: float | None = None

    @property
    def ranks_per_machine(self) -> float:
        return self.ranks / self.machines

    def network_hop_latency_s(self, protocol: Protocol) -> float:
        """The network's own latency per hop between machines under ``protocol`` (beyond
        NCCL's per-hop figure): :attr:`network_latency_s` for LL and LL128, for Simple
        :attr:`network_simple_latency_s`, twice :attr:`network_latency_s` where not given."""
        if protocol is not Protocol.SIMPLE:
            return self.network_latency_s
        return 2 * self.network_latency_s if self.network_simple_latency_s is None else self.network_simple_latency_s


@dataclass(frozen=True, slots=True)
class NvlsChunks:
    """NVLS's in-switch transfer: ``concurrent_ops`` pieces in flight (:data:`NVLS_CHANNELS`
    times the GPUs of a machine), each moving its share of the message in chunks
    (:func:`nvls_chunk_bytes`) one after another, at ``bw_bytes_per_s`` in all and
    ``chunk_s`` beyond its bytes per chunk (:attr:`Calibration.nvls_chunk_s`)."""

    bw_bytes_per_s: float
    chunk_s: float
    concurrent_ops: int

    def time_s(self, size_bytes: float) -> float:
        """The in-switch part's time for a message of ``size_bytes``."""
        chunks = size_bytes / (self.concurrent_ops * nvls_chunk_bytes(size_bytes, self.concurrent_ops))
        return size_bytes / self.bw_bytes_per_s + chunks * self.chunk_s


@dataclass(frozen=True, slots=True)
class NcclEstimate:
    """One algorithm and protocol of NCCL's, as the model predicts it.

    Attributes
    ----------
    algorithm : Algorithm
    protocol : Protocol
    latency_s : float
        The device's latency: what a call of no bytes keeps the GPUs busy.
    algbw_bytes_per_s : float
        The narrowest limit's: what large messages approach, but for NVLS's cost per chunk.
    host_s : float
        The host's cost of issuing the call (:attr:`Calibration.call_overhead_s`).
    nvls : NvlsChunks or None
        For NVLS and NVLS-tree: the in-switch part, which pays per chunk.
    """

    algorithm: Algorithm
    protocol: Protocol
    latency_s: float
    algbw_bytes_per_s: float
    host_s: float = 0.0
    nvls: NvlsChunks | None = None

    def device_s(self, size_bytes: float) -> float:
        """How long the call keeps the GPUs busy: ``latency_s + size_bytes / algbw``; with NVLS
        the in-switch part's time (:meth:`NvlsChunks.time_s`) where it is the longer (it
        overlaps with the network's, which NVLS-tree pipelines with it)."""
        transfer_s = size_bytes / self.algbw_bytes_per_s
        if self.nvls is not None:
            transfer_s = max(transfer_s, self.nvls.time_s(size_bytes))
        return self.latency_s + transfer_s

    def time_s(self, size_bytes: float) -> float:
        """Predicted time of a call moving ``size_bytes`` (nccl-tests' size), issued behind
        others: the host issues the next call while the device runs this one, so the call
        takes the longer of the two, ``max(host_s, device_s)``."""
        return call_time_s(self.host_s, self.device_s(size_bytes))

    @property
    def label(self) -> str:
        return f"{self.algorithm.value}/{self.protocol.value}"


def call_time_s(host_s: float, device_s: float) -> float:
    """The time of one call among calls issued back to back: the host issues the next while the
    device runs this one, so the longer of the two costs sets the pace."""
    return max(host_s, device_s)


def nccl_view(topology: Topology, ranks: Sequence[str], network_latency_s: float = 0.0) -> NcclView:
    """Read from the graph what NCCL's tuner would see of ``ranks``.

    Parameters
    ----------
    topology : Topology
    ranks : sequence of str
        GPU rank nodes; a rank's machine is its ``host_id`` (one machine when none is given).
    network_latency_s : float
        Latency of the network beyond NCCL's own per-hop figure (e.g. measured by ``topocoll
        topo probe``).

    Returns
    -------
    NcclView

    Raises
    ------
    SolverError
        A rank that is not a GPU of the topology, or a GPU without NVLink or PCIe links.

    Examples
    --------
    >>> from topocoll.topo.presets import build_preset
    >>> h100 = build_preset("dgx-h100")
    >>> view = nccl_view(h100, h100.compute_nodes())
    >>> view.ranks, view.machines, view.intra, round(view.gpu_bw_bytes_per_s / 1e9), view.nvls
    (8, 1, 'nvlink', 450, True)
    """
    nodes = {n.id: n for n in topology.nodes}
    for r in ranks:
        if r not in nodes or nodes[r].kind is not NodeKind.GPU:
            raise SolverError(f"NCCL's model needs GPU ranks; {r!r} is {'not in the topology' if r not in nodes else 'a ' + nodes[r].kind.value}")
    members: dict[str, list[str]] = {}
    for r in ranks:
        members.setdefault(nodes[r].host_id or "", []).append(r)
    switches = {n.id for n in topology.nodes if n.kind is NodeKind.NVSWITCH}
    to_switches: dict[str, float] = {r: 0.0 for r in ranks}
    nvlinked = {r: False for r in ranks}
    nic_bw: dict[str, float] = {}  # each NIC's bandwidth to the network
    pcie_parents: dict[str, set[str]] = {}  # node -> the PCIe nodes it hangs from
    for link in topology.links:
        if link.src in to_switches and link.kind is LinkKind.NVLINK:
            nvlinked[link.src] = True
            if link.dst in switches:
                to_switches[link.src] += link.bw_bytes_per_s
        src = nodes[link.src]
        if src.kind is NodeKind.NIC and link.kind is LinkKind.NET and nodes[link.dst].kind is not NodeKind.NIC:
            nic_bw[link.src] = nic_bw.get(link.src, 0.0) + link.bw_bytes_per_s
        if link.kind is LinkKind.PCIE and src.kind in (NodeKind.GPU, NodeKind.NIC):
            pcie_parents.setdefault(link.src, set()).add(link.dst)
    network = {m: _usable_network_bw(group, nodes, nic_bw, pcie_parents) for m, group in members.items()}
    sms = [nodes[r].sm for r in ranks]
    sm = None if None in sms else min(s for s in sms if s is not None)
    switched = all(to_switches[r] > 0 for r in ranks)
    # Machines alike (the same GPUs of the same wiring) have the same rings: build them once.
    wiring: dict[str | None, list[tuple[str, float]]] = {}
    for link in topology.links:
        host = nodes[link.src].host_id
        if host is not None and host == nodes[link.dst].host_id:
            wiring.setdefault(host, []).append((link.kind.value, link.bw_bytes_per_s))
    rings: dict[object, float] = {}
    for host, group in members.items():
        indices = tuple(nodes[r].index for r in group)
        key: object = (indices, tuple(sorted(wiring.get(host, [])))) if None not in indices and host else host
        if key not in rings:
            rings[key] = _machine_ring_busbw(topology, group, to_switches if switched else None)
    gpu_bw = min(rings.values())
    network_bw = min(network.get(m, 0.0) for m in members) if len(members) > 1 else None
    if network_bw is not None and not network_bw > 0:
        raise SolverError(f"machine {min(members, key=lambda m: network.get(m, 0.0))!r} has no network link: NCCL's model cannot join it")
    nvls = switched and sm is not None and sm >= NVLS_MIN_SM
    intra = "nvlink" if all(nvlinked.values()) else "pcie"
    return NcclView(len(ranks), len(members), sm, intra, gpu_bw, network_bw, nvls, network_latency_s)


def _usable_network_bw(group: Sequence[str], nodes: dict, nic_bw: dict[str, float], pcie_parents: dict[str, set[str]]) -> float:
    """The network bandwidth NCCL reaches from ``group``, the ranks of one machine.

    NCCL sends through the NICs nearest its GPUs (under the same PCIe switch) and, through
    NVLink, those nearest the machine's other GPUs of the communicator (PXN): the NICs that
    share a PCIe parent with a rank of the group. Where the graph places no NIC so (no PCIe
    detail), every NIC of the machine counts.
    """
    machine = nodes[group[0]].host_id
    nics = [nic for nic in nic_bw if nodes[nic].host_id == machine]
    parents = set().union(*(pcie_parents.get(r, set()) for r in group))
    near = [nic for nic in nics if pcie_parents.get(nic, set()) & parents]
    return sum(nic_bw[nic] for nic in (near or nics))


def _machine_ring_busbw(topology: Topology, group: Sequence[str], to_switches: dict[str, float] | None) -> float:
    """The most bus bandwidth NCCL's rings can have among ``group``, the ranks of one machine.

    Behind NVSwitches every GPU reaches every other at its full NVLink bandwidth, which rings
    use all of (``to_switches``); elsewhere (an NVLink mesh, PCIe) the rings are those of
    :func:`topocoll.solver.baselines.multichannel_ring`, one per channel, over the graph.
    """
    if len(group) == 1:
        return math.inf  # nothing to cross inside this machine
    if to_switches is not None:
        return min(to_switches[r] for r in group)
    from topocoll.solver.baselines import multichannel_ring
    from topocoll.solver.verify import verify

    checked = verify(multichannel_ring(topology, Collective.ALLGATHER, list(group)), topology)
    if not checked.ok:
        raise SolverError(f"no ring joins the GPUs {', '.join(group)} of one machine: {checked.errors[0]}")
    return (len(group) - 1) / len(group) / checked.t_bw_s_per_byte


def nccl_estimates(view: NcclView, collective: Collective, calibration: Calibration = CALIBRATION) -> tuple[NcclEstimate, ...]:
    """Every algorithm and protocol NCCL could run for ``collective`` on ``view``, predicted.

    Parameters
    ----------
    view : NcclView
    collective : Collective
    calibration : Calibration

    Returns
    -------
    tuple of NcclEstimate
        Empty for one rank.
    """
    n, machines = view.ranks, view.machines
    if n < 2:
        return ()
    ppn = view.ranks_per_machine
    sm = view.sm or 0
    host = calibration.overhead_s(view.sm)
    scale = calibration.latency_scale
    nvls_scale = calibration.nvls_latency_scale
    ops = NVLS_CHANNELS * max(1, round(view.ranks_per_machine))  # NVLS: a channel's head per GPU

    def nvls_chunks(bw_bytes_per_s: float) -> NvlsChunks:
        return NvlsChunks(bw_bytes_per_s, calibration.nvls_chunk_s, ops)

    allreduce = collective is Collective.ALLREDUCE
    steps = 2 * (n - 1) if allreduce else n - 1 if collective in (Collective.ALLGATHER, Collective.REDUCE_SCATTER) else n
    net_steps = 0 if machines == 1 else (2 if allreduce else 1) * (machines - 1)
    # The bus bandwidth an algorithm reaches, turned into algbw by nccl-tests' factor.
    bus_to_alg = n / steps if collective is not Collective.BROADCAST and collective is not Collective.REDUCE else 1.0
    network_bw = view.network_bw_bytes_per_s * calibration.network_efficiency if view.network_bw_bytes_per_s else math.inf
    ring_busbw = min(view.gpu_bw_bytes_per_s * calibration.ring_efficiency, network_bw)
    protocols = [Protocol.LL, Protocol.SIMPLE]
    if view.intra == "nvlink" and sm >= LL128_MIN_SM and (machines == 1 or view.network_rdma):
        protocols.insert(1, Protocol.LL128)
    ll_max = LL_MAX_BUSBW_ONE_MACHINE.get(10 * (sm // 10), LL_MAX_BUSBW_ONE_MACHINE[70]) if machines == 1 else LL_MAX_BUSBW_NETWORK[machines > 2]
    intra = view.intra
    out = []
    for p in protocols:
        i = list(Protocol).index(p)
        busbw = ring_busbw * PROTOCOL_BW_FACTOR[p]
        if p is Protocol.LL:
            busbw = min(busbw, ll_max)
        hop = HOP_LATENCY_S[intra][Algorithm.RING][i] * scale
        net = HOP_LATENCY_S["net"][Algorithm.RING][i] * scale + view.network_hop_latency_s(p)
        latency = BASE_LATENCY_S[Algorithm.RING][i] * scale + (steps - net_steps) * hop + net_steps * net
        out.append(NcclEstimate(Algorithm.RING, p, latency, busbw * bus_to_alg, host))
    simple = list(Protocol).index(Protocol.SIMPLE)
    if collective in (Collective.ALLGATHER, Collective.REDUCE_SCATTER):
        if view.nvls and machines == 1:
            # The switch multicasts (allgather) or reduces (reduce-scatter) each shard: every
            # GPU moves S (n - 1) / n through its NVLinks, as in a ring, with NVLS's efficiency.
            latency = HOP_LATENCY_S["nvlink"][Algorithm.NVLS][simple] * nvls_scale
            nvls_bw = view.gpu_bw_bytes_per_s * calibration.nvls_efficiency * n / (n - 1)
            out.append(NcclEstimate(Algorithm.NVLS, Protocol.SIMPLE, latency, nvls_bw, host, nvls_chunks(nvls_bw)))
        if machines == n and sm >= PAT_MIN_SM:
            levels = math.ceil(math.log2(n))
            net = HOP_LATENCY_S["net"][Algorithm.PAT][simple] * scale + view.network_hop_latency_s(Protocol.SIMPLE)
            latency = BASE_LATENCY_S[Algorithm.PAT][simple] * scale + levels * net / PAT_LEVEL_LATENCY_DIVISOR + n * PAT_RANK_LATENCY_S * scale
            out.append(NcclEstimate(Algorithm.PAT, Protocol.SIMPLE, latency, ring_busbw * PAT_BW_FACTOR, host))
    if not allreduce:
        return tuple(out)
    # Trees: a chain inside each machine, a double binary tree between machines. Each GPU of a
    # chain sends the buffer up and down once (algbw <= half its bandwidth), by the same copies
    # between neighbours as a ring's; between two machines each sends and receives the buffer
    # once, between more, up to twice.
    chain_algbw = view.gpu_bw_bytes_per_s * calibration.ring_efficiency / 2 if ppn > 1 else math.inf
    tree_net_algbw = network_bw * (1.0 if machines <= 2 else 0.5)
    depth = math.ceil(math.log2(machines)) if machines > 1 else 0
    for p in protocols:
        i = list(Protocol).index(p)
        algbw = min(chain_algbw, tree_net_algbw) * PROTOCOL_BW_FACTOR[p]
        if p is Protocol.LL:
            algbw = min(algbw, ll_max / 2)
        hop = HOP_LATENCY_S[intra][Algorithm.TREE][i] * scale
        net = HOP_LATENCY_S["net"][Algorithm.TREE][i] * scale + view.network_hop_latency_s(p)
        latency = BASE_LATENCY_S[Algorithm.TREE][i] * scale + 2 * ((ppn - 1) * hop + depth * net)
        out.append(NcclEstimate(Algorithm.TREE, p, latency, algbw, host))
    if view.nvls and ppn > 1:
        # Each GPU sends its buffer to the switch and receives the reduced buffer once (plus its
        # own shard's round trip): algbw <= B / (1 + 1/ppn) inside a machine.
        nvls_algbw = view.gpu_bw_bytes_per_s * calibration.nvls_efficiency / (1 + 1 / ppn)
        if machines == 1:
            latency = HOP_LATENCY_S["nvlink"][Algorithm.NVLS][simple] * nvls_scale
            out.append(NcclEstimate(Algorithm.NVLS, Protocol.SIMPLE, latency, nvls_algbw, host, nvls_chunks(nvls_algbw)))
        else:
            net = HOP_LATENCY_S["net"][Algorithm.NVLS_TREE][simple] * scale + view.network_hop_latency_s(Protocol.SIMPLE)
            latency = HOP_LATENCY_S["nvlink"][Algorithm.NVLS_TREE][simple] * nvls_scale + 2 * depth * net
            algbw = min(nvls_algbw, tree_net_algbw)
            out.append(NcclEstimate(Algorithm.NVLS_TREE, Protocol.SIMPLE, latency, algbw, host, nvls_chunks(nvls_algbw)))
    return tuple(out)


def nccl_time(
    view: NcclView,
    collective: Collective,
    size_bytes: float,
    calibration: Calibration = CALIBRATION,
    algorithms: frozenset[Algorithm] | None = None,
) -> NcclEstimate:
    """The fastest of :func:`nccl_estimates` at ``size_bytes``: what NCCL's tuner picks (by the
    device's time: the host's cost is the same for all).

    Parameters
    ----------
    view, collective, size_bytes, calibration
        As :func:`nccl_estimates`; ``size_bytes`` is nccl-tests' size.
    algorithms : frozenset of Algorithm, optional
        Only these, as ``NCCL_ALGO`` restricts NCCL's tuner (:func:`nccl_algorithms` reads its
        syntax); None: every algorithm.

    Raises
    ------
    ValueError
        For fewer than two ranks, a size that is not positive, or ``algorithms`` of which none
        runs here (NCCL fails such a call: no algorithm/protocol available).
    """
    if not size_bytes > 0:
        raise ValueError(f"size must be > 0 bytes, got {size_bytes}")
    estimates = nccl_estimates(view, collective, calibration)
    if not estimates:
        raise ValueError("NCCL's model needs two ranks or more")
    if algorithms is not None:
        estimates = tuple(e for e in estimates if e.algorithm in algorithms)
        if not estimates:
            wanted = ", ".join(sorted(a.value for a in algorithms))
            raise ValueError(f"none of the algorithms {wanted} runs {collective.value} on these ranks")
    return min(estimates, key=lambda e: e.device_s(size_bytes))


def nccl_algorithms(spec: str) -> frozenset[Algorithm]:
    """The algorithms an ``NCCL_ALGO`` value allows: names separated by commas, any case
    (``Ring``, ``Tree``, ``NVLS``, ``NVLSTree``, ``PAT``), or all but those after a leading ``^``.

    Raises
    ------
    ValueError
        For an empty value or a name the model does not know (CollNet is not modelled).

    Examples
    --------
    >>> sorted(a.value for a in nccl_algorithms("NVLS"))
    ['nvls']
    >>> sorted(a.value for a in nccl_algorithms("^ring,tree"))
    ['nvls', 'nvls_tree', 'pat']
    """
    exclude = spec.startswith("^")
    names = [n.strip() for n in spec.removeprefix("^").split(",") if n.strip()]
    if not names:
        raise ValueError(f"NCCL_ALGO {spec!r} names no algorithm")
    by_name = {a.value.replace("_", ""): a for a in Algorithm}
    chosen = set()
    for name in names:
        algorithm = by_name.get(name.lower().replace("_", ""))
        if algorithm is None:
            raise ValueError(f"NCCL_ALGO {spec!r}: unknown algorithm {name!r} (known: Ring, Tree, NVLS, NVLSTree, PAT)")
        chosen.add(algorithm)
    return frozenset(set(Algorithm) - chosen if exclude else chosen)


@dataclass(frozen=True, slots=True)
class NcclNative:
    """NCCL's own collectives on some ranks, as the planner's native model
    (:class:`topocoll.solver.planner.NativeModel`).

    Attributes
    ----------
    view : NcclView
    calibration : Calibration

    Examples
    --------
    >>> from topocoll.topo.presets import build_preset
    >>> h100 = build_preset("dgx-h100")
    >>> nccl = NcclNative(nccl_view(h100, h100.compute_nodes()))
    >>> round(nccl.time_s(Collective.ALLREDUCE, 1 << 30) * 1e3, 1)  # ms, NVLS; Azure's NDv5 table: 4.0 (466 GB/s busbw)
    4.1
    """

    view: NcclView
    calibration: Calibration = CALIBRATION

    @property
    def call_overhead_s(self) -> float:
        """The host's cost of one call on these GPUs (:meth:`Calibration.overhead_s`)."""
        return self.calibration.overhead_s(self.view.sm)

    def call_s(self, device_s: float) -> float:
        """A call that keeps the device busy ``device_s``, issued behind others
        (:func:`call_time_s` with :attr:`call_overhead_s`)."""
        return call_time_s(self.call_overhead_s, device_s)

    def link_efficiency(self, kind: LinkKind) -> float:
        """The share of a ``kind`` link that NCCL's point-to-point transfers reach: between
        machines the network's (:attr:`Calibration.network_efficiency`), inside a machine its
        rings' (:attr:`Calibration.ring_efficiency`: a ring step is one such copy between
        neighbours)."""
        return self.calibration.network_efficiency if kind is LinkKind.NET else self.calibration.ring_efficiency

    @property
    def latency_factor(self) -> float:
        """:attr:`Calibration.latency_scale`: schedules are priced with NCCL's published
        per-message latency, which the tables show to be that much too small."""
        return self.calibration.latency_scale

    def time_s(self, collective: Collective, size_bytes: float) -> float:
        """Predicted time of NCCL's ``collective`` of ``size_bytes`` (:func:`nccl_time`)."""
        return nccl_time(self.view, collective, size_bytes, self.calibration).time_s(size_bytes)

    def algbw_bytes_per_s(self, collective: Collective) -> float:
        """NCCL's best algorithm bandwidth for ``collective``: what large sizes approach."""
        return max(e.algbw_bytes_per_s for e in nccl_estimates(self.view, collective, self.calibration))


def nccl_native(topology: Topology, ranks: Sequence[str], network_latency_s: float = 0.0) -> NcclNative | None:
    """NCCL's model for ``ranks``, or None where the model does not apply: ranks that are not
    GPUs, or a graph that does not say how they connect (a GPU without NVLink or PCIe links, a
    machine without a network link); the reason is logged."""
    try:
        return NcclNative(nccl_view(topology, ranks, network_latency_s))
    except SolverError as exc:
        log.info("no model of NCCL's collectives here: %s", exc)
        return None
