"""Where a process group's topology comes from, and where every rank runs on it.

At group creation (:func:`group_topology`), in this order:

1. Every rank publishes where it runs (:mod:`topocoll.collectives.placement`).
2. The topology is the one passed in the group's options, else the file named by
   ``$TOPOCOLL_TOPOLOGY``, else **discovered**: the lowest rank of every machine discovers its
   machine (:func:`topocoll.topo.discover.discover_host`: NVML, the PCIe tree, NUMA nodes and
   NICs from sysfs; a machine without GPUs as its NUMA layout). Where ``$NCCL_TOPO_FILE`` names
   an NCCL topology file (as cloud images set it), that file is read as NCCL reads it and
   completed with what discovery saw (:func:`topocoll.topo.merge.merge_topologies`: the file
   wins where both say something, discovery fills in what it omits, such as NVLinks). The
   machine graphs travel through the store, and every rank joins them into one cluster
   (:func:`topocoll.topo.assemble.assemble_cluster`), with the network described by the file
   ``$TOPOCOLL_CLUSTER`` names, or else modelled (one switch per rail when every machine has the
   same NICs, one switch otherwise).
3. The ranks are placed on the topology by identity (:func:`topocoll.collectives.placement.map_ranks`;
   an assembled topology is built around them, its compute nodes ranked by group rank); the
   backend then checks that every rank has the same topology (its digest). A given topology is
   kept as it is, so schedules made for it offline keep fitting.

``$TOPOCOLL_TOPO_DUMP_FILE`` makes the rank whose global rank is
``$TOPOCOLL_TOPO_DUMP_FILE_RANK`` (default 0) write the group's topology there (contract-1
JSON, or NCCL XML for a ``.xml`` name), as ``NCCL_TOPO_DUMP_FILE`` does for NCCL: any run can be
replayed with ``topocoll synthesize --topology <file>``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topocoll.collectives.placement import RankIdentity, host_order, map_ranks
from topocoll.errors import CollectiveError, TopocollError
from topocoll.topo.model import Topology

__all__ = ["TopologySettings", "group_topology", "discover_machine", "dump_topology", "summary"]

logger = logging.getLogger(__name__)

TOPOLOGY_ENV = "TOPOCOLL_TOPOLOGY"
"""Environment variable naming the topology file every rank loads."""

_HOST_KEY = "host"
"""Store key prefix of the machine graphs (in the group's own prefix)."""

_ERROR = "error:"
"""Prefix of what a discovering rank publishes instead of its machine graph when it failed."""


@dataclass(frozen=True, slots=True)
class TopologySettings:
    """What the environment says about the topology (read once, at the edge).

    Parameters
    ----------
    topology_file : str, optional
        ``$TOPOCOLL_TOPOLOGY``: the whole topology, placement by identity.
    nccl_topo_file : str, optional
        ``$NCCL_TOPO_FILE``: this machine's NCCL topology, completed by discovery.
    cluster_file : str, optional
        ``$TOPOCOLL_CLUSTER``: the network between machines (:mod:`topocoll.topo.assemble`).
    dump_file : str, optional
        ``$TOPOCOLL_TOPO_DUMP_FILE``: where to write the group's topology.
    dump_rank : int
        ``$TOPOCOLL_TOPO_DUMP_FILE_RANK``: the global rank that writes it (default 0).
    host_id : str, optional
        ``$TOPOCOLL_HOSTID``: this machine's identity instead of host name and boot id.
    probe : bool
        ``$TOPOCOLL_PROBE`` (``1``, ``true``, ``yes``): measure the links and plan on the
        calibrated topology (:mod:`topocoll.collectives.probe`).
    probe_cache : str, optional
        ``$TOPOCOLL_PROBE_CACHE``: where rank 0 keeps calibrated topologies, one file per
        topology digest and placement (default ``~/.cache/topocoll/probe``; ``off``: none).
    sysfs_root, proc_root : str
        Roots of sysfs and procfs (discovery of a fake machine in tests).
    """

    topology_file: str | None = None
    nccl_topo_file: str | None = None
    cluster_file: str | None = None
    dump_file: str | None = None
    dump_rank: int = 0
    host_id: str | None = None
    sysfs_root: str = "/sys"
    proc_root: str = "/proc"
    probe: bool = False
    probe_cache: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TopologySettings:
        """The settings in ``environ`` (e.g. ``os.environ``).

        Raises
        ------
        CollectiveError
            ``TOPOCOLL_TOPO_DUMP_FILE_RANK`` is not a rank number.
        """
        text = environ.get("TOPOCOLL_TOPO_DUMP_FILE_RANK", "0").strip() or "0"
        try:
            dump_rank = int(text)
        except ValueError:
            raise CollectiveError(f"TOPOCOLL_TOPO_DUMP_FILE_RANK={text!r} is not a rank number") from None
        return cls(
            topology_file=environ.get(TOPOLOGY_ENV) or None,
            nccl_topo_file=environ.get("NCCL_TOPO_FILE") or None,
            cluster_file=environ.get("TOPOCOLL_CLUSTER") or None,
            dump_file=environ.get("TOPOCOLL_TOPO_DUMP_FILE") or None,
            dump_rank=dump_rank,
            host_id=environ.get("TOPOCOLL_HOSTID") or None,
            probe=environ.get(PROBE_ENV, "").strip().lower() in ("1", "true", "yes"),
            probe_cache=environ.get("TOPOCOLL_PROBE_CACHE") or None,
        )


#: Set to 1 to probe the links when a group starts.
PROBE_ENV = "TOPOCOLL_PROBE"


def discover_machine(host_name: str, settings: TopologySettings) -> Topology:
    """This machine's graph: discovered, or ``$NCCL_TOPO_FILE`` completed by discovery."""
    from topocoll.topo.discover import discover_host

    discovered = discover_host(settings.sysfs_root, settings.proc_root, host_id=host_name)
    if not settings.nccl_topo_file:
        return discovered
    from topocoll.topo.io import load_topology
    from topocoll.topo.merge import merge_topologies

    given = load_topology(settings.nccl_topo_file)
    return merge_topologies(_on_host(given, host_name), discovered)


def _on_host(topology: Topology, host_name: str) -> Topology:
    """``topology`` with every node on machine ``host_name`` (NCCL files name no machine)."""
    import dataclasses

    nodes = [node if node.host_id == host_name else dataclasses.replace(node, host_id=host_name) for node in topology.nodes]
    return Topology(nodes, topology.links, name=topology.name, notes=topology.notes)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _discovered(store: Any, identities: Sequence[RankIdentity], rank: int, settings: TopologySettings) -> Topology:
    """Discover on the lowest rank of each machine, share the graphs, assemble the cluster."""
    from topocoll.topo.assemble import RankPlacement, assemble_cluster, load_cluster_description

    hosts = host_order(identities)
    mine = identities[rank]
    index = hosts.index(mine.host_key)
    if next(i for i in identities if i.host_key == mine.host_key).rank == rank:
        try:
            text = discover_machine(mine.host, settings).to_json()
        except TopocollError as exc:
            text = _ERROR + f"{mine.describe()} could not discover its machine: {exc}"
        except OSError as exc:
            text = _ERROR + f"{mine.describe()} could not read {exc.filename}: {exc.strerror}"
        store.set(f"{_HOST_KEY}/{index}", text)
    graphs = []
    for k, key in enumerate(hosts):
        first = next(i for i in identities if i.host_key == key)
        try:
            text = _text(store.get(f"{_HOST_KEY}/{k}"))
        except RuntimeError as exc:
            raise CollectiveError(f"rank {rank}: {first.describe()} never published its machine: {exc}") from None
        if text.startswith(_ERROR):
            raise CollectiveError(f"rank {rank}: {text[len(_ERROR):]}")
        graphs.append(Topology.from_json(text, source=f"machine of {first.describe()}"))
    placements = [
        RankPlacement(rank=i.rank, host=hosts.index(i.host_key), busid=i.busid, numa=i.numa) for i in identities
    ]
    network = load_cluster_description(settings.cluster_file) if settings.cluster_file else None
    return assemble_cluster(graphs, ranks=placements, network=network)


def group_topology(
    store: Any,
    identities: Sequence[RankIdentity],
    rank: int,
    settings: TopologySettings,
    topology: Topology | None = None,
) -> tuple[Topology, tuple[str, ...]]:
    """The group's topology, with the placement written into it, and each rank's node.

    Parameters
    ----------
    store : torch.distributed.Store
        The group's own store (machine graphs travel through it).
    identities : sequence of RankIdentity
        Every rank's identity, in group rank order.
    rank : int
        This process's group rank.
    settings : TopologySettings
        What the environment says.
    topology : Topology, optional
        The topology of the group's options, if any.

    Returns
    -------
    (Topology, tuple of str)
        The topology and the node of every group rank.

    Raises
    ------
    TopocollError
        The file cannot be loaded, discovery failed on some machine, or a rank cannot be placed.
    OSError
        The topology file cannot be read.
    """
    if topology is None and settings.topology_file:
        from topocoll.topo.io import load_topology

        topology = load_topology(settings.topology_file)
    if topology is None:
        assembled = _discovered(store, identities, rank, settings)
        ranked = {assembled.node(n).rank: n for n in assembled.compute_nodes() if assembled.node(n).rank is not None}
        nodes = tuple(ranked[r] for r in range(len(identities)))
        return assembled, nodes
    return topology, map_ranks(topology, identities)


def summary(topology: Topology) -> str:
    """One line: the topology's name, node counts by kind and digest."""
    counts = ", ".join(f"{count} {kind}" for kind, count in topology.summary_counts().items() if count)
    return f"{topology.name or '(unnamed)'}: {counts} ({topology.digest()[:19]}...)"


def dump_topology(topology: Topology, path: str) -> None:
    """Write ``topology`` to ``path`` (format by extension, written atomically)."""
    from topocoll.topo.io import save_topology

    save_topology(topology, path)
