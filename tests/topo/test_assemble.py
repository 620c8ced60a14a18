"""Assembling a cluster from machine graphs: placement by identity, the network model, errors."""

from __future__ import annotations

import json

import pytest

from tests.topo.fake_host import host_from_nccl_xml
from tests.topo.fixtures import TOPOLOGY_DIR
from topocoll.errors import FormatError, TopologyError
from topocoll.solver.bound import cut_bound
from topocoll.solver.schedule import Collective
from topocoll.topo import bandwidth as bw
from topocoll.topo.assemble import (
    SOCKET_DEFAULT_BW_BYTES_PER_S,
    ClusterDescription,
    NetworkModel,
    RankPlacement,
    assemble_cluster,
    load_cluster_description,
)
from topocoll.topo.discover import discover_host
from topocoll.topo.model import LinkKind, Node, NodeKind, TopologyBuilder

H800 = "hgx-h800-8gpu-8nic.nccl-topo.xml"
RTX = "rtx4090-2gpu-2numa.nccl-topo.xml"


def machine(tmp_path, name: str, host: str):
    fake = host_from_nccl_xml((TOPOLOGY_DIR / name).read_text(), tmp_path / host)
    return discover_host(fake.sysfs, fake.proc, host_id=host, nvml=fake.nvml, arch=fake.arch)


def cpu_machine(host: str, numas=(0,)):
    builder = TopologyBuilder(name=f"discovered:{host}")
    for numa in numas:
        builder.add_node(Node(f"cpu{numa}", NodeKind.CPU, host_id=host, numa=numa))
    for a in numas:
        for b in numas:
            if a < b:
                builder.add_link(f"cpu{a}", f"cpu{b}", LinkKind.SMP, 10e9)
    return builder.build()


def gpu_busids(topology):
    return [n.busid for n in sorted(topology.nodes_of(NodeKind.GPU), key=lambda n: n.busid)]


def test_one_machine_keeps_ids_and_takes_the_placement(tmp_path):
    host = machine(tmp_path, H800, "a")
    busids = gpu_busids(host)
    order = list(reversed(busids))  # rank r on the GPU of the (7 - r)-th bus id
    cluster = assemble_cluster([host], ranks=[RankPlacement(r, 0, busid=b) for r, b in enumerate(order)])
    assert {n.id for n in cluster.nodes} == {n.id for n in host.nodes}
    by_busid = {n.busid: n for n in cluster.nodes_of(NodeKind.GPU)}
    assert [by_busid[b].rank for b in order] == list(range(8))
    assert cluster.name == host.name


def test_two_equal_machines_are_joined_by_rails(tmp_path):
    a, b = machine(tmp_path, H800, "a"), machine(tmp_path, H800, "b")
    ranks = [RankPlacement(8 * k + i, k, busid=busid) for k, host in enumerate((a, b)) for i, busid in enumerate(gpu_busids(host))]
    cluster = assemble_cluster([a, b], ranks=ranks)
    switches = sorted(n.id for n in cluster.nodes_of(NodeKind.NET_SWITCH))
    assert switches == sorted(f"rail{i}" for i in range(8))
    for i in range(8):  # NIC i of each machine, and only it, on rail i
        ends = sorted(l.src for l in cluster.links if l.dst == f"rail{i}")
        assert ends == [f"n0.nic{i}", f"n1.nic{i}"]
    assert cluster.link("n0.nic0", "rail0").bw_bytes_per_s == bw.net_bw_bytes_per_s(400e9)
    assert any("modelled as rail" in note for note in cluster.notes)
    assert cluster.node("n1.gpu0").host_id == "b" and cluster.node("n1.gpu0").rank == 8


def test_different_machines_share_one_switch(tmp_path):
    a, b = machine(tmp_path, H800, "a"), machine(tmp_path, RTX, "b")
    ranks = [RankPlacement(0, 0, busid=gpu_busids(a)[0]), RankPlacement(1, 1, busid=gpu_busids(b)[1])]
    cluster = assemble_cluster([a, b], ranks=ranks)
    assert [n.id for n in cluster.nodes_of(NodeKind.NET_SWITCH)] == ["switch"]
    nics = a.summary_counts()["nic"] + b.summary_counts()["nic"]
    assert len([l for l in cluster.links if l.dst == "switch"]) == nics
    assert any("single-switch" in note for note in cluster.notes)
    assert sorted(n.rank for n in cluster.nodes_of(NodeKind.GPU) if n.rank is not None) == [0, 1]


