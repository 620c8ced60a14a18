"""The README's benchmark command lines are valid as written: every ``topocoll-bench`` line of
its shell blocks parses and validates (a world of 4, nothing started), and its mpirun lines
carry what a 2-core machine needs."""

from __future__ import annotations

import re
import shlex

import pytest

from topocoll.bench import cli
from tests.bench.helpers import ENV_WORLD, REPO_ROOT


def _shell_lines() -> list[str]:
    text = (REPO_ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


def _bench_argv(line: str) -> list[str] | None:
    words = shlex.split(line)
    for marker in ("topocoll-bench", "topocoll.bench"):
        if marker in words:
            return words[words.index(marker) + 1 :]
    return None


BENCH_LINES = [line for line in _shell_lines() if _bench_argv(line) is not None]


def test_the_readme_has_benchmark_lines():
    assert len(BENCH_LINES) >= 3, BENCH_LINES


@pytest.mark.parametrize("line", BENCH_LINES)
def test_each_benchmark_line_validates(monkeypatch, tmp_path, line):
    for name, value in ENV_WORLD.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # output files of the line land nowhere that matters
    args = cli.build_parser().parse_args(_bench_argv(line))
    cli.validate(args, 4)
    if line.startswith("mpirun"):
        assert "--oversubscribe" in line.split(), "4 ranks on a 2-core machine need --oversubscribe"


def test_the_path_is_set_before_the_first_launch():
    lines = _shell_lines()
    first = next(i for i, line in enumerate(lines) if line.startswith(("mpirun", "torchrun", "topocoll-bench")))
    assert any(".venv/bin" in line and "PATH" in line for line in lines[:first])
