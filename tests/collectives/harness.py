"""Starting a few ranks for the multi-process tests (spawned processes, FileStore rendezvous)."""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def launch(target: Callable[..., None], world_size: int, workdir: Path, timeout_s: float, *args: Any) -> list[dict]:
    """Run ``target(rank, world_size, store_file, out_file, *args)`` in ``world_size`` processes.

    Every rank writes a JSON report to its ``out_file``. Returns the reports in rank order.
    Fails (after killing the stragglers) when a rank hangs past ``timeout_s`` or wrote nothing.
    """
    context = multiprocessing.get_context("spawn")
    store_file = workdir / "store"
    outs = [workdir / f"rank{r}.json" for r in range(world_size)]
    procs = [
        context.Process(target=target, args=(r, world_size, str(store_file), str(outs[r]), *args), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    hung = []
    deadline = time.monotonic() + timeout_s
    for r, p in enumerate(procs):
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            hung.append(r)
            p.kill()
            p.join()
    assert not hung, f"ranks {hung} did not finish within {timeout_s} s"
    reports = []
    for r, out in enumerate(outs):
        assert out.exists(), f"rank {r} wrote no report (exit code {procs[r].exitcode})"
        reports.append(json.loads(out.read_text()))
    return reports
