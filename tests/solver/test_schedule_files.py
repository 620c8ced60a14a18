"""Schedule files: hostile files refused in one line, a topology digest required, tampering caught.

``load_schedule`` is the one reader of schedule files (``topocoll verify``, ``topocoll
simulate`` and ``topocoll-bench`` use it); ``topocoll verify`` is run in-process through
``topocoll.cli.main``.
"""

from __future__ import annotations

import pytest

from tests.hostile import (
    SCHEDULE_FILES,
    TAMPERINGS,
    assert_one_line_error,
    synthesized_files,
    tampered_file,
    without_digest,
)
from topocoll import fileio
from topocoll.cli import main
from topocoll.errors import FormatError, ScheduleError
from topocoll.solver.schedule import Schedule, load_schedule
from topocoll.solver.verify import require_topology_digest, verify
from topocoll.topo.io import load_topology

TIMEOUT_S = 60
"""A refusal takes well under a second; a FIFO that blocked would hit this instead."""


@pytest.fixture
def files(tmp_path):
    """(topology, schedule) files: a real synthesized allreduce and its topology."""
    return synthesized_files(tmp_path)


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("kind", sorted(SCHEDULE_FILES))
def test_load_schedule_refuses_hostile_files(tmp_path, kind):
    path, fragment = SCHEDULE_FILES[kind](tmp_path)
    with pytest.raises(FormatError) as info:
        load_schedule(path)
    assert str(info.value).startswith(f"{path}: ") and fragment in str(info.value)


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("kind", sorted(SCHEDULE_FILES))
def test_verify_command_refuses_hostile_files(tmp_path, capsys, files, kind):
    topology_path, _ = files
    path, fragment = SCHEDULE_FILES[kind](tmp_path)
    status = main(["verify", str(path), "--topology", str(topology_path)])
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_one_line_error(status, captured.err, "topocoll", fragment)


def test_schedule_text_nested_too_deep_is_a_format_error():
    with pytest.raises(FormatError, match=r"^s\.json: JSON nested deeper than"):
        Schedule.from_json('{"steps": ' + "[" * 5000 + "]" * 5000 + "}", "s.json")


def test_a_file_over_the_schedule_limit_is_refused(monkeypatch, capsys, files):
    topology_path, schedule_path = files
    size = schedule_path.stat().st_size
    monkeypatch.setattr(fileio, "SCHEDULE_LIMIT_BYTES", size - 1)
    status = main(["verify", str(schedule_path), "--topology", str(topology_path)])
    fragment = f"{size:,} bytes is more than the {size - 1:,} bytes allowed for a schedule file"
    assert_one_line_error(status, capsys.readouterr().err, "topocoll", fragment)
    monkeypatch.setattr(fileio, "SCHEDULE_LIMIT_BYTES", size)
    assert main(["verify", str(schedule_path), "--topology", str(topology_path)]) == 0


def test_the_synthesized_schedule_verifies(capsys, files):
    topology_path, schedule_path = files
    assert main(["verify", str(schedule_path), "--topology", str(topology_path)]) == 0
    assert "correct     yes" in capsys.readouterr().out


def test_a_schedule_without_digest_is_refused_with_the_fix(capsys, files):
    topology_path, schedule_path = files
    path = tampered_file(schedule_path, without_digest)
    status = main(["verify", str(path), "--topology", str(topology_path)])
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_one_line_error(status, captured.err, "topocoll", f"{path}: schedule has no topology_digest")
    assert "re-synthesize it with 'topocoll synthesize" in captured.err


def test_an_empty_digest_is_refused_too(files):
    _, schedule_path = files
    schedule = load_schedule(schedule_path)
    require_topology_digest(schedule, "s.json")
    empty = Schedule.from_json(schedule_path.read_text().replace(schedule.topology_digest, ""))
    with pytest.raises(ScheduleError, match=r"^s\.json: schedule has no topology_digest"):
        require_topology_digest(empty, "s.json")


@pytest.mark.parametrize("change", sorted(TAMPERINGS))
def test_verify_command_refuses_tampered_schedules(capsys, files, change):
    topology_path, schedule_path = files
    path = tampered_file(schedule_path, TAMPERINGS[change])
    assert not verify(load_schedule(path), load_topology(topology_path)).ok
    assert main(["verify", str(path), "--topology", str(topology_path)]) == 1
    out = capsys.readouterr().out
    assert "correct     NO:" in out
