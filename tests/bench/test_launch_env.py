"""How the benchmark tells launchers apart (environment only; nothing is started)."""

from __future__ import annotations

import pytest

from topocoll.bench.launch import LaunchMethod, agree, detect_launch, rank_from_environment
from topocoll.bench.collective_table import BenchArgumentError


def test_env_variables_win():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
           "OMPI_COMM_WORLD_SIZE": "8"}
    launch = detect_launch(env)
    assert (launch.method, launch.rank, launch.world_size, launch.local_rank) == (LaunchMethod.ENV, 3, 8, 1)
    assert rank_from_environment(env) == 3


def test_env_launch_needs_a_master():
    with pytest.raises(BenchArgumentError, match="MASTER_PORT"):
        detect_launch({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"})
    with pytest.raises(BenchArgumentError, match="must be integers"):
        detect_launch({"RANK": "zero", "WORLD_SIZE": "2"})


def test_no_launcher_is_a_single_process():
    launch = detect_launch({})
    assert (launch.method, launch.rank, launch.world_size) == (LaunchMethod.SINGLE, 0, 1)
    assert rank_from_environment({}) == 0


def test_rank_of_mpi_launchers_without_initializing_mpi():
    assert rank_from_environment({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8"}) == 5
    assert rank_from_environment({"PMI_RANK": "2", "PMI_SIZE": "4"}) == 2


def test_agree_without_mpi_keeps_the_local_verdict():
    launch = detect_launch({})
    assert agree(launch, None) is None
    assert agree(launch, "bad") == "bad"


def test_share_cores_follows_torchrun(monkeypatch):
    import torch

    from topocoll.bench.launch import share_cores

    before = torch.get_num_threads()
    try:
        # An explicit OMP_NUM_THREADS is the user's choice: leave it.
        assert share_cores({"OMP_NUM_THREADS": "3", "LOCAL_WORLD_SIZE": "4"}) is None
        # A lone rank keeps every core.
        assert share_cores({"OMPI_COMM_WORLD_LOCAL_SIZE": "1"}) is None
        monkeypatch.setattr("os.cpu_count", lambda: 8)
        assert share_cores({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}) == 2
        assert torch.get_num_threads() == 2
        assert share_cores({"LOCAL_WORLD_SIZE": "16"}) == 1
    finally:
        torch.set_num_threads(before)
