"""Completing one topology of a machine with another, and the warnings a plan deserves.

Clouds ship NCCL topology files (``NCCL_TOPO_FILE``) that describe a machine's PCIe tree and
NICs but leave out its NVLinks (NCCL adds those from NVML at run time), or list only the PCIe
switches. Planning on such a file alone gives PCIe-only schedules for machines whose GPUs talk
over NVLink at many times that speed. :func:`merge_topologies` completes the file with what
discovery saw on the machine; :func:`planning_warnings` says when a topology still has links it
does not know.

Merging (``given`` wins where both say something):

- Nodes are matched by PCI bus id, CPUs by NUMA node, network placeholders through their NIC.
  Matched nodes keep the given id and attributes (missing attributes are filled in); nodes only
  discovery has are added (under their own id, or the next free one of their kind).
- A discovered link is added where the given file says nothing of that kind there: NVLinks of a
  GPU the file lists no NVLink for; the PCIe link of a device the file does not place; the
  network link of a NIC without one; SMP links between CPUs without any.
- The given notes that say NVLinks are unknown are dropped when NVML answered on the machine
  (the completing topology has GPUs and no note that NVML failed); a note says what was added.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from topocoll.topo.model import Link, LinkKind, Node, NodeKind, Topology, TopologyBuilder, natural_key

__all__ = ["merge_topologies", "planning_warnings", "unknown_link_notes"]

#: Phrases of the notes that say a topology's NVLinks are not known (written by the NCCL XML
#: and ``nvidia-smi topo -m`` importers, and by discovery without NVML).
_UNKNOWN_NVLINK_NOTES = (
    re.compile(r"no NVLinks listed"),
    re.compile(r"NVLinks unknown"),
    re.compile(r"NVLinks? (are |is )?not (known|listed|shown)"),
)
_NVML_FAILED = re.compile(r"^(NVML did not start|NVML could not list|nvidia-ml-py \(pynvml\) is not installed)")


def unknown_link_notes(topology: Topology) -> list[str]:
    """The notes of ``topology`` that say some of its NVLinks are unknown."""
    return [note for note in topology.notes if any(p.search(note) for p in _UNKNOWN_NVLINK_NOTES)]


def planning_warnings(topology: Topology) -> list[str]:
    """What a user must hear before trusting a schedule planned on ``topology``.

    Returns
    -------
    list of str
        One line per problem (empty when there is none): links the topology's source did not
        know, so schedules may leave out links the machine has.
    """
    unknown = unknown_link_notes(topology)
    if not unknown or not topology.nodes_of(NodeKind.GPU):
        return []
    return [
        f"{topology.name or 'the topology'}: {note}. Schedules planned on it use no NVLink it does not list, "
        "and their bound and % of bound are those of the file, not of the machine; complete it with "
        "'topocoll topo merge FILE DISCOVERED -o OUT' (DISCOVERED from 'topocoll topo discover' on the machine), "
        "or let the topo backend complete $NCCL_TOPO_FILE where the GPUs are"
        for note in unknown
    ]


def _matches(given: Topology, found: Topology) -> dict[str, str]:
    """Id in ``given`` of every node of ``found`` that ``given`` also has."""
    nics = {(n.busid, n.name): n.id for n in given.nodes_of(NodeKind.NIC) if n.busid}
    by_busid_any = {}
    for n in given.nodes:
        if n.busid and n.kind is not NodeKind.NIC:
            by_busid_any.setdefault(n.busid, n.id)
    cpus = {n.numa: n.id for n in given.nodes_of(NodeKind.CPU) if n.numa is not None}
    out: dict[str, str] = {}
    for node in found.nodes:
        if node.kind is NodeKind.NIC and node.busid:
            given_id = nics.get((node.busid, node.name))
            if given_id is None:  # a NIC file entry named otherwise: match the one of that bus id
                same = [n.id for n in given.nodes_of(NodeKind.NIC) if n.busid == node.busid]
                given_id = same[0] if len(same) == 1 else None
        elif node.busid:
            given_id = by_busid_any.get(node.busid)
        elif node.kind is NodeKind.CPU:
            given_id = cpus.get(node.numa)
        else:
            given_id = None
        if given_id is not None:
            out[node.id] = given_id
    for link in found.links:  # a NIC's network placeholder is the given NIC's one
        if link.kind is LinkKind.NET and link.src in out and found.node(link.dst).kind is NodeKind.NET_SWITCH:
            theirs = [l.dst for l in given.links if l.src == out[link.src] and l.kind is LinkKind.NET]
            if theirs:
                out[link.dst] = theirs[0]
    return out


def _free_id(node: Node, taken: set[str]) -> str:
    if node.id not in taken:
        return node.id
    prefix = re.sub(r"\d+$", "", node.id) or node.kind.value
    k = 0
    while f"{prefix}{k}" in taken:
        k += 1
    return f"{prefix}{k}"


def _filled(mine: Node, other: Node, rank: int | None) -> Node:
    return Node(
        mine.id,
        mine.kind,
        mine.rank if mine.rank is not None else rank,
        mine.host_id or other.host_id,
        mine.numa if mine.numa is not None else other.numa,
        mine.busid or other.busid,
        mine.name or other.name,
        mine.index if mine.index is not None else other.index,
        mine.sm if mine.sm is not None else other.sm,
        mine.gdr if mine.gdr is not None else other.gdr,
    )


def merge_topologies(given: Topology, found: Topology, *, name: str | None = None) -> Topology:
    """``given`` completed with what ``found`` knows (see the module documentation).

    Parameters
    ----------
    given : Topology
        The authoritative description (an ``NCCL_TOPO_FILE``).
    found : Topology
        What discovery saw on the same machine.
    name : str, optional
        Name of the result (default: the given one's).

    Returns
    -------
    Topology
    """
    match = _matches(given, found)
    taken = {n.id for n in given.nodes}
    for node in found.nodes:
        if node.id not in match:
            match[node.id] = _free_id(node, taken)
            taken.add(match[node.id])
    theirs = {match[n.id]: n for n in found.nodes}
    given_ids = {n.id for n in given.nodes}

    ranks = [n.rank for n in given.nodes if n.rank is not None]
    next_rank = max(ranks) + 1 if ranks else 0
    builder = TopologyBuilder(name=name if name is not None else given.name)
    for node in given.nodes:
        builder.add_node(_filled(node, theirs[node.id], None) if node.id in theirs else node)
    added_nodes = []
    for node in sorted(found.nodes, key=lambda n: natural_key(match[n.id])):
        if match[node.id] in given_ids:
            continue
        rank = None
        if node.kind.is_compute and node.rank is not None:
            rank, next_rank = next_rank, next_rank + 1
        builder.add_node(dataclasses.replace(node, id=match[node.id], rank=rank))
        added_nodes.append(match[node.id])

    kinds_at: dict[str, set[LinkKind]] = {}
    pairs = set()
    for link in given.links:
        builder.add_link(link.src, link.dst, link.kind, link.bw_bytes_per_s, link.latency_s, link.count, duplex=False)
        kinds_at.setdefault(link.src, set()).add(link.kind)
        kinds_at.setdefault(link.dst, set()).add(link.kind)
        pairs.add((link.src, link.dst))
    kind_of = {n.id: n.kind for n in given.nodes} | {match[n.id]: n.kind for n in found.nodes}

    def described(node: str, kind: LinkKind) -> bool:
        return kind in kinds_at.get(node, ())

    def wanted(link: Link) -> bool:
        a, b = match[link.src], match[link.dst]
        if (a, b) in pairs:
            return False
        if link.kind is LinkKind.NVLINK:
            return not any(described(x, link.kind) for x in (a, b) if kind_of[x] is NodeKind.GPU)
        if link.kind is LinkKind.NET:
            return not any(described(x, link.kind) for x in (a, b) if kind_of[x] is NodeKind.NIC)
        if link.kind is LinkKind.PCIE:
            return not (described(a, link.kind) and described(b, link.kind))
        return not (described(a, link.kind) or described(b, link.kind))

    added: dict[LinkKind, int] = {}
    for link in found.links:
        if wanted(link):
            a, b = match[link.src], match[link.dst]
            builder.add_link(a, b, link.kind, link.bw_bytes_per_s, link.latency_s, link.count, duplex=False)
            added[link.kind] = added.get(link.kind, 0) + 1

    nvml_answered = bool(found.nodes_of(NodeKind.GPU)) and not any(_NVML_FAILED.search(n) for n in found.notes)
    dropped = set(unknown_link_notes(given)) if nvml_answered else set()
    if nvml_answered and not given.nodes_of(NodeKind.GPU):
        dropped |= {n for n in given.notes if n == "no GPUs in the file"}
    for note in given.notes:
        if note not in dropped:
            builder.note(note)
    builder.note(_summary(found, added_nodes, kind_of, added))
    unseen = sorted(
        (n.busid for n in given.nodes_of(NodeKind.GPU) if n.busid and n.id not in set(match.values()) - set(added_nodes)),
        key=natural_key,
    )
    if unseen and found.nodes_of(NodeKind.GPU):
        shown = ", ".join(unseen[:4]) + (", ..." if len(unseen) > 4 else "")
        builder.note(f"{len(unseen)} GPU(s) of the given file not seen by discovery ({shown}): is the file for this machine?")
    for note in found.notes:
        builder.note(f"{found.name or 'discovery'}: {note}")
    return builder.build()


def _summary(found: Topology, nodes: Iterable[str], kind_of: dict[str, NodeKind], links: dict[LinkKind, int]) -> str:
    counts: dict[str, int] = {}
    for node in nodes:
        counts[kind_of[node].value] = counts.get(kind_of[node].value, 0) + 1
    parts = [f"{count} {kind} node(s)" for kind, count in sorted(counts.items())]
    # links are directed records: a full-duplex link is two of them
    parts += [f"{count} {kind.value} link record(s)" for kind, count in sorted(links.items(), key=lambda kv: kv[0].value)]
    what = ", ".join(parts) if parts else "nothing"
    return f"completed from {found.name or 'a discovered topology'}: added {what}"
