"""Partial allocations: the part of a cluster a job scheduler hands to one job.

A batch scheduler rarely gives a job a clean block of machines. :func:`allocate` takes a
cluster topology and keeps what one job sees: some machines, picked at random as a busy
scheduler leaves them, and on each of them some of its GPUs (a job that asked for fewer GPUs
per node than the machine has, or that shares machines with other jobs).

The job's topology keeps, for every chosen machine, the chosen GPUs and everything of the
machine that is not a GPU (PCIe switches, CPUs, NVSwitches, NICs: a job's traffic may cross
them), and the whole network; GPUs of other jobs and machines outside the allocation are
removed, since they neither send, receive nor forward this job's data. Ranks are renumbered
node-major, as launchers number them.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from topocoll.errors import TopologyError
from topocoll.topo.model import Node, NodeKind, Topology, natural_key

__all__ = ["allocate"]


def allocate(
    topology: Topology,
    nodes: int | None = None,
    gpus_per_node: int | Sequence[int] | None = None,
    *,
    seed: int = 0,
    name: str | None = None,
) -> Topology:
    """The part of ``topology`` a job of ``nodes`` machines x ``gpus_per_node`` GPUs gets.

    Parameters
    ----------
    topology : Topology
        A cluster: GPUs carry a ``host_id`` (as :func:`topocoll.topo.cluster.make_cluster`
        writes them).
    nodes : int, optional
        Machines in the job, chosen at random among those with enough GPUs (default: all).
    gpus_per_node : int or sequence of int, optional
        GPUs of each chosen machine, chosen at random (default: all of them); a sequence gives
        one count per machine, in rank order (``(8, 8, 1)``: two whole machines and one GPU of a
        third), and then the number of machines too.
    seed : int
        Seed of the random choices: the same seed gives the same allocation.
    name : str, optional
        Name of the result (default: says what was allocated).

    Returns
    -------
    Topology
        The job's topology; its compute nodes are the job's GPUs, ranked node-major.

    Raises
    ------
    TopologyError
        More machines or GPUs per machine asked for than the cluster has, counts < 1, or a
        topology whose GPUs name no machine.

    Examples
    --------
    >>> from topocoll.topo.cluster import make_cluster
    >>> job = allocate(make_cluster("dgx-h100", 8), nodes=3, gpus_per_node=5, seed=1)
    >>> len(job.compute_nodes())
    15
    >>> job = allocate(make_cluster("dgx-h100", 8), gpus_per_node=(8, 8, 1), seed=1)
    >>> [len(group) for group in job.ranks_by_host(job.compute_nodes())]
    [8, 8, 1]
    """
    by_host: dict[str, list[Node]] = {}
    for node in topology.nodes_of(NodeKind.GPU):
        if node.host_id is None:
            raise TopologyError(f"GPU {node.id} names no machine (host_id): allocations pick machines of a cluster")
        by_host.setdefault(node.host_id, []).append(node)
    if not by_host:
        raise TopologyError(f"topology {topology.name or '(unnamed)'} has no GPUs to allocate")
    hosts = sorted(by_host, key=natural_key)
    if isinstance(gpus_per_node, Sequence) and not isinstance(gpus_per_node, str):
        return _allocate_uneven(topology, by_host, hosts, nodes, tuple(gpus_per_node), seed, name)
    want_gpus = _count("gpus_per_node", gpus_per_node)
    eligible = [h for h in hosts if want_gpus is None or len(by_host[h]) >= want_gpus]
    if want_gpus is not None and not eligible:
        most = max(len(v) for v in by_host.values())
        raise TopologyError(f"a job of {want_gpus} GPUs per machine does not fit: no machine has more than {most}")
    want_nodes = _count("nodes", nodes)
    if want_nodes is not None and want_nodes > len(eligible):
        raise TopologyError(
            f"a job of {want_nodes} machines does not fit: the cluster has {len(eligible)}"
            + (f" with {want_gpus} GPUs or more" if want_gpus is not None else "")
        )
    chance = random.Random(seed)
    chosen_hosts = sorted(chance.sample(eligible, want_nodes) if want_nodes is not None else eligible, key=natural_key)
    kept_gpus: list[Node] = []
    for host in chosen_hosts:
        gpus = sorted(by_host[host], key=lambda n: natural_key(n.id))
        if want_gpus is not None:
            gpus = sorted(chance.sample(gpus, want_gpus), key=lambda n: natural_key(n.id))
        kept_gpus.extend(gpus)
    return _restrict(topology, set(chosen_hosts), kept_gpus, name or _name(topology, chosen_hosts, want_gpus, seed))


def _allocate_uneven(
    topology: Topology, by_host: dict[str, list[Node]], hosts: list[str], nodes: int | None, counts: tuple, seed: int, name: str | None
) -> Topology:
    """:func:`allocate` with one GPU count per machine: a machine at random among those with
    room for each count in turn (largest first, so that a small count does not take a machine
    a large one needs); ranks follow the counts' order."""
    if not counts:
        raise TopologyError("a job's GPU counts per machine are empty: give at least one machine")
    for count in counts:
        _count("GPUs per machine", count)
    if nodes is not None and nodes != len(counts):
        raise TopologyError(f"a job of {nodes} machines was given {len(counts)} GPU counts; give one count per machine")
    chance = random.Random(seed)
    free = list(hosts)
    placed: dict[int, str] = {}
    for i in sorted(range(len(counts)), key=lambda i: -counts[i]):
        room = [h for h in free if len(by_host[h]) >= counts[i]]
        if not room:
            most = max(len(by_host[h]) for h in hosts)
            raise TopologyError(
                f"a job of {len(counts)} machines with {', '.join(map(str, counts))} GPUs does not fit: "
                + (f"no machine has more than {most} GPUs" if counts[i] > most else f"the cluster has {len(hosts)} machines")
            )
        placed[i] = chance.choice(room)
        free.remove(placed[i])
    kept_gpus: list[Node] = []
    for i, count in enumerate(counts):  # ranks in the order of the counts
        gpus = sorted(by_host[placed[i]], key=lambda n: natural_key(n.id))
        kept_gpus.extend(sorted(chance.sample(gpus, count), key=lambda n: natural_key(n.id)))
    label = name or f"{topology.name or 'cluster'}: job of {len(counts)} machines, {'+'.join(map(str, counts))} GPUs (seed {seed})"
    return _restrict(topology, set(placed.values()), kept_gpus, label)


