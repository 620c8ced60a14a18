"""Bad command lines: one line on stderr, exit status 2, nothing started."""

from __future__ import annotations

import json
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
        (["gather"], "unknown collective 'gather'"),
        (["allreduce", "--skew", "zipf"], "--skew splits an alltoall's buffer; allreduce has no destinations to skew"),
        (["alltoall", "--skew", "zipf:x"], "--skew zipf:x: expected uniform, zipf[:EXPONENT >= 0] or hot[:RANK]"),
        (["alltoall", "--skew", "zipf:-1"], "--skew zipf:-1: expected uniform"),
        (["alltoall", "--skew", "hot:4"], "--skew hot:4: rank 4 is not a rank of a world of 4 (0..3)"),
        (["alltoall", "--skew", "no-such-matrix.csv"], "--skew no-such-matrix.csv: neither uniform, zipf[:S], hot[:R] nor a matrix file"),
        (["alltoall", "--planner", "ring"], "an alltoall is routed from its traffic matrix on every call"),
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
        (["allreduce", "-t", "2"], "nthreads (-t) 2: nccl-tests runs 2 threads in one process; here each rank is one process"),
        (["allreduce", "-g", "8"], "ngpus (-g) 8: nccl-tests runs 8 devices in one process"),
        (["allreduce", "-m", "0"], "agg_iters (-m) must be >= 1"),
        (["allreduce", "-N", "-1"], "run_cycles (-N) must be >= 0"),
        (["allreduce", "-z", "4"], "invalid choice: 4"),
        (["allreduce", "-d", "all", "-o", "mulsum"], "unknown reduction op 'mulsum'"),
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


@pytest.mark.parametrize(("text", "fragment"), [("0,1\n1,0\n", "must be 4 x 4"), ("0,x,0,0\n", "row 0: expected numbers of bytes")])
def test_bad_matrix_files_for_skew(world_of_four, capsys, tmp_path, text, fragment):
    path = tmp_path / "moe.csv"
    path.write_text(text)
    assert cli.main(["alltoall", "--skew", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and fragment in err and str(path) in err


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


def test_a_world_of_one_runs_as_nccl_tests_does(tmp_path):
    """Started without a launcher, as nccl-tests' binaries may be: one rank, a real run."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_WORLD and not k.startswith(("OMPI_", "PMI", "PMIX"))}
    done = subprocess.run(
        [tool("topocoll-bench"), "allreduce", "-b", "8", "-e", "64", "-f", "8", "-n", "2", "-w", "1", "-q", "-J", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 rank on cpu, launched by single process" in done.stdout
    rows = [line.split() for line in done.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert [int(r[0]) for r in rows] == [8, 64]
    for r in rows:
        # four groups (topo and gloo, out of place and in place): #wrong 0, busbw 0 (factor 2(n-1)/n)
        assert [r[8 + 4 * g] for g in range(4)] == ["0"] * 4
        assert [r[7 + 4 * g] for g in range(4)] == ["0.00"] * 4
        assert r[-2:] == ["-", "-"]  # no cut bound for one rank
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["world_size"] == 1 and len(data["rows"]) == 2


def test_nccl_tests_options_without_meaning_are_accepted_and_named(world_of_four):
    args = cli.build_parser().parse_args(["allreduce", "-G", "4", "-p", "1", "-C", "0", "-R", "1", "-t", "1", "-g", "1", "-y", "0"])
    config = cli.validate(args, 4)
    assert [n for n in config.notes if "ignored" in n] == [
        "-p 1 (threads initialize in parallel) has no meaning here: ignored",
        "-G 4 (CUDA graph launches) has no meaning here: ignored",
        "-R 1 (NCCL buffer registration) has no meaning here: ignored",
    ]


@pytest.mark.parametrize(
    ("collective", "datatype", "op", "expected"),
    [
        # -d all: every type torch's CPU backend reduces, in nccl-tests' order; -o all: sum prod max min avg
        ("allreduce", "all", "sum", [(t, "sum") for t in ("int8", "uint8", "int32", "int64", "half", "float", "double", "bfloat16")]),
        ("allreduce", "float", "all", [("float", o) for o in ("sum", "prod", "max", "min", "avg")]),
        ("reduce_scatter", "all", "all", [(t, o) for t in ("int8", "uint8", "int32", "int64") for o in ("sum", "prod", "max", "min")]
         + [(t, o) for t in ("half", "float", "double", "bfloat16") for o in ("sum", "prod", "max", "min", "avg")]),
        ("allgather", "all", "all", [(t, "sum") for t in ("int8", "uint8", "int32", "int64", "half", "float", "double", "bfloat16")]),
    ],
)
def test_all_types_and_ops(world_of_four, collective, datatype, op, expected):
    config = cli.validate(cli.build_parser().parse_args([collective, "-d", datatype, "-o", op]), 4)
    assert [(t, o.value) for t, o in config.combinations] == expected
    if datatype == "all":
        assert any("uint32, uint64" in n for n in config.notes)
    if (datatype, op) == ("all", "all") and collective == "reduce_scatter":
        assert any("avg of integer types is not run" in n for n in config.notes)


def test_help_mentions_nccl_tests_options(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    nccl_tests = "-t -g -b -e -i -f -n -m -w -N -p -c -o -d -r -z -y -T -G -C -S -J -a -R -x -D -V -M -u -I -K".split()
    for option in [*nccl_tests, "--output_file", "--csv", "--plot", "--topology", "--schedule"]:
        assert f"{option} " in out or f"{option}," in out, option
