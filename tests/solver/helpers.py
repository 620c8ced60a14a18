"""Small topology builders for the solver tests (all through TopologyBuilder).

Bandwidths are illustrative: NVLink 4 and PCIe Gen4 x16 per the figures of
``topocoll.topo.bandwidth``; the network is a 400 Gbit/s port.
"""

from __future__ import annotations

from topocoll.solver.schedule import Collective
from topocoll.topo.bandwidth import LATENCY_S, nvlink_bw_bytes_per_s, pcie_bw_bytes_per_s
from topocoll.topo.model import LinkKind, Node, NodeKind, Topology, TopologyBuilder

NVLINK_BW = nvlink_bw_bytes_per_s(4)
PCIE_BW = pcie_bw_bytes_per_s(4, 16)
NET_BW = 400e9 / 8
NVLINKS_PER_GPU = 18  # H100: 18 NVLinks per GPU (NVIDIA H100 whitepaper)


def _link(b: TopologyBuilder, a: str, c: str, kind: LinkKind, bw: float, count: int = 1) -> None:
    b.add_link(a, c, kind, bw * count, LATENCY_S[kind], count=count)


def _box(b: TopologyBuilder, n_gpus: int, prefix: str = "", host_id: str | None = None, rank0: int | None = None) -> list[str]:
    """GPUs on one NVSwitch fabric plus a PCIe tree to one CPU; returns the GPU ids."""
    gpus = []
    sw = b.add_node(Node(f"{prefix}nvswitch0", NodeKind.NVSWITCH, host_id=host_id)).id
    cpu = b.add_node(Node(f"{prefix}cpu0", NodeKind.CPU, host_id=host_id)).id
    for i in range(n_gpus):
        rank = None if rank0 is None else rank0 + i
        gpu = b.add_node(Node(f"{prefix}gpu{i}", NodeKind.GPU, rank=rank, host_id=host_id)).id
        gpus.append(gpu)
        _link(b, gpu, sw, LinkKind.NVLINK, NVLINK_BW, NVLINKS_PER_GPU)
        _link(b, gpu, cpu, LinkKind.PCIE, PCIE_BW)
    return gpus


def nvswitch_box(n_gpus: int = 4) -> Topology:
    """One machine: ``n_gpus`` GPUs on an NVSwitch (18 NVLinks each) and a CPU over PCIe."""
    b = TopologyBuilder("nvswitch-box")
    _box(b, n_gpus)
    return b.build()


def pcie_tree(n_gpus: int = 8, per_switch: int = 4) -> Topology:
    """GPUs under PCIe switches under one CPU, no NVLink."""
    b = TopologyBuilder("pcie-tree")
    cpu = b.add_node(Node("cpu0", NodeKind.CPU)).id
    for i in range(n_gpus):
        s = i // per_switch
        sw = f"pcisw{s}"
        if not b.has_node(sw):
            b.add_node(Node(sw, NodeKind.PCIE_SWITCH))
            _link(b, sw, cpu, LinkKind.PCIE, PCIE_BW)
        b.add_node(Node(f"gpu{i}", NodeKind.GPU, rank=i))
        _link(b, f"gpu{i}", sw, LinkKind.PCIE, PCIE_BW)
    return b.build()


def relay_ring(n_gpus: int = 5) -> Topology:
    """GPUs in a ring where every hop passes one relay switch: gpu_i - relay_i - gpu_{i+1}."""
    b = TopologyBuilder("relay-ring")
    for i in range(n_gpus):
        b.add_node(Node(f"gpu{i}", NodeKind.GPU, rank=i))
        b.add_node(Node(f"relay{i}", NodeKind.PCIE_SWITCH))
    for i in range(n_gpus):
        _link(b, f"gpu{i}", f"relay{i}", LinkKind.PCIE, PCIE_BW)
        _link(b, f"relay{i}", f"gpu{(i + 1) % n_gpus}", LinkKind.PCIE, PCIE_BW)
    return b.build()


def gpu_chain(n_gpus: int = 3, bw: float = NVLINK_BW) -> Topology:
    """GPUs joined in a line by direct links only (the inner GPUs must relay)."""
    b = TopologyBuilder("gpu-chain")
    for i in range(n_gpus):
        b.add_node(Node(f"gpu{i}", NodeKind.GPU, rank=i))
    for i in range(n_gpus - 1):
        _link(b, f"gpu{i}", f"gpu{i + 1}", LinkKind.NVLINK, bw)
    return b.build()


