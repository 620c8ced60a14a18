"""Tree packing by rails for clusters of identical hosts: host trees stay in their host, the
schedules verify, and they reach the cut bound where the network binds."""

from __future__ import annotations

import pytest

from tests.solver import helpers as H
from tests.solver.helpers import BOUNDED, MIN_RATIO, NEVER_BELOW, ratio_to_bound
from topocoll.solver.rail_packing import compose, host_groups, rail_packing
from topocoll.solver.schedule import Collective
from topocoll.solver.synthesize import SynthesisOptions, synthesize
from topocoll.topo.model import LinkKind, Node, NodeKind, Topology, TopologyBuilder


def _two_host_detour() -> Topology:
    """Two hosts where a host's own GPUs gain bandwidth by routing through the other host.

    Per host: gpu0 - gpu1 by a very slow NVLink; each GPU has a fast NIC; the NICs meet at a
    slow PCIe switch and each NIC has a fast port on its rail's leaf switch. Inside a host,
    gpu0 -> gpu1 has the NVLink and the path over the PCIe switch; leaving through leaf0,
    crossing the other host's PCIe switch and returning on leaf1 is as wide as the latter, so
    a packing over the whole graph weighs it among the top two trees. Host trees must not
    take it.
    """
    fast, slow, slowest = 100e9, 10e9, 1e9
    b = TopologyBuilder("two-host-detour")
    for leaf in ("leaf0", "leaf1"):
        b.add_node(Node(leaf, NodeKind.NET_SWITCH))
    for h in range(2):
        host = f"n{h}"
        b.add_node(Node(f"{host}.psw", NodeKind.PCIE_SWITCH, host_id=host))
        for i in range(2):
            b.add_node(Node(f"{host}.gpu{i}", NodeKind.GPU, rank=2 * h + i, host_id=host))
            b.add_node(Node(f"{host}.nic{i}", NodeKind.NIC, host_id=host))
            b.add_link(f"{host}.gpu{i}", f"{host}.nic{i}", LinkKind.PCIE, fast)
            b.add_link(f"{host}.nic{i}", f"{host}.psw", LinkKind.PCIE, slow)
            b.add_link(f"{host}.nic{i}", f"leaf{i}", LinkKind.NET, fast)
        b.add_link(f"{host}.gpu0", f"{host}.gpu1", LinkKind.NVLINK, slowest)
    return b.build()


@pytest.mark.parametrize("reverse", [False, True])
def test_hierarchical_host_trees_stay_inside_their_host(reverse):
    topo = _two_host_detour()
    ranks = list(topo.compute_nodes())
    groups = host_groups(topo, ranks)
    assert groups is not None and len(groups) == 2
    packing = compose(rail_packing(topo, ranks, groups, reverse=reverse))
    for tree in packing.trees:
        for parent, child, path in tree.arcs:
            assert len(set(path)) == len(path), f"path visits a node twice: {path}"
            hosts = {topo.node(ranks[parent]).host_id, topo.node(ranks[child]).host_id}
            if len(hosts) == 1:
                (host,) = hosts
                assert all(topo.node(x).host_id == host for x in path), f"intra-host arc leaves {host}: {path}"


@pytest.mark.parametrize("collective", [Collective.ALLGATHER, Collective.REDUCE_SCATTER, Collective.ALLREDUCE])
def test_hierarchical_schedules_verify(collective):
    options = SynthesisOptions(flat_max_ranks=2)  # 4 ranks on 2 hosts: hierarchical
    for topo in (_two_host_detour(), H.cluster(n_hosts=3, gpus_per_host=2, leaves=2)):
        ranks = list(topo.compute_nodes())
        synthesis = synthesize(topo, collective, ranks, options=options)
        ratio = ratio_to_bound(topo, synthesis)  # verifies
        if collective in BOUNDED:
            assert ratio <= NEVER_BELOW


