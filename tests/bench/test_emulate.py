"""``topocoll emulate``: scenarios, the truth topology, the network plan, and real emulated hosts.

The pure tests always run and derive what they expect by reading the scenario files
themselves. The root tests bring up real namespaces; they skip (saying why) without root or
``ip netns``, run each under its own timeout, and check that nothing is left behind.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import pytest

from topocoll.bench import network_plan as npl
from topocoll.bench import scenario as sc
from topocoll.cli import main
from topocoll.errors import ScenarioError, TopocollError
from topocoll.topo.io import load_topology
from topocoll.topo.model import LinkKind, NodeKind

SCENARIO_DIR = Path(str(resources.files("topocoll.bench") / "scenarios"))
SHIPPED = ("asym-ring", "multi-rail", "two-racks", "uniform")
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def raw(name: str) -> dict:
    """A shipped scenario file, read as plain JSON (not through the code under test)."""
    return json.loads((SCENARIO_DIR / f"{name}.json").read_text())


# ------------------------------------------------------------------------ scenarios
def test_shipped_scenarios_are_the_four_documented():
    assert sc.shipped_scenarios() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_scenario_truth_topology_matches_the_file(name):
    data = raw(name)
    topology = sc.scenario_topology(sc.load_scenario(name))
    counts = topology.summary_counts()
    host_links = [l for l in data["links"] if l["a"] in data["hosts"] or l["b"] in data["hosts"]]
    nic_count = sum((l["a"] in data["hosts"]) + (l["b"] in data["hosts"]) for l in data["links"])
    assert counts.get("host") == len(data["hosts"])
    assert counts.get("nic") == nic_count
    assert counts.get("net_switch", 0) == len(data.get("switches", []))
    assert host_links  # every scenario has hosts with NICs
    for rank, host in enumerate(data["hosts"]):
        node = topology.node(host)
        assert (node.kind, node.rank, node.host_id) == (NodeKind.HOST, rank, host)
    # NIC k of a host is its k-th link in file order; each link is one net edge each way
    seen: dict[str, int] = {}
    for link in data["links"]:
        ends = []
        for end in (link["a"], link["b"]):
            if end in data["hosts"]:
                ends.append(f"{end}.eth{seen.get(end, 0)}")
                seen[end] = seen.get(end, 0) + 1
            else:
                ends.append(end)
        for src, dst in (ends, ends[::-1]):
            edge = topology.link(src, dst)
            assert edge.kind is LinkKind.NET
            assert edge.bw_bytes_per_s == pytest.approx(link["rate_mbit"] * 1e6 / 8)
            assert edge.latency_s == pytest.approx(link.get("delay_ms", 0) / 1e3)
    for host, count in seen.items():
        for k in range(count):
            nic = topology.node(f"{host}.eth{k}")
            assert (nic.kind, nic.name, nic.host_id) == (NodeKind.NIC, f"eth{k}", host)
            assert topology.link(host, nic.id).bw_bytes_per_s >= 100 * max(l["rate_mbit"] * 1e6 / 8 for l in data["links"])


def test_asym_ring_has_one_link_four_times_slower():
    rates = sorted(l["rate_mbit"] for l in raw("asym-ring")["links"])
    assert rates[0] * 4 == rates[1] == rates[-1]


def test_truth_without_delays_has_zero_latency_and_says_so():
    topology = sc.scenario_topology(sc.load_scenario("two-racks"), delays_applied=False)
    assert all(l.latency_s == 0 for l in topology.links if l.kind is LinkKind.NET)
    assert any("delays" in note for note in topology.notes)


def _bad(mutate, name="two-racks"):
    data = copy.deepcopy(raw(name))
    mutate(data)
    return data


BAD_INPUTS = {
    "format": (lambda d: d.update(format="topocoll.scenario/9"), "unknown format"),
    "endpoint": (lambda d: d["links"][3].update(b="rack9"), "links[3]: unknown endpoint 'rack9'"),
    "duplicate host": (lambda d: d["hosts"].append("h1"), "hosts[4]: duplicate name 'h1'"),
    "host named like a switch": (lambda d: d["switches"].append("h0"), "switches[2]: duplicate name 'h0'"),
    "host without nic": (lambda d: d["hosts"].append("h4"), "hosts[4]: host 'h4' has no link"),
    "zero rate": (lambda d: d["links"][1].update(rate_mbit=0), "links[1]: rate_mbit must be > 0"),
    "negative rate": (lambda d: d["links"][2].update(rate_mbit=-5), "links[2]: rate_mbit must be > 0"),
    "negative delay": (lambda d: d["links"][0].update(delay_ms=-0.1), "links[0]: delay_ms must be >= 0"),
    "self link": (lambda d: d["links"].append({"a": "rack0", "b": "rack0", "rate_mbit": 1}), "links[5]: link from 'rack0' to itself"),
    "switch loop": (lambda d: d["links"].append({"a": "rack1", "b": "rack0", "rate_mbit": 10}), "links[5]: switch loop"),
    "two nics in one domain": (lambda d: d["links"].append({"a": "h0", "b": "rack1", "rate_mbit": 10}), "links[5]: host 'h0' has a second NIC"),
    "unknown field": (lambda d: d["links"][0].update(rate_gbit=1), "links[0]: unknown field 'rate_gbit'"),
    "bad name": (lambda d: d["hosts"].__setitem__(0, "h.0"), "hosts[0]: 'h.0' is not a valid name"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_scenario_is_refused_naming_file_and_element(case, tmp_path):
    mutate, expected = BAD_INPUTS[case]
    path = tmp_path / "two-racks.json"
    path.write_text(json.dumps(_bad(mutate)))
    with pytest.raises(ScenarioError) as info:
        sc.load_scenario(str(path))
    message = str(info.value)
    assert message.startswith("two-racks.json: ") and expected in message, message
    assert "\n" not in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, TopocollError)


def test_unreachable_hosts_are_refused():
    data = {"format": sc.FORMAT, "name": "split", "hosts": ["a", "b", "c", "d"],
            "links": [{"a": "a", "b": "b", "rate_mbit": 1}, {"a": "c", "b": "d", "rate_mbit": 1}]}
    with pytest.raises(ScenarioError, match="x.json: hosts 'a' and 'c' cannot reach each other"):
        sc.parse_scenario(data, "x.json")


def test_unknown_scenario_name_lists_the_shipped_ones():
    with pytest.raises(ScenarioError, match="not a file and not one of asym-ring, multi-rail"):
        sc.load_scenario("no-such-scenario")


def test_more_ranks_than_hosts_is_refused():
    scenario = sc.load_scenario("multi-rail")
    assert sc.check_ranks(scenario, None) == len(raw("multi-rail")["hosts"])
    assert sc.check_ranks(scenario, 2) == 2
    with pytest.raises(ScenarioError, match="--ranks 4: scenario multi-rail has 3 hosts"):
        sc.check_ranks(scenario, 4)


def test_cli_refuses_bad_scenario_with_exit_2_and_one_line(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_bad(BAD_INPUTS["endpoint"][0])))
    assert main(["emulate", "show", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "topocoll: error: bad.json: links[3]: unknown endpoint 'rack9'"
    assert main(["emulate", "run", "multi-rail", "--ranks", "4", "--", "true"]) == 2
    assert "--ranks 4" in capsys.readouterr().err


def test_cli_show_writes_the_truth_topology(tmp_path, capsys):
    out = tmp_path / "truth.json"
    assert main(["emulate", "show", "two-racks", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "two-racks" in text and "50 Mbit/s" in text
    topology = load_topology(out)
    assert topology.digest() == sc.scenario_topology(sc.load_scenario("two-racks")).digest()


# ------------------------------------------------------------------------- the plan
def _ring_neighbours(data):
    neighbours: dict[str, dict[str, float]] = {h: {} for h in data["hosts"]}
    for link in data["links"]:
        neighbours[link["a"]][link["b"]] = link["rate_mbit"]
        neighbours[link["b"]][link["a"]] = link["rate_mbit"]
    return neighbours


def test_asym_ring_routes_go_around_the_slow_link():
    data = raw("asym-ring")
    plan = npl.network_plan(sc.load_scenario("asym-ring"), "ab12")
    neighbours = _ring_neighbours(data)
    hosts = data["hosts"]
    for src in hosts:
        own = {n.address.rsplit(".", 1)[0] for n in plan.nics_of(src)}
        routes = {r.destination: r for r in plan.routes if r.host == src}
        for dst in hosts:
            if dst == src:
                continue
            if dst in neighbours[src]:
                hop = dst  # adjacent: always the direct cable, even the slow one
            else:
                # non-adjacent in a 4-ring: two 2-hop paths; the one whose worse link is faster
                middles = [m for m in neighbours[src] if dst in neighbours[m]]
                hop = max(middles, key=lambda m: min(neighbours[src][m], neighbours[m][dst]))
            for nic in plan.nics_of(dst):
                if nic.address.rsplit(".", 1)[0] in own:
                    assert f"{nic.address}/32" not in routes
                    continue
                route = routes[f"{nic.address}/32"]
                via_hosts = [n.host for n in plan.nics if n.address == route.via]
                assert via_hosts == [hop], (src, dst, route)
                out = [n for n in plan.nics_of(src) if n.ifname == route.dev][0]
                assert route.via.rsplit(".", 1)[0] == out.address.rsplit(".", 1)[0]
    # the test above then means h0 -> h2 and h1 -> h3 avoid the slow h3-h0 cable
    slow = min(data["links"], key=lambda l: l["rate_mbit"])
    assert {slow["a"], slow["b"]} == {"h3", "h0"}


def test_addresses_are_one_subnet_per_domain_and_index_plus_one():
    data = raw("multi-rail")
    plan = npl.network_plan(sc.load_scenario("multi-rail"), "cafe")
    assert plan.subnets == ("10.77.0.0/24", "10.77.1.0/24")
    for index, host in enumerate(data["hosts"]):
        assert [n.address for n in plan.nics_of(host)] == [f"10.77.0.{index + 1}", f"10.77.1.{index + 1}"]
    assert plan.routes == ()  # every pair shares a rail
    other = npl.network_plan(sc.load_scenario("multi-rail"), "cafe", subnet_base="172.30.0.0/16")
    assert other.address("h2", "eth1") == "172.30.1.3"


@pytest.mark.parametrize("name", SHIPPED)
def test_interface_names_fit_and_are_unique_per_run(name):
    scenario = sc.load_scenario(name)
    plans = [npl.network_plan(scenario, rid) for rid in ("a1b2c3", "a1b2c4", "ffff")]
    for plan in plans:
        fabric = plan.fabric_interfaces()
        assert len(set(fabric)) == len(fabric)
        assert all(plan.run_id in n for n in fabric) and all(plan.run_id in ns for ns in plan.namespaces)
        assert all(len(n) <= 15 for n in fabric + tuple(n.ifname for n in plan.nics))
        for host in scenario.hosts:
            names = [n.ifname for n in plan.nics_of(host)]
            assert names == [f"eth{k}" for k in range(len(names))]
    assert not set(plans[0].fabric_interfaces()) & set(plans[1].fabric_interfaces())
    assert not set(plans[0].namespaces) & set(plans[1].namespaces)


def test_every_link_is_shaped_at_both_ends():
    data = raw("two-racks")
    plan = npl.network_plan(sc.load_scenario("two-racks"), "beef")
    tbf = [c for c in plan.setup_commands() if c[0] == "tc" and "tbf" in c]
    assert len(tbf) == 2 * len(data["links"])
    rates = sorted(c[c.index("rate") + 1] for c in tbf)
    assert rates == sorted(f"{int(l['rate_mbit'] * 1e6)}bit" for l in data["links"] for _ in (0, 1))
    netem = [c for c in plan.setup_commands() if "netem" in c]
    assert len(netem) == 2 * sum(1 for l in data["links"] if l.get("delay_ms", 0) > 0)
    rates_only = npl.network_plan(sc.load_scenario("two-racks"), "beef", apply_delays=False)
    assert not [c for c in rates_only.setup_commands() if "netem" in c]


def test_fair_ports_queue_each_flow_apart():
    data = raw("two-racks")
    plan = npl.network_plan(sc.load_scenario("two-racks"), "beef", apply_delays=False, port_queue="fair")
    commands = plan.setup_commands()
    fifo = npl.network_plan(sc.load_scenario("two-racks"), "beef", apply_delays=False).setup_commands()
    assert not [c for c in commands if "tbf" in c]
    rate_of_end = {(ns, dev): f"{int(link.rate_bits_per_s)}bit" for ns, dev, link in plan.shaped_ends()}
    assert sorted(rate_of_end.values()) == sorted(f"{int(l['rate_mbit'] * 1e6)}bit" for l in data["links"] for _ in (0, 1))
    host_of = {n.address: n.host for n in plan.nics}
    pairs = {(a, b) for a in data["hosts"] for b in data["hosts"] if a != b}
    for (ns, dev), rate in rate_of_end.items():
        mine = [c for c in commands if c[:3] == ("tc", "-n", ns) and c[c.index("dev") + 1] == dev]
        classes = {c[c.index("classid") + 1]: c for c in mine if c[3:5] == ("class", "add")}
        root_class = [c for c in classes.values() if c[c.index("parent") + 1] == "1:"]
        assert len(root_class) == 1 and root_class[0][root_class[0].index("rate") + 1] == rate
        leaves = {k: c for k, c in classes.items() if c[c.index("parent") + 1] == "1:1"}
        assert len(leaves) == len(pairs) + 1  # one per flow, one for what matches no pair
        assert all(c[c.index("ceil") + 1] == rate for c in leaves.values())
        assert sum(int(c[c.index("rate") + 1].removesuffix("bit")) for c in leaves.values()) <= int(rate.removesuffix("bit"))
        flows = {(host_of[c[c.index("src") + 1].removesuffix("/32")], host_of[c[c.index("dst") + 1].removesuffix("/32")]):
                 c[c.index("flowid") + 1] for c in mine if "u32" in c}
        assert set(flows) == pairs
        assert len(set(flows.values())) == len(pairs) and set(flows.values()) < set(leaves)
        (default,) = set(leaves) - set(flows.values())
        (root_qdisc,) = [c for c in mine if c[3] == "qdisc" and "root" in c]
        assert root_qdisc[root_qdisc.index("htb") + 2] == default.split(":")[1]
        queues = [int(c[c.index("limit") + 1]) for c in mine if "bfifo" in c]
        assert len(queues) == len(leaves)
        # the flows split what the same port holds as a fifo, each keeping room for a burst
        (tbf,) = [c for c in fifo if c[:3] == ("tc", "-n", ns) and c[c.index("dev") + 1] == dev and "tbf" in c]
        port_bytes = int(tbf[tbf.index("limit") + 1])
        assert len(set(queues)) == 1 and queues[0] >= npl.TBF_MIN_BURST_BYTES
        assert sum(queues) <= port_bytes or queues[0] == npl.TBF_MIN_BURST_BYTES
        assert queues[0] < port_bytes
    with pytest.raises(ScenarioError, match="port queue 'red'"):
        npl.network_plan(sc.load_scenario("two-racks"), "beef", port_queue="red")


@pytest.mark.parametrize("port_queue", npl.PORT_QUEUES)
def test_renewing_queues_deletes_each_shaped_root_and_shapes_it_as_setup_did(port_queue):
    plan = npl.network_plan(sc.load_scenario("two-racks"), "beef", port_queue=port_queue)
    setup, queues, renew = plan.setup_commands(), plan.queue_commands(), plan.requeue_commands()
    tc = [c for c in setup if c[0] == "tc"]
    assert tc == list(queues)
    ends = {(c[2], c[c.index("dev") + 1]) for c in tc}
    deletes = renew[: len(renew) - len(queues)]
    assert renew[len(deletes):] == queues
    assert all(c[3:5] == ("qdisc", "del") and c[-1] == "root" for c in deletes)
    assert sorted((c[2], c[c.index("dev") + 1]) for c in deletes) == sorted(ends)
    assert len(ends) == len(deletes) == 2 * len(raw("two-racks")["links"])


def test_hosts_get_the_congestion_control_and_the_fabric_does_not():
    plan = npl.network_plan(sc.load_scenario("two-racks"), "beef")
    setting = f"net.ipv4.tcp_congestion_control={npl.HOST_TCP_CONGESTION_CONTROL}"
    set_in = [c[c.index("exec") + 1] for c in plan.setup_commands() if setting in c]
    assert sorted(set_in) == sorted(plan.namespace(h) for h in raw("two-racks")["hosts"])


def test_bad_run_id_and_subnet_are_refused():
    scenario = sc.load_scenario("uniform")
    with pytest.raises(ScenarioError, match="run id"):
        npl.network_plan(scenario, "XYZ")
    with pytest.raises(ScenarioError, match="/16"):
        npl.network_plan(scenario, "abcd", subnet_base="10.77.0.0/24")


# ----------------------------------------------------------------- real emulated hosts
def _why_no_root() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc, mounts)"
    for tool in ("ip", "tc", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "'ip netns' does not work here"
    return None


root = pytest.mark.skipif(_why_no_root() is not None, reason=_why_no_root() or "")

PAIR = {"format": sc.FORMAT, "name": "pair", "description": "two hosts on one switch, for the rate check",
        "hosts": ["h0", "h1"], "switches": ["sw0"],
        "links": [{"a": "h0", "b": "sw0", "rate_mbit": 80}, {"a": "h1", "b": "sw0", "rate_mbit": 80}]}

SERVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0)); s.listen(1); print(s.getsockname()[1], flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.monotonic()
    n += len(b)
print(n, time.monotonic() - t0, flush=True)
"""

