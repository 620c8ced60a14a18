"""The multi-node cluster generator: structure, ratios, connectivity and scale."""

from __future__ import annotations

import math
import time

import networkx as nx
import pytest

from topocoll.errors import TopologyError
from topocoll.topo.cluster import DEFAULT_SWITCH_RADIX, make_cluster
from topocoll.topo.model import LinkKind, NodeKind, Topology
from topocoll.topo.presets import PRESETS, build_preset


def _leaves(topo: Topology) -> list[str]:
    return [n.id for n in topo.nodes_of(NodeKind.NET_SWITCH) if n.id.startswith("leaf")]


def _spines(topo: Topology) -> list[str]:
    return [n.id for n in topo.nodes_of(NodeKind.NET_SWITCH) if n.id.startswith("spine")]


def _down_up(topo: Topology, leaf: str) -> tuple[float, float]:
    down = sum(l.bw_bytes_per_s for l in topo.links if l.dst == leaf and topo.node(l.src).kind is NodeKind.NIC)
    up = sum(l.bw_bytes_per_s for l in topo.links if l.src == leaf and l.dst.startswith("spine"))
    return down, up


def test_rail_two_nodes():
    topo = make_cluster("dgx-h100", 2)
    counts = topo.summary_counts()
    single = build_preset("dgx-h100").summary_counts()
    for kind in ("gpu", "nic", "cpu", "nvswitch", "pcie_switch"):
        assert counts[kind] == 2 * single[kind]
    assert _leaves(topo) == [f"leaf{i}" for i in range(8)] and not _spines(topo)
    for rail in range(8):
        attached = sorted(l.src for l in topo.links if l.dst == f"leaf{rail}")
        assert attached == [f"n0.nic{rail}", f"n1.nic{rail}"]
    # NDR adapters: 400 Gbit/s = 50 GB/s each way
    assert topo.link("n1.nic3", "leaf3").bw_bytes_per_s == pytest.approx(400e9 / 8)
    assert topo.link("n1.nic3", "leaf3").kind is LinkKind.NET


def test_ids_hosts_and_node_major_ranks():
    topo = make_cluster("dgx-a100", 3, network="fat-tree")
    for node in topo.nodes:
        if node.kind is NodeKind.NET_SWITCH:
            assert node.host_id is None
        else:
            k, _, local = node.id.partition(".")
            assert node.host_id == k and k in ("n0", "n1", "n2") and local
    assert topo.compute_nodes() == tuple(f"n{k}.gpu{i}" for k in range(3) for i in range(8))
    assert [topo.node(n).rank for n in topo.compute_nodes()] == list(range(24))
    # inside each machine, the preset's own wiring (its ports' own switch ports are the fabric's)
    one = build_preset("dgx-a100")
    for link in one.links:
        if link.kind is LinkKind.NET:
            continue
        copy = topo.link(f"n2.{link.src}", f"n2.{link.dst}")
        assert (copy.kind, copy.bw_bytes_per_s, copy.count) == (link.kind, link.bw_bytes_per_s, link.count)


def test_single_node_is_the_plain_preset():
    assert make_cluster("mi300x", 1).digest() == build_preset("mi300x").digest()


def test_fat_tree_oversubscription_ratio_in_bandwidth():
    radix, ratio = 16, 3.0
    topo = make_cluster("dgx-h100", 4, network="fat-tree", oversubscription=ratio, switch_radix=radix)
    nics = 4 * 8
    down_ports = math.floor(radix * ratio / (1 + ratio))  # 12 machine ports, 4 uplinks
    leaves, spines = _leaves(topo), _spines(topo)
    assert len(leaves) == 4  # one whole machine (8 NICs) per 12-port leaf, none split over two
    assert len(spines) == radix - down_ports == 4
    attached = [l.src for l in topo.links if l.dst.startswith("leaf") and l.src.endswith(tuple(f"nic{i}" for i in range(8)))]
    assert len(attached) == nics and len(set(attached)) == nics
    for leaf in leaves:
        down, up = _down_up(topo, leaf)
        assert down / up == pytest.approx(ratio)
        assert {l.dst for l in topo.links if l.src == leaf and l.dst.startswith("spine")} == set(spines)
        assert down <= down_ports * 50e9 + 1


