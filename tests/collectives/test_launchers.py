"""The "topo" backend under the real launchers: torchrun (env://) and mpirun (mpi4py bootstrap),
and with a topology file named by TOPOCOLL_TOPOLOGY."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.topo.fixtures import TOPOLOGY_DIR

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("launched_rank.py")
FIXTURES = TOPOLOGY_DIR
BIN = Path(sys.executable).parent


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _oks(stdout: str) -> list[list[str]]:
    # ranks share the launcher's stdout, so lines may interleave
    return sorted(list(m) for m in re.findall(r"OK (\d+) (\d+) ([a-z0-9_-]+)", stdout))


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_torchrun_env_init_with_a_topology_file():
    fixture = FIXTURES / "aws-p4d.24xlarge-a100.nccl-topo.xml"
    if not fixture.exists():
        pytest.skip(f"fixture {fixture.name} not present")
    torchrun = BIN / "torchrun"
    result = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "3", str(SCRIPT), "env"],
        env=_env(TOPOCOLL_TOPOLOGY=str(fixture), OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    oks = _oks(result.stdout)
    assert [o[:2] for o in oks] == [["0", "3"], ["1", "3"], ["2", "3"]], result.stdout


@pytest.mark.multiprocess
@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_mpirun_bootstrap():
    mpirun = BIN / "mpirun"
    if not mpirun.exists() and shutil.which("mpirun") is None:
        pytest.skip("no mpirun")
    result = subprocess.run(
        [str(mpirun if mpirun.exists() else "mpirun"), "--oversubscribe", "-n", "2", sys.executable, str(SCRIPT), "mpi"],
        env=_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [o[:2] for o in _oks(result.stdout)] == [["0", "2"], ["1", "2"]], result.stdout


def _topocoll_shm() -> set[str]:
    directory = Path("/dev/shm")
    return {p.name for p in directory.iterdir() if p.name.startswith("topocoll")} if directory.is_dir() else set()


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_torchrun_restarts_every_rank_after_a_peer_dies(tmp_path):
    """torchrun --max-restarts: the last rank dies in the middle of a collective, torchrun stops
    the others and starts all of them again, and the new group gives right answers."""
    before = _topocoll_shm()
    result = subprocess.run(
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            "3",
            "--max-restarts",
            "1",
            "--monitor-interval",
            "0.5",
            str(SCRIPT),
            "elastic",
        ],
        env=_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=260,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    first = sorted(re.findall(r"ATTEMPT0 (\d+)", result.stdout))
    assert first == ["0", "1", "2"], result.stdout  # the first attempt ran until the death
    assert [o[:2] for o in _oks(result.stdout)] == [["0", "3"], ["1", "3"], ["2", "3"]], result.stdout
    assert re.search(r"exitcode\s*:\s*3\b", result.stderr), result.stderr[-3000:]  # the death torchrun saw
    left = _topocoll_shm() - before
    assert not left, f"left in /dev/shm: {sorted(left)}"