def cluster(n_hosts: int = 2, gpus_per_host: int = 4, leaves: int = 1) -> Topology:
    """``n_hosts`` NVSwitch boxes (``host_id`` set), one NIC per GPU, a leaf/spine network."""
    b = TopologyBuilder("cluster")
    spine = b.add_node(Node("spine0", NodeKind.NET_SWITCH)).id if leaves > 1 else None
    for leaf in range(leaves):
        b.add_node(Node(f"leaf{leaf}", NodeKind.NET_SWITCH))
        if spine is not None:
            _link(b, f"leaf{leaf}", spine, LinkKind.NET, NET_BW, count=8)
    for h in range(n_hosts):
        prefix = f"n{h}."
        gpus = _box(b, gpus_per_host, prefix=prefix, host_id=f"n{h}", rank0=h * gpus_per_host)
        for i, gpu in enumerate(gpus):
            nic = b.add_node(Node(f"{prefix}nic{i}", NodeKind.NIC, host_id=f"n{h}")).id
            _link(b, gpu, nic, LinkKind.PCIE, PCIE_BW)
            _link(b, nic, f"leaf{h % leaves}", LinkKind.NET, NET_BW)
    return b.build()


def host_star(n_hosts: int = 4) -> Topology:
    """CPU host processes on one network switch (a CPU-only cluster)."""
    b = TopologyBuilder("host-star")
    b.add_node(Node("sw0", NodeKind.NET_SWITCH))
    for i in range(n_hosts):
        b.add_node(Node(f"host{i}", NodeKind.HOST, rank=i, host_id=f"h{i}"))
        _link(b, f"host{i}", "sw0", LinkKind.NET, NET_BW)
    return b.build()


def ranks_connected(topology, ranks) -> bool:
    """Whether ``ranks`` reach each other when compute nodes outside them cannot forward."""
    import networkx as nx

    keep = set(ranks)
    idle = [n.id for n in topology.nodes if n.kind.is_compute and n.id not in keep]
    graph = nx.DiGraph(topology.graph)
    graph.remove_nodes_from(idle)
    first = ranks[0]
    both = (nx.descendants(graph, first) | {first}) & (nx.ancestors(graph, first) | {first})
    return keep <= both


#: Per-direction bandwidths the random topologies draw from (bytes/s): a mix of NVLink and
#: PCIe figures of :mod:`topocoll.topo.bandwidth` so that cuts of very different widths occur.
RANDOM_BWS = (NVLINK_BW, NVLINK_BW * 2, PCIE_BW, PCIE_BW / 2, NET_BW)


def random_topology(draw, min_gpus: int = 2, max_gpus: int = 5, max_switches: int = 3, symmetric: bool = True) -> Topology:
    """A random connected topology, for use inside a ``hypothesis.strategies.composite``.

    ``draw`` is hypothesis' draw function. GPUs ``gpu0..`` and switches ``sw0..`` (PCIe
    switches: pure forwarders) are joined first by a random spanning tree, then by a few extra
    links. Every link exists in both directions; with ``symmetric`` the two directions have
    the same bandwidth (full duplex), otherwise each direction draws its own.
    """
    from hypothesis import strategies as st

    n_gpus = draw(st.integers(min_gpus, max_gpus))
    n_switches = draw(st.integers(0, max_switches))
    names = [f"gpu{i}" for i in range(n_gpus)] + [f"sw{i}" for i in range(n_switches)]
    order = draw(st.permutations(names))
    pairs: set[tuple[str, str]] = set()
    for k in range(1, len(order)):
        parent = order[draw(st.integers(0, k - 1))]
        pairs.add((parent, order[k]))
    all_pairs = [(a, c) for i, a in enumerate(names) for c in names[i + 1 :]]
    extra = draw(st.lists(st.sampled_from(all_pairs), max_size=len(names)))
    for a, c in extra:
        if (a, c) not in pairs and (c, a) not in pairs:
            pairs.add((a, c))
    b = TopologyBuilder("random")
    for name in names:
        b.add_node(Node(name, NodeKind.GPU if name.startswith("gpu") else NodeKind.PCIE_SWITCH))
    bw = st.sampled_from(RANDOM_BWS)
    for a, c in sorted(pairs):
        kind = LinkKind.NVLINK if a.startswith("gpu") and c.startswith("gpu") else LinkKind.PCIE
        forward = draw(bw)
        if symmetric:
            b.add_link(a, c, kind, forward, LATENCY_S[kind])
        else:
            b.add_link(a, c, kind, forward, LATENCY_S[kind], duplex=False)
            b.add_link(c, a, kind, draw(bw), LATENCY_S[kind], duplex=False)
    return b.build()


#: Column generation stops within 0.1 % of the bound (SynthesisOptions.gap); the goal is 99.5 %.
MIN_RATIO = 0.995
#: A schedule can never beat the bound; this covers float rounding only.
NEVER_BELOW = 1 + 1e-6
#: The collectives whose cut bound is exact (allreduce's is a reference, see DESIGN's measures).
BOUNDED = (Collective.ALLGATHER, Collective.REDUCE_SCATTER, Collective.BROADCAST, Collective.REDUCE)


def ratio_to_bound(topo: Topology, synthesis) -> float:
    """``bound / T_bw`` of a synthesis, its schedule verified first (the verifier measures T_bw)."""
    from topocoll.solver.verify import verify

    checked = verify(synthesis.schedule, topo)
    assert checked.ok, checked.errors[:3]
    return synthesis.bound.time_per_byte_s / checked.t_bw_s_per_byte
