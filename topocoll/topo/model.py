"""The topology model: typed nodes and links over a networkx directed graph.

A :class:`Topology` is immutable. It is built from :class:`Node` and :class:`Link` records,
validated once, and then read by the solver. Its JSON form is contract 1 of the design
(networkx node-link data, ``edges="links"``), written in a canonical order so that equal
topologies give equal files and equal :meth:`Topology.digest` values.

Every physical full-duplex link is two :class:`Link` records, one per direction. Parallel
physical links between the same pair are one record with summed bandwidth and a ``count``;
:class:`TopologyBuilder` does that merging for importers and presets.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from topocoll import fileio
from topocoll.errors import FormatError, TopologyError

FORMAT = "topocoll.topology/1"

#: The optional node attributes of contract 1, in the order the JSON form writes them.
NODE_ATTRIBUTES = ("rank", "host_id", "numa", "busid", "name", "index", "sm", "gdr")


class NodeKind(str, enum.Enum):
    """What a vertex of the topology is."""

    GPU = "gpu"
    CPU = "cpu"
    NVSWITCH = "nvswitch"
    PCIE_SWITCH = "pcie_switch"
    NIC = "nic"
    NET_SWITCH = "net_switch"
    HOST = "host"  # a rank that is a CPU process

    @property
    def is_compute(self) -> bool:
        """True for the kinds a rank can run on."""
        return self in (NodeKind.GPU, NodeKind.HOST)


class LinkKind(str, enum.Enum):
    """The physical technology of a link."""

    NVLINK = "nvlink"
    PCIE = "pcie"
    C2C = "c2c"
    XGMI = "xgmi"
    SMP = "smp"  # QPI / UPI / Infinity Fabric between sockets
    NET = "net"
    SHM = "shm"
    LOOPBACK = "loopback"


@dataclass(frozen=True, slots=True)
class Node:
    """A vertex: a GPU, CPU, switch, NIC or host process.

    Parameters
    ----------
    id : str
        Unique name, e.g. ``"gpu3"`` or ``"n1.nic0"``.
    kind : NodeKind
        What the vertex is.
    rank : int, optional
        The rank that runs on this node, when the source says so (compute nodes only).
    host_id : str, optional
        Which machine the node belongs to (multi-node topologies).
    numa : int, optional
        NUMA node id.
    busid : str, optional
        PCI bus id, lower case ``dddd:bb:dd.f``.
    name : str, optional
        Human-readable name (``"mlx5_0"``, ``"NVIDIA H100"``).
    index : int, optional
        A GPU's index on its machine as NVML and ``nvidia-smi`` number them (NCCL's ``dev``),
        when the source says so.
    sm : int, optional
        A GPU's CUDA compute capability as NCCL writes it, major x 10 + minor (``90`` for
        H100), when the source says so.
    gdr : bool, optional
        Whether a GPU or NIC supports GPUDirect RDMA, when the source says so (NCCL's ``gdr``).
    """

    id: str
    kind: NodeKind
    rank: int | None = None
    host_id: str | None = None
    numa: int | None = None
    busid: str | None = None
    name: str | None = None
    index: int | None = None
    sm: int | None = None
    gdr: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise TopologyError(f"node id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.kind, NodeKind):
            raise TopologyError(f"node {self.id}: kind must be a NodeKind, got {self.kind!r}")
        if self.rank is not None:
            if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
                raise TopologyError(f"node {self.id}: rank must be an integer >= 0, got {self.rank!r}")
            if not self.kind.is_compute:
                raise TopologyError(f"node {self.id}: only gpu/host nodes carry a rank, this is {self.kind.value}")
        if self.numa is not None and (isinstance(self.numa, bool) or not isinstance(self.numa, int)):
            raise TopologyError(f"node {self.id}: numa must be an integer, got {self.numa!r}")
        for attr in ("host_id", "busid", "name"):
            value = getattr(self, attr)
            if value is not None and not isinstance(value, str):
                raise TopologyError(f"node {self.id}: {attr} must be a string, got {value!r}")
        for attr, low in (("index", 0), ("sm", 1)):
            value = getattr(self, attr)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise TopologyError(f"node {self.id}: {attr} must be an integer >= {low}, got {value!r}")
            if self.kind is not NodeKind.GPU:
                raise TopologyError(f"node {self.id}: only gpu nodes carry an {attr}, this is {self.kind.value}")
        if self.gdr is not None:
            if not isinstance(self.gdr, bool):
                raise TopologyError(f"node {self.id}: gdr must be true or false, got {self.gdr!r}")
            if self.kind not in (NodeKind.GPU, NodeKind.NIC):
                raise TopologyError(f"node {self.id}: only gpu and nic nodes carry gdr, this is {self.kind.value}")


@dataclass(frozen=True, slots=True)
class Link:
    """One direction of a physical link (or of several parallel ones).

    Parameters
    ----------
    src, dst : str
        Node ids.
    kind : LinkKind
        Technology.
    bw_bytes_per_s : float
        Bandwidth in one direction, bytes per second, summed over ``count`` parallel links.
    latency_s : float
        One-way latency in seconds.
    count : int
        Number of parallel physical links merged into this record.
    """

    src: str
    dst: str
    kind: LinkKind
    bw_bytes_per_s: float
    latency_s: float = 0.0
    count: int = 1

    def __post_init__(self) -> None:
        name = f"link {self.src}->{self.dst}"
        for end in (self.src, self.dst):
            if not isinstance(end, str) or not end:
                raise TopologyError(f"{name}: endpoints must be non-empty node ids (strings), got {end!r}")
        if not isinstance(self.kind, LinkKind):
            raise TopologyError(f"{name}: kind must be a LinkKind, got {self.kind!r}")
        if self.src == self.dst:
            raise TopologyError(f"{name}: a link cannot join a node to itself")
        _check_number(name, "bw_bytes_per_s", self.bw_bytes_per_s, allow_zero=False)
        _check_number(name, "latency_s", self.latency_s, allow_zero=True)
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise TopologyError(f"{name}: count must be an integer >= 1, got {self.count!r}")


def _check_number(owner: str, attr: str, value: Any, *, allow_zero: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TopologyError(f"{owner}: {attr} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        expected = ">= 0" if allow_zero else "> 0"
        raise TopologyError(f"{owner}: {attr} must be finite and {expected}, got {value!r}")


def natural_key(text: str) -> tuple:
    """Sort key that orders ``gpu2`` before ``gpu10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


@dataclass(frozen=True)
class Topology:
    """An immutable, validated topology.

    Build one from records (``Topology(nodes, links)``), from contract-1 JSON
    (:meth:`from_json`), or with :class:`TopologyBuilder`. The records are kept in canonical
    order (natural order of ids) whatever order they came in.

    Parameters
    ----------
    nodes : iterable of Node
    links : iterable of Link
    name : str
        A label for reports (e.g. the source file or preset name).
    notes : iterable of str
        What the source could not tell (missing NVLinks, unknown speeds, ...): importers say
        here what they did not learn instead of inventing it.

    Raises
    ------
    TopologyError
        Duplicate node ids or links, unknown endpoints, duplicate ranks, or compute nodes that
        cannot all reach each other.
    """

    nodes: tuple[Node, ...]
    links: tuple[Link, ...]
    name: str = ""
    notes: tuple[str, ...] = ()
    _graph: nx.DiGraph = field(init=False, repr=False, compare=False)

    def __init__(
        self,
        nodes: Iterable[Node],
        links: Iterable[Link],
        name: str = "",
        notes: Iterable[str] = (),
    ) -> None:
        node_tuple = tuple(sorted(nodes, key=lambda n: natural_key(n.id)))
        link_tuple = tuple(sorted(links, key=lambda l: (natural_key(l.src), natural_key(l.dst))))
        object.__setattr__(self, "nodes", node_tuple)
        object.__setattr__(self, "links", link_tuple)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "notes", tuple(notes))
        object.__setattr__(self, "_graph", self._build_graph())
        self._check_ranks()
        self._check_connected()

    # ----------------------------------------------------------------- construction checks
    def _build_graph(self) -> nx.DiGraph:
        graph = nx.DiGraph()
        for node in self.nodes:
            if node.id in graph:
                raise TopologyError(f"node {node.id}: defined twice")
            graph.add_node(node.id, record=node)
        for link in self.links:
            for end in (link.src, link.dst):
                if end not in graph:
                    raise TopologyError(f"link {link.src}->{link.dst}: unknown endpoint {end!r}")
            if graph.has_edge(link.src, link.dst):
                raise TopologyError(
                    f"link {link.src}->{link.dst}: defined twice (merge parallel links into one with a count)"
                )
            graph.add_edge(link.src, link.dst, record=link)
        return nx.freeze(graph)

    def _check_ranks(self) -> None:
        seen: dict[int, str] = {}
        for node in self.nodes:
            if node.rank is None:
                continue
            if node.rank in seen:
                raise TopologyError(f"node {node.id}: rank {node.rank} already used by node {seen[node.rank]}")
            seen[node.rank] = node.id

    def _check_connected(self) -> None:
        compute = self.compute_nodes()
        if len(compute) < 2:
            return
        first = compute[0]
        forward = nx.descendants(self._graph, first) | {first}
        backward = nx.ancestors(self._graph, first) | {first}
        cut_off = [n for n in compute if n not in forward or n not in backward]
        if cut_off:
            shown = ", ".join(cut_off[:4]) + (" ..." if len(cut_off) > 4 else "")
            raise TopologyError(
                f"compute nodes are not connected: {shown} cannot exchange data with {first}"
            )

    # ------------------------------------------------------------------------- queries
    @property
    def graph(self) -> nx.DiGraph:
        """The frozen networkx view; node and edge attribute ``record`` holds the record."""
        return self._graph

    def node(self, node_id: str) -> Node:
        """The record of node ``node_id``; raises TopologyError when there is none."""
        try:
            return self._graph.nodes[node_id]["record"]
        except KeyError:
            raise TopologyError(f"no node {node_id!r} in topology {self.name or '(unnamed)'}") from None

    def link(self, src: str, dst: str) -> Link:
        """The link record from ``src`` to ``dst``; raises TopologyError when there is none."""
        try:
            return self._graph.edges[src, dst]["record"]
        except KeyError:
            raise TopologyError(f"no link {src}->{dst} in topology {self.name or '(unnamed)'}") from None

    def has_link(self, src: str, dst: str) -> bool:
        """Whether a link from ``src`` to ``dst`` exists."""
        return self._graph.has_edge(src, dst)

    def nodes_of(self, *kinds: NodeKind) -> tuple[Node, ...]:
        """The node records of the given kinds, in canonical order."""
        return tuple(n for n in self.nodes if n.kind in kinds)

    def compute_nodes(self) -> tuple[str, ...]:
        """Ids of the nodes ranks can run on, in rank order.

        Nodes that carry a rank come first, by rank; the others follow in natural id order.
        """
        compute = [n for n in self.nodes if n.kind.is_compute]
        ranked = sorted((n for n in compute if n.rank is not None), key=lambda n: n.rank)
        unranked = [n for n in compute if n.rank is None]
        return tuple(n.id for n in ranked + unranked)

    def ranks_by_host(self, ranks: Sequence[str]) -> list[list[int]]:
        """Rank indices grouped by their node's ``host_id``, hosts in order of first appearance.

        A rank whose node has no ``host_id`` is a group of its own.

        Examples
        --------
        >>> from topocoll.topo.cluster import make_cluster
        >>> two = make_cluster("dgx1-v100", 2)
        >>> [len(group) for group in two.ranks_by_host(two.compute_nodes())]
        [8, 8]
        """
        groups: dict[object, list[int]] = {}
        for index, node_id in enumerate(ranks):
            host = self.node(node_id).host_id
            groups.setdefault(host if host is not None else ("", node_id), []).append(index)
        return list(groups.values())

    def capacity(self, src: str, dst: str) -> float:
        """Bandwidth of the link ``src -> dst`` in bytes per second."""
        return self.link(src, dst).bw_bytes_per_s

    def is_symmetric(self) -> bool:
        """Every link has a reverse twin of equal bandwidth (full duplex): the reversed graph
        is the same graph, so whatever holds for data flowing one way holds the other way."""
        return all(self.has_link(l.dst, l.src) and self.capacity(l.dst, l.src) == l.bw_bytes_per_s for l in self.links)

    def path_bw_bytes_per_s(self, path: Iterable[str]) -> float:
        """Bandwidth of a route: the minimum over its links."""
        hops = list(path)
        return min(self.capacity(a, b) for a, b in zip(hops, hops[1:]))

    def path_latency_s(self, path: Iterable[str]) -> float:
        """Latency of a route: the sum over its links."""
        hops = list(path)
        return sum(self.link(a, b).latency_s for a, b in zip(hops, hops[1:]))

    # ---------------------------------------------------------------------- JSON
    def to_json_dict(self) -> dict[str, Any]:
        """Contract-1 node-link data, canonical order, plain JSON types."""
        nodes = []
        for node in self.nodes:
            entry: dict[str, Any] = {"id": node.id, "kind": node.kind.value}
            for attr in NODE_ATTRIBUTES:
                value = getattr(node, attr)
                if value is not None:
                    entry[attr] = value
            nodes.append(entry)
        links = [
            {
                "source": link.src,
                "target": link.dst,
                "kind": link.kind.value,
                "bw_bytes_per_s": float(link.bw_bytes_per_s),
                "latency_s": float(link.latency_s),
                "count": link.count,
            }
            for link in self.links
        ]
        graph: dict[str, Any] = {"format": FORMAT}
        if self.name:
            graph["name"] = self.name
        if self.notes:
            graph["notes"] = list(self.notes)
        return {"directed": True, "multigraph": False, "graph": graph, "nodes": nodes, "links": links}

    def to_json(self) -> str:
        """Canonical JSON text (sorted keys, two-space indent, trailing newline)."""
        return json.dumps(self.to_json_dict(), indent=2, sort_keys=True) + "\n"

    def digest(self) -> str:
        """``sha256:<hex>`` over the nodes and links (not the name or notes)."""
        data = self.to_json_dict()
        body = json.dumps({"nodes": data["nodes"], "links": data["links"]}, sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(body.encode()).hexdigest()

    @classmethod
    def from_json_dict(cls, data: Any, source: str = "<json>") -> "Topology":
        """Parse contract-1 node-link data, naming ``source`` and the element in every error.

        Raises
        ------
        TopologyError
            Wrong types, missing fields, unknown kinds or any model violation.
        """
        if not isinstance(data, Mapping):
            raise TopologyError(f"{source}: expected a JSON object with 'nodes' and 'links'")
        if data.get("directed") is False:
            raise TopologyError(f"{source}: the graph must be directed (\"directed\": true)")
        edges_key = "links" if "links" in data else "edges"
        raw_nodes, raw_links = data.get("nodes"), data.get(edges_key)
        if not isinstance(raw_nodes, list) or not isinstance(raw_links, list):
            raise TopologyError(f"{source}: 'nodes' and 'links' must be lists")
        graph_attrs = data.get("graph") or {}
        if not isinstance(graph_attrs, Mapping):
            raise TopologyError(f"{source}: 'graph' must be an object")
        nodes = [_node_from_json(entry, f"{source}: nodes[{i}]") for i, entry in enumerate(raw_nodes)]
        links = [_link_from_json(entry, f"{source}: {edges_key}[{i}]") for i, entry in enumerate(raw_links)]
        notes = graph_attrs.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise TopologyError(f"{source}: graph.notes must be a list of strings")
        name = graph_attrs.get("name", "")
        if not isinstance(name, str):
            raise TopologyError(f"{source}: graph.name must be a string")
        try:
            return cls(nodes, links, name=name, notes=notes)
        except TopologyError as exc:
            raise TopologyError(f"{source}: {exc}") from None

    @classmethod
    def from_json(cls, text: str, source: str = "<json>") -> "Topology":
        """Parse contract-1 JSON text. See :meth:`from_json_dict`.

        Raises
        ------
        TopologyError
            Malformed JSON (with its line) or any error of :meth:`from_json_dict`.
        FormatError
            JSON nested too deeply to parse (:func:`topocoll.fileio.loads_json`).
        """
        try:
            data = fileio.loads_json(text, source, parse_constant=_reject_constant)
        except json.JSONDecodeError as exc:
            raise TopologyError(f"{source}: line {exc.lineno}: malformed JSON: {exc.msg}") from None
        except FormatError:
            raise
        except ValueError as exc:  # a NaN or Infinity constant
            raise TopologyError(f"{source}: {exc}") from None
        return cls.from_json_dict(data, source)

    def summary_counts(self) -> dict[str, int]:
        """Number of nodes per kind (kinds with none omitted)."""
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.kind.value] = counts.get(node.kind.value, 0) + 1
        return counts


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a valid number in a topology")


