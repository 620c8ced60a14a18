"""Which topology node every rank of a group runs on.

At group creation every rank publishes its :class:`RankIdentity` through the group's store:
its machine (:func:`topocoll.topo.host.host_identity`) and its device — for a CUDA rank the
PCI bus id of ``torch.cuda.current_device()`` (the physical device, so ``CUDA_VISIBLE_DEVICES``
and CUDA's device order do not matter), for a CPU rank the NUMA node of the CPUs it may run on.
Every rank reads all of them and computes the same placement, so errors are raised alike on
every rank.

:func:`map_ranks` places the ranks on the compute nodes of a given topology (a file, or one
passed in the group's options):

1. **Machines.** When every rank's host name is a ``host_id`` of the topology, by name;
   otherwise, when the topology describes as many machines as the ranks run on, in order
   (the machine of the lowest rank first, against the topology's machines in rank order). A
   topology whose compute nodes name no machine is taken to be the ranks' only one.
2. **Devices.** A CUDA rank goes on the GPU with its bus id. On a topology that gives GPUs bus
   ids, a device it does not have, or two ranks on one GPU, is an error naming the rank, its
   host and its device. A CPU rank goes on a ``host`` node of its NUMA node when the topology
   gives NUMA nodes.
3. **The rest.** Ranks the topology says nothing to (no machine names, no bus ids: e.g. the
   flat topology or a preset) keep the rule of the first release, global rank ``g`` on the
   ``g``-th compute node; on a topology with machine names, the remaining ranks of a machine
   take its remaining compute nodes in order.

A topology assembled by discovery is built around the ranks instead
(:func:`topocoll.topo.assemble.assemble_cluster`), so it needs no placement.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from topocoll.errors import CollectiveError, TopologyError
from topocoll.topo.host import HostIdentity, numa_of_cpus, process_cpus
from topocoll.topo.model import NodeKind, Topology

__all__ = ["RankIdentity", "local_identity", "exchange_identities", "host_order", "map_ranks"]

logger = logging.getLogger(__name__)

_KEY = "identity"
"""Store key prefix of the published identities (in the group's own store prefix)."""


@dataclass(frozen=True, slots=True)
class RankIdentity:
    """Where one rank of a group runs.

    Parameters
    ----------
    rank : int
        Rank in the group.
    global_rank : int
        Rank in the world.
    host : str
        Host name (``host_id`` of its machine's nodes in a discovered topology).
    host_key : str
        Equal for ranks of one machine (:class:`topocoll.topo.host.HostIdentity`).
    device : str
        ``"cuda:<index>"`` or ``"cpu"``.
    busid : str, optional
        PCI bus id of the CUDA device (``dddd:bb:dd.f``), when known.
    numa : int, optional
        NUMA node of a CPU rank's CPUs, when known.
    """

    rank: int
    global_rank: int
    host: str
    host_key: str
    device: str
    busid: str | None = None
    numa: int | None = None

    @property
    def is_cuda(self) -> bool:
        """Whether the rank runs on a CUDA device."""
        return self.device.startswith("cuda")

    def describe(self) -> str:
        """E.g. ``"rank 3 (host node1, cuda:1 at 0000:07:00.0)"``."""
        where = self.device
        if self.busid:
            where += f" at {self.busid}"
        elif self.numa is not None:
            where += f" on NUMA node {self.numa}"
        return f"rank {self.rank} (host {self.host}, {where})"

    def to_json(self) -> str:
        """Compact JSON of the fields."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, source: str) -> RankIdentity:
        """Parse :meth:`to_json` output; a CollectiveError naming ``source`` if it is not one."""
        try:
            data = json.loads(text)
            identity = cls(**data)
        except (ValueError, TypeError) as exc:
            raise CollectiveError(f"{source}: not a rank identity: {exc}") from None
        if not isinstance(identity.rank, int) or not isinstance(identity.host_key, str):
            raise CollectiveError(f"{source}: not a rank identity: {text[:80]!r}")
        return identity


def _cuda_busid(index: int) -> str | None:
    """PCI bus id of CUDA device ``index`` as sysfs writes it, or None when torch cannot say."""
    properties = torch.cuda.get_device_properties(index)
    try:
        domain, bus, device = properties.pci_domain_id, properties.pci_bus_id, properties.pci_device_id
    except AttributeError:  # a torch without the PCI fields of cudaDeviceProp
        logger.warning("torch does not report the PCI bus id of cuda:%d; the rank is placed by order", index)
        return None
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def local_identity(
    rank: int,
    global_rank: int,
    host: HostIdentity,
    *,
    device: torch.device | None = None,
    sysfs_root: str = "/sys",
) -> RankIdentity:
    """This process's identity in a group.

    Parameters
    ----------
    rank, global_rank : int
        Ranks in the group and in the world.
    host : HostIdentity
        This machine.
    device : torch.device, optional
        The group's device. Default: ``cuda:<current device>`` where CUDA is available, else
        the CPU.
    sysfs_root : str
        Root of sysfs, to find the NUMA node of this process's CPUs.
    """
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return RankIdentity(rank, global_rank, host.name, host.key, f"cuda:{index}", busid=_cuda_busid(index))
    return RankIdentity(rank, global_rank, host.name, host.key, "cpu", numa=numa_of_cpus(process_cpus(), sysfs_root))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def exchange_identities(store: Any, identity: RankIdentity, size: int) -> tuple[RankIdentity, ...]:
    """Publish ``identity`` in the group's store and read every rank's, in rank order.

    Raises
    ------
    CollectiveError
        A rank did not publish within the store's timeout, or published something else.
    """
    store.set(f"{_KEY}/{identity.rank}", identity.to_json())
    identities = []
    for peer in range(size):
        try:
            text = _text(store.get(f"{_KEY}/{peer}"))
        except RuntimeError as exc:
            raise CollectiveError(f"rank {identity.rank}: rank {peer} never said where it runs: {exc}") from None
        found = RankIdentity.from_json(text, f"rank {identity.rank}: identity of rank {peer}")
        if found.rank != peer:
            raise CollectiveError(f"rank {identity.rank}: identity of rank {peer} names rank {found.rank}")
        identities.append(found)
    return tuple(identities)


def host_order(identities: Sequence[RankIdentity]) -> tuple[str, ...]:
    """The ranks' machines (host keys), the machine of the lowest rank first."""
    return tuple(dict.fromkeys(identity.host_key for identity in identities))


def _topology_hosts(topology: Topology) -> tuple[str | None, ...]:
    """The topology's machines (``host_id`` of its compute nodes), in rank order."""
    return tuple(dict.fromkeys(topology.node(node).host_id for node in topology.compute_nodes()))


def _assign_hosts(topology: Topology, identities: Sequence[RankIdentity]) -> dict[str, str | None]:
    """Host key of the ranks -> ``host_id`` of the topology machine they run on."""
    ours = host_order(identities)
    theirs = _topology_hosts(topology)
    if theirs == (None,):
        return dict.fromkeys(ours)  # a topology that names no machine: the ranks' only one
    names = {identity.host_key: identity.host for identity in identities}
    if set(names.values()) <= set(theirs) and len(set(names.values())) == len(ours):
        return names
    if len(theirs) == len(ours):
        return dict(zip(ours, theirs))
    label = topology.name or "(unnamed)"
    shown = ", ".join(str(h) for h in theirs[:4]) + (" ..." if len(theirs) > 4 else "")
    raise TopologyError(
        f"topology {label} describes {len(theirs)} machines ({shown}), but the ranks run on {len(ours)} "
        f"({', '.join(sorted(set(names.values()))[:4])}); give a topology of the machines the job runs on"
    )


def map_ranks(topology: Topology, identities: Sequence[RankIdentity]) -> tuple[str, ...]:
    """The compute node of every rank (see the module documentation for the rules).

    Parameters
    ----------
    topology : Topology
        The group's topology.
    identities : sequence of RankIdentity
        One per group rank, in rank order.

    Returns
    -------
    tuple of str
        ``nodes[i]`` is the node of group rank ``i``.

    Raises
    ------
    TopologyError
        A rank's device is not in the topology, two ranks share a GPU, the machines do not
        match, or there are fewer compute nodes than ranks.
    """
    compute = topology.compute_nodes()
    host_of = _assign_hosts(topology, identities)
    anonymous = all(topology.node(n).host_id is None for n in compute)
    nodes: list[str | None] = [None] * len(identities)
    owner: dict[str, RankIdentity] = {}

    def place(identity: RankIdentity, node: str) -> None:
        if node in owner:
            other = owner[node]
            raise TopologyError(f"{other.describe()} and {identity.describe()} would both run on {node}; give each rank its own device")
        owner[node] = identity
        nodes[identity.rank] = node

    for key in host_order(identities):
        members = [identity for identity in identities if identity.host_key == key]
        candidates = [n for n in compute if topology.node(n).host_id == host_of[key]]
        by_busid = {topology.node(n).busid: n for n in candidates if topology.node(n).busid}
        for identity in members:
            if identity.busid is None or not by_busid:
                continue
            node = by_busid.get(identity.busid)
            if node is None:
                shown = ", ".join(sorted(by_busid)[:8])
                raise TopologyError(
                    f"{identity.describe()}: its GPU is not in topology {topology.name or '(unnamed)'} "
                    f"(which has GPUs at {shown} on that machine)"
                )
            place(identity, node)
        for identity in members:
            if nodes[identity.rank] is not None or identity.numa is None:
                continue
            local = [n for n in candidates if topology.node(n).kind is NodeKind.HOST and topology.node(n).numa == identity.numa]
            free = [n for n in local if n not in owner]
            if free:
                place(identity, free[0])
        for identity in members:
            if nodes[identity.rank] is not None:
                continue
            if anonymous:
                # nothing says where the nodes are: the first release's rule, stable across groups
                if identity.global_rank >= len(compute):
                    raise TopologyError(
                        f"topology {topology.name or '(unnamed)'} has {len(compute)} compute nodes, "
                        f"global rank {identity.global_rank} needs at least {identity.global_rank + 1}"
                    )
                place(identity, compute[identity.global_rank])
                continue
            free = [n for n in candidates if n not in owner]
            if not free:
                raise TopologyError(
                    f"{identity.describe()}: no free compute node left on machine {host_of[key]} of topology "
                    f"{topology.name or '(unnamed)'} ({len(candidates)} compute nodes for {len(members)} ranks)"
                )
            place(identity, free[0])
    return tuple(node for node in nodes if node is not None)
