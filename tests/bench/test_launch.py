"""Real launches of ``topocoll-bench``: mpirun with 2 and 4 ranks, torchrun, plain env://.

Each launch costs 10-30 s here (every rank imports torch on 2 shared cores), so every launch
checks as much as it can: the table's columns, ``#wrong`` 0 for the backend and the baseline,
``busbw = algbw x factor`` (factors written out from nccl-tests' documentation), the ``count``
column, the cut-bound columns and the JSON numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from topocoll.solver.baselines import ring
from topocoll.solver.traffic import traffic_bound, traffic_matrix
from topocoll.topo.discover import flat_topology
from topocoll.topo.presets import build_preset
from tests.bench.helpers import LAUNCH_TIMEOUT_S, free_port, mpi_env, parse_table, tool

FACTORS = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "alltoall": lambda n: (n - 1) / n,
}
"""nccl-tests' bus-bandwidth factors (doc/PERFORMANCE.md), written out independently."""

SHORT_SWEEP = ["-b", "1K", "-e", "1M", "-f", "32", "-n", "3", "-w", "1", "-c", "1", "-T", "120"]
SWEEP_SIZES = [1024, 32768, 1048576]


def _mpirun(n: int, argv: list[str]) -> subprocess.CompletedProcess:
    command = [tool("mpirun"), "--oversubscribe", "-np", str(n), tool("topocoll-bench"), *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=mpi_env())