def test_fat_tree_leaves_hold_whole_machines():
    """64-port leaves at 2:1 keep floor(64 * 2 / 3) = 42 ports for machines: five DGX H100 (40
    NICs) per leaf, and the 32nd machine's NICs all on the seventh leaf, not split over two."""
    topo = make_cluster("dgx-h100", 32, network="fat-tree", oversubscription=2.0)
    machines_of = {}
    for link in topo.links:
        if link.dst.startswith("leaf") and topo.node(link.src).kind is NodeKind.NIC:
            machines_of.setdefault(link.dst, set()).add(link.src.split(".")[0])
    assert len(machines_of) == math.ceil(32 / 5)
    assert sorted(len(m) for m in machines_of.values()) == [2] + [5] * 6
    every = [m for ms in machines_of.values() for m in ms]
    assert len(every) == len(set(every)) == 32  # no machine on two leaves


def test_fat_tree_non_blocking_by_default():
    topo = make_cluster("dgx-a100", 8, network="fat-tree", switch_radix=16)
    assert _spines(topo)
    for leaf in _leaves(topo):
        down, up = _down_up(topo, leaf)
        assert up == pytest.approx(down)


def test_small_fat_tree_fits_one_switch():
    topo = make_cluster("dgx-h100", 2, network="fat-tree")
    assert _leaves(topo) == ["leaf0"] and not _spines(topo)
    assert len([l for l in topo.links if l.dst == "leaf0"]) == 16


def test_rail_split_over_leaves_gets_spines():
    radix = 8
    topo = make_cluster("pcie-8gpu", 10, network="rail", switch_radix=radix)
    rails = PRESETS["pcie-8gpu"].nics
    down_ports = radix // 2
    per_rail = math.ceil(10 / down_ports)
    assert len(_leaves(topo)) == rails * per_rail
    assert len(_spines(topo)) == radix - down_ports
    # each leaf holds NICs of one rail only
    for leaf in _leaves(topo):
        rails_here = {l.src.rsplit("nic", 1)[1] for l in topo.links if l.dst == leaf and "nic" in l.src}
        assert len(rails_here) == 1
    # the network alone joins every leaf to every other one (without going through machines)
    fabric = topo.graph.subgraph([n.id for n in topo.nodes_of(NodeKind.NET_SWITCH)])
    assert nx.is_strongly_connected(fabric)


def _switches(topo: Topology, prefix: str) -> list[str]:
    return [n.id for n in topo.nodes_of(NodeKind.NET_SWITCH) if n.id.startswith(prefix)]


def _bw(topo: Topology, src_prefix: str, dst: str) -> float:
    return sum(l.bw_bytes_per_s for l in topo.links if l.dst == dst and l.src.startswith(src_prefix))


