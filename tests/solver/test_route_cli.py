"""``topocoll route``: the table, the schedule file (checked by ``topocoll verify``), matrix files, and their refusals."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.hostile import assert_one_line_error
from topocoll.cli import main
from topocoll.solver import traffic
from topocoll.solver.schedule import load_schedule
from topocoll.topo.cluster import make_cluster


@pytest.fixture
def cluster(tmp_path):
    path = tmp_path / "h100x2.json"
    path.write_text(make_cluster("dgx-h100", 2).to_json())
    return path


def _run(capsys, argv):
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_pattern_table_and_routing_file(capsys, cluster, tmp_path):
    out_path = tmp_path / "r.json"
    status, out, err = _run(
        capsys, ["route", "--topology", str(cluster), "--pattern", "hot", "--bytes-per-rank", "16M", "-o", str(out_path)]
    )
    assert status == 0, err
    methods = re.findall(r"^(lp|fast|single_path|direct)\s+[\d.]+ (?:µs|ms|s)\s+([\d.]+)x the bound", out, re.MULTILINE)
    assert [m for m, _ in methods] == ["lp", "fast", "single_path", "direct"]
    ratios = {m: float(r) for m, r in methods}
    assert ratios["lp"] >= 1.0 and ratios["lp"] <= ratios["single_path"]
    data = json.loads(out_path.read_text())
    assert data["format"] == "topocoll.schedule/1" and data["collective"] == "alltoall" and data["name"] == "lp"
    matrix = np.asarray(data["matrix_bytes"])
    np.testing.assert_allclose(matrix, traffic.traffic_matrix("hot", 16, 16 << 20))
    # every pair's block is covered by its chunks, and the last leg of each chunk reaches its pair's destination
    covered = np.zeros_like(matrix)
    for chunk in data["chunks"]:
        covered[chunk["src"], chunk["dst"]] += chunk["size"]
    np.testing.assert_allclose(covered, (matrix > 0).astype(float), atol=1e-12)
    arrivals = {t["chunk"] for step in data["steps"] for t in step if t["dst"] == next(c["dst"] for c in data["chunks"] if c["id"] == t["chunk"])}
    assert arrivals == {c["id"] for c in data["chunks"]}

    status, out, err = _run(capsys, ["verify", str(out_path), "--topology", str(cluster), "--size", "16M"])
    assert status == 0, err
    assert re.search(r"^correct\s+yes$", out, re.MULTILINE)
    percent = float(re.search(r"^bandwidth .* ([\d.]+) % of bound", out, re.MULTILINE).group(1))
    assert percent == pytest.approx(100.0 / ratios["lp"], rel=0.02)  # the table's ratio, printed to 2 digits


def test_verify_refuses_a_tampered_alltoall_schedule(capsys, cluster, tmp_path):
    out_path = tmp_path / "r.json"
    status, _, err = _run(capsys, ["route", "--topology", str(cluster), "--pattern", "zipf", "--bytes-per-rank", "4M", "-o", str(out_path)])
    assert status == 0, err
    data = json.loads(out_path.read_text())
    data["steps"][0].append(dict(data["steps"][0][0]))  # one chunk sent twice in one step
    out_path.write_text(json.dumps(data))
    status, out, _ = _run(capsys, ["verify", str(out_path), "--topology", str(cluster)])
    assert status == 1
    assert "is also written by transfer 0 of this step" in out


@pytest.mark.parametrize(("name", "text"), [("m.csv", "0, 1M\n2M, 0\n"), ("m.json", "[[0, 1048576], [2097152, 0]]")])
def test_matrix_files(capsys, cluster, tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    status, out, err = _run(capsys, ["route", "--topology", str(cluster), "--ranks", "n0.gpu0,n1.gpu0", "--matrix", str(path)])
    assert status == 0, err
    assert f"traffic     {path}: 2 ranks, {3 * 1048576 / 1e6:.1f} MB in all" in out


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("0,x\n1,0\n", "row 0: expected numbers of bytes"),
        ("0,1\n", "must be 2 x 2"),
        ("0,-5\n1,0\n", "entry [0][1] = -5.0"),
        ('{"rows": 1}', "expected numbers of bytes"),
    ],
)
def test_bad_matrix_files_are_refused_and_nothing_is_written(capsys, cluster, tmp_path, text, fragment):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    out_path = tmp_path / "never.json"
    status, _, err = _run(
        capsys, ["route", "--topology", str(cluster), "--ranks", "n0.gpu0,n1.gpu0", "--matrix", str(path), "-o", str(out_path)]
    )
    assert_one_line_error(status, err, "topocoll", fragment)
    assert str(path) in err
    assert not out_path.exists()


def test_an_unknown_rank_and_a_missing_folder_are_refused(capsys, cluster, tmp_path):
    status, _, err = _run(capsys, ["route", "--topology", str(cluster), "--ranks", "n0.gpu0,gpu99", "--pattern", "uniform"])
    assert_one_line_error(status, err, "topocoll", "no node 'gpu99'")
    status, _, err = _run(capsys, ["route", "--topology", str(cluster), "--pattern", "zipf", "-o", str(tmp_path / "no" / "r.json")])
    assert_one_line_error(status, err, "topocoll", "does not exist")


def test_the_routing_file_in_the_compact_format_is_the_same_schedule(capsys, cluster, tmp_path):
    files = {}
    for version in (1, 2):
        files[version] = tmp_path / f"r{version}.json"
        argv = ["route", "--topology", str(cluster), "--pattern", "zipf", "--bytes-per-rank", "4M", "-o", str(files[version]), "--format", str(version)]
        status, _, err = _run(capsys, argv)
        assert status == 0, err
    compact = json.loads(files[2].read_text())
    assert compact["format"] == "topocoll.schedule/2"
    assert all(len(c) == 5 for c in compact["chunks"])  # each chunk names its pair
    assert load_schedule(files[1]) == load_schedule(files[2])
    status, out, err = _run(capsys, ["verify", str(files[2]), "--topology", str(cluster)])
    assert status == 0, err
    assert re.search(r"^correct\s+yes$", out, re.MULTILINE)