def _check_output(done: subprocess.CompletedProcess, collective: str, n: int, itemsize: int, json_path=None) -> list[dict]:
    if done.returncode != 0:
        ours = [line for line in done.stderr.splitlines() if line.startswith("topocoll-bench:") or "Error" in line]
        pytest.fail(f"exit status {done.returncode}\n" + "\n".join(ours) + f"\n--- stdout tail ---\n{done.stdout[-1500:]}")
    out = done.stdout
    assert out.startswith("# nThread 1 nGpus 1 minBytes 1024 maxBytes 1048576 step: 32(factor) warmup iters: 1 iters: 3")
    for rank in range(n):
        assert f"#  Rank {rank:2d} Group  0 Pid " in out
    assert "# Topology: " in out
    placements = next(line for line in out.splitlines() if "out-of-place" in line)
    assert placements.startswith("#" + " " * 62 + "out-of-place" + " " * 23 + "in-place")  # nccl-tests' own line
    assert "baseline out-of-place" in placements and "baseline in-place" in placements
    names = next(line for line in out.splitlines() if line.startswith("#       size"))
    assert names.split() == ["#", "size", "count", "type", "redop", "root"] + ["time", "algbw", "busbw", "#wrong"] * 4 + [
        "speedup", "bound", "%bound"]
    assert "# Out of bounds values : 0 OK" in out
    assert "# Avg bus bandwidth    : " in out
    # groups: topo out of place, topo in place, baseline out of place, baseline in place
    rows = parse_table(out, groups=4)
    assert [int(r["size"]) for r in rows] == SWEEP_SIZES
    factor = FACTORS[collective](n)
    native = 1 if collective in ("allreduce", "broadcast", "reduce") else 0  # torch.distributed's own form
    for r in rows:
        elements = int(r["size"]) // itemsize
        assert r["count"] == (elements // n if collective in ("allgather", "reduce_scatter") else elements)
        for g in range(4):
            assert r[f"g{g}_wrong"] == 0
            assert r[f"g{g}_busbw"] == pytest.approx(r[f"g{g}_algbw"] * factor, abs=0.011)
            assert r[f"g{g}_time"] > 0
        assert r["bound"] is not None and r["bound"] > 0
        assert r["speedup"] == pytest.approx(r[f"g{2 + native}_time"] / r[f"g{native}_time"], rel=0.02, abs=0.011)
    if json_path is not None:
        data = json.loads(json_path.read_text())
        assert data["world_size"] == n and data["collective"] == collective
        for row in data["rows"]:
            assert row["results"] == row["in_place" if native else "out_of_place"]
            for label, placement in ((label, placement) for label in ("topo", "baseline") for placement in ("out_of_place", "in_place")):
                result = row[placement][label]
                assert result["wrong"] == 0
                assert result["algbw_bytes_per_s"] == pytest.approx(row["size_bytes"] / result["time_s"], rel=1e-6, abs=0)
                assert result["busbw_bytes_per_s"] == pytest.approx(result["algbw_bytes_per_s"] * factor)
            assert row["percent_of_bound"] == pytest.approx(
                100 * row["results"]["topo"]["algbw_bytes_per_s"] / row["bound_algbw_bytes_per_s"])
    return rows


@pytest.mark.mpi
@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
@pytest.mark.parametrize(
    ("collective", "options", "itemsize", "ranks"),
    # 4 ranks for the main job, root 3 and a shard per rank; fewer elsewhere: each rank costs a
    # torch import, and 3 ranks would round the sweep sizes of the sharded collectives
    [
        ("allreduce", [], 4, 4),
        ("allgather", ["-d", "int32"], 4, 2),
        ("reduce_scatter", ["-o", "max", "-d", "bfloat16"], 2, 4),
        ("broadcast", ["-r", "1", "-d", "int8", "-a", "1"], 1, 3),
        ("reduce", ["-r", "3", "-o", "prod", "-d", "half"], 2, 4),
    ],
)
def test_mpirun_launches(collective, options, itemsize, ranks, tmp_path):
    json_path = tmp_path / "result.json"
    done = _mpirun(ranks, [collective, *SHORT_SWEEP, *options, "-J", str(json_path)])
    rows = _check_output(done, collective, ranks, itemsize, json_path)
    root = int(options[options.index("-r") + 1]) if "-r" in options else -1
    assert all(r["root"] == root for r in rows)
    aggregation = "average across ranks (-a 1)" if "-a" in options else "maximum across ranks (-a 3)"
    assert f"# Time: {aggregation}" in done.stdout


@pytest.mark.mpi
@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
def test_mpirun_alltoall_with_skew(tmp_path):
    """3 ranks on three GPUs of a DGX-1 (which offers several paths per pair, so the routed
    all-to-all runs): Zipf traffic, every element checked, no in-place form, the matrix's bound."""
    topology = build_preset("dgx1-v100")
    topology_path = tmp_path / "dgx1.json"
    topology_path.write_text(topology.to_json())
    json_path = tmp_path / "a2a.json"
    done = _mpirun(3, ["alltoall", *SHORT_SWEEP, "-d", "int32", "--skew", "zipf:1.5", "--seed", "4",
                       "--topology", str(topology_path), "-J", str(json_path)])
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "# Traffic: Zipf(1.5) over the other ranks, seed 4" in out
    assert "out of place only (torch has no in-place form)" in out
    assert "# Out of bounds values : 0 OK" in out
    rows = parse_table(out, groups=4)
    # every rank sends S split by Zipf(1.5) over the two others, rounded down per pair
    shares = traffic_matrix("zipf", 3, 1.0, zipf_s=1.5, seed=4)
    bound_per_byte_s = traffic_bound(topology, topology.compute_nodes()[:3], shares).time_s
    assert [r["size"] for r in rows] == [
        max(sum(int(np.floor(v * size / 4 + 1e-9)) for v in row) for row in shares) * 4 for size in SWEEP_SIZES
    ]
    for r in rows:
        assert r["count"] == r["size"] // 4 // 3
        assert r["g0_wrong"] == 0 and r["g2_wrong"] == 0
        assert r["g1_time"] is None and r["g3_time"] is None  # no in-place columns
        assert r["g0_busbw"] == pytest.approx(r["g0_algbw"] * 2 / 3, abs=0.011)
        assert r["bound"] == pytest.approx(1 / bound_per_byte_s / 1e9, rel=0.01, abs=0)  # S over the bound time of S
    data = json.loads(json_path.read_text())
    assert data["config"]["traffic"] == {"pattern": "zipf", "zipf_s": 1.5, "hot_rank": None, "seed": 4, "matrix": None, "source": None}
    assert all(row["in_place"] == {"topo": None, "baseline": None} for row in data["rows"])


@pytest.mark.mpi
@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
def test_mpirun_two_ranks_given_schedule_and_outputs(tmp_path):
    topology = flat_topology(2)
    (tmp_path / "flat2.json").write_text(topology.to_json())
    (tmp_path / "ring.json").write_text(ring(topology, "allreduce", list(topology.compute_nodes())).to_json())
    paths = {"-J": tmp_path / "r.json", "--csv": tmp_path / "r.csv", "--plot": tmp_path / "r.png"}
    argv = ["allreduce", *SHORT_SWEEP, "-d", "double", "-o", "min", "--topology", str(tmp_path / "flat2.json"),
            "--schedule", str(tmp_path / "ring.json")]
    for option, path in paths.items():
        argv += [option, str(path)]
    done = _mpirun(2, argv)
    rows = _check_output(done, "allreduce", 2, 8, paths["-J"])
    assert all(r["type"] == "double" and r["redop"] == "min" for r in rows)
    assert f"# Schedule: {tmp_path / 'ring.json'} (ring" in done.stdout
    assert paths["--csv"].read_text().splitlines()[0].startswith(
        "size_bytes,count,type,redop,root,topo_out_of_place_time_us,topo_out_of_place_algbw_GB_per_s,")
    assert len(paths["--csv"].read_text().splitlines()) == 1 + len(SWEEP_SIZES)
    assert paths["--plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads(paths["-J"].read_text())["config"]
    assert config["command"].startswith("topocoll-bench allreduce -b 1K")
    assert config["launcher"] == "mpirun" and config["schedule"] == str(tmp_path / "ring.json")


@pytest.mark.mpi
@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
def test_mpirun_bad_arguments_stop_every_rank():
    done = _mpirun(2, ["allreduce", "-b", "1M", "-e", "8", "-T", "60"])
    assert done.returncode == 2
    assert done.stdout == ""
    ours = [line for line in done.stderr.splitlines() if line.startswith("topocoll-bench:")]
    assert ours == ["topocoll-bench: error: invalid sizes for 'minbytes' and 'maxbytes': 1048576 > 8"]


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
def test_torchrun_two_ranks():
    command = [tool("torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "topocoll.bench",
               "allgather", *SHORT_SWEEP]
    done = subprocess.run(command, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=mpi_env())
    _check_output(done, "allgather", 2, 4)
    assert "launched by env" in done.stdout


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
def test_plain_env_variables_two_ranks():
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = mpi_env()
        env.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, "-m", "topocoll.bench", "broadcast", "-r", "1", *SHORT_SWEEP],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    try:
        outputs = [p.communicate(timeout=LAUNCH_TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert outputs[1][0] == ""  # only rank 0 prints
    done = subprocess.CompletedProcess(procs[0].args, procs[0].returncode, outputs[0][0], outputs[0][1])
    assert procs[1].returncode == 0, outputs[1][1][-2000:]
    rows = _check_output(done, "broadcast", 2, 4)
    assert all(r["root"] == 1 for r in rows)
