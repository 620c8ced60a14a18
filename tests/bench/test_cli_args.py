"""Bad command lines: one line on stderr, exit status 2, nothing started."""

from __future__ import annotations

import os
import subprocess

import pytest

from topocoll.bench import cli
from tests.bench.helpers import ENV_WORLD, tool


@pytest.fixture
def world_of_four(monkeypatch):
    for name, value in ENV_WORLD.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["allreduce", "-b", "1M", "-e", "8"], "invalid sizes for 'minbytes' and 'maxbytes': 1048576 > 8"),
        (["alltoall"], "unknown collective 'alltoall'"),
        (["allreduce", "-d", "complex"], "unknown datatype 'complex'"),
        (["allreduce", "-o", "mulsum"], "unknown reduction op 'mulsum'"),
        (["reduce", "-o", "avg", "-d", "int32"], "avg needs a floating-point datatype"),
        (["broadcast", "-r", "4"], "root (-r) 4 is not a rank of a world of 4 (0..3)"),
        (["reduce", "-r", "-1"], "root (-r) -1 is not a rank"),
        (["allreduce", "-b", "12Q"], "invalid minbytes '12Q'"),
        (["allreduce", "-n", "0"], "iters (-n) must be >= 1"),
        (["allreduce", "--bogus"], "unrecognized arguments: --bogus"),
        (["allreduce", "-a", "7"], "invalid choice: 7"),
        (["allreduce", "--topology", "no-such-file.json"], "--topology no-such-file.json: no such file"),
        (["allreduce", "--planner", "bogus"], "unknown planner 'bogus'"),
        (["allreduce", "--planner", "ring", "--backend", "gloo"], "--planner chooses the topo backend's schedules"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(world_of_four, capsys, argv, message):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("topocoll-bench: error: ")
    assert message in lines[0]


def test_missing_output_directory(world_of_four, capsys, tmp_path):
    assert cli.main(["allreduce", "-J", str(tmp_path / "missing" / "r.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_only_rank_0_prints(monkeypatch, capsys):
    for name, value in ENV_WORLD.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RANK", "2")
    assert cli.main(["allreduce", "-d", "complex"]) == 2
    assert capsys.readouterr().err == ""


def test_schedule_for_another_collective(world_of_four, capsys, tmp_path):
    from topocoll.solver.baselines import ring
    from topocoll.topo.discover import flat_topology

    schedule = ring(flat_topology(4), "allgather", list(flat_topology(4).compute_nodes()))
    path = tmp_path / "ag.json"
    path.write_text(schedule.to_json())
    assert cli.main(["allreduce", "--schedule", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "schedule is for allgather, the benchmark runs allreduce" in err[0]


def test_topology_with_too_few_ranks(world_of_four, capsys, tmp_path):
    from topocoll.topo.discover import flat_topology

    path = tmp_path / "two.json"
    path.write_text(flat_topology(2).to_json())
    assert cli.main(["allreduce", "--topology", str(path)]) == 2
    assert "2 compute nodes, but 4 ranks need 4" in capsys.readouterr().err


def test_a_world_of_one_is_refused():
    """Started without a launcher: one line, status 2 (a real process, nothing patched)."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_WORLD and not k.startswith(("OMPI_", "PMI", "PMIX"))}
    done = subprocess.run(
        [tool("topocoll-bench"), "allreduce", "-b", "8", "-e", "128M", "-f", "2"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "topocoll-bench: error: a collective needs at least 2 ranks, this is a world of 1: "
        "start with mpirun -np N or torchrun --nproc-per-node N"
    ]


def test_help_mentions_nccl_tests_options(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for option in ("-b", "-e", "-f", "-i", "-n", "-w", "-c", "-a", "-d", "-o", "-r", "-J", "--csv", "--plot", "--topology", "--schedule"):
        assert option in out