def _enum_value(enum_type: type[enum.Enum], value: Any, where: str, attr: str) -> Any:
    try:
        return enum_type(value)
    except ValueError:
        allowed = ", ".join(member.value for member in enum_type)
        raise TopologyError(f"{where}: {attr} {value!r} is not one of {allowed}") from None


def _node_from_json(entry: Any, where: str) -> Node:
    if not isinstance(entry, Mapping):
        raise TopologyError(f"{where}: expected an object")
    if "id" not in entry:
        raise TopologyError(f"{where}: missing 'id'")
    where = f"{where} ({entry['id']})"
    kind = _enum_value(NodeKind, entry.get("kind"), where, "kind")
    try:
        return Node(
            id=entry["id"],
            kind=kind,
            rank=entry.get("rank"),
            host_id=entry.get("host_id"),
            numa=entry.get("numa"),
            busid=entry.get("busid"),
            name=entry.get("name"),
            index=entry.get("index"),
            sm=entry.get("sm"),
            gdr=entry.get("gdr"),
        )
    except TopologyError as exc:
        raise TopologyError(f"{where}: {exc}") from None


def _link_from_json(entry: Any, where: str) -> Link:
    if not isinstance(entry, Mapping):
        raise TopologyError(f"{where}: expected an object")
    for key in ("source", "target", "kind", "bw_bytes_per_s"):
        if key not in entry:
            raise TopologyError(f"{where}: missing {key!r}")
    where = f"{where} ({entry['source']}->{entry['target']})"
    kind = _enum_value(LinkKind, entry["kind"], where, "kind")
    try:
        return Link(
            src=entry["source"],
            dst=entry["target"],
            kind=kind,
            bw_bytes_per_s=entry["bw_bytes_per_s"],
            latency_s=entry.get("latency_s", 0.0),
            count=entry.get("count", 1),
        )
    except TopologyError as exc:
        raise TopologyError(f"{where}: {exc}") from None


