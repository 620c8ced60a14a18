"""The measuring loop in a real (one-process) gloo world: timing, combining and counting wrong elements."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.bench.helpers import REPO_ROOT

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from topocoll.bench import operations
    from topocoll.bench.collective_table import COLLECTIVES, RedOp
    from topocoll.bench.runner import Series, SweepSettings, TimeAggregation, measure_size
    from topocoll.solver.schedule import Collective

    store = dist.FileStore(sys.argv[1], 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=60))
    meta = dist.new_group(backend="gloo")
    corrupt = int(sys.argv[2])
    honest_issue = operations.issue

    def issue(spec, buffers, group, op, root, async_op=False):
        work = honest_issue(spec, buffers, group, op, root, async_op)
        if work is not None:
            work.wait()
        buffers.output[:corrupt] += 1  # a broken collective: the first elements come out wrong

    operations.issue = issue
    settings = SweepSettings(COLLECTIVES[Collective.ALLREDUCE], RedOp.SUM, "float", torch.float32, 0,
                             iters=2, warmup=0, check=2, aggregation=TimeAggregation.MAX, device=torch.device("cpu"))
    row = measure_size(settings, (Series("gloo", None),), 64, 0, 1, meta, lambda size: 2.0e-9 * size)
    m = row.results[0]
    print(json.dumps({"wrong": m.wrong, "time_s": m.time_s, "algbw": m.algbw_bytes_per_s, "busbw": m.busbw_bytes_per_s,
                      "size": row.size_bytes, "count": row.count, "bound": row.bound_time_s,
                      "placed_wrong": [g[0].wrong for g in row.placed], "in_place_is_results": row.placed[1] == row.results}))
    dist.destroy_process_group()
    """
)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("corrupt", [0, 3])
def test_wrong_elements_are_counted(tmp_path, corrupt):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "store"), str(corrupt)],
        capture_output=True, text=True, timeout=150, cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # a world of one: the allreduce of the fill is the fill; every corrupted element counts once
    assert result["wrong"] == corrupt
    assert result["placed_wrong"] == [corrupt, corrupt]  # out of place and in place are both checked
    assert result["in_place_is_results"]  # all_reduce is in place in torch.distributed
    assert (result["size"], result["count"]) == (64, 16)
    assert result["algbw"] == pytest.approx(64 / result["time_s"], rel=1e-6, abs=0)
    assert result["busbw"] == 0.0  # nccl-tests' factor 2(n-1)/n is 0 for one rank
    assert result["bound"] == pytest.approx(2.0e-9 * 64)
