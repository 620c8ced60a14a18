"""Partial allocations: what one job keeps of a cluster."""

from __future__ import annotations

import pytest

from topocoll.cli import main
from topocoll.errors import TopologyError
from topocoll.solver.bound import cut_bound
from topocoll.solver.schedule import Collective
from topocoll.topo.allocation import allocate
from topocoll.topo.cluster import make_cluster
from topocoll.topo.io import load_topology
from topocoll.topo.model import NodeKind
from topocoll.topo.presets import build_preset


@pytest.fixture(scope="module")
def cluster():
    return make_cluster("dgx-h100", 16)


def _hosts(topology):
    return sorted({topology.node(n).host_id for n in topology.compute_nodes()}, key=lambda h: int(h[1:]))


def test_some_gpus_of_some_machines(cluster):
    job = allocate(cluster, nodes=5, gpus_per_node=3, seed=11)
    gpus = job.compute_nodes()
    assert len(gpus) == 15 and [job.node(g).rank for g in gpus] == list(range(15))
    hosts = _hosts(job)
    assert len(hosts) == 5
    for host in hosts:  # ranks node-major, three GPUs of each machine
        mine = [g for g in gpus if job.node(g).host_id == host]
        assert len(mine) == 3 and tuple(mine) == gpus[gpus.index(mine[0]) : gpus.index(mine[0]) + 3]
    # a chosen machine keeps every part that is not a GPU; the others are gone; the network stays
    single = build_preset("dgx-h100")
    for host in hosts:
        for kind in (NodeKind.NIC, NodeKind.NVSWITCH, NodeKind.PCIE_SWITCH, NodeKind.CPU):
            assert sum(1 for n in job.nodes_of(kind) if n.host_id == host) == len(single.nodes_of(kind))
    assert {n.host_id for n in job.nodes if n.host_id} == set(hosts)
    assert len(job.nodes_of(NodeKind.NET_SWITCH)) == len(cluster.nodes_of(NodeKind.NET_SWITCH))
    assert job.notes[-1] == "partial allocation: 15 GPUs on 5 machines"


def test_the_seed_decides_and_repeats(cluster):
    first = allocate(cluster, nodes=4, gpus_per_node=2, seed=5)
    assert first.to_json() == allocate(cluster, nodes=4, gpus_per_node=2, seed=5).to_json()
    others = {tuple(allocate(cluster, nodes=4, gpus_per_node=2, seed=s).compute_nodes()) for s in range(6)}
    assert len(others) > 1  # 1820 ways to pick 4 of 16 machines, 28 for 2 of 8 GPUs


@pytest.mark.parametrize(("nodes", "gpus"), [(2, None), (3, 5)])
def test_the_job_has_the_bound_of_its_gpus_in_the_whole_cluster(cluster, nodes, gpus):
    """What was removed (other machines, other jobs' GPUs) carries none of the job's data: the cut
    bound of the job's topology is that of the same GPUs as ranks of the whole cluster."""
    job = allocate(cluster, nodes=nodes, gpus_per_node=gpus, seed=1)
    assert len(job.compute_nodes()) == nodes * (gpus or 8)
    for collective in (Collective.ALLGATHER, Collective.REDUCE_SCATTER):
        alone = cut_bound(job, collective, job.compute_nodes(), None)
        within = cut_bound(cluster, collective, job.compute_nodes(), None)
        assert alone.time_per_byte_s == pytest.approx(within.time_per_byte_s, rel=1e-9, abs=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": 17}, "a job of 17 machines does not fit: the cluster has 16"),
        ({"gpus_per_node": 9}, "a job of 9 GPUs per machine does not fit: no machine has more than 8"),
        ({"nodes": 0}, "a job's nodes must be an integer >= 1"),
        ({"gpus_per_node": 2.5}, "a job's gpus per node must be an integer >= 1"),
    ],
)
def test_more_than_the_cluster_has_is_refused(cluster, kwargs, message):
    with pytest.raises(TopologyError, match=message):
        allocate(cluster, **kwargs)


def test_one_count_per_machine(cluster):
    """Schedulers hand out jobs that do not fill machines: 8, 8 and 1 GPUs of three machines."""
    job = allocate(cluster, gpus_per_node=(8, 1, 8), seed=3)
    gpus = job.compute_nodes()
    groups = job.ranks_by_host(gpus)
    assert [len(g) for g in groups] == [8, 1, 8]  # ranks follow the counts' order
    assert [i for g in groups for i in g] == list(range(17))
    hosts = [job.node(gpus[g[0]]).host_id for g in groups]
    assert len(set(hosts)) == 3 and set(hosts) == set(_hosts(job))
    assert job.to_json() == allocate(cluster, gpus_per_node=(8, 1, 8), seed=3).to_json()
    assert allocate(cluster, nodes=3, gpus_per_node=[8, 1, 8], seed=3).to_json() == job.to_json()
    # counts that fit only when the large one is placed first: machines of 8 and 4 free GPUs
    busy = allocate(make_cluster("dgx-h100", 2), gpus_per_node=(8, 4), seed=0)
    for seed in range(6):
        again = allocate(busy, gpus_per_node=(2, 8), seed=seed)
        assert [len(g) for g in again.ranks_by_host(again.compute_nodes())] == [2, 8]


@pytest.mark.parametrize(
    ("counts", "nodes", "message"),
    [
        ((), None, "empty"),
        ((8, 0), None, "a job's GPUs per machine must be an integer >= 1, got 0"),
        ((8, 9), None, "no machine has more than 8 GPUs"),
        ((1,) * 17, None, "the cluster has 16 machines"),
        ((8, 8), 3, "a job of 3 machines was given 2 GPU counts"),
    ],
)
def test_uneven_counts_that_do_not_fit_are_refused(cluster, counts, nodes, message):
    with pytest.raises(TopologyError, match=message):
        allocate(cluster, nodes=nodes, gpus_per_node=counts)


def test_gpus_without_a_machine_are_refused():
    with pytest.raises(TopologyError, match="names no machine"):
        allocate(build_preset("dgx-h100"), nodes=1)


def test_cli_writes_the_job_or_refuses_in_one_line(tmp_path, capsys):
    out = tmp_path / "job.json"
    assert main(["topo", "preset", "dgx-a100", "--nodes", "6", "--alloc-nodes", "2", "--alloc-gpus", "5", "--seed", "4", "-o", str(out)]) == 0
    job = load_topology(out)
    assert len(job.compute_nodes()) == 10 and len(_hosts(job)) == 2
    capsys.readouterr()
    bad = tmp_path / "bad.json"
    assert main(["topo", "preset", "dgx-a100", "--nodes", "6", "--alloc-nodes", "7", "-o", str(bad)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "a job of 7 machines does not fit" in err
    assert not bad.exists()
    uneven = tmp_path / "uneven.json"
    assert main(["topo", "preset", "dgx-h100", "--nodes", "4", "--alloc-gpus", "8,8,1", "-o", str(uneven)]) == 0
    job = load_topology(uneven)
    assert [len(g) for g in job.ranks_by_host(job.compute_nodes())] == [8, 8, 1]
    capsys.readouterr()
    assert main(["topo", "preset", "dgx-h100", "--nodes", "2", "--alloc-gpus", "8,8,1", "-o", str(bad)]) == 2
    assert "the cluster has 2 machines" in capsys.readouterr().err and not bad.exists()