def test_cpu_machines_get_processes_and_socket_nics():
    a, b = cpu_machine("a", numas=(0, 1)), cpu_machine("b")
    ranks = [RankPlacement(0, 1), RankPlacement(1, 0, numa=1), RankPlacement(2, 0, numa=0)]
    cluster = assemble_cluster([a, b], ranks=ranks)
    assert cluster.compute_nodes() == ("n1.proc0", "n0.proc1", "n0.proc2")
    assert cluster.link("n0.proc1", "n0.cpu1").kind is LinkKind.SHM
    assert cluster.link("n0.proc2", "n0.cpu0").kind is LinkKind.SHM
    assert cluster.link("n0.socket", "rail0").bw_bytes_per_s == SOCKET_DEFAULT_BW_BYTES_PER_S
    assert cluster.node("n1.proc0").host_id == "b"


def test_placement_errors_name_rank_and_device(tmp_path):
    a = machine(tmp_path, RTX, "a")
    busid = gpu_busids(a)[0]
    with pytest.raises(TopologyError, match=r"rank 1: no GPU at 0000:99:00.0"):
        assemble_cluster([a], ranks=[RankPlacement(0, 0, busid=busid), RankPlacement(1, 0, busid="0000:99:00.0")])
    with pytest.raises(TopologyError, match=r"ranks 0 and 1 would both run on gpu0"):
        assemble_cluster([a], ranks=[RankPlacement(0, 0, busid=busid), RankPlacement(1, 0, busid=busid)])
    with pytest.raises(TopologyError, match=r"rank 0: NUMA node 5 is not on"):
        assemble_cluster([cpu_machine("c")], ranks=[RankPlacement(0, 0, numa=5)])
    with pytest.raises(TopologyError, match="same number of NICs"):
        b = machine(tmp_path, H800, "b")
        assemble_cluster([a, b], ranks=[RankPlacement(0, 0, busid=busid)], network=ClusterDescription(NetworkModel.RAIL))
    with pytest.raises(TopologyError, match="at least one machine"):
        assemble_cluster([], ranks=[])


def test_nic_speed_override_sets_the_inter_machine_bound():
    """Two one-socket machines of two CPU ranks each: the allgather bound across the machine
    cut is set by the NIC speed alone, so doubling it doubles the bound."""
    hosts = [cpu_machine("a"), cpu_machine("b")]
    ranks = [RankPlacement(r, r // 2) for r in range(4)]
    slow = bw.GB / 10  # far below the shared-memory links (12 GB/s)
    bounds = []
    for speed in (slow, 2 * slow):
        cluster = assemble_cluster(hosts, ranks=ranks, network=ClusterDescription(nic_bw_bytes_per_s=speed))
        bounds.append(cut_bound(cluster, Collective.ALLGATHER, list(cluster.compute_nodes())).algbw_bytes_per_s)
    assert bounds[1] == pytest.approx(2 * bounds[0])


def test_cluster_description_file(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"format": "topocoll.cluster/1", "network": "single-switch", "nic_bw_bytes_per_s": 5e10}))
    assert load_cluster_description(path) == ClusterDescription(NetworkModel.SINGLE_SWITCH, 5e10)
    for bad, message in (
        ({"format": "topocoll.cluster/1", "netwrok": "rail"}, "unknown key 'netwrok'"),
        ({"format": "topocoll.cluster/1", "network": "torus"}, "network must be 'rail' or 'single-switch'"),
        ({"format": "topocoll.cluster/1", "nic_bw_bytes_per_s": -1}, "nic_bw_bytes_per_s must be a number > 0"),
        ({"network": "rail"}, "format must be"),
        ([1], "a cluster description is a JSON object"),
    ):
        path.write_text(json.dumps(bad))
        with pytest.raises(FormatError, match=message) as info:
            load_cluster_description(path)
        assert str(path) in str(info.value)
