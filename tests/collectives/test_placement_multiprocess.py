"""Four real ranks, no topology given: the group discovers its machines, places every rank by
identity, and its dumped topology replays its schedule through ``topocoll synthesize``."""

from __future__ import annotations

import json

import pytest

from tests.collectives.harness import launch
from tests.collectives.placement_worker import placement_worker
from topocoll.cli import main
from topocoll.collectives.schedule_source import STEP_OVERHEAD_S
from topocoll.topo.io import load_topology

WORLD = 4
SIZE_BYTES = 1 << 12  # a power of two: its own size bucket


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_shuffled_ranks_are_placed_by_identity_and_the_dump_replays(tmp_path):
    hosts = ["beta", "alpha", "beta", "alpha"]  # rank 0 on the machine of rank 2, not of rank 1
    dump = tmp_path / "group.json"
    reports = launch(placement_worker, WORLD, tmp_path, 200, hosts, str(dump), SIZE_BYTES)
    assert all(r["sum_ok"] for r in reports)
    assert [r["host_id"] for r in reports] == hosts  # every rank on a node of its own machine
    assert [r["node_rank"] for r in reports] == list(range(WORLD))
    assert len({r["node"] for r in reports}) == WORLD
    assert len({r["digest"] for r in reports}) == 1
    topology = load_topology(dump)
    assert topology.digest() == reports[0]["digest"]
    # ranks of one machine share its CPU through memory; machines meet only through the network
    for a in range(WORLD):
        for b in range(WORLD):
            path_kinds = {topology.link(x, y).kind.value for x, y in _hops(topology, reports[a]["node"], reports[b]["node"])}
            assert ("net" in path_kinds) == (hosts[a] != hosts[b]), (a, b, path_kinds)
    replay = tmp_path / "replay.json"
    status = main(["synthesize", "--topology", str(dump), "--collective", "allreduce", "--size", str(SIZE_BYTES),
                   "--overhead-us", repr(STEP_OVERHEAD_S * 1e6), "-o", str(replay)])
    assert status == 0
    assert json.loads(replay.read_text()) == reports[0]["schedule"]


def _hops(topology, src, dst):
    import networkx as nx

    path = nx.shortest_path(topology.graph, src, dst)
    return list(zip(path, path[1:]))
