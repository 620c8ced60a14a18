"""Placing ranks on topology nodes by identity (host, CUDA bus id, NUMA node)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from topocoll.collectives.placement import RankIdentity, exchange_identities, local_identity, map_ranks
from topocoll.errors import CollectiveError, TopologyError
from topocoll.topo.cluster import make_cluster
from topocoll.topo.discover import flat_topology
from topocoll.topo.host import HostIdentity, host_identity, numa_of_cpus, parse_cpu_list
from topocoll.topo.io import load_topology
from topocoll.topo.model import LinkKind, Node, NodeKind, TopologyBuilder

DATA = Path(__file__).resolve().parents[1] / "data" / "topologies"
H800 = DATA / "hgx-h800-8gpu-8nic.nccl-topo.xml"


def gpu_rank(rank: int, busid: str | None, host: str = "a", device: int = 0, global_rank: int | None = None) -> RankIdentity:
    return RankIdentity(rank, rank if global_rank is None else global_rank, host, host + "/boot", f"cuda:{device}", busid=busid)


def cpu_rank(rank: int, host: str = "a", numa: int | None = None, global_rank: int | None = None) -> RankIdentity:
    return RankIdentity(rank, rank if global_rank is None else global_rank, host, host + "/boot", "cpu", numa=numa)


# ------------------------------------------------------------------------- GPUs by bus id
def test_cuda_ranks_go_on_the_gpu_with_their_bus_id_whatever_their_rank():
    topology = load_topology(H800)
    busid_of = {node: topology.node(node).busid for node in topology.compute_nodes()}
    nodes = list(busid_of)
    random.Random(7).shuffle(nodes)  # rank r runs on a GPU that is not the r-th
    # CUDA_VISIBLE_DEVICES reordered: every rank sees its GPU as cuda:0
    identities = [gpu_rank(r, busid_of[node], device=0) for r, node in enumerate(nodes)]
    assert map_ranks(topology, identities) == tuple(nodes)


def test_a_gpu_the_topology_lacks_is_an_error_naming_rank_host_and_device():
    topology = load_topology(H800)
    identities = [gpu_rank(0, topology.node("gpu0").busid), gpu_rank(1, "0000:99:00.0", device=1)]
    with pytest.raises(TopologyError, match=r"rank 1 \(host a, cuda:1 at 0000:99:00.0\): its GPU is not in topology"):
        map_ranks(topology, identities)


def test_two_ranks_on_one_gpu_is_an_error_naming_both():
    topology = load_topology(H800)
    busid = topology.node("gpu3").busid
    with pytest.raises(TopologyError, match=r"rank 0 .* and rank 1 .* would both run on gpu3"):
        map_ranks(topology, [gpu_rank(0, busid), gpu_rank(1, busid)])


# -------------------------------------------------------------------------- machines
def _two_host_cpu_topology(numa_per_host: int = 1, procs_per_numa: int = 2):
    builder = TopologyBuilder(name="two-hosts")
    builder.add_node(Node("switch", NodeKind.NET_SWITCH))
    for host in ("alpha", "beta"):
        for numa in range(numa_per_host):
            builder.add_node(Node(f"{host}.cpu{numa}", NodeKind.CPU, host_id=host, numa=numa))
            builder.add_link(f"{host}.cpu{numa}", "switch", LinkKind.NET, 1e9, 1e-6)
            for p in range(procs_per_numa):
                proc = f"{host}.n{numa}p{p}"
                builder.add_node(Node(proc, NodeKind.HOST, host_id=host, numa=numa))
                builder.add_link(proc, f"{host}.cpu{numa}", LinkKind.SHM, 1e10, 1e-7)
    return builder.build()


def test_ranks_go_on_the_machine_they_name_in_any_rank_order():
    topology = _two_host_cpu_topology()
    # ranks interleaved across the machines, rank 0 on the second one the topology lists
    hosts = ["beta", "alpha", "beta", "alpha"]
    nodes = map_ranks(topology, [cpu_rank(r, host) for r, host in enumerate(hosts)])
    assert [topology.node(n).host_id for n in nodes] == hosts
    assert len(set(nodes)) == 4


def test_unnamed_machines_are_matched_in_order():
    topology = _two_host_cpu_topology()
    hosts = ["x", "y", "x", "y"]  # names the topology does not know: first machine of the ranks -> first machine listed
    nodes = map_ranks(topology, [cpu_rank(r, host) for r, host in enumerate(hosts)])
    first = topology.node(topology.compute_nodes()[0]).host_id
    assert topology.node(nodes[0]).host_id == first
    assert topology.node(nodes[0]).host_id == topology.node(nodes[2]).host_id != topology.node(nodes[1]).host_id


def test_more_machines_than_the_topology_has_is_an_error():
    topology = _two_host_cpu_topology()
    with pytest.raises(TopologyError, match="describes 2 machines .* the ranks run on 3"):
        map_ranks(topology, [cpu_rank(r, host) for r, host in enumerate("xyz")])


def test_cpu_ranks_go_on_their_numa_node():
    topology = _two_host_cpu_topology(numa_per_host=2, procs_per_numa=1)
    nodes = map_ranks(topology, [cpu_rank(0, "alpha", numa=1), cpu_rank(1, "alpha", numa=0)])
    assert [topology.node(n).numa for n in nodes] == [1, 0]


def test_a_topology_that_says_nothing_keeps_global_rank_order():
    # the flat topology and presets name no machine and no bus id: global rank g on node g
    topology = flat_topology(4)
    members = [cpu_rank(0, "a", global_rank=1), cpu_rank(1, "a", global_rank=3)]  # new_group([1, 3])
    assert map_ranks(topology, members) == ("host1", "host3")
    with pytest.raises(TopologyError, match="has 4 compute nodes, global rank 5"):
        map_ranks(topology, [cpu_rank(0, "a", global_rank=5)])


def test_cluster_presets_place_ranks_by_machine():
    topology = make_cluster("dgx-h100", 2)
    # 16 ranks, host names unknown to the preset: machines matched in order, GPUs by order
    identities = [gpu_rank(r, None, host="m1" if r < 8 else "m2") for r in range(16)]
    assert map_ranks(topology, identities) == topology.compute_nodes()


# ------------------------------------------------------------------ identity plumbing
def test_identity_json_round_trip_and_bad_input():
    identity = gpu_rank(2, "0000:07:00.0", host="n1", device=3)
    assert RankIdentity.from_json(identity.to_json(), "here") == identity
    with pytest.raises(CollectiveError, match="here: not a rank identity"):
        RankIdentity.from_json('{"rank": 1}', "here")
    with pytest.raises(CollectiveError, match="here: not a rank identity"):
        RankIdentity.from_json("not json", "here")


def test_exchange_identities_through_a_real_store(tmp_path):
    store = torch.distributed.FileStore(str(tmp_path / "store"), 2)
    mine = cpu_rank(0, "a")
    store.set("identity/1", cpu_rank(1, "b").to_json())
    assert exchange_identities(store, mine, 2) == (mine, cpu_rank(1, "b"))
    store.set("identity/1", cpu_rank(0, "b").to_json())  # a rank claiming another's number
    with pytest.raises(CollectiveError, match="identity of rank 1 names rank 0"):
        exchange_identities(store, mine, 2)


def test_local_identity_of_a_cpu_rank(tmp_path):
    node = tmp_path / "devices" / "system" / "node"
    cpus = sorted(os.sched_getaffinity(0))
    (node / "node0").mkdir(parents=True)
    (node / "node0" / "cpulist").write_text(f"{max(cpus) + 1}-{max(cpus) + 4}\n")  # none of ours
    (node / "node1").mkdir()
    (node / "node1" / "cpulist").write_text(",".join(map(str, cpus)) + "\n")
    identity = local_identity(2, 5, HostIdentity("n1", "n1/k"), device=torch.device("cpu"), sysfs_root=str(tmp_path))
    assert (identity.rank, identity.global_rank, identity.host, identity.device, identity.numa) == (2, 5, "n1", "cpu", 1)


def test_host_identity_and_cpu_lists(tmp_path):
    (tmp_path / "sys" / "kernel" / "random").mkdir(parents=True)
    (tmp_path / "sys" / "kernel" / "random" / "boot_id").write_text("1234-abcd\n")
    identity = host_identity(tmp_path)
    assert identity.key.endswith("/1234-abcd") and identity.key.startswith(identity.name)
    assert host_identity(tmp_path / "missing").key == identity.name  # no boot id: the name alone
    assert host_identity(override="nodeA") == HostIdentity("nodeA", "nodeA")
    assert parse_cpu_list("0-2,7,9-10\n") == frozenset({0, 1, 2, 7, 9, 10})
    with pytest.raises(ValueError):
        parse_cpu_list("3-1")
    assert numa_of_cpus({0}, tmp_path / "nowhere") is None
