"""The soak command (``benchmarks/soak.py``): its random cases and checks, and two short real runs.

The real runs start 2 ranks each (5-15 s here): gloo against gloo, where every result must
agree (this checks the soak itself), and topo against gloo without ``all_gather_coalesced``,
whose output layout on topo is known to be wrong and is being fixed on its own.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
SOAK_PATH = REPO_ROOT / "benchmarks" / "soak.py"


def _load_soak():
    name = "benchmarks_soak"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SOAK_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


soak = _load_soak()


def _mix(**changes):
    values = dict(kinds=soak.KINDS, dtypes=soak.DTYPES, ranks=4, max_bytes=1 << 20, irregular_fraction=0.3, async_fraction=0.25)
    values.update(changes)
    return soak.Mix(**values)


def test_a_case_depends_on_the_seed_and_its_index_only():
    mix = _mix()
    assert soak.draw_case(5, 17, mix) == soak.draw_case(5, 17, mix)
    assert [soak.draw_case(5, i, mix) for i in range(50)] != [soak.draw_case(6, i, mix) for i in range(50)]
    only = soak.draw_case(5, 17, _mix(kinds=("reduce",)))
    assert only.kind == "reduce" and only.index == 17


def test_cases_are_valid_and_cover_the_awkward_sizes():
    mix = _mix()
    cases = [soak.draw_case(1, i, mix) for i in range(3000)]
    assert {c.kind for c in cases} == set(soak.KINDS)
    assert {c.layout for c in cases} == set(soak.LAYOUTS)
    assert any(c.async_op for c in cases) and any(c.stacked for c in cases)
    numels = [n for c in cases for n in c.numels]
    assert 0 in numels and 1 in numels and any(n > 1 and n % 2 for n in numels)
    assert max(n * soak.ITEMSIZE[c.dtype] for c in cases for n in c.numels) > mix.max_bytes // 4
    for c in cases:
        assert (c.op is not None) == (c.kind in soak.REDUCING_KINDS)
        if c.op is not None:
            assert c.op in soak.ops_for(c.dtype), c
        assert (c.root is not None) == (c.kind in soak.ROOTED_KINDS)
        assert c.root is None or 0 <= c.root < mix.ranks
        pieces = mix.ranks if c.kind in soak.GATHERING_KINDS | soak.SCATTERING_KINDS else 1
        assert sum(c.numels) * pieces * soak.ITEMSIZE[c.dtype] <= mix.max_bytes, c


@pytest.mark.parametrize("ranks", [2, 4, 9, 64])
@pytest.mark.parametrize("dtype", [d for d in soak.DTYPES if d != "bool"])
def test_sums_and_products_of_the_data_stay_exact(dtype, ranks):
    gen = torch.Generator().manual_seed(ranks)
    for op in ("SUM", "PRODUCT"):
        data = [soak.make_values(torch, gen, dtype, 2000, op, ranks) for _ in range(ranks)]
        wide = [d.double() for d in data]
        got, want = data[0].clone(), wide[0].clone()
        for d, w in zip(data[1:], wide[1:]):
            got = got + d if op == "SUM" else got * d
            want = want + w if op == "SUM" else want * w
        limit = soak.EXACT_LIMIT[dtype]
        assert float(want.abs().max()) <= limit, (op, dtype, ranks)
        assert torch.equal(got.double(), want), (op, dtype, ranks)


def test_copies_and_bitwise_data_use_every_bit_pattern():
    gen = torch.Generator().manual_seed(0)
    values = soak.make_values(torch, gen, "int64", 4000, "BXOR", 4)
    assert int(values.min()) < -(2**60) and int(values.max()) > 2**60


@pytest.mark.parametrize("layout", soak.LAYOUTS)
def test_a_placed_tensor_is_checked_inside_and_beside_its_view(layout):
    gen = torch.Generator().manual_seed(3)
    values = torch.arange(12, dtype=torch.int32)
    shape = soak.unit_shape(12, layout)
    placed = soak.place(torch, gen, values, layout, shape)
    assert placed.view.is_contiguous() == (layout in ("contiguous", "offset"))
    expected = placed.view.clone() * 2
    placed.view.mul_(2)
    assert soak.check_placed(placed, expected, "result") is None
    assert soak.check_unchanged(placed, "input") == "input: the input was changed"
    wrong = expected.contiguous().clone()
    wrong.view(-1)[5] += 1
    assert "1 of 12 elements differ, first at 5" in soak.check_placed(placed, wrong, "result")
    if placed.base.numel() > placed.view.numel():  # a write into the gap shows
        placed.base[-1] += 1
        assert soak.check_placed(placed, expected, "result") == "result: wrote outside the tensor's view"


def test_floating_point_results_compare_bit_for_bit():
    a = torch.tensor([0.0, 1.5], dtype=torch.float32)
    assert soak.mismatch(a, a.clone(), "x") is None
    assert soak.mismatch(torch.tensor([-0.0, 1.5]), a, "x") == "x: same values, different bits"
    assert "got" in soak.mismatch(a, a.to(torch.float64), "x")


def test_the_options_are_checked():
    parser = soak.build_parser()
    args = parser.parse_args(["--kinds", "reduce,broadcast", "--max-bytes", "256K"])
    assert args.kinds == ["reduce", "broadcast"] and args.max_bytes == 256 * 1024
    with pytest.raises(SystemExit):
        parser.parse_args(["--kinds", "all_to_all"])
    with pytest.raises(SystemExit) as leaving:
        soak.main(["--kinds", "reduce", "--skip-kinds", "reduce"])  # nothing left to draw from
    assert leaving.value.code == 2
    with pytest.raises(ValueError, match="no kinds"):
        _mix(kinds=())
    assert math.isclose(soak.control_timeout(10).total_seconds(), 50)


def _run_soak(tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "soak.json"
    short = "--ranks 2 --collectives 200 --max-bytes 256K --timeout-s 20".split()
    command = [sys.executable, str(SOAK_PATH), *short, "-o", str(out), *options]
    done = subprocess.run(command, capture_output=True, text=True, timeout=100, cwd=REPO_ROOT)
    assert out.exists(), done.stdout + done.stderr
    return done, json.loads(out.read_text())


def _assert_clean(done: subprocess.CompletedProcess, report: dict, kinds: set[str]) -> None:
    totals = report["totals"]
    shown = done.stdout[-3000:] + done.stderr[-2000:]
    assert (totals["wrong"], totals["errors"]) == (0, 0), shown
    assert done.returncode == 0, shown
    assert totals["collectives"] == 200 and not totals["stopped_early"]
    assert {k for k, row in report["per_kind"].items() if row["count"]} == kinds
    assert report["topocoll_from_checkout"]
    assert "total" in done.stdout and "collectives/s" in done.stdout


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_gloo_against_gloo_agrees_everywhere(tmp_path):
    done, report = _run_soak(tmp_path, "--backend", "gloo", "--seed", "11")
    _assert_clean(done, report, set(soak.KINDS))
    assert report["backend"] == "gloo" and report["ranks"] == 2 and report["seed"] == 11


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_topo_agrees_with_gloo(tmp_path):
    done, report = _run_soak(tmp_path, "--seed", "3")
    _assert_clean(done, report, set(soak.KINDS))
    assert report["backend"] == "topo"


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_topo_agrees_with_gloo_on_tiny_and_strided_tensors(tmp_path):
    """Up to 64 bytes: many empty and one-element tensors with gaps between elements, which
    torch calls contiguous although a byte view of them is impossible."""
    done, report = _run_soak(tmp_path, "--seed", "5", "--max-bytes", "64", "--irregular-fraction", "0.8")
    _assert_clean(done, report, set(soak.KINDS))
