"""Size parsing and the sweep, against nccl-tests' rules (binary units, inclusive loop)."""

from __future__ import annotations

import pytest

from topocoll.bench.collective_table import BenchArgumentError
from topocoll.errors import UsageError
from topocoll.bench.sizes import parse_size, parse_size_range, sweep
from topocoll.units import size_label


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", 8),
        ("128M", 128 * 1024 * 1024),
        ("128m", 128 * 1024 * 1024),
        ("1K", 1024),
        ("1.5K", 1536),
        ("8G", 8 * 1024**3),
        ("4GiB", 4 * 1024**3),
        ("2KB", 2048),
        (" 16 ", 16),
    ],
)
def test_parse_size_binary_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "M", "12Q", "-8", "1e3", "8 M M", "0x10"])
def test_parse_size_rejects_garbage(text):
    with pytest.raises(UsageError, match="invalid"):
        parse_size(text)


def test_sweep_factor_matches_the_fixture_run():
    # gcp-a3mega: "-b 8 -e 8G -f 2" printed 31 rows, from 8 to 8589934592.
    sizes = sweep(8, 8 * 1024**3, step_factor=2)
    assert len(sizes) == 31
    assert sizes[0] == 8 and sizes[-1] == 8589934592
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))


def test_sweep_stops_at_the_last_size_not_above_max():
    assert sweep(8, 100, step_factor=4) == (8, 32)
    assert sweep(1000, 3500, step_bytes=1000) == (1000, 2000, 3000)


def test_sweep_single_size():
    assert sweep(32 << 20, 32 << 20) == (32 << 20,)


def test_sweep_rejects_min_above_max():
    with pytest.raises(BenchArgumentError, match="1048576 > 8"):
        sweep(1 << 20, 8, step_factor=2)


def test_sweep_rejects_non_advancing_steps():
    with pytest.raises(BenchArgumentError, match="increment"):
        sweep(8, 64, step_factor=1, step_bytes=0)
    with pytest.raises(BenchArgumentError, match="minimum size"):
        sweep(0, 64, step_factor=2)


def test_size_range_forms():
    assert parse_size_range("1K:1G") == tuple(1024 * 2**k for k in range(21))
    assert parse_size_range("1K:64K:8") == (1024, 8192, 65536)
    assert parse_size_range("4K,1K,4K") == (1024, 4096)
    assert parse_size_range("2M") == (2 << 20,)
    for bad in ("1K:2K:1", "1K:2K:x", "1:2:3:4", "2K:1K"):
        with pytest.raises(BenchArgumentError):
            parse_size_range(bad)


def test_size_label():
    assert [size_label(s) for s in (8, 1024, 1536, 128 << 20, 1 << 30)] == ["8", "1K", "1.5K", "128M", "1G"]