def _count(what: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TopologyError(f"a job's {what.replace('_', ' ')} must be an integer >= 1, got {value!r}")
    return value


def _name(topology: Topology, hosts: Sequence[str], gpus: int | None, seed: int) -> str:
    per = f"{gpus} GPUs each" if gpus is not None else "all GPUs"
    return f"{topology.name or 'cluster'}: job of {len(hosts)} machines, {per} (seed {seed})"


def _restrict(topology: Topology, hosts: set[str], gpus: list[Node], name: str) -> Topology:
    """``topology`` without other machines and other jobs' GPUs; ``gpus`` ranked in order."""
    rank_of = {node.id: rank for rank, node in enumerate(gpus)}
    nodes = []
    for node in topology.nodes:
        if node.kind is NodeKind.GPU:
            if node.id in rank_of:
                nodes.append(dataclasses.replace(node, rank=rank_of[node.id]))
        elif node.kind is NodeKind.HOST:
            continue  # CPU-process ranks are not part of a GPU job
        elif node.host_id is None or node.host_id in hosts:
            nodes.append(node)
    kept = {node.id for node in nodes}
    links = [link for link in topology.links if link.src in kept and link.dst in kept]
    notes = (*topology.notes, f"partial allocation: {len(gpus)} GPUs on {len(hosts)} machines")
    return Topology(nodes, links, name=name, notes=notes)