class TopologyBuilder:
    """Mutable helper that collects nodes and links, then makes a :class:`Topology`.

    Parallel links between the same ordered pair are merged (bandwidth and count summed), as
    contract 1 asks. Used by the importers, presets and the cluster generator.
    """

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._nodes: dict[str, Node] = {}
        self._links: dict[tuple[str, str], Link] = {}
        self.notes: list[str] = []

    def add_node(self, node: Node) -> Node:
        """Add ``node``; a second node with the same id raises TopologyError."""
        if node.id in self._nodes:
            raise TopologyError(f"node {node.id}: defined twice")
        self._nodes[node.id] = node
        return node

    def has_node(self, node_id: str) -> bool:
        """Whether a node with this id was added."""
        return node_id in self._nodes

    def node(self, node_id: str) -> Node:
        """The node added under ``node_id``."""
        return self._nodes[node_id]

    def add_link(
        self,
        src: str,
        dst: str,
        kind: LinkKind,
        bw_bytes_per_s: float,
        latency_s: float = 0.0,
        count: int = 1,
        duplex: bool = True,
    ) -> None:
        """Add a link (both directions when ``duplex``), merging with an existing one."""
        pairs = [(src, dst), (dst, src)] if duplex else [(src, dst)]
        for a, b in pairs:
            new = Link(a, b, kind, bw_bytes_per_s, latency_s, count)
            old = self._links.get((a, b))
            if old is not None:
                new = Link(
                    a,
                    b,
                    old.kind,
                    old.bw_bytes_per_s + new.bw_bytes_per_s,
                    max(old.latency_s, new.latency_s),
                    old.count + new.count,
                )
            self._links[(a, b)] = new

    def note(self, text: str) -> None:
        """Record something the source could not tell."""
        if text not in self.notes:
            self.notes.append(text)

    def add_full_mesh(
        self, node_ids: Sequence[str], kind: LinkKind, bw_bytes_per_s: float | Mapping[str, float], latency_s: float = 0.0
    ) -> None:
        """Join every pair of ``node_ids`` by a duplex link of ``kind`` (sockets by SMP links).

        ``bw_bytes_per_s`` is one figure for all pairs, or one per node, a pair then getting
        the smaller of its two ends' figures.
        """
        for i, a in enumerate(node_ids):
            for b in node_ids[i + 1 :]:
                if isinstance(bw_bytes_per_s, Mapping):
                    bw = min(bw_bytes_per_s[a], bw_bytes_per_s[b])
                else:
                    bw = bw_bytes_per_s
                self.add_link(a, b, kind, bw, latency_s)

    def build(self, source: str | None = None) -> Topology:
        """Validate and return the topology.

        Parameters
        ----------
        source : str, optional
            The file or machine the topology comes from: errors then start with it.

        Raises
        ------
        TopologyError
        """
        try:
            return Topology(self._nodes.values(), self._links.values(), name=self.name, notes=self.notes)
        except TopologyError as exc:
            if source is None:
                raise
            raise TopologyError(f"{source}: {exc}") from None
