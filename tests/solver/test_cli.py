"""``topocoll synthesize`` and ``topocoll verify``: the README's first schedule commands, their
figures checked against the library computed independently, and their refusals."""

from __future__ import annotations

import json
import re

import pytest

from tests.hostile import TAMPERINGS, assert_one_line_error, synthesized_files, tampered_file, without_digest
from topocoll.cli import main
from topocoll.solver.bound import cut_bound
from topocoll.solver.schedule import Collective, load_schedule
from topocoll.solver.verify import verify
from topocoll.topo.io import load_topology
from topocoll.topo.presets import build_preset

RANKS = ("gpu0", "gpu3", "gpu5")
"""Three GPUs of a DGX-1 that are not fully connected by NVLink (gpu3-gpu5 go through others)."""


@pytest.fixture
def dgx1(tmp_path):
    path = tmp_path / "dgx1.json"
    path.write_text(build_preset("dgx1-v100").to_json())
    return path


def _run(capsys, argv):
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _percent(out: str, label: str) -> float:
    match = re.search(rf"^{label}\s+algbw\s+[\d.]+ GB/s\s+([\d.]+) % of bound", out, re.MULTILINE)
    assert match, out
    return float(match.group(1))


def test_synthesize_writes_a_verified_schedule_with_the_figures_it_prints(capsys, dgx1, tmp_path):
    out_path = tmp_path / "ag.json"
    status, out, err = _run(
        capsys,
        ["synthesize", "--topology", str(dgx1), "--collective", "allgather", "--ranks", ",".join(RANKS), "-o", str(out_path)],
    )
    assert status == 0, err
    schedule = load_schedule(out_path)
    topology = load_topology(dgx1)
    assert schedule.collective is Collective.ALLGATHER and schedule.ranks == RANKS
    assert schedule.topology_digest == topology.digest()
    checked = verify(schedule, topology)
    assert checked.ok, checked.errors[:3]
    # the printed percentage is the cut bound over the schedule's own bandwidth time
    bound = cut_bound(topology, Collective.ALLGATHER, RANKS, None)
    assert _percent(out, "schedule") == pytest.approx(100 * bound.time_per_byte_s / checked.t_bw_s_per_byte, abs=0.01)
    match = re.search(r"^bound\s+algbw\s+([\d.]+) GB/s", out, re.MULTILINE)
    assert match and float(match.group(1)) == pytest.approx(bound.algbw_bytes_per_s / 1e9, abs=0.01)
    assert f"wrote       {out_path}" in out


def test_verify_accepts_what_synthesize_wrote(capsys, dgx1, tmp_path):
    out_path = tmp_path / "ar.json"
    assert _run(capsys, ["synthesize", "--topology", str(dgx1), "--collective", "allreduce", "-o", str(out_path)])[0] == 0
    status, out, err = _run(capsys, ["verify", str(out_path), "--topology", str(dgx1), "--size", "64M"])
    assert status == 0, err
    assert re.search(r"^correct\s+yes$", out, re.MULTILINE), out
    checked = verify(load_schedule(out_path), load_topology(dgx1))
    bound = cut_bound(load_topology(dgx1), Collective.ALLREDUCE, load_schedule(out_path).ranks, None)
    assert _percent(out, "bandwidth") == pytest.approx(100 * bound.time_per_byte_s / checked.t_bw_s_per_byte, abs=0.01)


@pytest.mark.parametrize("change", sorted(TAMPERINGS))
def test_verify_finds_a_tampered_schedule_wrong(capsys, tmp_path, change):
    topology_path, schedule_path = synthesized_files(tmp_path)
    path = tampered_file(schedule_path, TAMPERINGS[change])
    status, out, err = _run(capsys, ["verify", str(path), "--topology", str(topology_path)])
    assert status == 1, (out, err)
    assert re.search(r"^correct\s+NO: \d+ error", out, re.MULTILINE), out


def test_verify_refuses_a_schedule_without_digest(capsys, tmp_path):
    topology_path, schedule_path = synthesized_files(tmp_path)
    path = tampered_file(schedule_path, without_digest)
    status, _, err = _run(capsys, ["verify", str(path), "--topology", str(topology_path)])
    assert_one_line_error(status, err, "topocoll", "topology_digest")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--collective", "alltoall"], "alltoall"),
        (["--collective", "allreduce", "--root", "1"], "--root applies to broadcast and reduce"),
        (["--collective", "allreduce", "--ranks", "gpu0,gpu99"], "no node 'gpu99'"),
        (["--collective", "allreduce", "--size", "0"], "--size must be > 0"),
    ],
)
def test_synthesize_refuses_bad_requests_and_writes_nothing(capsys, dgx1, tmp_path, extra, message):
    out_path = tmp_path / "never.json"
    status, out, err = _run(capsys, ["synthesize", "--topology", str(dgx1), *extra, "-o", str(out_path)])
    assert_one_line_error(status, err, "topocoll", message)
    assert not out_path.exists()


def test_synthesize_checks_the_output_folder_before_solving(capsys, dgx1, tmp_path):
    status, out, err = _run(
        capsys, ["synthesize", "--topology", str(dgx1), "--collective", "allreduce", "-o", str(tmp_path / "no" / "x.json")]
    )
    assert_one_line_error(status, err, "topocoll", "does not exist")
    assert out == ""


