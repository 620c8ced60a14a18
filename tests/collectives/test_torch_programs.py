"""What PyTorch users run, on "topo" and on gloo side by side: group names, DeviceMesh (1-D and
data × tensor parallel), functional collectives (eager and compiled), DTensor, sparse
all-reduce, the monitored barrier, subgroups, DDP, FSDP2, and a new default group after
``destroy_process_group``. Every program of :mod:`tests.collectives.torch_programs` must give
what it gives on gloo (training losses within float tolerance: the reduction order differs)."""

from __future__ import annotations

import math

import pytest

from tests.collectives.harness import launch
from tests.collectives.torch_programs import PROGRAMS, STEPS, torch_programs

WORLD = 4
TIMEOUT_S = 240
TRAINING = ("ddp", "fsdp2", "mesh_2d")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return {
        backend: launch(torch_programs, WORLD, tmp_path_factory.mktemp(backend), TIMEOUT_S, backend)
        for backend in ("gloo", "topo")
    }


@pytest.mark.parametrize("program", [*PROGRAMS, "reinit"])
def test_topo_gives_what_gloo_gives(reports, program):
    for rank in range(WORLD):
        gloo, topo = reports["gloo"][rank][program], reports["topo"][rank][program]
        assert not (isinstance(gloo, str) and gloo.startswith("error")), f"the control failed: {gloo}"
        assert not (isinstance(topo, str) and topo.startswith("error")), f"rank {rank}: {topo}"
        if program in TRAINING:
            assert len(topo) == STEPS and all(math.isfinite(v) for v in topo)
            assert topo == pytest.approx(gloo, rel=1e-5, abs=1e-6), f"rank {rank}: losses {topo} against gloo's {gloo}"
        else:
            assert topo == gloo, f"rank {rank}"


def test_the_programs_compute_what_they_should(reports):
    # Independent of both backends: values computed from the inputs the programs use.
    for rank, report in enumerate(reports["topo"]):
        total = sum(range(WORLD))
        assert report["functional"]["all_reduce"] == [4 * i + total for i in range(4)]
        assert report["functional"]["all_gather_tensor"] == [i + r for r in range(WORLD) for i in range(4)]
        assert report["functional"]["reduce_scatter_tensor"] == [WORLD * (4 * rank + i) for i in range(4)]
        assert report["compiled_functional"] == [2.0 * total + 1] * 3
        assert report["dtensor"] == [float(i) for i in range(2 * WORLD)]
        assert report["sparse_all_reduce"] == [1.0] * WORLD + [float(total)]
        pair = rank // 2 * 2
        paired = 2.0 if rank in (0, WORLD - 1) else 1.0
        assert report["subgroups"] == [float(pair + pair + 1)] * 2 + [paired]
        assert report["reinit"] == [float(sum(range(1, WORLD + 1)))] * 2
        assert report["group_name"] == ["0", "default_pg"]


def test_nothing_is_left_in_shared_memory(reports):
    assert all(r["shm_left"] == [] for r in reports["topo"])
