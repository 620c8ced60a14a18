"""Locating the shared real topology files, and small read-only queries tests use on results.

The files are kept in ``tests/data/topologies`` (copies of the public files each names in its
first line), so every checkout runs the tests on them.
"""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest

from topocoll.topo.model import LinkKind, NodeKind, Topology

REPO_ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY_DIR = REPO_ROOT / "tests" / "data" / "topologies"
GB = 1e9


def fixture_path(name: str) -> Path:
    """Path of the shared fixture ``name``; skips the test when it is not there."""
    path = TOPOLOGY_DIR / name
    if not path.is_file():
        pytest.skip(f"shared topology fixture {name} not available")
    return path


def fixture_text(name: str) -> str:
    """Content of the shared fixture ``name`` (skips when absent)."""
    return fixture_path(name).read_text(encoding="utf-8")


def all_fixture_names() -> list[str]:
    """Names of every file in the fixture directory (empty when it is absent)."""
    if not TOPOLOGY_DIR.is_dir():
        return []
    return sorted(p.name for p in TOPOLOGY_DIR.iterdir() if p.is_file() and p.name != "README.md")


def ids_of(topo: Topology, kind: NodeKind) -> list[str]:
    """Node ids of one kind."""
    return [n.id for n in topo.nodes_of(kind)]


def out_links(topo: Topology, node_id: str, kind: LinkKind):
    """Links of ``kind`` leaving ``node_id``."""
    return [topo.link(node_id, other) for other in topo.graph.successors(node_id) if topo.link(node_id, other).kind is kind]


def nvlink_count(topo: Topology, node_id: str) -> int:
    """Physical NVLinks leaving a GPU (counts of merged links summed)."""
    return sum(link.count for link in out_links(topo, node_id, LinkKind.NVLINK))


def nvlink_bw(topo: Topology, node_id: str) -> float:
    """NVLink bandwidth leaving a GPU, bytes/s."""
    return sum(link.bw_bytes_per_s for link in out_links(topo, node_id, LinkKind.NVLINK))


def net_speeds(topo: Topology) -> dict[str, float]:
    """NIC name (or id) -> network bandwidth in bytes/s, for NICs with a net link."""
    speeds = {}
    for nic in topo.nodes_of(NodeKind.NIC):
        links = out_links(topo, nic.id, LinkKind.NET)
        if links:
            speeds[nic.name or nic.id] = sum(link.bw_bytes_per_s for link in links)
    return speeds


def pcie_parent(topo: Topology, node_id: str) -> str:
    """The PCIe neighbour of ``node_id`` that is one hop closer to a CPU."""
    pcie = nx.Graph()
    pcie.add_edges_from((l.src, l.dst) for l in topo.links if l.kind is LinkKind.PCIE)
    cpus = [c for c in ids_of(topo, NodeKind.CPU) if c in pcie]
    dist = nx.multi_source_dijkstra_path_length(pcie, cpus)
    return min(pcie.neighbors(node_id), key=lambda n: dist[n])


def by_busid(topo: Topology, busid: str, kind: NodeKind | None = None) -> str:
    """Id of the node with ``busid`` (of ``kind`` when given)."""
    found = [n.id for n in topo.nodes if n.busid == busid and (kind is None or n.kind is kind)]
    assert len(found) == 1, f"{busid}: {found}"
    return found[0]


def gpus_under(topo: Topology, switch_id: str) -> set[int]:
    """Ranks (or GPU numbers) of the GPUs whose PCIe parent is ``switch_id``."""
    return {
        int(n.id[3:]) for n in topo.nodes_of(NodeKind.GPU) if pcie_parent(topo, n.id) == switch_id
    }