def test_synthesize_reports_in_switch_reduction_where_nvswitches_offer_it(capsys, tmp_path):
    """On an H100 box the NVLS figure, S (1 + 1/8) over a GPU's 18 x 25 GB/s, is printed beside
    the cut bound; on an A100 box (no NVLS) nothing is said of it."""
    for preset, expected in (("dgx-h100", 450e9 / (1 + 1 / 8)), ("dgx-a100", None)):
        path = tmp_path / f"{preset}.json"
        path.write_text(build_preset(preset).to_json())
        status, out, err = _run(capsys, ["synthesize", "--topology", str(path), "--collective", "allreduce", "-o", str(tmp_path / "s.json")])
        assert status == 0, err
        match = re.search(r"^in-switch\s+algbw\s+([\d.]+) GB/s\s+with NVLS", out, re.MULTILINE)
        if expected is None:
            assert match is None, out
        else:
            assert match and float(match.group(1)) == pytest.approx(expected / 1e9, abs=0.01), out


# --------------------------------------------------------------------------- format 3 (by rule)


@pytest.fixture
def three_machines(tmp_path):
    from topocoll.topo.cluster import make_cluster

    path = tmp_path / "h3.json"
    path.write_text(make_cluster("dgx-h100", 3).to_json())
    return path


def test_synthesize_by_rule_then_verify_it_spelt_out_and_by_parts(capsys, three_machines, tmp_path, monkeypatch):
    """The percentages printed are the library's (synthesize_by_rule's loads against the bound),
    and verify prints the same one whether it replays the spelt-out schedule or reads the parts."""
    from topocoll.solver import cli as solver_cli
    from topocoll.solver.rule_schedule import synthesize_by_rule

    out_path = tmp_path / "ar.json"
    status, out, _ = _run(capsys, ["synthesize", "--topology", str(three_machines), "--collective", "allreduce", "--format", "3", "-o", str(out_path)])
    assert status == 0 and "topocoll.schedule/3" in out
    topo = load_topology(three_machines)
    by_rule, bound = synthesize_by_rule(topo, Collective.ALLREDUCE, list(topo.compute_nodes()))
    t_bw, _ = by_rule.t_bw_s_per_byte(topo)
    expected = 100 * bound.time_per_byte_s / t_bw
    assert _percent(out, "schedule") == pytest.approx(expected, abs=0.006)
    status, out, _ = _run(capsys, ["verify", str(out_path), "--topology", str(three_machines)])
    assert status == 0 and "correct     yes" in out and "steps" in out  # replayed transfer by transfer
    assert _percent(out, "bandwidth") == pytest.approx(expected, abs=0.006)
    monkeypatch.setattr(solver_cli, "EXPAND_MAX_TRANSFERS", 10)
    status, out, _ = _run(capsys, ["verify", str(out_path), "--topology", str(three_machines)])
    assert status == 0 and "checked by its parts" in out
    assert _percent(out, "bandwidth") == pytest.approx(expected, abs=0.006)


def test_verify_by_parts_says_no_for_another_topology(capsys, three_machines, tmp_path, monkeypatch):
    from topocoll.solver import cli as solver_cli
    from topocoll.topo.cluster import make_cluster

    out_path = tmp_path / "ag.json"
    assert _run(capsys, ["synthesize", "--topology", str(three_machines), "--collective", "allgather", "--format", "3", "-o", str(out_path)])[0] == 0
    other = tmp_path / "other.json"
    other.write_text(make_cluster("dgx-h100", 3, network="superpod", su_nodes=2).to_json())
    monkeypatch.setattr(solver_cli, "EXPAND_MAX_TRANSFERS", 10)
    status, out, _ = _run(capsys, ["verify", str(out_path), "--topology", str(other)])
    assert status == 1 and "correct     NO: the schedule was made for topology" in out


@pytest.mark.parametrize(
    "collective, topology, message",
    [
        ("broadcast", "three", "--format 3 describes allgather, reduce_scatter and allreduce, not broadcast"),
        ("allgather", "one", "needs the ranks on at least two hosts"),
    ],
)
def test_synthesize_by_rule_refusals(capsys, three_machines, dgx1, tmp_path, collective, topology, message):
    out_path = tmp_path / "x.json"
    path = three_machines if topology == "three" else dgx1
    status, _, err = _run(capsys, ["synthesize", "--topology", str(path), "--collective", collective, "--format", "3", "-o", str(out_path)])
    assert_one_line_error(status, err, "topocoll", message)
    assert not out_path.exists()


def test_rail_tree_applies_to_format_3(capsys, three_machines, tmp_path):
    out_path = tmp_path / "x.json"
    argv = ["synthesize", "--topology", str(three_machines), "--collective", "allgather", "--rail-tree", "binomial", "-o", str(out_path)]
    status, _, err = _run(capsys, argv)
    assert_one_line_error(status, err, "topocoll", "--rail-tree applies to --format 3")
    status, out, _ = _run(capsys, argv + ["--format", "3"])
    assert status == 0 and "binomial rail tree" in out
    data = json.loads(out_path.read_text())
    assert data["gather"]["tree"] == [[0, 1], [0, 2]]  # 3 machines: 1 and 2 hang off 0 (2 = 0 + 2^1)
