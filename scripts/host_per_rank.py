"""Run a script or module under ``torchrun`` with every local rank posing as its own machine.

Sets ``NCCL_HOSTID`` and ``TOPOCOLL_HOSTID`` to ``emulated-<LOCAL_RANK>`` before anything
starts. NCCL then takes the ranks for separate hosts: it lets them share one GPU (it refuses two
ranks on one GPU of one host) and connects them through its network transport, and topocoll
discovers one machine per rank and places each rank on it. This is how ``scripts/gpu-check``
runs the multi-rank CUDA checks on a machine with a single GPU; the speeds it measures are those
of NCCL's socket transport on that machine, not of any GPU interconnect.

usage: torchrun --nproc-per-node N scripts/host_per_rank.py (-m MODULE | SCRIPT) [ARGS...]
"""

from __future__ import annotations

import os
import runpy
import sys


def main(argv: list[str]) -> None:
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        sys.exit(__doc__.strip().splitlines()[-1])
    host = f"emulated-{os.environ.get('LOCAL_RANK', '0')}"
    os.environ["NCCL_HOSTID"] = os.environ["TOPOCOLL_HOSTID"] = host
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
