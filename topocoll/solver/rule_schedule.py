"""Schedules described by a rule: format ``topocoll.schedule/3``.

A hierarchical schedule (:mod:`topocoll.solver.rail_packing`) over N ranks has N trees of N - 1
arcs each: spelt out transfer by transfer (formats 1 and 2) that is 134 million transfers for an
allreduce of 8192 GPUs. Its parts are linear in N: per rail the routes of the hops between
consecutive hosts, per host its own trees, and the rule that composes them
(:class:`~topocoll.solver.rail_packing.RailPacking`). A :class:`RuleSchedule` keeps those parts
and the pipelining depth; :meth:`RuleSchedule.expand` applies the layout of
:func:`topocoll.solver.synthesize.layout` and gives the very schedule synthesis would have
written, transfer for transfer.

What can be known without expanding is computed from the parts:

- :meth:`RuleSchedule.check`: every route follows links of the topology between the ranks it
  joins, every host tree spans its host from its root, the slots add up. Every composed tree is
  then a spanning tree over all ranks (a rail chain reaches the root's rail member on every
  host, whose host tree reaches the rest), and the layout rule makes a correct collective of
  spanning trees (the transfer-level verifier checks that rule on every expanded schedule in
  the tests).
- :meth:`RuleSchedule.link_loads`: the bytes every link carries, summed route by route and host
  tree by host tree with the number of composed trees using each, so the bandwidth time and the
  bottleneck need no expansion either.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topocoll import fileio
from topocoll.errors import ScheduleError, SolverError, TopocollError
from topocoll.solver.bound import Bound, cut_bound
from topocoll.solver.packing import Tree
from topocoll.solver.rail_packing import RailPacking, RailRoutes, compose, host_groups, rail_packing
from topocoll.solver.request import check_request
from topocoll.solver.schedule import FORMAT_RULE, Collective, Schedule, without_cycle_collection
from topocoll.solver.synthesize import SynthesisOptions, layout, reverse_packing
from topocoll.topo.model import Topology

#: Most transfers :meth:`RuleSchedule.expand` spells out: about 4 GB of records (a 256-GPU plan of
#: 4.2 million transfers peaks at 0.8 GB, ``benchmarks/results/scale.md``, about 200 bytes each).
EXPAND_MAX_TRANSFERS = 20_000_000
#: Collectives a rule describes: those laid out on trees of every rank.
RULE_COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCE_SCATTER, Collective.ALLREDUCE)


@dataclass(frozen=True, slots=True)
class RuleSchedule:
    """A hierarchical schedule by its parts (see the module docstring).

    Attributes
    ----------
    collective : Collective
        Allgather, reduce-scatter or allreduce.
    ranks : tuple of str
    topology_digest : str
    pipeline : int
        Pieces each tree's data is cut into, as in :class:`~topocoll.solver.synthesize.SynthesisOptions`.
    gather : RailPacking or None
        Trees the data spreads down (allgather, allreduce).
    scatter : RailPacking or None
        Trees packed on the reversed graph (reduce-scatter, allreduce): their paths run parent
        -> child there, so child -> parent on the topology, read backwards.
    name : str
    """

    collective: Collective
    ranks: tuple[str, ...]
    topology_digest: str
    pipeline: int
    gather: RailPacking | None
    scatter: RailPacking | None
    name: str = "lp"

    def __post_init__(self) -> None:
        if self.collective not in RULE_COLLECTIVES:
            raise ScheduleError(f"a schedule by rule is an allgather, reduce-scatter or allreduce, not {self.collective.value}")
        needs_gather = self.collective in (Collective.ALLGATHER, Collective.ALLREDUCE)
        needs_scatter = self.collective in (Collective.REDUCE_SCATTER, Collective.ALLREDUCE)
        if (self.gather is not None) != needs_gather or (self.scatter is not None) != needs_scatter:
            raise ScheduleError(
                f"{self.collective.value} by rule: gather trees {'needed' if needs_gather else 'not expected'}, "
                f"scatter trees {'needed' if needs_scatter else 'not expected'}"
            )
        if self.pipeline < 1:
            raise ScheduleError(f"pipeline must be >= 1, got {self.pipeline}")
        for _, part in self._parts():
            _check_hosts(part, len(self.ranks))

    def _parts(self) -> list[tuple[str, RailPacking]]:
        return [(what, p) for what, p in (("gather", self.gather), ("scatter", self.scatter)) if p is not None]

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self.ranks)

    def transfers_at_least(self) -> int:
        """Transfers the schedule spelt out has at least: every composed tree's arcs, once per piece."""
        n = len(self.ranks)
        return sum(n * part.copies * (n - 1) * self.pipeline for _, part in self._parts())

    def expand(self, source: str = "the schedule") -> Schedule:
        """The schedule spelt out, transfer for transfer (quadratic in the ranks).

        Raises
        ------
        ScheduleError
            It would spell out more than :data:`EXPAND_MAX_TRANSFERS` transfers.
        """
        need = self.transfers_at_least()
        if need > EXPAND_MAX_TRANSFERS:
            raise ScheduleError(
                f"{source}: a schedule by rule over {len(self.ranks)} ranks spells out at least {need / 1e6:.0f} million "
                f"transfers, more than the {EXPAND_MAX_TRANSFERS / 1e6:.0f} million this expands; "
                "topocoll verify checks it by its parts"
            )
        gather = compose(self.gather) if self.gather is not None else None
        scatter = reverse_packing(compose(self.scatter)) if self.scatter is not None else None
        return layout(self.collective, self.ranks, None, gather, scatter, self.pipeline, self.topology_digest, self.name)

    def link_loads(self) -> dict[tuple[str, str], float]:
        """Bytes each link carries per byte of buffer, whatever the pipelining."""
        loads: dict[tuple[str, str], float] = {}
        n = len(self.ranks)
        for what, part in self._parts():
            backwards = what == "scatter"
            per_tree = 1.0 / (n * part.copies)  # each rank's 1/n of the buffer, 1/copies per tree
            n_hosts = len(part.hosts)
            spans = part.spans()
            for rail in part.rails:
                for (a, b), (turn, routes) in rail.hops.items():
                    crossings = spans[(b - a) % n_hosts] * part.copies
                    for k, path in enumerate(routes):
                        # crossings t with (turn + t) % len(routes) == k
                        first = (k - turn) % len(routes)
                        uses = 0 if first >= crossings else (crossings - 1 - first) // len(routes) + 1
                        _add_path(loads, path, uses * per_tree, backwards)
            for per_root in part.host_trees:
                for trees in per_root:
                    for tree, count in trees:
                        for _, _, path in tree.arcs:
                            _add_path(loads, path, count * per_tree, backwards)
        return loads

    def t_bw_s_per_byte(self, topology: Topology) -> tuple[float, tuple[str, str]]:
        """Bandwidth time per byte of buffer and the busiest link."""
        worst, busiest = 0.0, ("", "")
        for link, load in self.link_loads().items():
            time = load / topology.capacity(*link)
            if time > worst:
                worst, busiest = time, link
        return worst, busiest

    def check(self, topology: Topology) -> None:
        """Raise ScheduleError, naming the element, where a part does not fit ``topology``."""
        if self.topology_digest != topology.digest():
            raise ScheduleError(f"the schedule was made for topology {self.topology_digest}, not this one ({topology.digest()})")
        for what, part in self._parts():
            backwards = what == "scatter"
            hosts = part.hosts
            for i, rail in enumerate(part.rails):
                for (a, b), (turn, routes) in sorted(rail.hops.items()):
                    src, dst = self.ranks[hosts[a][i]], self.ranks[hosts[b][i]]
                    where = f"{what} rail {i} hop {a}->{b}"
                    if not routes or not 0 <= turn < len(routes):
                        raise ScheduleError(f"{where}: needs a route, and a turn among them")
                    for path in routes:
                        _check_path(topology, path, src, dst, backwards, where)
            for o, per_root in enumerate(part.host_trees):
                members = hosts[o]
                for i, trees in enumerate(per_root):
                    where = f"{what} host {o} root {i}"
                    if sum(count for _, count in trees) != len(hosts) * part.copies or any(c < 1 for _, c in trees):
                        raise ScheduleError(f"{where}: tree slots must be positive and add up to hosts x copies = {len(hosts) * part.copies}")
                    for tree, _ in trees:
                        _check_host_tree(topology, tree, i, members, self.ranks, backwards, where)

    # ------------------------------------------------------------------------------ JSON
    def to_json_dict(self) -> dict[str, Any]:
        """The format-3 dictionary (see the README's schedule formats)."""
        number = {node: k for k, node in enumerate(self.ranks)}
        nodes: list[str] = []
        paths: list[list[int]] = []
        path_number: dict[tuple[str, ...], int] = {}

        def p(path: tuple[str, ...]) -> int:
            if path not in path_number:
                path_number[path] = len(paths)
                for node in path:
                    if node not in number:
                        number[node] = len(number)
                        nodes.append(node)
                paths.append([number[node] for node in path])
            return path_number[path]

        vias: list[list[int]] = []
        via_number: dict[tuple[int, ...], int] = {}

        def hop(routes: tuple[tuple[str, ...], ...]) -> list[Any]:
            """``[[route, ...]]``, or ``[head, via, tail]`` for routes that differ in the middle only."""
            if len(routes) == 1:
                return [[p(routes[0])]]
            pre = _common(routes)
            suf = _common([r[::-1] for r in routes])
            head, tail = routes[0][: pre - 1], routes[0][len(routes[0]) - suf + 1 :]
            middles = tuple(p(r[pre - 1 : len(r) - suf + 1]) for r in routes)
            if middles not in via_number:
                via_number[middles] = len(vias)
                vias.append(list(middles))
            return [p(head), via_number[middles], p(tail)]

        def packing(part: RailPacking) -> dict[str, Any]:
            return {
                "hosts": [list(h) for h in part.hosts],
                "copies": part.copies,
                "tree": [list(arc) for arc in part.tree],
                "rails": [[[a, b, turn, *hop(routes)] for (a, b), (turn, routes) in sorted(r.hops.items())] for r in part.rails],
                "host_trees": [
                    [[[[[pa, ch, p(path)] for pa, ch, path in tree.arcs], count] for tree, count in trees] for trees in per_root]
                    for per_root in part.host_trees
                ],
            }

        gather = packing(self.gather) if self.gather is not None else None
        if self.scatter is None:
            scatter = None
        elif self.scatter is self.gather:
            scatter = "gather"  # a symmetric topology: the same trees, read backwards
        else:
            scatter = packing(self.scatter)
        return {
            "format": FORMAT_RULE,
            "collective": self.collective.value,
            "name": self.name,
            "root": None,
            "ranks": list(self.ranks),
            "topology_digest": self.topology_digest,
            "pipeline": self.pipeline,
            "nodes": nodes,
            "paths": paths,
            "vias": vias,
            "gather": gather,
            "scatter": scatter,
        }

    def to_json(self) -> str:
        """Canonical JSON text of format 3."""
        return json.dumps(self.to_json_dict(), sort_keys=True, separators=(",", ":")) + "\n"

    @classmethod
    def from_json_dict(cls, data: Any, source: str = "<schedule>") -> "RuleSchedule":
        """Parse format-3 data; every error names ``source`` and the element."""
        try:
            return _from_json_dict(data)
        except ScheduleError as exc:
            raise ScheduleError(f"{source}: {exc}") from None
        except (KeyError, TypeError, ValueError, IndexError, TopocollError) as exc:
            raise ScheduleError(f"{source}: not a valid {FORMAT_RULE} schedule ({type(exc).__name__}: {exc})") from None

    @classmethod
    def from_json(cls, text: str, source: str = "<schedule>") -> "RuleSchedule":
        """Parse format-3 JSON text."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ScheduleError(f"{source}: not JSON ({exc.msg} at line {exc.lineno})") from None
        return cls.from_json_dict(data, source)


def synthesize_by_rule(
    topology: Topology, collective: Collective, ranks: Sequence[str], options: SynthesisOptions = SynthesisOptions()
) -> tuple[RuleSchedule, Bound]:
    """The hierarchical schedule :func:`~topocoll.solver.synthesize.synthesize` lays out, kept by its parts.

    Parameters
    ----------
    topology : Topology
    collective : Collective
        Allgather, reduce-scatter or allreduce.
    ranks : sequence of str
        Rank nodes, in rank order, a regular multi-host set
        (:func:`~topocoll.solver.rail_packing.host_groups`).
    options : SynthesisOptions
        ``pipeline``, ``rail_tree``, ``solver``, ``time_limit_s`` and ``gap`` apply.

    Returns
    -------
    (RuleSchedule, Bound)
        The schedule (checked against ``topology``) and the cut bound it is measured against.

    Raises
    ------
    SolverError
        Another collective, or ranks that are not a regular multi-host set.
    """
    if collective not in RULE_COLLECTIVES:
        raise SolverError(f"a schedule by rule is an allgather, reduce-scatter or allreduce, not {collective.value}")
    ranks = check_request(topology, collective, ranks, None)
    groups = host_groups(topology, ranks)
    if groups is None:
        raise SolverError("a schedule by rule needs the ranks on at least two hosts, the same number (at least two) on each")
    bound = cut_bound(topology, collective, ranks)
    kwargs = dict(solver=options.solver, time_limit_s=options.time_limit_s, gap=options.gap, tree=options.rail_tree)
    gather = scatter = None
    if collective in (Collective.ALLGATHER, Collective.ALLREDUCE):
        gather = rail_packing(topology, ranks, groups, **kwargs)
    if collective in (Collective.REDUCE_SCATTER, Collective.ALLREDUCE):
        if gather is not None and topology.is_symmetric():
            scatter = gather
        else:
            scatter = rail_packing(topology, ranks, groups, reverse=True, **kwargs)
    schedule = RuleSchedule(collective, tuple(ranks), topology.digest(), options.pipeline, gather, scatter)
    schedule.check(topology)
    return schedule, bound


def load_schedule_or_rule(path: str | os.PathLike) -> Schedule | RuleSchedule:
    """Read a schedule file of any format, keeping a format-3 one by its parts.

    Raises as :func:`topocoll.solver.schedule.load_schedule` does.
    """
    source = str(path)
    text = fileio.read_input(path, fileio.SCHEDULE_LIMIT_BYTES, "schedule file")
    try:
        with without_cycle_collection():
            data = fileio.loads_json(text, source)
    except json.JSONDecodeError as exc:
        raise ScheduleError(f"{source}: line {exc.lineno}: malformed JSON: {exc.msg}") from None
    if is_rule_format(data):
        return RuleSchedule.from_json_dict(data, source)
    return Schedule.from_json_dict(data, source)


def is_rule_format(data: Any) -> bool:
    """Whether parsed schedule JSON is of format 3."""
    return isinstance(data, Mapping) and data.get("format") == FORMAT_RULE


def _from_json_dict(data: Any) -> RuleSchedule:
    if not is_rule_format(data):
        raise ScheduleError(f"format must be {FORMAT_RULE!r}, got {data.get('format') if isinstance(data, Mapping) else data!r}")
    ranks = tuple(_str(x, "ranks") for x in data["ranks"])
    nodes = ranks + tuple(_str(x, "nodes") for x in data["nodes"])
    paths = [tuple(nodes[_int(k, "paths")] for k in path) for path in data["paths"]]
    vias = [tuple(_int(k, "vias") for k in via) for via in data.get("vias", [])]

    def path(k: Any) -> tuple[str, ...]:
        return paths[_int(k, "path number")]

    def routes(entry: list) -> tuple[tuple[str, ...], ...]:
        if len(entry) == 1:  # [[route, ...]]
            return tuple(path(x) for x in entry[0])
        head, via, tail = entry  # routes that differ between a shared head and tail
        return tuple(path(head) + path(middle) + path(tail) for middle in vias[_int(via, "via")])

    def packing(entry: Mapping[str, Any]) -> RailPacking:
        return RailPacking(
            tuple(tuple(_int(r, "hosts") for r in host) for host in entry["hosts"]),
            _int(entry["copies"], "copies"),
            tuple((_int(pa, "tree"), _int(ch, "tree")) for pa, ch in entry["tree"]),
            tuple(
                RailRoutes({(_int(hop[0], "hop"), _int(hop[1], "hop")): (_int(hop[2], "turn"), routes(hop[3:])) for hop in rail})
                for rail in entry["rails"]
            ),
            tuple(
                tuple(
                    tuple((Tree(i, tuple((_int(pa, "arc"), _int(ch, "arc"), path(x)) for pa, ch, x in arcs), 1.0), _int(count, "slots")) for arcs, count in trees)
                    for i, trees in enumerate(per_root)
                )
                for per_root in entry["host_trees"]
            ),
        )

    gather = packing(data["gather"]) if data["gather"] is not None else None
    scatter_entry = data["scatter"]
    if scatter_entry == "gather":
        if gather is None:
            raise ScheduleError('scatter is "gather" but there are no gather trees')
        scatter = gather
    else:
        scatter = packing(scatter_entry) if scatter_entry is not None else None
    if data.get("root") is not None:
        raise ScheduleError("a schedule by rule has no root")
    return RuleSchedule(
        Collective.parse(_str(data["collective"], "collective")),
        ranks,
        _str(data["topology_digest"], "topology_digest"),
        _int(data["pipeline"], "pipeline"),
        gather,
        scatter,
        _str(data.get("name", ""), "name"),
    )


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ScheduleError(f"{where}: expected a string, got {value!r}")
    return value


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScheduleError(f"{where}: expected an integer, got {value!r}")
    return value


def _common(routes: Sequence[tuple[str, ...]]) -> int:
    """Length of the prefix every route shares, short of the shortest route."""
    k, shortest = 0, min(len(r) for r in routes) - 1
    while k < shortest and all(r[k] == routes[0][k] for r in routes):
        k += 1
    return k


def _add_path(loads: dict[tuple[str, str], float], path: tuple[str, ...], amount: float, backwards: bool) -> None:
    if not amount:
        return
    for a, b in zip(path, path[1:]):
        link = (b, a) if backwards else (a, b)
        loads[link] = loads.get(link, 0.0) + amount


def _check_hosts(part: RailPacking, n: int) -> None:
    hosts = part.hosts
    flat = sorted(r for host in hosts for r in host)
    if len(hosts) < 2 or flat != list(range(n)) or len({len(h) for h in hosts}) != 1:
        raise ScheduleError(f"hosts must split ranks 0..{n - 1} into at least two hosts of one size")
    if part.copies < 1:
        raise ScheduleError(f"copies must be >= 1, got {part.copies}")
    n_hosts = len(hosts)
    reached = {0}
    for parent, child in part.tree:
        if parent not in reached or child in reached or not 0 <= child < n_hosts:
            raise ScheduleError(f"rail tree arc {parent}->{child} does not grow a tree over hosts 0..{n_hosts - 1} from 0")
        reached.add(child)
    if len(reached) != n_hosts:
        raise ScheduleError(f"the rail tree reaches {len(reached)} of {n_hosts} hosts")
    needed = {(a, (a + span) % n_hosts) for a in range(n_hosts) for span in part.spans()}
    if len(part.rails) != len(hosts[0]):
        raise ScheduleError(f"need a rail per rank of a host ({len(hosts[0])}), got {len(part.rails)}")
    for i, rail in enumerate(part.rails):
        if set(rail.hops) != needed:
            missing = sorted(needed - set(rail.hops)) or sorted(set(rail.hops) - needed)
            raise ScheduleError(f"rail {i}: its hops must be those the rotated rail tree takes (hop {missing[0][0]}->{missing[0][1]} is not)")
    if len(part.host_trees) != len(hosts) or any(len(per_root) != len(hosts[0]) for per_root in part.host_trees):
        raise ScheduleError(f"need host trees for every host ({len(hosts)}) and every local root ({len(hosts[0])})")


def _check_path(topology: Topology, path: tuple[str, ...], src: str, dst: str, backwards: bool, where: str) -> None:
    if len(path) < 2 or path[0] != src or path[-1] != dst:
        raise ScheduleError(f"{where}: route {'-'.join(path)} must run from {src} to {dst}")
    if len(set(path)) != len(path):
        raise ScheduleError(f"{where}: route {'-'.join(path)} visits a node twice")
    for a, b in zip(path, path[1:]):
        link = (b, a) if backwards else (a, b)
        if not topology.has_link(*link):
            raise ScheduleError(f"{where}: route {'-'.join(path)} uses {link[0]}->{link[1]}, which is not a link")


def _check_host_tree(
    topology: Topology, tree: Tree, root: int, members: tuple[int, ...], ranks: tuple[str, ...], backwards: bool, where: str
) -> None:
    reached = {root}
    for parent, child, path in tree.arcs:
        if parent not in reached or child in reached or not 0 <= child < len(members):
            raise ScheduleError(f"{where}: arc {parent}->{child} does not grow a tree from local rank {root}")
        reached.add(child)
        _check_path(topology, path, ranks[members[parent]], ranks[members[child]], backwards, where)
    if len(reached) != len(members):
        raise ScheduleError(f"{where}: a host tree reaches {len(reached)} of the host's {len(members)} ranks")