def test_hierarchical_reaches_the_bound_when_the_network_binds():
    # helpers.cluster: NVSwitch hosts, one 50 GB/s NIC per GPU behind PCIe Gen4 x16 (~32
    # GB/s), one leaf: the PCIe/NIC path is the narrow cut, so the host phase is free.
    topo = H.cluster(n_hosts=3, gpus_per_host=2, leaves=1)
    ranks = list(topo.compute_nodes())
    synthesis = synthesize(topo, Collective.ALLGATHER, ranks, options=SynthesisOptions(flat_max_ranks=2))
    assert ratio_to_bound(topo, synthesis) >= MIN_RATIO


def test_rail_chains_spread_over_every_spine_of_an_oversubscribed_fat_tree():
    """8 DGX H100 on 32-port leaves at 2:1: 21 machine ports, so two machines (16 NICs) per leaf,
    4 leaves, 11 spines, each trunk 16 * 50 / (2 * 11) GB/s: a leaf's uplinks carry exactly
    what its 8 rails' NICs can receive, and every rail's ring enters each leaf once. Those 8
    hops carry 7 hosts' shards, in `copies` chains each; dealt out in turn over the 11 spines,
    the busiest trunk carries ceil(8 * 7 * copies / 11) chains against an average of 8 * 7 *
    copies / 11, which is the distance to the bound. Routed by the first shortest path, every
    hop crossed one spine: 1/11 of that."""
    from topocoll.solver.rail_packing import MIN_SLOTS_PER_HOST
    from topocoll.topo.cluster import make_cluster

    topo = make_cluster("dgx-h100", 8, network="fat-tree", oversubscription=2.0, switch_radix=32)
    spines = [n.id for n in topo.nodes_of(NodeKind.NET_SWITCH) if n.id.startswith("spine")]
    assert len(spines) == 11
    ranks = list(topo.compute_nodes())
    synthesis = synthesize(topo, Collective.ALLGATHER, ranks)
    copies = -(-MIN_SLOTS_PER_HOST // 8)
    chains = 8 * 7 * copies
    expected = (chains / len(spines)) / -(-chains // len(spines))
    assert ratio_to_bound(topo, synthesis) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("n_hosts", [2, 5, 8, 13])
def test_rail_trees_span_the_hosts_at_their_depth(n_hosts):
    import math

    from topocoll.solver.rail_packing import rail_tree

    most_bits = max(bin(v).count("1") for v in range(n_hosts))  # a position's depth: its set bits
    assert most_bits <= math.ceil(math.log2(n_hosts))
    for kind, depth in (("chain", n_hosts - 1), ("binomial", most_bits)):
        arcs = rail_tree(kind, n_hosts)
        level = {0: 0}
        for parent, child in arcs:
            assert parent in level and child not in level  # parents before children, each child once
            level[child] = level[parent] + 1
        assert sorted(level) == list(range(n_hosts))
        assert max(level.values()) == depth


def test_a_binomial_rail_tree_reaches_the_bound_in_log_depth_on_a_non_blocking_network():
    """16 DGX H100 on rails of one leaf each (16 <= 64 ports): every rotation of a tree makes each
    NIC send and receive 15 shards, so the binomial tree is as fast as the chain by bandwidth;
    composed with the 8-GPU host trees (one level below the NVSwitch) it is 4 + 1 levels deep
    where the chain's composition is 15 + 1."""
    from topocoll.solver.verify import verify
    from topocoll.topo.cluster import make_cluster

    topo = make_cluster("dgx-h100", 16)
    ranks = list(topo.compute_nodes())
    heights = {}
    for tree in ("chain", "binomial"):
        synthesis = synthesize(topo, Collective.ALLGATHER, ranks, options=SynthesisOptions(rail_tree=tree))
        assert ratio_to_bound(topo, synthesis) == pytest.approx(1.0, abs=1e-6)
        heights[tree] = len(synthesis.schedule.steps)
    assert heights == {"chain": 16, "binomial": 5}
    assert verify(synthesis.schedule, topo).ok
