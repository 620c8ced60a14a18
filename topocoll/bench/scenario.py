"""Emulation scenarios: K hosts, switches and shaped links, as data.

A scenario file (``"format": "topocoll.scenario/1"``) names hosts, switches and links with a
rate and a one-way delay. This module parses and validates a scenario (:func:`parse_scenario`)
and gives the topology the emulated network really has (:func:`scenario_topology`, the ground
truth a discovered or probed topology can be compared with). With
:mod:`topocoll.bench.network_plan` (the namespaces, addresses, routes and ``ip``/``tc`` commands
that emulate it) it is the pure half of ``topocoll emulate``; nothing here runs a command,
:mod:`topocoll.bench.emulate` does.

Network model
-------------
Every link whose endpoint is a host gives that host one NIC, ``eth0``, ``eth1``, ... in the
order the links are listed. An *L2 domain* is a connected set of switches (switch-switch links
join them) with the NICs attached to them, or one direct host-host link. Each domain gets its
own /24 out of a /16 base (:data:`topocoll.bench.network_plan.DEFAULT_SUBNET_BASE`); a host's address in a domain is
``.(host index + 1)``. Hosts that share no domain reach each other through static routes over
other hosts (which forward): for each other host the path with the fewest hops, ties broken by
the widest bottleneck rate, then by the hosts' names along the path. Hosts that share a domain
always talk over it directly, so a direct send between adjacent hosts takes the direct link.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import networkx as nx

from topocoll import fileio
from topocoll.errors import FormatError, ScenarioError
from topocoll.topo import bandwidth as bw
from topocoll.topo.model import Link, LinkKind, Node, NodeKind, Topology, TopologyBuilder, natural_key

__all__ = [
    "assumed_rates",
    "FORMAT",
    "HOST_NIC_BW_BYTES_PER_S",
    "ScenarioLink",
    "Scenario",
    "parse_scenario",
    "load_scenario",
    "shipped_scenarios",
    "check_ranks",
    "scenario_topology",
    "Domains",
    "domains_of",
    "host_graph",
]

FORMAT = "topocoll.scenario/1"

#: Bandwidth of the link between an emulated host's process and its NIC. It is the in-memory
#: path of the kernel (a copy into a socket buffer), never the bottleneck of a scenario whose
#: links are at most a few hundred Mbit/s, so the figure only has to be far above them: we use
#: the shared-memory figure of the bandwidth table (12 GB/s, hundreds of times a network link).
HOST_NIC_BW_BYTES_PER_S = bw.SHM_BW_BYTES_PER_S

#: Names of hosts and switches: they become hostnames, namespace names and node ids (``h0.eth0``),
#: so no dots, and short enough that ``tce-<run id>-<name>`` stays readable.
NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,31}$")

SCENARIO_LIMIT_BYTES = 1 << 20
"""Largest scenario file read (1 MiB; the shipped ones are under 2 kB)."""


# ------------------------------------------------------------------------------- records
@dataclass(frozen=True, slots=True)
class ScenarioLink:
    """One full-duplex link of a scenario, shaped to the same rate in both directions.

    Parameters
    ----------
    a, b : str
        Endpoints: host or switch names.
    rate_bits_per_s : float
        Rate of each direction, bits per second (> 0).
    delay_s : float
        One-way delay added in each direction, seconds (>= 0).
    """

    a: str
    b: str
    rate_bits_per_s: float
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.rate_bits_per_s > 0:
            raise ScenarioError(f"link {self.a}-{self.b}: rate must be > 0, got {self.rate_bits_per_s!r}")
        if not self.delay_s >= 0:
            raise ScenarioError(f"link {self.a}-{self.b}: delay must be >= 0, got {self.delay_s!r}")


@dataclass(frozen=True, slots=True)
class Scenario:
    """A validated scenario. Build one with :func:`parse_scenario` or :func:`load_scenario`.

    Parameters
    ----------
    name : str
        Short name (``two-racks``); also the label of the truth topology.
    description : str
        What it emulates and why its figures are what they are.
    hosts, switches : tuple of str
        Names; host i runs rank i.
    links : tuple of ScenarioLink
        In file order (that order numbers each host's NICs).
    """

    name: str
    description: str
    hosts: tuple[str, ...]
    switches: tuple[str, ...]
    links: tuple[ScenarioLink, ...]

    def host_index(self, host: str) -> int:
        """Index (= rank) of ``host``."""
        return self.hosts.index(host)

    def nic_links(self, host: str) -> tuple[int, ...]:
        """Indices of the links that give ``host`` its NICs, in NIC order (eth0 first)."""
        return tuple(i for i, link in enumerate(self.links) if host in (link.a, link.b))

    def ifname(self, host: str, link_index: int) -> str:
        """Name of the NIC that link ``link_index`` gives ``host`` (``eth0``, ``eth1``, ...)."""
        return f"eth{self.nic_links(host).index(link_index)}"


# --------------------------------------------------------------------------------- parsing
def _number(value: Any, where: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (float("inf"), float("-inf")):
        raise ScenarioError(f"{where}: {field} must be a finite number, got {value!r}")
    return float(value)


def _names(data: Mapping[str, Any], key: str, source: str, required: bool) -> list[str]:
    raw = data.get(key, None)
    if raw is None and not required:
        return []
    if not isinstance(raw, list):
        raise ScenarioError(f"{source}: '{key}' must be a list of names")
    for i, name in enumerate(raw):
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise ScenarioError(
                f"{source}: {key}[{i}]: {name!r} is not a valid name (a letter, then up to 31 letters, digits or '-')"
            )
    return raw


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate scenario JSON data and return the :class:`Scenario`.

    Parameters
    ----------
    data : object
        The parsed JSON document.
    source : str
        Label for error messages (the file's name).

    Returns
    -------
    Scenario

    Raises
    ------
    ScenarioError
        One line naming ``source`` and the element: unknown format, a bad or duplicate name,
        an unknown endpoint, a link from a node to itself, a rate <= 0, a negative delay, a
        host without a NIC or with two NICs in one L2 domain, a loop of switches in one L2
        domain, or hosts that cannot reach each other.

    Examples
    --------
    >>> s = parse_scenario({"format": "topocoll.scenario/1", "name": "pair", "hosts": ["h0", "h1"],
    ...                     "links": [{"a": "h0", "b": "h1", "rate_mbit": 100}]})
    >>> s.links[0].rate_bits_per_s
    100000000.0
    """
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{source}: expected a JSON object")
    if data.get("format") != FORMAT:
        raise ScenarioError(f"{source}: unknown format {data.get('format')!r}; expected {FORMAT!r}")
    name = data.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ScenarioError(f"{source}: 'name' must be a name (a letter, then up to 31 letters, digits or '-'), got {name!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ScenarioError(f"{source}: 'description' must be a string")
    hosts = _names(data, "hosts", source, required=True)
    switches = _names(data, "switches", source, required=False)
    if len(hosts) < 1:
        raise ScenarioError(f"{source}: 'hosts' is empty")
    seen: dict[str, str] = {}
    for key, names in (("hosts", hosts), ("switches", switches)):
        for i, node in enumerate(names):
            if node in seen:
                raise ScenarioError(f"{source}: {key}[{i}]: duplicate name {node!r} (already in {seen[node]})")
            seen[node] = key
    raw_links = data.get("links")
    if not isinstance(raw_links, list):
        raise ScenarioError(f"{source}: 'links' must be a list")
    links: list[ScenarioLink] = []
    for i, entry in enumerate(raw_links):
        where = f"{source}: links[{i}]"
        if not isinstance(entry, Mapping):
            raise ScenarioError(f"{where}: expected an object with 'a', 'b', 'rate_mbit'")
        unknown = sorted(set(entry) - {"a", "b", "rate_mbit", "delay_ms"})
        if unknown:
            raise ScenarioError(f"{where}: unknown field {unknown[0]!r}; known: a, b, rate_mbit, delay_ms")
        for end in ("a", "b"):
            if end not in entry:
                raise ScenarioError(f"{where}: missing {end!r}")
            if entry[end] not in seen:
                raise ScenarioError(f"{where}: unknown endpoint {entry[end]!r}")
        if entry["a"] == entry["b"]:
            raise ScenarioError(f"{where}: link from {entry['a']!r} to itself")
        if "rate_mbit" not in entry:
            raise ScenarioError(f"{where}: missing 'rate_mbit'")
        rate_mbit = _number(entry["rate_mbit"], where, "rate_mbit")
        if rate_mbit <= 0:
            raise ScenarioError(f"{where}: rate_mbit must be > 0, got {entry['rate_mbit']!r}")
        delay_ms = _number(entry.get("delay_ms", 0.0), where, "delay_ms")
        if delay_ms < 0:
            raise ScenarioError(f"{where}: delay_ms must be >= 0, got {entry['delay_ms']!r}")
        links.append(ScenarioLink(entry["a"], entry["b"], rate_mbit * 1e6, delay_ms * 1e-3))
    scenario = Scenario(name, description, tuple(hosts), tuple(switches), tuple(links))
    _check_structure(scenario, source)
    return scenario


def _check_structure(scenario: Scenario, source: str) -> None:
    """Checks that need the whole scenario: NICs, switch loops, one NIC per domain, reachability."""
    for host in scenario.hosts:
        if not scenario.nic_links(host):
            raise ScenarioError(f"{source}: hosts[{scenario.host_index(host)}]: host {host!r} has no link (no NIC)")
    switches = set(scenario.switches)
    fabric = nx.Graph()
    fabric.add_nodes_from(scenario.switches)
    for i, link in enumerate(scenario.links):
        if link.a in switches and link.b in switches:
            if nx.has_path(fabric, link.a, link.b):
                raise ScenarioError(
                    f"{source}: links[{i}]: switch loop in one L2 domain ({link.a} and {link.b} are already connected)"
                )
            fabric.add_edge(link.a, link.b)
    domains = domains_of(scenario)
    for host in scenario.hosts:
        seen: dict[int, int] = {}
        for i in scenario.nic_links(host):
            domain = domains.link_domain[i]
            if domain in seen:
                raise ScenarioError(
                    f"{source}: links[{i}]: host {host!r} has a second NIC in the L2 domain of links[{seen[domain]}]; "
                    "give each NIC its own switch"
                )
            seen[domain] = i
    graph = host_graph(scenario, domains)
    if not nx.is_connected(graph):
        parts = sorted((sorted(c, key=natural_key) for c in nx.connected_components(graph)), key=lambda c: natural_key(c[0]))
        raise ScenarioError(f"{source}: hosts {parts[0][0]!r} and {parts[1][0]!r} cannot reach each other")


def shipped_scenarios() -> tuple[str, ...]:
    """Names of the scenarios shipped in ``topocoll/bench/scenarios/``, sorted."""
    folder = resources.files("topocoll.bench") / "scenarios"
    return tuple(sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json")))


def load_scenario(name_or_path: str) -> Scenario:
    """Read a scenario file, or a shipped scenario by name (``two-racks``).

    Parameters
    ----------
    name_or_path : str
        A path to a scenario JSON file, or the name of a shipped scenario.

    Raises
    ------
    ScenarioError
        Neither a file nor a shipped name, malformed JSON, or any error of
        :func:`parse_scenario` (naming the file).
    """
    path = Path(name_or_path)
    if not path.exists():
        if name_or_path in shipped_scenarios():
            path = Path(str(resources.files("topocoll.bench") / "scenarios" / f"{name_or_path}.json"))
        else:
            raise ScenarioError(
                f"unknown scenario {name_or_path!r}: not a file and not one of {', '.join(shipped_scenarios())}"
            )
    source = path.name
    try:
        text = fileio.read_input(path, SCENARIO_LIMIT_BYTES, "scenario file")
        data = fileio.loads_json(text, source)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{source}: line {exc.lineno}: malformed JSON: {exc.msg}") from None
    except FormatError as exc:
        raise ScenarioError(str(exc)) from None
    return parse_scenario(data, source)


def check_ranks(scenario: Scenario, ranks: int | None) -> int:
    """The number of ranks to run: ``ranks``, or every host when None.

    Raises
    ------
    ScenarioError
        ``ranks`` < 1 or more than the scenario has hosts.
    """
    if ranks is None:
        return len(scenario.hosts)
    if ranks < 1 or ranks > len(scenario.hosts):
        raise ScenarioError(f"--ranks {ranks}: scenario {scenario.name} has {len(scenario.hosts)} hosts, pick 1..{len(scenario.hosts)}")
    return ranks


# ------------------------------------------------------------------------- ground truth
def scenario_topology(scenario: Scenario, *, delays_applied: bool = True) -> Topology:
    """The topology the emulated network has (contract 1): the ground truth of a run.

    Parameters
    ----------
    scenario : Scenario
    delays_applied : bool
        False when the run shapes rates only (no netem): every network latency is then 0
        and a note says so.

    Returns
    -------
    Topology
        Per host a ``host`` node (id = host name, ``rank`` = its index, ``host_id`` = its name);
        per NIC a ``nic`` node ``<host>.<ethK>`` (``name`` = the interface); per switch a
        ``net_switch`` node; ``loopback`` links host-NIC at :data:`HOST_NIC_BW_BYTES_PER_S`,
        ``net`` links for every scenario link at its rate (bits/s / 8) and delay, both
        directions.
    """
    builder = TopologyBuilder(name=f"emulated:{scenario.name}")
    for rank, host in enumerate(scenario.hosts):
        builder.add_node(Node(host, NodeKind.HOST, rank=rank, host_id=host, name=f"emulated host {host}"))
        for i in scenario.nic_links(host):
            ifname = scenario.ifname(host, i)
            nic = f"{host}.{ifname}"
            builder.add_node(Node(nic, NodeKind.NIC, host_id=host, name=ifname))
            builder.add_link(host, nic, LinkKind.LOOPBACK, HOST_NIC_BW_BYTES_PER_S, bw.latency_s(LinkKind.LOOPBACK))
    for switch in scenario.switches:
        builder.add_node(Node(switch, NodeKind.NET_SWITCH, name=f"emulated switch {switch}"))
    hosts = set(scenario.hosts)
    for i, link in enumerate(scenario.links):
        ends = [f"{end}.{scenario.ifname(end, i)}" if end in hosts else end for end in (link.a, link.b)]
        latency = link.delay_s if delays_applied else 0.0
        builder.add_link(ends[0], ends[1], LinkKind.NET, link.rate_bits_per_s / 8, latency)
    if not delays_applied and any(link.delay_s > 0 for link in scenario.links):
        builder.note("link delays of the scenario were not applied (rates only); latencies are 0")
    return builder.build()


# -------------------------------------------------------------------------- network model
@dataclass(frozen=True, slots=True)
class Domains:
    """L2 domains: ``link_domain[i]`` for every link with a host end or between switches."""

    count: int
    link_domain: Mapping[int, int]
    switch_domain: Mapping[str, int]


def assumed_rates(topology: Topology) -> Topology:
    """``topology`` with every network link at the speed assumed for a NIC that reports none
    (NCCL's 10 Gb/s socket default): what a run knows of an emulated cluster before probing."""
    guess = bw.net_bw_bytes_per_s(bw.SOCKET_DEFAULT_SPEED_BITS_PER_S)
    links = [
        Link(l.src, l.dst, l.kind, guess if l.kind is LinkKind.NET else l.bw_bytes_per_s, l.latency_s, l.count)
        for l in topology.links
    ]
    note = f"network links at the assumed {bw.SOCKET_DEFAULT_SPEED_BITS_PER_S / 1e9:g} Gb/s of a NIC that reports no speed"
    return Topology(topology.nodes, links, name=topology.name, notes=(*topology.notes, note))


def domains_of(scenario: Scenario) -> Domains:
    switches = set(scenario.switches)
    fabric = nx.Graph()
    fabric.add_nodes_from(scenario.switches)
    fabric.add_edges_from((l.a, l.b) for l in scenario.links if l.a in switches and l.b in switches)
    switch_domain: dict[str, int] = {}
    count = 0
    for switch in scenario.switches:  # numbered in the order of their first switch
        if switch not in switch_domain:
            for member in nx.node_connected_component(fabric, switch):
                switch_domain[member] = count
            count += 1
    link_domain: dict[int, int] = {}
    for i, link in enumerate(scenario.links):
        on_switch = link.a if link.a in switches else link.b if link.b in switches else None
        if on_switch is not None:
            link_domain[i] = switch_domain[on_switch]
    for i, link in enumerate(scenario.links):
        if link.a not in switches and link.b not in switches:  # a direct cable: its own domain
            link_domain[i] = count
            count += 1
    return Domains(count, link_domain, switch_domain)


def host_graph(scenario: Scenario, domains: Domains) -> nx.Graph:
    """Hosts, joined where they share a domain; ``rate`` = the widest bottleneck between them."""
    switches = set(scenario.switches)
    fabric = nx.Graph()
    fabric.add_nodes_from(scenario.switches)
    for link in scenario.links:
        if link.a in switches and link.b in switches:
            fabric.add_edge(link.a, link.b, rate=link.rate_bits_per_s)
    graph = nx.Graph()
    graph.add_nodes_from(scenario.hosts)
    attach: dict[int, list[tuple[str, str, float]]] = {}  # domain -> (host, switch, rate)
    for i, link in enumerate(scenario.links):
        if link.a in switches or link.b in switches:
            host, switch = (link.b, link.a) if link.a in switches else (link.a, link.b)
            if host in switches:
                continue
            attach.setdefault(domains.link_domain[i], []).append((host, switch, link.rate_bits_per_s))
        else:
            _join(graph, link.a, link.b, link.rate_bits_per_s)
    for members in attach.values():
        for x, (ha, sa, ra) in enumerate(members):
            for hb, sb, rb in members[x + 1 :]:
                path = nx.shortest_path(fabric, sa, sb)
                inner = [fabric.edges[u, v]["rate"] for u, v in zip(path, path[1:])]
                _join(graph, ha, hb, min([ra, rb, *inner]))
    return graph


def _join(graph: nx.Graph, a: str, b: str, rate: float) -> None:
    if graph.has_edge(a, b):
        graph.edges[a, b]["rate"] = max(graph.edges[a, b]["rate"], rate)
    else:
        graph.add_edge(a, b, rate=rate)


def describe(scenario: Scenario) -> Iterable[str]:
    """Lines summarizing ``scenario`` for the CLI: hosts with their NICs, then links."""
    hosts = set(scenario.hosts)
    yield f"scenario {scenario.name}: {len(scenario.hosts)} hosts, {len(scenario.switches)} switches, {len(scenario.links)} links"
    if scenario.description:
        yield f"  {scenario.description}"
    for i, link in enumerate(scenario.links):
        ends = [f"{e}.{scenario.ifname(e, i)}" if e in hosts else e for e in (link.a, link.b)]
        delay = f", {link.delay_s * 1e3:g} ms" if link.delay_s else ""
        yield f"  links[{i}]: {ends[0]} <-> {ends[1]}: {link.rate_bits_per_s / 1e6:g} Mbit/s{delay}"
