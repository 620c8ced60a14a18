"""``topocoll-bench`` with hostile or tampered input files: exit status 2, one line, nothing run.

Run in-process in an env:// world of 4 (as ``test_cli_args``): every file is read and checked
before torch.distributed would connect, so a refusal costs no launch. A few real processes
check that no traceback reaches stderr.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.bench.helpers import ENV_WORLD, REPO_ROOT, tool
from tests.hostile import (
    SCHEDULE_FILES,
    TAMPERINGS,
    TOPOLOGY_FILES,
    assert_one_line_error,
    synthesized_files,
    tampered_file,
    without_digest,
)
from topocoll import fileio
from topocoll.bench import cli
from topocoll.errors import FormatError, ScheduleError

PROG = "topocoll-bench"
TIMEOUT_S = 120
"""Importing torch in a fresh process takes a few seconds; a FIFO that blocked would hit this."""


@pytest.fixture
def world_of_four(monkeypatch):
    for name, value in ENV_WORLD.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def files(tmp_path):
    """(topology, schedule) files: a real synthesized allreduce for 4 ranks and its topology."""
    return synthesized_files(tmp_path)


def _bench(capsys, argv: list[str]) -> tuple[int, str]:
    status = cli.main(["allreduce", "--device", "cpu", *argv])
    captured = capsys.readouterr()
    assert captured.out == ""
    return status, captured.err


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("kind", sorted(TOPOLOGY_FILES))
def test_hostile_topology_file(world_of_four, capsys, tmp_path, kind):
    path, fragment = TOPOLOGY_FILES[kind](tmp_path)
    status, err = _bench(capsys, ["--topology", str(path)])
    assert_one_line_error(status, err, PROG, f"{path}: ")
    assert fragment in err


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("kind", sorted(SCHEDULE_FILES))
def test_hostile_schedule_file(world_of_four, capsys, tmp_path, files, kind):
    topology_path, _ = files
    path, fragment = SCHEDULE_FILES[kind](tmp_path)
    status, err = _bench(capsys, ["--topology", str(topology_path), "--schedule", str(path)])
    assert_one_line_error(status, err, PROG, fragment)


def test_schedule_over_the_size_limit(world_of_four, capsys, monkeypatch, files):
    topology_path, schedule_path = files
    monkeypatch.setattr(fileio, "SCHEDULE_LIMIT_BYTES", schedule_path.stat().st_size - 1)
    status, err = _bench(capsys, ["--topology", str(topology_path), "--schedule", str(schedule_path)])
    assert_one_line_error(status, err, PROG, "bytes allowed for a schedule file")


def test_topology_over_the_size_limit(world_of_four, capsys, monkeypatch, files):
    topology_path, _ = files
    monkeypatch.setattr(fileio, "TOPOLOGY_LIMIT_BYTES", topology_path.stat().st_size - 1)
    status, err = _bench(capsys, ["--topology", str(topology_path)])
    assert_one_line_error(status, err, PROG, "bytes allowed for a topology file")


def test_schedule_without_digest_is_refused(world_of_four, capsys, files):
    topology_path, schedule_path = files
    path = tampered_file(schedule_path, without_digest)
    status, err = _bench(capsys, ["--topology", str(topology_path), "--schedule", str(path)])
    assert_one_line_error(status, err, PROG, f"{path}: schedule has no topology_digest")
    assert "topocoll synthesize" in err


@pytest.mark.parametrize("change", sorted(TAMPERINGS))
def test_tampered_schedule_is_refused_with_the_verifiers_message(world_of_four, capsys, files, change):
    topology_path, schedule_path = files
    path = tampered_file(schedule_path, TAMPERINGS[change])
    status, err = _bench(capsys, ["--topology", str(topology_path), "--schedule", str(path)])
    assert_one_line_error(status, err, PROG, f"{path} is not valid: ")


@pytest.mark.parametrize("change", sorted(TAMPERINGS))
def test_load_setup_verifies_the_schedule(files, change):
    topology_path, schedule_path = files
    args = ["allreduce", "--device", "cpu", "--topology", str(topology_path), "--schedule", str(schedule_path)]
    config = cli.validate(cli.build_parser().parse_args(args), 4)
    setup = cli.load_setup(config, 4)
    assert setup.schedule is not None and setup.schedule.topology_digest == setup.topology.digest()
    path = tampered_file(schedule_path, TAMPERINGS[change])
    args[-1] = str(path)
    config = cli.validate(cli.build_parser().parse_args(args), 4)
    with pytest.raises(ScheduleError, match=rf"^{path} is not valid: "):
        cli.load_setup(config, 4)


def test_topology_environment_variable_path(monkeypatch, tmp_path):
    """The backend's ``TOPOCOLL_TOPOLOGY`` loader gets a FormatError, not a RecursionError."""
    from topocoll.collectives.backend import TOPOLOGY_ENV
    from topocoll.collectives.placement import RankIdentity
    from topocoll.collectives.topology_source import TopologySettings, group_topology

    alone = [RankIdentity(0, 0, "a", "a", "cpu")]
    for kind in ("deep-xml", "deep-json", "fifo", "dev-zero"):
        path, fragment = TOPOLOGY_FILES[kind](tmp_path)
        monkeypatch.setenv(TOPOLOGY_ENV, str(path))
        with pytest.raises(FormatError, match=re.escape(fragment)):
            group_topology(None, alone, 0, TopologySettings.from_env(os.environ))


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("kind", ["fifo", "deep-xml", "deep-json"])
def test_a_real_process_exits_2_with_one_line(tmp_path, kind):
    path, fragment = TOPOLOGY_FILES[kind](tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "PMIX"))}
    env.update(ENV_WORLD, PYTHONPATH=str(REPO_ROOT))  # the checkout under test
    done = subprocess.run(
        [tool(PROG), "allreduce", "--device", "cpu", "--topology", str(path)],
        capture_output=True, text=True, timeout=TIMEOUT_S, env=env,
    )
    assert done.stdout == ""
    assert_one_line_error(done.returncode, done.stderr, PROG, fragment)
