"""Schedules by rule (format 3): spelt out they are exactly what synthesis lays out, their link
loads computed from the parts are the verifier's, they survive JSON, and bad parts are named."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.solver import helpers as H
from topocoll.errors import ScheduleError, SolverError
from topocoll.solver import rule_schedule
from topocoll.solver.rail_packing import RailRoutes
from topocoll.solver.rule_schedule import RuleSchedule, load_schedule_or_rule, synthesize_by_rule
from topocoll.solver.schedule import Collective, Schedule
from topocoll.solver.synthesize import SynthesisOptions, synthesize
from topocoll.solver.verify import verify
from topocoll.topo.cluster import make_cluster
from topocoll.topo.model import Topology

COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCE_SCATTER, Collective.ALLREDUCE)
#: Hierarchical from two ranks on: the small clusters below take the same path as 64 ranks and more.
OPTIONS = SynthesisOptions(flat_max_ranks=2, pipeline=2)


def _one_way_slower(topo: Topology) -> Topology:
    """``topo`` with one NIC -> leaf direction at half its bandwidth: not symmetric, so the
    reduce-scatter trees are packed on their own (on the reversed graph)."""
    first = next(l for l in topo.links if l.dst.startswith("leaf"))
    links = [dataclasses.replace(l, bw_bytes_per_s=l.bw_bytes_per_s / 2) if l is first else l for l in topo.links]
    return Topology(topo.nodes, links, name=topo.name + " (one way slower)")


CLUSTERS = {
    "rail": lambda: make_cluster("dgx-h100", 3),
    "fat-tree": lambda: make_cluster("dgx-h100", 4, network="fat-tree", oversubscription=2.0, switch_radix=32),
    "superpod": lambda: make_cluster("dgx-h100", 4, network="superpod", su_nodes=2),
    "asymmetric": lambda: _one_way_slower(H.cluster(n_hosts=3, gpus_per_host=2, leaves=2)),
    "rail5": lambda: make_cluster("dgx-a100", 5),  # 5 machines: a binomial tree of positions 0..4
}


@pytest.mark.parametrize("collective", COLLECTIVES, ids=lambda c: c.value)
@pytest.mark.parametrize("cluster, tree", [(c, "chain") for c in sorted(CLUSTERS)] + [("superpod", "binomial"), ("rail5", "binomial")])
def test_spelt_out_it_is_the_synthesized_schedule_and_its_loads_are_the_verifiers(cluster, tree, collective):
    topo = CLUSTERS[cluster]()
    ranks = list(topo.compute_nodes())
    options = dataclasses.replace(OPTIONS, rail_tree=tree)
    by_rule, bound = synthesize_by_rule(topo, collective, ranks, options)
    if cluster == "asymmetric" and collective is not Collective.ALLGATHER:
        assert not topo.is_symmetric() and by_rule.scatter is not by_rule.gather
    expanded = by_rule.expand()
    assert expanded == synthesize(topo, collective, ranks, options=options).schedule
    assert RuleSchedule.from_json(by_rule.to_json()).expand() == expanded
    checked = verify(expanded, topo, size_bytes=1.0)
    checked.raise_if_failed()
    t_bw, busiest = by_rule.t_bw_s_per_byte(topo)
    assert t_bw == pytest.approx(checked.t_bw_s, rel=1e-9, abs=0)
    loads = by_rule.link_loads()
    assert set(loads) == set(checked.link_load)
    for link, load in checked.link_load.items():
        assert loads[link] == pytest.approx(load, rel=1e-9, abs=0), link
    assert t_bw >= bound.time_per_byte_s * (1 - 1e-9)


@pytest.mark.parametrize("collective", COLLECTIVES, ids=lambda c: c.value)
def test_json_round_trip_and_every_reader_spells_it_out(collective, tmp_path):
    topo = CLUSTERS["asymmetric"]()
    by_rule, _ = synthesize_by_rule(topo, collective, list(topo.compute_nodes()), OPTIONS)
    text = by_rule.to_json()
    assert json.loads(text)["format"] == "topocoll.schedule/3"
    again = RuleSchedule.from_json(text, "s.json")
    assert again.expand() == by_rule.expand()
    assert again.to_json() == text
    assert Schedule.from_json(text, "s.json") == by_rule.expand()  # what load_schedule gives every command
    path = tmp_path / "s.json"
    path.write_text(text)
    assert isinstance(load_schedule_or_rule(path), RuleSchedule)


def test_a_symmetric_topology_writes_the_reduction_trees_once():
    topo = CLUSTERS["rail"]()
    by_rule, _ = synthesize_by_rule(topo, Collective.ALLREDUCE, list(topo.compute_nodes()), OPTIONS)
    data = by_rule.to_json_dict()
    assert data["scatter"] == "gather"
    assert RuleSchedule.from_json_dict(data).expand() == by_rule.expand()


def test_the_file_grows_with_the_ranks_not_their_square():
    """Per rank the parts hold a route per hop of its rail and its share of its host's trees,
    whatever the rank count; spelt out, each of the N x copies trees has N - 1 arcs."""
    per_rank = {}
    for nodes in (4, 16):
        topo = make_cluster("dgx-h100", nodes)
        by_rule, _ = synthesize_by_rule(topo, Collective.ALLGATHER, list(topo.compute_nodes()))
        n = 8 * nodes
        assert by_rule.transfers_at_least() == n * by_rule.gather.copies * (n - 1)
        per_rank[nodes] = len(by_rule.to_json()) / n
    assert per_rank[16] < 1.2 * per_rank[4]


def _schedule() -> tuple[Topology, RuleSchedule]:
    topo = CLUSTERS["rail"]()
    return topo, synthesize_by_rule(topo, Collective.ALLGATHER, list(topo.compute_nodes()), OPTIONS)[0]


def test_check_names_a_route_that_leaves_the_links():
    topo, by_rule = _schedule()
    part = by_rule.gather
    rail = part.rails[1]
    turn, routes = rail.hops[0, 1]
    wrong = (routes[0][0], routes[0][-1])  # straight from one GPU to the other machine's GPU
    bad_rail = RailRoutes({**rail.hops, (0, 1): (turn, (wrong,) + routes[1:])})
    bad = dataclasses.replace(by_rule, gather=dataclasses.replace(part, rails=(part.rails[0], bad_rail) + part.rails[2:]))
    with pytest.raises(ScheduleError, match=r"gather rail 1 hop 0->1: route .* uses n0\.gpu1->n1\.gpu1, which is not a link"):
        bad.check(topo)


def test_check_names_a_host_tree_that_misses_ranks_and_slots_that_do_not_add_up():
    topo, by_rule = _schedule()
    part = by_rule.gather
    tree, count = part.host_trees[2][3][0]
    short = dataclasses.replace(tree, arcs=tree.arcs[:-1])
    per_root = list(part.host_trees[2])
    per_root[3] = ((short, count),) + part.host_trees[2][3][1:]
    bad = dataclasses.replace(by_rule, gather=dataclasses.replace(part, host_trees=part.host_trees[:2] + (tuple(per_root),)))
    with pytest.raises(ScheduleError, match=r"gather host 2 root 3: a host tree reaches 7 of the host's 8 ranks"):
        bad.check(topo)
    per_root[3] = ((tree, count + 1),) + part.host_trees[2][3][1:]
    bad = dataclasses.replace(by_rule, gather=dataclasses.replace(part, host_trees=part.host_trees[:2] + (tuple(per_root),)))
    with pytest.raises(ScheduleError, match=r"gather host 2 root 3: tree slots must be positive and add up to hosts x copies"):
        bad.check(topo)


def test_check_refuses_another_topology():
    _, by_rule = _schedule()
    with pytest.raises(ScheduleError, match="was made for topology"):
        by_rule.check(make_cluster("dgx-h100", 3, network="superpod", su_nodes=2))


def test_expanding_past_the_limit_is_refused_in_one_line(monkeypatch):
    _, by_rule = _schedule()
    need = by_rule.transfers_at_least()
    assert need == 24 * 22 * 23 * 2  # 24 ranks x ceil(64 / 3) copies x 23 arcs x 2 pieces
    monkeypatch.setattr(rule_schedule, "EXPAND_MAX_TRANSFERS", need - 1)
    with pytest.raises(ScheduleError, match=r"^s\.json: a schedule by rule over 24 ranks spells out at least 0 million transfers, .*topocoll verify checks it by its parts$"):
        by_rule.expand("s.json")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["paths"].__setitem__(0, [0, 10**6]), "IndexError"),
        (lambda d: d.__setitem__("scatter", "gather") or d.__setitem__("collective", "allreduce") or d.__setitem__("gather", None), 'scatter is "gather" but there are no gather trees'),
        (lambda d: d["gather"].__setitem__("hosts", [[0, 1]]), "hosts must split ranks"),
        (lambda d: d.__setitem__("collective", "broadcast"), "not broadcast"),
        (lambda d: d.__setitem__("pipeline", "2"), "pipeline: expected an integer"),
    ],
)
def test_a_damaged_file_is_refused_naming_it(edit, message):
    _, by_rule = _schedule()
    data = json.loads(by_rule.to_json())
    edit(data)
    with pytest.raises(ScheduleError, match=rf"^bad\.json: .*{message}"):
        RuleSchedule.from_json(json.dumps(data), "bad.json")


def test_only_multi_host_all_rank_collectives_have_a_rule():
    topo = CLUSTERS["rail"]()
    with pytest.raises(SolverError, match="not broadcast"):
        synthesize_by_rule(topo, Collective.BROADCAST, list(topo.compute_nodes()))
    one = H.nvswitch_box(4)
    with pytest.raises(SolverError, match="at least two hosts"):
        synthesize_by_rule(one, Collective.ALLGATHER, list(one.compute_nodes()))
