"""``topocoll simulate``: the predicted table, checked against hand-derived figures."""

from __future__ import annotations

import json

import pytest

from topocoll.cli import main
from topocoll.solver.baselines import ring
from topocoll.topo.discover import flat_topology
from tests.bench.helpers import fixture, parse_table
from tests.hostile import TAMPERINGS, synthesized_files, tampered_file, without_digest

FACTORS = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
           "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}
"""nccl-tests' bus-bandwidth factors (doc/PERFORMANCE.md), written out here independently."""

SERIES = 5  # topocoll, ring, multichannel_ring, double_binary_tree, hierarchical


@pytest.fixture
def flat4(tmp_path):
    path = tmp_path / "flat4.json"
    path.write_text(flat_topology(4).to_json())
    return path


def _run(capsys, argv):
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_flat_allreduce_against_hand_derived_figures(capsys, flat4, tmp_path):
    status, out, _ = _run(capsys, ["simulate", "--topology", str(flat4), "--collective", "allreduce", "--sizes", "1K:1G:32",
                                   "-J", str(tmp_path / "s.json")])
    assert status == 0
    rows = parse_table(out, SERIES, with_wrong=False)
    assert [r["size"] for r in rows] == [1024.0, 32768.0, 1048576.0, 33554432.0, 1073741824.0]
    link_bw_gb = 12.0  # flat_topology's default host-hub bandwidth (GB/s)
    for r in rows:
        assert r["count"] == r["size"] / 4 and r["type"] == "float" and r["redop"] == "sum" and r["root"] == -1
        for g in range(SERIES):
            assert r[f"g{g}_busbw"] == pytest.approx(r[f"g{g}_algbw"] * 1.5, abs=0.011)
        # cut bound of allreduce on a star of equal links: algbw = n B / (2 (n - 1)) = 8 GB/s
        assert r["bound"] == pytest.approx(4 * link_bw_gb / 6)
    # a ring over a star of equal links moves S/n per link per step: busbw -> link bandwidth
    assert rows[-1]["g1_busbw"] == pytest.approx(link_bw_gb, rel=2e-3)
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["kind"] == "simulate" and data["series"] == ["topocoll", "ring", "multichannel_ring", "double_binary_tree", "hierarchical"]
    for row in data["rows"]:
        # plan() keeps the candidate with the lowest predicted time, and the baselines are among
        # its candidates: topocoll's prediction is never slower than theirs at any size
        assert row["speedup"] >= 1 - 1e-9
        for label, result in row["results"].items():
            assert result["algbw_bytes_per_s"] == pytest.approx(row["size_bytes"] / result["time_s"], rel=1e-6, abs=0)
            assert result["busbw_bytes_per_s"] == pytest.approx(result["algbw_bytes_per_s"] * 1.5)


@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter", "broadcast"])
def test_no_prediction_beats_the_cut_bound(capsys, collective):
    topology = fixture("alibaba-a100-4gpu-2nic.nccl-topo.xml")
    status, out, _ = _run(capsys, ["simulate", "--topology", str(topology), "--collective", collective, "--sizes", "4K:256M:64",
                                   "--root", "1"])
    assert status == 0
    rows = parse_table(out, SERIES, with_wrong=False)
    assert rows
    json_free = [line for line in out.splitlines() if line.startswith("# Ranks:")]
    n = len(json_free[0].split(":")[1].split(";")[0].split(","))
    for r in rows:
        for g in range(SERIES):
            if r[f"g{g}_algbw"] is None:
                continue
            assert r[f"g{g}_busbw"] == pytest.approx(r[f"g{g}_algbw"] * FACTORS[collective](n), abs=0.011)
            assert r[f"g{g}_algbw"] <= r["bound"] * (1 + 1e-3) + 0.005
        assert r["root"] == (1 if collective == "broadcast" else -1)


def test_given_schedule_is_the_topocoll_series(capsys, flat4, tmp_path):
    topology = flat_topology(4)
    path = tmp_path / "ring.json"
    path.write_text(ring(topology, "allgather", list(topology.compute_nodes())).to_json())
    status, out, _ = _run(capsys, ["simulate", "--topology", str(flat4), "--schedule", str(path), "--sizes", "1M,64M"])
    assert status == 0
    rows = parse_table(out, SERIES, with_wrong=False)
    assert len(rows) == 2
    for r in rows:
        assert (r["g0_time"], r["g0_algbw"]) == (r["g1_time"], r["g1_algbw"])
        assert r["redop"] == "none"


