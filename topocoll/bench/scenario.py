"""Emulation scenarios: K hosts, switches and shaped links, as data.

A scenario file (``"format": "topocoll.scenario/1"``) names hosts, switches and links with a
rate and a one-way delay. This module is the pure half of ``topocoll emulate``: it parses and
validates a scenario (:func:`parse_scenario`), gives the topology the emulated network really
has (:func:`scenario_topology`, the ground truth a discovered or probed topology can be compared
with) and plans the network that emulates it (:func:`network_plan`: namespace and interface
names, addresses, static routes and the exact ``ip``/``tc`` commands). Nothing here runs a
command; :mod:`topocoll.bench.emulate` does.

Network model
-------------
Every link whose endpoint is a host gives that host one NIC, ``eth0``, ``eth1``, ... in the
order the links are listed. An *L2 domain* is a connected set of switches (switch-switch links
join them) with the NICs attached to them, or one direct host-host link. Each domain gets its
own /24 out of a /16 base (:data:`DEFAULT_SUBNET_BASE`); a host's address in a domain is
``.(host index + 1)``. Hosts that share no domain reach each other through static routes over
other hosts (which forward): for each other host the path with the fewest hops, ties broken by
the widest bottleneck rate, then by the hosts' names along the path. Hosts that share a domain
always talk over it directly, so a direct send between adjacent hosts takes the direct link.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Mapping, Sequence
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
    "DEFAULT_SUBNET_BASE",
    "HOST_NIC_BW_BYTES_PER_S",
    "ScenarioLink",
    "Scenario",
    "Nic",
    "Route",
    "NetworkPlan",
    "parse_scenario",
    "load_scenario",
    "shipped_scenarios",
    "check_ranks",
    "scenario_topology",
    "network_plan",
]

FORMAT = "topocoll.scenario/1"

#: The /16 the domains' /24s are cut from. 10.77/16 is private (RFC 1918) and, unlike
#: 10.0/16, 10.1/16 or 10.10/16, not a common default of cloud VPCs, Docker or home routers.
DEFAULT_SUBNET_BASE = "10.77.0.0/16"

#: Bandwidth of the link between an emulated host's process and its NIC. It is the in-memory
#: path of the kernel (a copy into a socket buffer), never the bottleneck of a scenario whose
#: links are at most a few hundred Mbit/s, so the figure only has to be far above them: we use
#: the shared-memory figure of the bandwidth table (12 GB/s, hundreds of times a network link).
HOST_NIC_BW_BYTES_PER_S = bw.SHM_BW_BYTES_PER_S

#: Names of hosts and switches: they become hostnames, namespace names and node ids (``h0.eth0``),
#: so no dots, and short enough that ``tce-<run id>-<name>`` stays readable.
NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,31}$")

#: Run ids: short hex strings, part of every namespace, interface and file name of a run.
RUN_ID_PATTERN = re.compile(r"^[0-9a-f]{4,6}$")

#: Linux limit on interface names (IFNAMSIZ - 1).
MAX_IFNAME_CHARS = 15

#: tbf parameters. The bucket holds 2 ms at the link's rate (at least 16 KiB so that a full
#: 1500-byte frame and small GSO bursts always fit); the queue holds 20 ms of data, about a
#: switch's port buffer, beyond which packets are dropped and TCP backs off.
TBF_BURST_S = 2e-3
TBF_MIN_BURST_BYTES = 16 * 1024
TBF_QUEUE_S = 20e-3

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
    domains = _domains(scenario)
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
    graph = _host_graph(scenario, domains)
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


# ---------------------------------------------------------------------------- the plan
@dataclass(frozen=True, slots=True)
class _Domains:
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


def _domains(scenario: Scenario) -> _Domains:
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
    return _Domains(count, link_domain, switch_domain)


def _host_graph(scenario: Scenario, domains: _Domains) -> nx.Graph:
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


@dataclass(frozen=True, slots=True)
class Nic:
    """One NIC of an emulated host: a veth end in the host's namespace.

    Parameters
    ----------
    host, ifname : str
        Owner and interface name (``eth0``).
    link_index : int
        The scenario link it belongs to.
    domain : int
        Its L2 domain (the third octet of its subnet's offset in the base).
    address : str
        IPv4 address; ``prefix_len`` its prefix (24).
    peer_namespace, peer_ifname : str
        The other end of the veth pair: on the switch's bridge in the fabric namespace, or the
        other host's NIC for a direct link.
    """

    host: str
    ifname: str
    link_index: int
    domain: int
    address: str
    prefix_len: int
    peer_namespace: str
    peer_ifname: str


@dataclass(frozen=True, slots=True)
class Route:
    """A static route in a host's namespace: ``destination`` (a /32) via ``via`` on ``dev``."""

    host: str
    destination: str
    via: str
    dev: str


@dataclass(frozen=True, slots=True)
class NetworkPlan:
    """Everything one run creates, as data (see :func:`network_plan`).

    Parameters
    ----------
    run_id : str
        Short hex id, part of every namespace and fabric interface name.
    scenario : Scenario
    apply_delays : bool
        Whether netem delays are part of the qdisc commands.
    fabric_namespace : str
        The namespace holding the bridges.
    host_namespaces : tuple of (host, namespace)
    bridges : tuple of (switch, bridge interface name)
    nics : tuple of Nic
    routes : tuple of Route
    subnets : tuple of str
        One /24 per L2 domain, by domain number.
    """

    run_id: str
    scenario: Scenario
    apply_delays: bool
    fabric_namespace: str
    host_namespaces: tuple[tuple[str, str], ...]
    bridges: tuple[tuple[str, str], ...]
    nics: tuple[Nic, ...]
    routes: tuple[Route, ...]
    subnets: tuple[str, ...]

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Every namespace of the run, fabric first."""
        return (self.fabric_namespace, *(ns for _, ns in self.host_namespaces))

    def namespace(self, host: str) -> str:
        """The network namespace of ``host``."""
        for name, ns in self.host_namespaces:
            if name == host:
                return ns
        raise ScenarioError(f"no host {host!r} in scenario {self.scenario.name}")

    def nics_of(self, host: str) -> tuple[Nic, ...]:
        """The NICs of ``host``, eth0 first."""
        return tuple(n for n in self.nics if n.host == host)

    def address(self, host: str, ifname: str = "eth0") -> str:
        """The IPv4 address of ``host`` on ``ifname``."""
        for nic in self.nics_of(host):
            if nic.ifname == ifname:
                return nic.address
        raise ScenarioError(f"host {host!r} has no interface {ifname!r}")

    def hosts_file(self) -> str:
        """Text of the ``/etc/hosts`` every emulated host sees: each address with its host's name."""
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost"]
        lines += [f"{nic.address}\t{nic.host}" for nic in self.nics]
        return "\n".join(lines) + "\n"

    def fabric_interfaces(self) -> tuple[str, ...]:
        """Names of every interface made in the fabric namespace (bridges and veth ends)."""
        names = [b for _, b in self.bridges]
        names += [n.peer_ifname for n in self.nics if n.peer_namespace == self.fabric_namespace]
        names += [_trunk_names(self.run_id, i)[k] for i in self._trunk_links() for k in (0, 1)]
        return tuple(names)

    def _trunk_links(self) -> tuple[int, ...]:
        switches = set(self.scenario.switches)
        return tuple(i for i, l in enumerate(self.scenario.links) if l.a in switches and l.b in switches)

    def setup_commands(self) -> tuple[tuple[str, ...], ...]:
        """The commands that build the network, in order; each an argv tuple.

        Namespaces first (with ``lo`` up, forwarding on and reverse-path filtering off in the
        hosts, since routed replies may come back on another NIC), then bridges, veth pairs,
        addresses, tc qdiscs on both ends of every link, and the static routes.
        """
        cmds: list[tuple[str, ...]] = []
        fab = self.fabric_namespace
        for ns in self.namespaces:
            cmds.append(("ip", "netns", "add", ns))
            cmds.append(("ip", "-n", ns, "link", "set", "lo", "up"))
        for _, ns in self.host_namespaces:
            cmds.append(
                (
                    "ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1",
                    "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
                )
            )
        for _, bridge in self.bridges:
            cmds.append(("ip", "-n", fab, "link", "add", bridge, "type", "bridge"))
            cmds.append(("ip", "-n", fab, "link", "set", bridge, "up"))
        bridge_of = dict(self.bridges)
        switches = set(self.scenario.switches)
        made: set[int] = set()
        for nic in self.nics:
            ns = self.namespace(nic.host)
            link = self.scenario.links[nic.link_index]
            if nic.peer_namespace == fab:
                switch = link.a if link.a in switches else link.b
                cmds.append(("ip", "-n", fab, "link", "add", nic.peer_ifname, "type", "veth", "peer", "name", nic.ifname, "netns", ns))
                cmds.append(("ip", "-n", fab, "link", "set", nic.peer_ifname, "master", bridge_of[switch]))
                cmds.append(("ip", "-n", fab, "link", "set", nic.peer_ifname, "up"))
            elif nic.link_index not in made:
                cmds.append(
                    ("ip", "-n", ns, "link", "add", nic.ifname, "type", "veth", "peer", "name", nic.peer_ifname, "netns", nic.peer_namespace)
                )
            made.add(nic.link_index)
            cmds.append(("ip", "-n", ns, "addr", "add", f"{nic.address}/{nic.prefix_len}", "dev", nic.ifname))
            cmds.append(("ip", "-n", ns, "link", "set", nic.ifname, "up"))
        for i in self._trunk_links():
            link = self.scenario.links[i]
            end_a, end_b = _trunk_names(self.run_id, i)
            cmds.append(("ip", "-n", fab, "link", "add", end_a, "type", "veth", "peer", "name", end_b))
            for end, switch in ((end_a, link.a), (end_b, link.b)):
                cmds.append(("ip", "-n", fab, "link", "set", end, "master", bridge_of[switch]))
                cmds.append(("ip", "-n", fab, "link", "set", end, "up"))
        for ns, dev, link in self.shaped_ends():
            cmds.extend(qdisc_commands(ns, dev, link.rate_bits_per_s, link.delay_s if self.apply_delays else 0.0))
        for route in self.routes:
            cmds.append(("ip", "-n", self.namespace(route.host), "route", "add", route.destination, "via", route.via, "dev", route.dev))
        return tuple(cmds)

    def shaped_ends(self) -> tuple[tuple[str, str, ScenarioLink], ...]:
        """(namespace, interface, link) for both veth ends of every link: each shapes its egress."""
        ends: list[tuple[str, str, ScenarioLink]] = []
        for nic in self.nics:
            link = self.scenario.links[nic.link_index]
            ends.append((self.namespace(nic.host), nic.ifname, link))
            if nic.peer_namespace == self.fabric_namespace:
                ends.append((self.fabric_namespace, nic.peer_ifname, link))
        for i in self._trunk_links():
            for end in _trunk_names(self.run_id, i):
                ends.append((self.fabric_namespace, end, self.scenario.links[i]))
        return tuple(ends)

    def teardown_commands(self) -> tuple[tuple[str, ...], ...]:
        """The commands that remove the network: deleting a namespace deletes its interfaces,
        their veth peers and qdiscs with it."""
        return tuple(("ip", "netns", "delete", ns) for ns in reversed(self.namespaces))


def _trunk_names(run_id: str, link_index: int) -> tuple[str, str]:
    return f"{run_id}x{link_index}a", f"{run_id}x{link_index}b"


def qdisc_commands(namespace: str, dev: str, rate_bits_per_s: float, delay_s: float) -> tuple[tuple[str, ...], ...]:
    """The ``tc`` commands that shape the egress of ``dev`` to a rate and a delay.

    Parameters
    ----------
    namespace, dev : str
        Where the interface is.
    rate_bits_per_s : float
        Token-bucket rate (tbf counts whole frames, Ethernet header included).
    delay_s : float
        One-way delay; when > 0 a netem qdisc at the root delays packets and the tbf is its
        child (the layout of the netem manual's rate-and-delay example).

    Returns
    -------
    tuple of argv tuples
    """
    rate_bytes_per_s = rate_bits_per_s / 8
    burst_bytes = max(int(rate_bytes_per_s * TBF_BURST_S), TBF_MIN_BURST_BYTES)
    limit_bytes = max(int(rate_bytes_per_s * TBF_QUEUE_S), 2 * burst_bytes)
    tbf = ("tbf", "rate", f"{int(round(rate_bits_per_s))}bit", "burst", str(burst_bytes), "limit", str(limit_bytes))
    if delay_s > 0:
        delay_us = max(1, int(round(delay_s * 1e6)))
        return (
            ("tc", "-n", namespace, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "netem", "delay", f"{delay_us}us"),
            ("tc", "-n", namespace, "qdisc", "replace", "dev", dev, "parent", "1:1", "handle", "10:", *tbf),
        )
    return (("tc", "-n", namespace, "qdisc", "replace", "dev", dev, "root", "handle", "1:", *tbf),)


def network_plan(
    scenario: Scenario, run_id: str, *, subnet_base: str = DEFAULT_SUBNET_BASE, apply_delays: bool = True
) -> NetworkPlan:
    """Plan the network of one run of ``scenario``: names, addresses, routes, commands.

    Parameters
    ----------
    scenario : Scenario
    run_id : str
        4-6 lower-case hex digits, unique per run (the caller draws it).
    subnet_base : str
        An IPv4 network of prefix /16 or shorter; domain D gets its D-th /24.
    apply_delays : bool
        Put netem delays in the qdisc commands (False: rates only).

    Returns
    -------
    NetworkPlan

    Raises
    ------
    ScenarioError
        A bad run id or base, more domains than the base has /24s, or more than 253 hosts.
    """
    if not RUN_ID_PATTERN.match(run_id):
        raise ScenarioError(f"run id {run_id!r} must be 4-6 lower-case hex digits")
    try:
        base = ipaddress.IPv4Network(subnet_base, strict=True)
    except ValueError as exc:
        raise ScenarioError(f"subnet base {subnet_base!r}: {exc}") from None
    if base.prefixlen > 16:
        raise ScenarioError(f"subnet base {subnet_base}: needs a /16 or larger, one /24 per L2 domain")
    domains = _domains(scenario)
    subnets = tuple(base.subnets(new_prefix=24))
    if domains.count > len(subnets):
        raise ScenarioError(f"scenario {scenario.name}: {domains.count} L2 domains do not fit in {subnet_base}")
    if len(scenario.hosts) > 253:
        raise ScenarioError(f"scenario {scenario.name}: at most 253 hosts (one /24 per domain)")
    fab = f"tce-{run_id}-fabric"
    host_ns = tuple((h, f"tce-{run_id}-{h}") for h in scenario.hosts)
    ns_of = dict(host_ns)
    bridges = tuple((s, f"{run_id}s{j}") for j, s in enumerate(scenario.switches))
    switches = set(scenario.switches)
    nics: list[Nic] = []
    for host in scenario.hosts:
        index = scenario.host_index(host)
        for i in scenario.nic_links(host):
            link = scenario.links[i]
            domain = domains.link_domain[i]
            address = str(subnets[domain].network_address + index + 1)
            other = link.b if link.a == host else link.a
            if other in switches:
                peer_ns, peer_if = fab, f"{run_id}p{i}"
            else:
                peer_ns, peer_if = ns_of[other], scenario.ifname(other, i)
            nics.append(Nic(host, scenario.ifname(host, i), i, domain, address, 24, peer_ns, peer_if))
    for name in [b for _, b in bridges] + [n.peer_ifname for n in nics] + [n.ifname for n in nics]:
        if len(name) > MAX_IFNAME_CHARS:  # cannot happen with the patterns above; a guard for edits
            raise ScenarioError(f"interface name {name!r} is longer than {MAX_IFNAME_CHARS} characters")
    routes = _routes(scenario, domains, tuple(nics))
    return NetworkPlan(
        run_id=run_id,
        scenario=scenario,
        apply_delays=apply_delays,
        fabric_namespace=fab,
        host_namespaces=host_ns,
        bridges=bridges,
        nics=tuple(nics),
        routes=routes,
        subnets=tuple(str(subnets[d]) for d in range(domains.count)),
    )


def _routes(scenario: Scenario, domains: _Domains, nics: Sequence[Nic]) -> tuple[Route, ...]:
    graph = _host_graph(scenario, domains)
    by_host: dict[str, list[Nic]] = {}
    for nic in nics:
        by_host.setdefault(nic.host, []).append(nic)
    rate_of = {i: link.rate_bits_per_s for i, link in enumerate(scenario.links)}
    routes: list[Route] = []
    for src in scenario.hosts:
        attached = {n.domain for n in by_host[src]}
        for dst in scenario.hosts:
            if dst == src:
                continue
            hop = next_hop(graph, src, dst)
            # the NIC pair to the next hop: the shared domain with the widest link, then the lowest
            shared = [(a, b) for a in by_host[src] for b in by_host[hop] if a.domain == b.domain]
            out, via = min(shared, key=lambda p: (-min(rate_of[p[0].link_index], rate_of[p[1].link_index]), p[0].domain))
            for target in by_host[dst]:
                if target.domain in attached:
                    continue  # on a shared domain: the connected route already reaches it
                routes.append(Route(src, f"{target.address}/32", via.address, out.ifname))
    return tuple(routes)


def next_hop(graph: nx.Graph, src: str, dst: str) -> str:
    """The host after ``src`` on the path to ``dst``: fewest hops, then widest bottleneck, then names."""
    best = min(
        nx.all_shortest_paths(graph, src, dst),
        key=lambda path: (
            -min(graph.edges[u, v]["rate"] for u, v in zip(path, path[1:])),
            tuple(natural_key(h) for h in path),
        ),
    )
    return best[1]


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
