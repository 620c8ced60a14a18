"""The network that emulates a scenario: namespace and interface names, addresses, static routes
and the exact ``ip``/``tc`` commands (:func:`network_plan`), computed without running anything.

The network model it follows (NICs, L2 domains, routes over forwarding hosts) is described in
:mod:`topocoll.bench.scenario`; :mod:`topocoll.bench.emulate` runs the plan.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from topocoll.bench.scenario import Domains, Scenario, ScenarioLink, domains_of, host_graph
from topocoll.errors import ScenarioError
from topocoll.topo.model import natural_key

__all__ = ["DEFAULT_SUBNET_BASE", "PORT_QUEUES", "Nic", "Route", "NetworkPlan", "network_plan", "next_hop", "qdisc_commands"]

#: The /16 the domains' /24s are cut from. 10.77/16 is private (RFC 1918) and, unlike
#: 10.0/16, 10.1/16 or 10.10/16, not a common default of cloud VPCs, Docker or home routers.
DEFAULT_SUBNET_BASE = "10.77.0.0/16"

#: Run ids: short hex strings, part of every namespace, interface and file name of a run.
RUN_ID_PATTERN = re.compile(r"^[0-9a-f]{4,6}$")

#: Linux limit on interface names (IFNAMSIZ - 1).
MAX_IFNAME_CHARS = 15

#: tbf parameters. The bucket holds 2 ms at the link's rate (at least 16 KiB so that a full
#: 1500-byte frame and small GSO bursts always fit); the queue holds 5 ms of data, a shallow
#: switch port buffer, beyond which packets are dropped and TCP backs off. Why 5 ms: a link a
#: collective loads in both directions queues each direction's acknowledgements behind the
#: other direction's data. Measured on ``two-racks``'s 50 Mbit/s uplink, one gloo exchange
#: each way (32 MiB, Reno, two runs each): 95-96 % of the one-way rate per direction with a
#: 5 ms queue, 89-95 % with 10 ms, 81-95 % with 20 ms, 82-97 % with 50 ms.
TBF_BURST_S = 2e-3
TBF_MIN_BURST_BYTES = 16 * 1024
TBF_QUEUE_S = 5e-3

#: Bytes a ``fair`` port's class may send per turn: one full frame (1500-byte MTU plus the
#: 14-byte Ethernet header), so that turns interleave frame by frame, as fair queueing serves packets.
FAIR_QUANTUM_BYTES = 1514

#: The TCP congestion control of every emulated host. Network namespaces inherit the machine's
#: default, which may be BBR; measured on the same uplink, two BBR flows each way shared it
#: unevenly (2.2-4.1 MB/s each, 79 % of the link per direction) where Reno's four flows got
#: 2.8-2.9 MB/s each (95 %). Reno is always built into Linux and always allowed in a namespace
#: (CUBIC, the usual default, need not be: only what the machine's
#: ``net.ipv4.tcp_allowed_congestion_control`` lists is).
HOST_TCP_CONGESTION_CONTROL = "reno"

#: How a shaped port queues what waits for it:
#:
#: - ``fifo``: one drop-tail queue (tbf), an Ethernet switch port. TCP flows that meet there
#:   share it unevenly: a flow held back elsewhere loses packets to one that is not.
#: - ``fair``: one queue per flow (pair of hosts), served in turn (htb classes, each assured an
#:   equal share and lent what the others leave), as fair queueing does. A flow below its
#:   share never queues behind another: max-min fair sharing, the model of
#:   :mod:`topocoll.solver.events`. The flows split the port's buffer (what a ``fifo`` port
#:   holds) equally, each at least :data:`TBF_MIN_BURST_BYTES`, as a switch shares its buffer
#:   among its queues. With the whole buffer each, a flow that never loses a packet (an
#:   in-rack one, behind its own queue) grew its window and its standing queue without end,
#:   and its connection's acknowledgements of the other direction's data waited behind it:
#:   measured on ``two-racks``, 32 MiB allgathers back to back ran at 3.15-3.30 s for 99 calls,
#:   then at 3.5-3.7 s from the 100th on (its window 49 packets at call 90, 84 at call 112),
#:   where with the split buffer calls 2 to 112 ran at 2.92-3.04 s (one 3.16 s); ``simulate``: 2.82 s.
PORT_QUEUES = ("fifo", "fair")


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
    port_queue : str
        One of :data:`PORT_QUEUES`: how every shaped port queues.
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
    port_queue: str
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
        hosts, since routed replies may come back on another NIC, and the hosts' TCP congestion
        control set to :data:`HOST_TCP_CONGESTION_CONTROL`), then bridges, veth pairs,
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
                    f"net.ipv4.tcp_congestion_control={HOST_TCP_CONGESTION_CONTROL}",
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
        cmds.extend(self.queue_commands())
        for route in self.routes:
            cmds.append(("ip", "-n", self.namespace(route.host), "route", "add", route.destination, "via", route.via, "dev", route.dev))
        return tuple(cmds)

    def queue_commands(self) -> tuple[tuple[str, ...], ...]:
        """The ``tc`` commands that shape both ends of every link (:func:`qdisc_commands`)."""
        flows = self.flows() if self.port_queue == "fair" else None
        cmds: list[tuple[str, ...]] = []
        for ns, dev, link in self.shaped_ends():
            cmds.extend(qdisc_commands(ns, dev, link.rate_bits_per_s, link.delay_s if self.apply_delays else 0.0, flows))
        return tuple(cmds)

    def requeue_commands(self) -> tuple[tuple[str, ...], ...]:
        """The commands that replace every shaped port's queues with new ones, as
        :meth:`setup_commands` made them: each end's root qdisc deleted, then
        :meth:`queue_commands`. See :meth:`topocoll.bench.emulate.EmulatedCluster.renew_queues`
        for why."""
        deletes = tuple(("tc", "-n", ns, "qdisc", "del", "dev", dev, "root") for ns, dev, _ in self.shaped_ends())
        return deletes + self.queue_commands()

    def flows(self) -> tuple[tuple[tuple[str, str], ...], ...]:
        """A fair port's queues: one per ordered pair of hosts, each the (source, destination)
        address pairs of all the NICs of the two hosts; pairs in scenario order."""
        flows = []
        for src in self.scenario.hosts:
            for dst in self.scenario.hosts:
                if src != dst:
                    flows.append(tuple((a.address, b.address) for a in self.nics_of(src) for b in self.nics_of(dst)))
        return tuple(flows)

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


def qdisc_commands(
    namespace: str,
    dev: str,
    rate_bits_per_s: float,
    delay_s: float,
    flows: Sequence[Sequence[tuple[str, str]]] | None = None,
) -> tuple[tuple[str, ...], ...]:
    """The ``tc`` commands that shape the egress of ``dev`` to a rate and a delay.

    Parameters
    ----------
    namespace, dev : str
        Where the interface is.
    rate_bits_per_s : float
        Token-bucket rate (tbf and htb count whole frames, Ethernet header included).
    delay_s : float
        One-way delay; when > 0 a netem qdisc at the root delays packets and the shaper is its
        child (the layout of the netem manual's rate-and-delay example).
    flows : sequence of sequences of (str, str), optional
        For a ``fair`` port (see :data:`PORT_QUEUES`): the (source, destination) addresses of
        each flow. Each flow gets an htb class assured ``rate / (len(flows) + 1)`` and lent up
        to the whole rate, with its own drop-tail queue holding an equal part of the port's
        buffer (at least :data:`TBF_MIN_BURST_BYTES`); a last class takes what no pair
        matches. None: one tbf, a ``fifo`` port.

    Returns
    -------
    tuple of argv tuples
    """
    rate_bytes_per_s = rate_bits_per_s / 8
    burst_bytes = max(int(rate_bytes_per_s * TBF_BURST_S), TBF_MIN_BURST_BYTES)
    limit_bytes = max(int(rate_bytes_per_s * TBF_QUEUE_S), 2 * burst_bytes)
    tc = ("tc", "-n", namespace)
    rate = f"{int(round(rate_bits_per_s))}bit"
    cmds: list[tuple[str, ...]] = []
    if delay_s > 0:
        delay_us = max(1, int(round(delay_s * 1e6)))
        cmds.append((*tc, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "netem", "delay", f"{delay_us}us"))
        at, handle = ("parent", "1:1"), "10"
    else:
        at, handle = ("root",), "1"
    if flows is None:
        tbf = ("tbf", "rate", rate, "burst", str(burst_bytes), "limit", str(limit_bytes))
        cmds.append((*tc, "qdisc", "replace", "dev", dev, *at, "handle", f"{handle}:", *tbf))
        return tuple(cmds)
    # class minors are hex: 1 the port, 2.. one per flow, the last one the default
    queues = [*flows, ()]  # the default class matches no address pair
    shaping = ("burst", str(burst_bytes), "cburst", str(burst_bytes), "quantum", str(FAIR_QUANTUM_BYTES))
    share = f"{max(1, int(rate_bits_per_s / len(queues)))}bit"
    queue_bytes = max(limit_bytes // len(queues), TBF_MIN_BURST_BYTES)
    cmds.append((*tc, "qdisc", "replace", "dev", dev, *at, "handle", f"{handle}:", "htb", "default", f"{len(queues) + 1:x}"))
    cmds.append((*tc, "class", "add", "dev", dev, "parent", f"{handle}:", "classid", f"{handle}:1", "htb", "rate", rate, "ceil", rate, *shaping))
    for j, pairs in enumerate(queues):
        classid = f"{handle}:{j + 2:x}"
        cmds.append((*tc, "class", "add", "dev", dev, "parent", f"{handle}:1", "classid", classid, "htb", "rate", share, "ceil", rate, *shaping))
        cmds.append((*tc, "qdisc", "add", "dev", dev, "parent", classid, "handle", f"{0x100 + j:x}:", "bfifo", "limit", str(queue_bytes)))
        for src, dst in pairs:
            cmds.append((*tc, "filter", "add", "dev", dev, "parent", f"{handle}:", "protocol", "ip", "prio", "1", "u32",
                         "match", "ip", "src", f"{src}/32", "match", "ip", "dst", f"{dst}/32", "flowid", classid))
    return tuple(cmds)


def network_plan(
    scenario: Scenario,
    run_id: str,
    *,
    subnet_base: str = DEFAULT_SUBNET_BASE,
    apply_delays: bool = True,
    port_queue: str = "fifo",
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
    port_queue : str
        How shaped ports queue, one of :data:`PORT_QUEUES`.

    Returns
    -------
    NetworkPlan

    Raises
    ------
    ScenarioError
        A bad run id, base or port queue, more domains than the base has /24s, or more than
        253 hosts.
    """
    if not RUN_ID_PATTERN.match(run_id):
        raise ScenarioError(f"run id {run_id!r} must be 4-6 lower-case hex digits")
    if port_queue not in PORT_QUEUES:
        raise ScenarioError(f"port queue {port_queue!r}: expected one of {', '.join(PORT_QUEUES)}")
    try:
        base = ipaddress.IPv4Network(subnet_base, strict=True)
    except ValueError as exc:
        raise ScenarioError(f"subnet base {subnet_base!r}: {exc}") from None
    if base.prefixlen > 16:
        raise ScenarioError(f"subnet base {subnet_base}: needs a /16 or larger, one /24 per L2 domain")
    domains = domains_of(scenario)
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
        port_queue=port_queue,
        fabric_namespace=fab,
        host_namespaces=host_ns,
        bridges=bridges,
        nics=tuple(nics),
        routes=routes,
        subnets=tuple(str(subnets[d]) for d in range(domains.count)),
    )


def _routes(scenario: Scenario, domains: Domains, nics: Sequence[Nic]) -> tuple[Route, ...]:
    graph = host_graph(scenario, domains)
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