def test_busiest_links_and_their_picture(capsys, flat4, tmp_path):
    """A given ring allreduce on the flat star: every rank sends 2 (n - 1) blocks of S/n over its
    link to the hub, so each such link carries 1.5 S; its busy fraction is bytes / (bw x time)."""
    topology = flat_topology(4)
    path = tmp_path / "ring.json"
    path.write_text(ring(topology, "allreduce", list(topology.compute_nodes())).to_json())
    status, out, _ = _run(capsys, ["simulate", "--topology", str(flat4), "--schedule", str(path), "--sizes", "64M",
                                   "--model", "events", "-J", str(tmp_path / "s.json"), "--png", str(tmp_path / "load.png")])
    assert status == 0
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["config"]["model"] == "events"
    links = data["config"]["busiest_links"]
    size = 64 * 2**20
    time_s = data["rows"][0]["results"]["topocoll"]["time_s"]
    uplinks = [link for link in links if link["dst"] == topology.links[0].dst or link["src"] == topology.links[0].dst]
    assert len(uplinks) == 8  # both directions of the 4 host links
    for link in uplinks:
        assert link["bytes"] == pytest.approx(1.5 * size)
        assert link["utilisation"] == pytest.approx(link["bytes"] / (link["bw_bytes_per_s"] * time_s), rel=1e-6, abs=0)
    assert "# Busiest links of topocoll's schedule at 67108864 B" in out
    assert (tmp_path / "load.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_both_models_agree_on_a_ring_and_say_which_ran(capsys, flat4, tmp_path):
    """A ring's steps each wait for the one before, so lock step costs it nothing."""
    topology = flat_topology(4)
    path = tmp_path / "ring.json"
    path.write_text(ring(topology, "allgather", list(topology.compute_nodes())).to_json())
    tables = {}
    for model in ("events", "alpha-beta"):
        status, out, _ = _run(capsys, ["simulate", "--topology", str(flat4), "--schedule", str(path), "--sizes", "1K:1G:32", "--model", model])
        assert status == 0
        assert ("event simulator" if model == "events" else "alpha-beta model") in out.splitlines()[0]
        tables[model] = parse_table(out, SERIES, with_wrong=False)
    for a, b in zip(tables["events"], tables["alpha-beta"]):
        assert a["g0_time"] == pytest.approx(b["g0_time"], rel=2e-3)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--collective", "alltoall"], "an alltoall is routed from its traffic matrix"),
        (["--collective", "gather"], "unknown collective 'gather'"),
        (["--collective", "allreduce", "--sizes", "1G:1K"], "> 1024"),
        (["--collective", "allreduce", "--ranks", "host0,nope"], "'nope' is not a compute node"),
        (["--collective", "allreduce", "--ranks", "9"], "has 4 compute nodes"),
        (["--collective", "broadcast", "--root", "4"], "--root 4 is not a rank of 4"),
        (["--collective", "allreduce", "--baselines", "magic"], "unknown baseline 'magic'"),
        (["--collective", "allreduce", "--model", "exact"], "--model 'exact': expected one of auto, events, alpha-beta"),
    ],
)
def test_bad_arguments(capsys, flat4, extra, message):
    status, out, err = _run(capsys, ["simulate", "--topology", str(flat4), *extra])
    assert status == 2
    assert out == ""
    assert len(err.splitlines()) == 1 and message in err


def test_no_file_left_behind_on_error(capsys, flat4, tmp_path):
    status, _, _ = _run(capsys, ["simulate", "--topology", str(flat4), "--collective", "broadcast", "--root", "9",
                                 "-J", str(tmp_path / "x.json"), "--csv", str(tmp_path / "x.csv")])
    assert status == 2
    assert list(tmp_path.iterdir()) == [flat4]


@pytest.mark.parametrize("change", ["without-digest", *sorted(TAMPERINGS)])
def test_a_tampered_or_unstamped_schedule_is_not_simulated(capsys, tmp_path, change):
    topology_path, schedule_path = synthesized_files(tmp_path)
    path = tampered_file(schedule_path, without_digest if change == "without-digest" else TAMPERINGS[change])
    status, out, err = _run(capsys, ["simulate", "--topology", str(topology_path), "--schedule", str(path)])
    assert status == 2 and out == ""
    assert len(err.splitlines()) == 1, err
    assert ("no topology_digest" if change == "without-digest" else "is not valid") in err, err


