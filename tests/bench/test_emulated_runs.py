"""The topo backend on emulated hosts: transfers on the rails their paths name, and every
collective correct on the smallest scenario, nothing left behind (root only)."""

from __future__ import annotations

import io
import os
import sys

import pytest

from tests.bench.test_emulate import PACKAGE_PARENT, emulated, root  # noqa: F401 (fixture)
from topocoll.bench import scenario as sc

WORKER = [sys.executable, "-m", "tests.bench.emulated_worker"]
MIB = 1 << 20


def run(cluster, args, ranks=None):
    out, err = io.StringIO(), io.StringIO()
    env = {**os.environ, "PYTHONPATH": PACKAGE_PARENT}
    result = cluster.run_ranks([*WORKER, *args], ranks=ranks, timeout_s=90, stdout=out, stderr=err, env=env)
    assert result.returncode == 0, err.getvalue()[-3000:]
    return out.getvalue()


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
