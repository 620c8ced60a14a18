"""Report formatting against real nccl-tests output, and the JSON / CSV / plot files."""

from __future__ import annotations

import csv
import io
import json

import pytest

from topocoll.bench.report import Measurement, Report, Row, format_time_us, percent_of_bound, speedup
from topocoll.solver.schedule import Collective
from tests.bench.helpers import fixture

GB = 1e9


def _fixture_rows(name: str) -> list[list[str]]:
    lines = fixture(name).read_text().splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("name", ["gcp-a3mega-h100-2node.all_reduce_perf.txt", "oci-bm.gpu.h100.8-2node-roce.all_reduce_perf.txt"])
def test_rows_reproduce_nccl_tests_layout(name):
    """Our leading columns and first result group are laid out exactly as nccl-tests prints them."""
    for line in _fixture_rows(name):
        cells = line.split()
        size, count, dtype, redop, root = int(cells[0]), int(cells[1]), cells[2], cells[3], int(cells[4])
        time_us, algbw, busbw, wrong = float(cells[5]), float(cells[6]), float(cells[7]), int(cells[8])
        row = Row(size, count, dtype, redop, root, (Measurement(time_us * 1e-6, algbw * GB, busbw * GB, wrong),))
        report = Report("bench", Collective.ALLREDUCE, 16, ("topo",), (row,))
        ours = report.format_row(row)
        # nccl-tests' out-of-place block ends after the #wrong cell: 52 + 2 + 7 + 2 + 6 + 2 + 6 + 2 + 5 chars
        assert ours[:84] == line[:84]


@pytest.mark.parametrize(
    ("time_s", "text"),
    [(47535e-6, "  47535"), (12646e-6, "  12646"), (135.8e-6, "  135.8"), (9.5e-6, "   9.50"), (9999.94e-6, " 9999.9")],
)
def test_time_cell_precision_follows_nccl_tests(time_s, text):
    assert format_time_us(time_s) == text


def _report(wrong: int = 0) -> Report:
    rows = (
        Row(1024, 256, "float", "sum", -1, (Measurement(2e-6, 512e6, 768e6, 0), Measurement(4e-6, 256e6, 384e6, wrong)), 1e-6),
        Row(2048, 512, "float", "sum", -1, (Measurement(4e-6, 512e6, 768e6, 0), None), None),
    )
    return Report("bench", Collective.ALLREDUCE, 4, ("topo", "baseline"), rows, header=("hello",), config={"baseline": "gloo"})


def test_speedup_and_bound_columns():
    row = _report().rows[0]
    assert speedup(row) == pytest.approx(2.0)
    assert row.bound_algbw_bytes_per_s == pytest.approx(1024 / 1e-6)
    assert percent_of_bound(row) == pytest.approx(100 * 512e6 / (1024 / 1e-6))
    line = _report().format_row(row).split()
    assert line[-3:] == ["2.00", "1.02", "50.0"]
    missing = _report().format_row(_report().rows[1]).split()
    assert missing[9:13] == ["-", "-", "-", "-"] and missing[-3:] == ["-", "-", "-"]


def test_footer_ok_and_failed():
    ok = _report().to_text()
    assert "# Out of bounds values : 0 OK" in ok
    assert "# Avg bus bandwidth    : 0.768 " in ok
    failed = _report(wrong=7).to_text()
    assert "# Out of bounds values : 7 FAILED" in failed
    assert _report(wrong=7).wrong_total == 7


def test_header_columns_are_aligned_with_rows():
    report = _report()
    names = report.table_header()[1]
    row = report.format_row(report.rows[0])
    # each right-aligned column name ends where its values end
    for column in ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "speedup", "bound", "%bound"):
        end = names.index(column) + len(column)
        assert row[end - 1] != " " and (end == len(row) or row[end] == " "), column