def test_simulate_runs_without_torch(flat4, tmp_path):
    """Predicting a table needs no torch: the whole command, table and JSON written, in a fresh
    interpreter whose ``sys.modules`` is then read."""
    import subprocess
    import sys

    from tests.bench.helpers import REPO_ROOT

    script = (
        "import sys\n"
        "from topocoll.cli import main\n"
        f"status = main(['simulate', '--topology', {str(flat4)!r}, '--collective', 'allgather', '--sizes', '1K:1M',"
        f" '-J', {str(tmp_path / 'p.json')!r}])\n"
        "print(status, sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "0 []"
    assert json.loads((tmp_path / "p.json").read_text())["rows"]


def test_the_in_switch_bound_is_said_where_it_passes_the_cut(capsys, tmp_path):
    from topocoll.topo.presets import build_preset

    path = tmp_path / "h100.json"
    path.write_text(build_preset("dgx-h100").to_json())
    out_json = tmp_path / "p.json"
    status, out, err = _run(capsys, ["simulate", "--topology", str(path), "--collective", "allreduce", "--sizes", "1G",
                                     "--baselines", "none", "--ranks", "gpu0,gpu1,gpu2,gpu3", "-J", str(out_json)])
    assert status == 0, err
    assert "# In-switch reduction (NVLS) allows algbw up to 360.00 GB/s" in out  # 450 GB/s / (1 + 1/4)
    assert json.loads(out_json.read_text())["config"]["in_switch_bound"]["algbw_bytes_per_s"] == pytest.approx(360e9)
    status, out, err = _run(capsys, ["simulate", "--topology", str(path), "--collective", "allreduce", "--sizes", "1G",
                                     "--baselines", "none", "--ranks", "gpu0,gpu1", "-J", str(out_json)])
    assert status == 0, err
    assert "In-switch" not in out  # two GPUs: up and down costs more than one exchange


def test_nccl_series_and_hand_over(capsys, tmp_path):
    """--nccl adds NCCL's own allreduce by the calibrated model, runs the schedules as on NCCL,
    and topocoll's series hands the sizes where NCCL is faster to it: never slower than NCCL."""
    from topocoll.solver.metrics import bus_factor
    from topocoll.solver.nccl_model import nccl_native
    from topocoll.solver.schedule import Collective
    from topocoll.topo.presets import build_preset

    topology = build_preset("pcie-8gpu")
    path = tmp_path / "pcie.json"
    path.write_text(topology.to_json())
    status, out, _ = _run(capsys, ["simulate", "--topology", str(path), "--collective", "allreduce", "--sizes", "1K:1G:32",
                                   "--baselines", "ring", "--nccl", "-J", str(tmp_path / "s.json")])
    assert status == 0
    rows = parse_table(out, 3, with_wrong=False)
    model = nccl_native(topology, topology.compute_nodes())
    factor = bus_factor(Collective.ALLREDUCE, 8)
    for r in rows:
        expected_s = model.time_s(Collective.ALLREDUCE, r["size"])
        assert r["g2_time"] == pytest.approx(expected_s * 1e6, rel=1e-3, abs=0.011)
        assert r["g2_busbw"] == pytest.approx(r["size"] / expected_s * factor / 1e9, rel=1e-3, abs=0.011)
        assert r["g0_time"] <= r["g2_time"] * (1 + 1e-3)  # handed over, or faster
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["series"] == ["topocoll", "ring", "nccl"]
    handed = data["config"]["nccl_model"]["handed_to_nccl_sizes_bytes"]
    assert handed and rows[0]["size"] in handed  # 1 KiB: NCCL's LL beats any schedule's steps
    # at 1 GiB the PCIe box gains: synthesized trees over both sockets beat NCCL's ring
    assert rows[-1]["size"] not in handed and rows[-1]["g0_time"] < 0.8 * rows[-1]["g2_time"]
    assert "topocoll hands the collective to NCCL at: " in out


def test_nccl_series_needs_gpus(capsys, flat4):
    status, _, err = _run(capsys, ["simulate", "--topology", str(flat4), "--collective", "allreduce", "--nccl"])
    assert status == 2 and "GPU" in err and "Traceback" not in err