@pytest.mark.parametrize("ratio", [1.0, 3.0])
def test_three_tiers_when_leaves_outnumber_a_spines_ports(ratio):
    """16 DGX H100 on 8-port switches: 128 NICs, leaves of floor(8 r / (1 + r)) machine ports, more
    leaves than 8, so pods of 4 leaves with their own spines, and core groups above them."""
    radix = 8
    topo = make_cluster("dgx-h100", 16, network="fat-tree", switch_radix=radix, oversubscription=ratio)
    down_ports = math.floor(radix * ratio / (1 + ratio))
    uplinks = radix - down_ports
    leaves = _leaves(topo)
    assert len(leaves) == math.ceil(128 / down_ports)
    pods = math.ceil(len(leaves) / (radix // 2))
    assert len(_switches(topo, "pod")) == pods * uplinks and len(_switches(topo, "core")) == uplinks
    assert not _spines(topo) and not topo.notes
    for leaf in leaves:
        down, up = sum(l.bw_bytes_per_s for l in topo.links if l.dst == leaf and "nic" in l.src), sum(
            l.bw_bytes_per_s for l in topo.links if l.src == leaf and l.dst.startswith("pod")
        )
        assert down / up == pytest.approx(ratio)
    for spine in _switches(topo, "pod"):
        from_leaves = _bw(topo, "leaf", spine)
        to_core = sum(l.bw_bytes_per_s for l in topo.links if l.src == spine and l.dst.startswith("core"))
        assert to_core == pytest.approx(from_leaves)  # spines and cores do not oversubscribe
    # what leaves a pod towards the cores is all its leaves send up: one pod's NICs' bandwidth / ratio
    pod0 = [n for n in _switches(topo, "pod0.")]
    leaving = sum(l.bw_bytes_per_s for l in topo.links if l.src in pod0 and l.dst.startswith("core"))
    pod0_nics = sum(1 for l in topo.links if "nic" in l.src and l.dst in leaves[: radix // 2])
    assert leaving == pytest.approx(pod0_nics * 50e9 / ratio)
    fabric = topo.graph.subgraph([n.id for n in topo.nodes_of(NodeKind.NET_SWITCH)])
    assert nx.is_strongly_connected(fabric)


def test_two_tiers_can_be_asked_for_and_say_what_a_spine_stands_for():
    topo = make_cluster("dgx-h100", 16, network="fat-tree", switch_radix=8, tiers=2)
    assert _spines(topo) and not _switches(topo, "core")
    assert any("each spine here stands for a group of switches" in note for note in topo.notes)


def test_superpod_scalable_units_put_each_units_rail_on_its_own_leaf():
    topo = make_cluster("dgx-h100", 8, network="superpod", su_nodes=4)
    leaves = _leaves(topo)
    assert len(leaves) == 2 * 8  # 2 units x 8 rails
    seen = set()
    for leaf in leaves:
        nics = sorted(l.src for l in topo.links if l.dst == leaf and "nic" in l.src)
        machines = {int(n.split(".")[0][1:]) for n in nics}
        rails = {n.rsplit("nic", 1)[1] for n in nics}
        assert len(nics) == 4 and len(rails) == 1 and len({m // 4 for m in machines}) == 1
        seen.add((min(machines) // 4, rails.pop()))
        down, up = _down_up(topo, leaf)
        assert up == pytest.approx(down)
    assert len(seen) == 16
    assert len(_spines(topo)) == DEFAULT_SWITCH_RADIX - DEFAULT_SWITCH_RADIX // 2
    assert nx.is_strongly_connected(topo.graph)


def test_superpod_unit_must_fit_a_leaf():
    with pytest.raises(TopologyError, match="su_nodes 40 does not fit a leaf"):
        make_cluster("dgx-h100", 80, network="superpod", su_nodes=40)


def test_whole_cluster_is_strongly_connected():
    for network in ("rail", "fat-tree", "superpod"):
        topo = make_cluster("dgx1-v100", 5, network=network, switch_radix=4, su_nodes=2)
        assert nx.is_strongly_connected(topo.graph)


def test_nic_options():
    topo = make_cluster("dgx-h100", 2, nics_per_node=4, nic_bw_bytes_per_s=25e9)
    assert len(_leaves(topo)) == 4
    assert len(topo.nodes_of(NodeKind.NIC)) == 8
    for link in topo.links:
        if link.kind is LinkKind.NET:
            assert link.bw_bytes_per_s == 25e9


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"preset": "dgx-9000", "nodes": 2}, "unknown preset"),
        ({"preset": "dgx-h100", "nodes": 0}, "nodes"),
        ({"preset": "dgx-h100", "nodes": 2.5}, "nodes"),
        ({"preset": "dgx-h100", "nodes": 2, "nics_per_node": 0}, "nics_per_node"),
        ({"preset": "dgx-h100", "nodes": 2, "network": "torus"}, "unknown network 'torus'"),
        ({"preset": "dgx-h100", "nodes": 2, "oversubscription": 0.0}, "oversubscription"),
        ({"preset": "dgx-h100", "nodes": 2, "oversubscription": 0.5}, "oversubscription must be a finite number >= 1"),
        ({"preset": "dgx-h100", "nodes": 2, "tiers": 4}, "tiers must be 2, 3 or None"),
        ({"preset": "dgx-h100", "nodes": 2, "network": "superpod", "su_nodes": 0}, "su_nodes"),
        ({"preset": "dgx-h100", "nodes": 2, "oversubscription": float("nan")}, "oversubscription"),
        ({"preset": "dgx-h100", "nodes": 2, "nic_bw_bytes_per_s": float("inf")}, "nic_bw_bytes_per_s"),
        ({"preset": "dgx-h100", "nodes": 2, "nic_bw_bytes_per_s": -1.0}, "nic_bw_bytes_per_s"),
        ({"preset": "dgx-h100", "nodes": 2, "switch_radix": 1}, "switch_radix"),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(TopologyError, match=message):
        make_cluster(**kwargs)


@pytest.mark.parametrize("network", ["rail", "fat-tree"])
def test_1024_gpus_build_quickly(network):
    start = time.process_time()
    topo = make_cluster("dgx-h100", 128, network=network)
    elapsed = time.process_time() - start
    assert elapsed < 2.0, f"{elapsed:.2f} s CPU"
    assert len(topo.nodes_of(NodeKind.GPU)) == 1024
    assert [topo.node(n).rank for n in topo.compute_nodes()] == list(range(1024))
    # 1024 NICs on leaves of DEFAULT_SWITCH_RADIX ports, half of them towards the spines
    down_ports = DEFAULT_SWITCH_RADIX // 2
    assert len(_leaves(topo)) == 1024 // down_ports
    assert len(_spines(topo)) == DEFAULT_SWITCH_RADIX - down_ports
