"""The topo backend on emulated hosts: transfers on the rails their paths name, and every
collective correct on the smallest scenario, nothing left behind (root only)."""

from __future__ import annotations

import io
import os
import re
import sys

import pytest

from tests.bench.test_emulate import PACKAGE_PARENT, emulated, root  # noqa: F401 (fixture)
from topocoll.bench import scenario as sc

WORKER = [sys.executable, "-m", "tests.bench.emulated_worker"]
MIB = 1 << 20


def run(cluster, args, ranks=None, **variables):
    out, err = io.StringIO(), io.StringIO()
    env = {**os.environ, "PYTHONPATH": PACKAGE_PARENT, **variables}
    result = cluster.run_ranks([*WORKER, *args], ranks=ranks, timeout_s=90, stdout=out, stderr=err, env=env)
    assert result.returncode == 0, err.getvalue()[-3000:]
    return out.getvalue() + err.getvalue()  # the ranks' logs (stderr) too


@root
@pytest.mark.timeout(120)
def test_two_halves_on_two_rails_leave_by_both_nics(emulated):  # noqa: F811
    """multi-rail: 8 MiB from h0 to h1 in two halves. Over both rails, each of h0's NICs sends
    at least its half; both over rail 0, eth1 sends nothing of the data."""
    cluster = emulated(sc.load_scenario("multi-rail"))
    sent = {}
    for mode in ("both", "rail0"):
        before = {ifname: cluster.interface_stats("h0", ifname) for ifname in ("eth0", "eth1")}
        out = run(cluster, ["rails", mode, str(8 * MIB)], ranks=2)
        assert "[h0] rails 2" in out and "[h1] rails 2" in out
        sent[mode] = {ifname: cluster.interface_stats("h0", ifname) - before[ifname] for ifname in before}
    assert sent["both"]["eth0"] >= 4 * MIB and sent["both"]["eth1"] >= 4 * MIB, sent
    assert sent["rail0"]["eth0"] >= 8 * MIB and sent["rail0"]["eth1"] < 1 * MIB, sent


@root
@pytest.mark.timeout(150)
def test_every_collective_matches_gloo_on_the_smallest_scenario(emulated):  # noqa: F811
    scenarios = {name: sc.load_scenario(name) for name in sc.shipped_scenarios()}
    smallest = min(scenarios, key=lambda name: (len(scenarios[name].hosts), name))
    cluster = emulated(scenarios[smallest])
    out = run(cluster, ["collectives"])
    for host in scenarios[smallest].hosts:
        for name in ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce"):
            assert f"[{host}] ok {name}" in out, out[-2000:]


@root
@pytest.mark.timeout(150)
def test_the_backend_probes_at_start_and_caches_per_topology(emulated, tmp_path):  # noqa: F811
    """TOPOCOLL_PROBE=1 on multi-rail (2 hosts), given the structure with every network link at
    an assumed 10 Gb/s: the group plans on measured NIC rates (the scenario's rail rates,
    within 15 %), rank 0 caches the calibration, and a second group with the same topology and
    placement takes it from the cache."""
    from topocoll.topo.io import save_topology

    cluster = emulated(sc.load_scenario("multi-rail"))
    cache = tmp_path / "probe-cache"
    nominal = tmp_path / "nominal.json"
    save_topology(sc.assumed_rates(sc.scenario_topology(sc.load_scenario("multi-rail"), delays_applied=False)), nominal)
    variables = {"TOPOCOLL_PROBE": "1", "TOPOCOLL_PROBE_CACHE": str(cache), "TOPOCOLL_DEBUG": "INFO", "TOPOCOLL_TOPOLOGY": str(nominal)}
    first = run(cluster, ["probed"], ranks=2, **variables)
    assert len(list(cache.glob("*.json"))) == 1
    truth = {(l.src, l.dst): l.bw_bytes_per_s for l in sc.scenario_topology(sc.load_scenario("multi-rail")).links}
    measured = {}
    for line in first.splitlines():
        if line.startswith("[h0] link "):
            _, src, dst, value = line.split("] ", 1)[1].split()
            measured[(src, dst)] = float(value)
    # with two hosts a NIC's send side and its peer's receive side carry the same flows: one
    # class, measured once; the chain's narrowest link is the measured rate (the rest nominal)
    for a, b in ((0, 1), (1, 0)):
        for k in (0, 1):
            chain = [(f"h{a}.eth{k}", f"rail{k}"), (f"rail{k}", f"h{b}.eth{k}")]
            got = min(measured[link] for link in chain)
            assert got == pytest.approx(truth[chain[0]], rel=0.15), (chain, got, truth[chain[0]])
    second = run(cluster, ["probed"], ranks=2, **variables)
    assert "from the probe cache" in second
    digests = {line.split()[-1] for line in (first + second).splitlines() if re.match(r"\[h\d\] probed sha256:", line)}
    assert len([line for line in (first + second).splitlines() if re.match(r"\[h\d\] probed ", line)]) == 4
    assert len(digests) == 1  # both groups, all ranks: one calibrated topology