def test_json_round_trip_keeps_si_units():
    data = json.loads(_report().to_json())
    assert data["format"] == "topocoll.bench/1"
    assert data["bus_factor"] == pytest.approx(2 * 3 / 4)
    first = data["rows"][0]
    assert first["results"]["topo"]["time_s"] == 2e-6
    assert first["results"]["baseline"]["wrong"] == 0
    assert first["bound_busbw_bytes_per_s"] == pytest.approx(1024 / 1e-6 * 1.5)
    assert data["rows"][1]["results"]["baseline"] is None
    assert data["summary"]["avg_busbw_bytes_per_s"]["topo"] == pytest.approx(768e6)


def test_csv_has_units_in_headers():
    rows = list(csv.DictReader(io.StringIO(_report().to_csv())))
    assert rows[0]["topo_time_us"] == "2"
    assert rows[0]["topo_busbw_GB_per_s"] == "0.768"
    assert rows[0]["speedup"] == "2"
    assert rows[1]["baseline_time_us"] == "" and rows[1]["bound_algbw_GB_per_s"] == ""


def test_write_outputs(tmp_path):
    pytest.importorskip("matplotlib")
    report = _report()
    report.write_outputs(str(tmp_path / "r.json"), str(tmp_path / "r.csv"), str(tmp_path / "r.png"))
    assert json.loads((tmp_path / "r.json").read_text())["kind"] == "bench"
    assert (tmp_path / "r.csv").read_text().startswith("size_bytes,count,")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "r.json", "r.png"]


def _placed_report() -> Report:
    # topo: out of place 4 us, in place 2 us; baseline: 8 us and 6 us; allreduce runs in place in torch
    oop = (Measurement(4e-6, 256e6, 384e6, 0), Measurement(8e-6, 128e6, 192e6, 0))
    ip = (Measurement(2e-6, 512e6, 768e6, 0), Measurement(6e-6, 1024 / 6e-6, 1.5 * 1024 / 6e-6, 3))
    row = Row(1024, 256, "float", "sum", -1, ip, 1e-6, placed=(oop, ip))
    return Report("bench", Collective.ALLREDUCE, 4, ("topo", "baseline"), (row,), placements=True)


def test_placed_header_is_nccl_tests_own_then_the_baseline():
    nccl = fixture("gcp-a3mega-h100-2node.all_reduce_perf.txt").read_text().splitlines()
    at = next(i for i, line in enumerate(nccl) if "out-of-place" in line)
    ours = _placed_report().table_header()
    # nccl-tests' three header lines, character for character, over its two groups
    assert ours[0].startswith(nccl[at].rstrip())
    assert ours[1].startswith(nccl[at + 1].rstrip()) and ours[2].startswith(nccl[at + 2].rstrip())
    assert ours[0].split()[1:] == ["out-of-place", "in-place", "baseline", "out-of-place", "baseline", "in-place", "vs", "baseline,", "bound"]


def test_placed_rows_give_both_groups_per_series_and_judge_the_native_form():
    report = _placed_report()
    cells = report.format_row(report.rows[0]).split()
    assert cells[5:21] == ["4.00", "0.26", "0.38", "0", "2.00", "0.51", "0.77", "0", "8.00", "0.13", "0.19", "0", "6.00", "0.17", "0.26", "3"]
    assert cells[-3:] == ["3.00", "1.02", "50.0"]  # 6 us / 2 us in place; topo's in-place algbw over the bound
    assert report.wrong_total == 3  # the in-place baseline's
    assert report.avg_busbw_bytes_per_s(0) == pytest.approx((384e6 + 768e6) / 2)  # both placements, as nccl-tests
    data = json.loads(report.to_json())["rows"][0]
    assert data["out_of_place"]["topo"]["time_s"] == 4e-6 and data["in_place"]["baseline"]["wrong"] == 3
    assert data["results"] == data["in_place"]
    head = next(csv.reader(io.StringIO(report.to_csv())))
    assert head[5:9] == ["topo_out_of_place_time_us", "topo_out_of_place_algbw_GB_per_s", "topo_out_of_place_busbw_GB_per_s", "topo_out_of_place_wrong"]
    assert head[13] == "baseline_out_of_place_time_us" and head[-3:] == ["speedup", "bound_algbw_GB_per_s", "percent_of_bound"]
