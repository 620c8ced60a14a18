"""Shared helpers of the benchmark tests: paths, launching, parsing the nccl-tests table."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

from tests.topo.fixtures import TOPOLOGY_DIR, fixture_path

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = TOPOLOGY_DIR
"""Real topology files and nccl-tests outputs."""

BIN = Path(sys.executable).parent
"""The interpreter's scripts directory (mpirun, torchrun and topocoll-bench live there)."""

LAUNCH_TIMEOUT_S = 300
"""Wall-clock limit of one multi-process launch (4 ranks importing torch on 2 cores: 10-30 s)."""


ENV_WORLD = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
"""An env:// world of 4: validation runs, and fails, before torch.distributed would connect."""


fixture = fixture_path
"""A real topology or nccl-tests output file kept with the tests."""


def tool(name: str) -> str:
    """Absolute path of a script of this environment; skips when it is not installed."""
    candidate = BIN / name
    if candidate.is_file():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed")
    return found


def mpi_env() -> dict[str, str]:
    """Environment for mpirun run as root on a machine with fewer cores than ranks."""
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def free_port() -> int:
    """A port nobody listens on right now (for env:// launches)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


COLUMNS = ("size", "count", "type", "redop", "root")


def parse_table(stdout: str, groups: int, with_wrong: bool = True) -> list[dict[str, object]]:
    """The data lines of a benchmark/simulation table as dicts.

    Each row has the five leading nccl-tests columns, then per group ``g{i}_time``,
    ``g{i}_algbw``, ``g{i}_busbw`` (and ``g{i}_wrong``), then ``speedup``, ``bound``,
    ``percent``; numbers as floats, ``-`` and ``N/A`` as None.
    """
    names = list(COLUMNS)
    for g in range(groups):
        names += [f"g{g}_time", f"g{g}_algbw", f"g{g}_busbw"] + ([f"g{g}_wrong"] if with_wrong else [])
    names += ["speedup", "bound", "percent"]
    rows = []
    for line in stdout.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split()
        assert len(cells) == len(names), f"unexpected row {line!r}"
        row: dict[str, object] = {}
        for name, cell in zip(names, cells):
            if name in ("type", "redop"):
                row[name] = cell
            elif cell in ("-", "N/A"):
                row[name] = None
            else:
                row[name] = float(cell)
        rows.append(row)
    return rows
