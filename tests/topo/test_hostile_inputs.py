"""Hostile topology files: refused with one line and exit status 2, never a traceback or a hang.

Each file is made in ``tmp_path`` (:mod:`tests.hostile`) and given to ``load_topology`` (what
every loader goes through, the backend's ``TOPOCOLL_TOPOLOGY`` path included), to ``topocoll
topo show`` and ``topocoll topo convert`` in-process, and to a real ``topocoll`` process.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.hostile import TOPOLOGY_FILES, assert_one_line_error
from tests.topo.fixtures import REPO_ROOT, TOPOLOGY_DIR
from topocoll import fileio
from topocoll.cli import main
from topocoll.errors import FormatError
from topocoll.topo.io import load_topology
from topocoll.topo.model import Topology

PROCESS_TIMEOUT_S = 60
"""A refusal takes well under a second; a FIFO that blocked would hit this instead."""


@pytest.mark.timeout(PROCESS_TIMEOUT_S)
@pytest.mark.parametrize("kind", sorted(TOPOLOGY_FILES))
def test_load_topology_refuses_with_a_format_error(tmp_path, kind):
    path, fragment = TOPOLOGY_FILES[kind](tmp_path)
    with pytest.raises(FormatError) as info:
        load_topology(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and fragment in message
    assert "\n" not in message


@pytest.mark.timeout(PROCESS_TIMEOUT_S)
@pytest.mark.parametrize("command", ["show", "convert"])
@pytest.mark.parametrize("kind", sorted(TOPOLOGY_FILES))
def test_topo_commands_exit_2_with_one_line(tmp_path, capsys, kind, command):
    path, fragment = TOPOLOGY_FILES[kind](tmp_path)
    out = tmp_path / "out.json"
    argv = ["topo", command, str(path)] + (["-o", str(out)] if command == "convert" else [])
    status = main(argv)
    captured = capsys.readouterr()
    assert_one_line_error(status, captured.err, "topocoll", fragment)
    assert not out.exists()


@pytest.mark.timeout(PROCESS_TIMEOUT_S)
@pytest.mark.parametrize("kind", sorted(TOPOLOGY_FILES))
def test_a_real_process_exits_2_with_one_line(tmp_path, kind):
    path, fragment = TOPOLOGY_FILES[kind](tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}  # the checkout under test
    done = subprocess.run(
        [sys.executable, "-m", "topocoll.cli", "topo", "show", str(path)],
        capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, cwd=tmp_path, env=env,
    )
    assert done.stdout == ""
    assert_one_line_error(done.returncode, done.stderr, "topocoll", fragment)


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch, capsys):
    real = TOPOLOGY_DIR / "aws-p5.48xlarge-h100.nccl-topo.xml"
    size = real.stat().st_size
    monkeypatch.setattr(fileio, "TOPOLOGY_LIMIT_BYTES", size - 1)
    status = main(["topo", "show", str(real)])
    fragment = f"{size:,} bytes is more than the {size - 1:,} bytes allowed for a topology file"
    assert_one_line_error(status, capsys.readouterr().err, "topocoll", fragment)
    monkeypatch.setattr(fileio, "TOPOLOGY_LIMIT_BYTES", size)
    assert main(["topo", "show", str(real)]) == 0


def test_the_limits_fit_every_real_file():
    sizes = [p.stat().st_size for p in TOPOLOGY_DIR.iterdir() if p.is_file()]
    assert sizes and max(sizes) * 1000 < fileio.TOPOLOGY_LIMIT_BYTES
    assert fileio.SCHEDULE_LIMIT_BYTES > 200 * fileio.MIB  # a 1024-rank allreduce schedule


def test_topology_json_text_nested_too_deep_is_a_format_error():
    with pytest.raises(FormatError, match=r"^t\.json: JSON nested deeper than"):
        Topology.from_json("[" * 5000 + "]" * 5000, "t.json")


def test_link_endpoints_must_be_strings(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text('{"nodes": [{"id": "a", "kind": "gpu"}], "links": '
                    '[{"source": ["a"], "target": "b", "kind": "nvlink", "bw_bytes_per_s": 1}]}')
    status = main(["topo", "show", str(path)])
    assert_one_line_error(status, capsys.readouterr().err, "topocoll", "endpoints must be non-empty node ids")