CLIENT = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
buf = b"x" * 65536
if sys.argv[3].startswith("s"):
    end = time.monotonic() + float(sys.argv[3][1:])
    while time.monotonic() < end: c.sendall(buf)
else:
    for _ in range(int(sys.argv[3]) // len(buf)): c.sendall(buf)
c.close()
"""

REACH = """
import errno, socket, sys
bad = []
for addr in sys.argv[1:]:
    s = socket.socket(); s.settimeout(3)
    code = s.connect_ex((addr, 9))  # nothing listens: a refusal proves the packet got there and back
    if code != errno.ECONNREFUSED: bad.append(f"{addr}: {errno.errorcode.get(code, code)}")
print("; ".join(bad) or "all reached")
"""


def _leftovers(run_id: str, shm_before: set[str], state_dir: Path) -> list[str]:
    from topocoll.bench.emulate import _pids_with_marker

    left = []
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left += [f"namespace {line.split()[0]}" for line in namespaces.splitlines() if run_id in line]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left += [f"interface {line.split()[1]}" for line in links.splitlines() if run_id in line]
    left += [f"process {pid}" for pid in _pids_with_marker(run_id)]
    left += [f"file {p}" for p in state_dir.glob(f"*{run_id}*")]
    left += [f"/dev/shm/{n}" for n in set(os.listdir("/dev/shm")) - shm_before]
    return left


@pytest.fixture
def emulated(tmp_path):
    """Make EmulatedClusters (rates only, so that kernels without netem run them too) and
    check, after the test whatever its outcome, that each left nothing behind."""
    from topocoll.bench.emulate import EmulatedCluster

    made = []
    shm_before = set(os.listdir("/dev/shm"))

    def make(scenario, **options):
        cluster = EmulatedCluster(scenario, state_dir=tmp_path / "state", apply_delays=False, **options)
        made.append(cluster)
        cluster.up()
        return cluster

    yield make
    for cluster in made:
        cluster.down()
    for cluster in made:
        assert _leftovers(cluster.run_id, shm_before, tmp_path / "state") == []


@root
@pytest.mark.timeout(30)
def test_up_and_down_leave_nothing(tmp_path, capsys):
    data = raw("two-racks")
    state = tmp_path / "state"
    shm_before = set(os.listdir("/dev/shm"))
    run_id = None
    try:
        assert main(["emulate", "up", "two-racks", "--no-delay", "--name", "racks", "--state-dir", str(state)]) == 0
        out = capsys.readouterr().out
        run_id = out.split("(run ", 1)[1].split(",", 1)[0]
        truth = Path(out.split("truth topology: ", 1)[1].split()[0])
        assert load_topology(truth).summary_counts()["host"] == len(data["hosts"])
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert sum(run_id in line for line in listed.splitlines()) == len(data["hosts"]) + 1  # + the fabric
        fabric = subprocess.run(["tc", "-n", f"tce-{run_id}-fabric", "qdisc", "show"], capture_output=True, text=True).stdout
        trunks = sum(1 for l in data["links"] if l["a"] in data["switches"] and l["b"] in data["switches"])
        assert fabric.count("qdisc tbf") == len(data["hosts"]) + 2 * trunks  # the switch end of each host link, both trunk ends
        assert main(["emulate", "exec", "racks", "h2", "--state-dir", str(state), "--", "hostname"]) == 0
        assert main(["emulate", "down", "racks", "--state-dir", str(state)]) == 0
    finally:
        main(["emulate", "down", "--all", "--state-dir", str(state)])
    assert run_id and _leftovers(run_id, shm_before, state) == []


@root
@pytest.mark.timeout(40)
def test_failing_rank_stops_the_others_tears_down_and_gives_its_status(tmp_path, capfd):
    state = tmp_path / "state"
    shm_before = set(os.listdir("/dev/shm"))
    started = time.monotonic()
    status = main(["emulate", "run", "uniform", "--no-delay", "--state-dir", str(state), "--",
                   "sh", "-c", 'echo "rank $RANK of $WORLD_SIZE on $(hostname)"; [ "$RANK" = 2 ] && sleep 1 && exit 7; sleep 60'])
    assert status == 7
    assert time.monotonic() - started < 30  # the sleepers were stopped, not waited for
    out, err = capfd.readouterr()
    for rank, host in enumerate(raw("uniform")["hosts"]):
        assert f"[{host}] rank {rank} of 4 on {host}" in out
    assert "rank 2 (h2) exited with 7" in err
    run_id = Path(err.split("truth topology ", 1)[1].split()[0]).name.split(".")[0]
    assert _leftovers(run_id, shm_before, state) == [] and not list(state.glob("*"))


@root
@pytest.mark.timeout(40)
def test_ranks_get_the_env_launch_variables(tmp_path, capfd):
    code = ("import os, json; print(json.dumps({k: os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', "
            "'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'GLOO_SOCKET_IFNAME', 'TOPOCOLL_HOSTID', "
            "'TOPOCOLL_TOPOLOGY', 'TOPOCOLL_EMULATE_SCENARIO')}))")
    keep = tmp_path / "truth.json"
    assert main(["emulate", "run", "multi-rail", "--ranks", "2", "--no-delay", "--keep-truth", str(keep),
                 "--state-dir", str(tmp_path / "state"), "--", "python", "-c", code]) == 0
    out = capfd.readouterr().out
    envs = {line.split("] ", 1)[0][1:]: json.loads(line.split("] ", 1)[1]) for line in out.splitlines() if line.startswith("[")}
    assert set(envs) == {"h0", "h1"}
    assert {e["MASTER_PORT"] for e in envs.values()} == {envs["h0"]["MASTER_PORT"]}
    for rank, host in enumerate(("h0", "h1")):
        env = envs[host]
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(rank), "2", "0", "1")
        assert (env["MASTER_ADDR"], env["GLOO_SOCKET_IFNAME"], env["TOPOCOLL_HOSTID"]) == ("10.77.0.1", "eth0", host)
        assert env["TOPOCOLL_EMULATE_SCENARIO"] == "multi-rail" and env["TOPOCOLL_TOPOLOGY"].endswith(".truth.json")
    assert load_topology(keep).summary_counts()["nic"] == 6


@root
@pytest.mark.timeout(40)
def test_sigint_to_a_running_emulate_run_tears_down(tmp_path):
    state = tmp_path / "state"
    shm_before = set(os.listdir("/dev/shm"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([PACKAGE_PARENT, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "topocoll.cli", "emulate", "run", "two-racks", "--no-delay", "--state-dir", str(state),
         "--", "sh", "-c", "echo started; sleep 60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stdout.readline().endswith("started\n")  # a rank runs: the cluster is up
        run_id = json.loads(next(state.glob("*.state.json")).read_text())["run_id"]
        proc.send_signal(signal.SIGINT)
        status = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert status == 130, proc.stderr.read()
    assert "interrupted (SIGINT); emulated hosts removed" in proc.stderr.read()
    assert _leftovers(run_id, shm_before, state) == []


@root
@pytest.mark.timeout(30)
def test_shaped_rate_is_within_15_percent_of_the_setting(emulated):
    cluster = emulated(sc.parse_scenario(PAIR, "pair.json"))
    server = cluster.host_popen("h1", [sys.executable, "-c", SERVER, cluster.plan.address("h1")],
                                stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()
        cluster.host_exec("h0", [sys.executable, "-c", CLIENT, cluster.plan.address("h1"), port, "s3"], check=True)
        count, seconds = map(float, server.stdout.readline().split())
    finally:
        server.kill()
        server.wait()
    measured_bits_per_s = count * 8 / seconds
    setting = PAIR["links"][0]["rate_mbit"] * 1e6
    print(f"rate: set {setting / 1e6:g} Mbit/s, measured {measured_bits_per_s / 1e6:.1f} Mbit/s of TCP payload")
    assert abs(measured_bits_per_s - setting) / setting < 0.15
    qdisc = cluster.host_exec("h0", ["tc", "-s", "qdisc", "show", "dev", "eth0"]).stdout
    assert "tbf" in qdisc and "80Mbit" in qdisc
    for host in ("h0", "h1"):
        algorithm = cluster.host_exec(host, ["sysctl", "-n", "net.ipv4.tcp_congestion_control"], check=True).stdout.strip()
        assert algorithm == npl.HOST_TCP_CONGESTION_CONTROL


@root
@pytest.mark.timeout(30)
def test_asym_ring_hosts_reach_their_non_adjacent_peers(emulated):
    cluster = emulated(sc.load_scenario("asym-ring"))
    for host in cluster.scenario.hosts:
        others = [n.address for n in cluster.plan.nics if n.host != host]
        result = cluster.host_exec(host, [sys.executable, "-c", REACH, *others], check=True)
        assert result.stdout.strip() == "all reached", (host, result.stdout)


@root
@pytest.mark.timeout(30)
def test_each_host_has_its_own_dev_shm_and_hostname(emulated):
    cluster = emulated(sc.load_scenario("uniform"))
    marker = f"tce-{cluster.run_id}-probe"
    assert cluster.host_exec("h0", ["sh", "-c", f"hostname && touch /dev/shm/{marker}"], check=True).stdout.strip() == "h0"
    assert cluster.host_exec("h0", ["ls", "/dev/shm"]).stdout.split() == [marker]  # kept between commands
    assert cluster.host_exec("h1", ["hostname"]).stdout.strip() == "h1"
    assert marker not in cluster.host_exec("h1", ["ls", "/dev/shm"]).stdout
    assert marker not in os.listdir("/dev/shm")


@root
@pytest.mark.timeout(30)
def test_multi_rail_stream_on_eth1_is_counted_on_eth1_only(emulated):
    cluster = emulated(sc.load_scenario("multi-rail"))
    size_bytes = 2 * 1024 * 1024
    target = cluster.plan.address("h1", "eth1")
    before = {ifname: cluster.interface_stats("h0", ifname) for ifname in ("eth0", "eth1")}
    server = cluster.host_popen("h1", [sys.executable, "-c", SERVER, target], stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()
        cluster.host_exec("h0", [sys.executable, "-c", CLIENT, target, port, str(size_bytes)], check=True)
        assert int(float(server.stdout.readline().split()[0])) == size_bytes
    finally:
        server.kill()
        server.wait()
    sent = {ifname: cluster.interface_stats("h0", ifname) - before[ifname] for ifname in before}
    assert sent["eth1"] >= size_bytes
    assert sent["eth0"] < 64 * 1024, sent  # at most neighbour discovery, nothing of the stream


@root
@pytest.mark.timeout(30)
def test_fair_port_counts_a_stream_in_its_flows_class(emulated):
    cluster = emulated(sc.load_scenario("two-racks"), port_queue="fair")
    size_bytes = 2 * 1024 * 1024
    fab = cluster.plan.fabric_namespace
    (port,) = [n.peer_ifname for n in cluster.plan.nics if n.host == "h0"]  # the switch's port towards h0
    host_of = {n.address: n.host for n in cluster.plan.nics}

    def bytes_by_flow() -> dict:
        """Bytes each class of the port sent, keyed by the (source, destination) hosts its filter
        matches (htb prints no JSON for classes, and u32's JSON repeats the key "match"; the
        text gives the addresses in hex at offsets 12 and 16 of the IP header)."""
        def show(*what: str) -> str:
            return subprocess.run(["tc", "-n", fab, *what, "show", "dev", port], capture_output=True, text=True, check=True).stdout

        def host(key: str) -> str:
            return host_of[str(ipaddress.IPv4Address(int(key, 16)))]

        flow_of_class = {m[1]: (host(m[2]), host(m[3]))
                         for m in re.finditer(r"flowid (\S+) .*\n +match (\w{8})/ffffffff at 12\n +match (\w{8})/ffffffff at 16", show("filter"))}
        sent = {m[1]: int(m[2]) for m in re.finditer(r"class htb (\S+) .*\n Sent (\d+) bytes", show("-s", "class"))}
        return {flow_of_class.get(c, c): n for c, n in sent.items() if c != "1:1"}

    def stream_h1_to_h0() -> dict:
        """Send ``size_bytes`` from h1 to h0; the bytes each flow's class sent meanwhile."""
        before = bytes_by_flow()
        assert ("h1", "h0") in before and ("h2", "h0") in before
        server = cluster.host_popen("h0", [sys.executable, "-c", SERVER, cluster.plan.address("h0")], stdout=subprocess.PIPE, text=True)
        try:
            listening = server.stdout.readline().strip()
            cluster.host_exec("h1", [sys.executable, "-c", CLIENT, cluster.plan.address("h0"), listening, str(size_bytes)], check=True)
            assert int(float(server.stdout.readline().split()[0])) == size_bytes
        finally:
            server.kill()
            server.wait()
        return {k: v - before[k] for k, v in bytes_by_flow().items()}

    for renewed in (False, True):
        if renewed:
            # new queues: the same classes, counting from zero, and streams still counted in theirs
            flows = set(bytes_by_flow())
            cluster.renew_queues()
            fresh = bytes_by_flow()
            assert set(fresh) == flows and all(v < 64 * 1024 for v in fresh.values()), fresh
        sent = stream_h1_to_h0()
        assert sent.pop(("h1", "h0")) >= size_bytes
        assert all(v < 64 * 1024 for v in sent.values()), sent  # at most neighbour discovery


def test_refusals_without_root_or_tools_are_one_line_and_create_nothing(monkeypatch, capsys, tmp_path):
    from topocoll.bench import emulate

    monkeypatch.setattr(emulate.os, "geteuid", lambda: 1000)
    assert main(["emulate", "run", "uniform", "--state-dir", str(tmp_path), "--", "true"]) == 2
    assert capsys.readouterr().err.strip() == "topocoll: error: emulated hosts need root (network namespaces, tc, mounts); run as root"
    monkeypatch.setattr(emulate.os, "geteuid", lambda: 0)
    monkeypatch.setattr(emulate.shutil, "which", lambda tool: None if tool == "tc" else "/bin/" + tool)
    assert main(["emulate", "up", "uniform", "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("topocoll: error: missing command(s) tc") and "\n" not in err
    assert list(tmp_path.iterdir()) == []
