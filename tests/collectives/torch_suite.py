"""PyTorch's own distributed tests (``DistributedTest._DistTestBase``) against a named backend.

Run as ``python -m tests.collectives.torch_suite --out results.json [--spawn] [NAME ...]`` with
``BACKEND`` (``gloo`` or ``topo``) and ``WORLD_SIZE`` in the environment, as PyTorch's
``test/distributed/test_distributed_spawn.py`` is run (PyTorch's harness sets ``TEMP_DIR`` and
``INIT_METHOD`` again for each test). Without names every test method of the suite runs. The
results, one record per test (outcome, message, seconds), go to ``--out``.

PyTorch's test code runs unmodified; this module only drives it:

* the suite reads ``BACKEND`` when it is imported and skips a test whose decorators name other
  backends, so this module registers "topo" (``import topocoll.collectives``; spawned ranks
  import this module again) and declares it in ``DistTestCases.backend_feature`` (``"plugin"``,
  the hook for out-of-tree backends, and the features it implements) before importing the suite;
* :data:`BACKEND_GATED` lists tests that PyTorch runs only on the backends it names although
  their bodies suit any CPU backend (``require_backend_is_available({"gloo"})``); on "topo" this
  module puts a copy of each without the skip mark on the test class;
* the ranks of a test are forked from the runner (``--spawn``: spawned, as in PyTorch's CI) —
  forking skips each rank's 3-5 s import of torch, so that dozens of tests fit in a minute.
  Nothing in the runner holds threads or a process group when it forks.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import time
import unittest
from pathlib import Path

import torch

import topocoll.collectives  # noqa: F401  (registers "topo" in the runner and in spawned ranks)
from topocoll.collectives.backend import BACKEND_NAME
from torch.testing._internal.common_distributed import DistTestCases

BACKEND = os.environ["BACKEND"]

TOPO_FEATURES = ("plugin", "ddp", "subgroup")
"""``DistTestCases.backend_feature`` sets "topo" belongs to: an out-of-tree backend that runs
DistributedDataParallel and ``new_group`` (its CUDA path is not declared: it has not run on a GPU)."""

if BACKEND == BACKEND_NAME:
    for _feature in TOPO_FEATURES:
        DistTestCases.backend_feature[_feature].add(BACKEND)

# imported only now: its decorators read BACKEND and the feature sets at import
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

BACKEND_GATED = (
    "test_all_reduce_coalesced_sum",
    "test_all_reduce_coalesced_product",
    "test_all_reduce_coalesced_min",
    "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_group_sum",
    "test_all_reduce_coalesced_group_product",
    "test_all_reduce_coalesced_group_min",
    "test_all_reduce_coalesced_group_max",
    "test_all_reduce_coalesced_full_group_sum",
    "test_all_reduce_coalesced_full_group_product",
    "test_all_reduce_coalesced_full_group_min",
    "test_all_reduce_coalesced_full_group_max",
    "test_scatter_object_list",
    "test_all_gather_object_default_pg",
    "test_all_gather_object_subgroup",
    "test_get_future",
    "test_grads_same_across_ranks_with_no_sync",
    "test_barrier_timeout_full_group",
    "test_batch_isend_irecv_gloo",
    "test_batch_isend_irecv_gloo_tags",
    "test_sparse_all_reduce_sum",
)
"""Tests PyTorch runs only on the backends it names (gloo; gloo, nccl and ucc) although their
bodies, off nccl, only use CPU collectives any backend offers; they run on every backend here.
Each carries no other skip decorator (the gloo runs of the same tests would show one).

Left gated, because their bodies name the backend: ``test_monitored_barrier_gloo*``
(``dist.monitored_barrier`` accepts only a group whose backend is called "gloo"; a topo group
offers ``group.monitored_barrier``) and ``test_accumulate_gradients_no_sync*`` (its helper
builds the model only when ``BACKEND`` is "mpi", "gloo" or "nccl")."""

def _ungated(name: str):
    """The suite's test method without the skip its backend gate put on it.

    PyTorch's gates mark the function itself (``__unittest_skip__``) and leave it callable: the
    copy made here calls it and carries every other attribute.
    """
    method = getattr(DistributedTest._DistTestBase, name)

    @functools.wraps(method)
    def test(self):
        return method(self)

    for attribute in ("__unittest_skip__", "__unittest_skip_why__"):
        test.__dict__.pop(attribute, None)
    return test


class TorchSuiteTest(TestDistBackend, DistributedTest._DistTestBase):
    """PyTorch's ``TestDistBackendWithSpawn`` for any ``BACKEND``, its ranks forked or spawned."""

    start_method = "fork"
    """How the runner starts a test's ranks (``run`` sets it on each test)."""

    def setUp(self) -> None:
        super().setUp()
        self._start_processes(torch.multiprocessing.get_context(self.start_method).Process)


if BACKEND == BACKEND_NAME:
    for _name in BACKEND_GATED:
        setattr(TorchSuiteTest, _name, _ungated(_name))


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")


def failure_summary(text: str) -> str:
    """The distinct exception lines of a failure report (one per rank), at most 400 characters."""
    lines = [m.group(0) for m in (_EXCEPTION_LINE.match(line.strip()) for line in text.splitlines()) if m]
    # "RuntimeError: Process 1 exited with error code 10 and exception:" only frames the rank's own
    shown = [line for line in lines if not line.startswith("RuntimeError: Process ")] or lines[-1:]
    if not shown:
        shown = [text.strip().splitlines()[-1]] if text.strip() else ["(no message)"]
    unique = list(dict.fromkeys(shown))
    return " | ".join(unique)[:400]


def _write(out: Path, records: dict[str, dict]) -> None:
    body = {"backend": BACKEND, "world_size": int(os.environ["WORLD_SIZE"]), "tests": records}
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(body, indent=1, sort_keys=True))
    partial.replace(out)  # a reader never sees half a file


class _RecordingResult(unittest.TextTestResult):
    """Keeps one record per test (outcome, message, seconds), written to ``out`` after each test
    so that a runner stopped part way still leaves the results it has."""

    def __init__(self, *args, out: Path, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.records: dict[str, dict] = {}
        self._started = 0.0
        self._out = out

    def startTest(self, test) -> None:  # noqa: N802 (unittest's name)
        self._started = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome: str, message: str = "") -> None:
        name = test.id().rsplit(".", 1)[-1]
        self.records[name] = {"outcome": outcome, "message": message, "seconds": round(time.monotonic() - self._started, 2)}
        _write(self._out, self.records)

    def addSuccess(self, test) -> None:  # noqa: N802
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err) -> None:  # noqa: N802
        super().addFailure(test, err)
        self._record(test, "failed", failure_summary(self._exc_info_to_string(err, test)))

    def addError(self, test, err) -> None:  # noqa: N802
        super().addError(test, err)
        self._record(test, "failed", failure_summary(self._exc_info_to_string(err, test)))

    def addSkip(self, test, reason) -> None:  # noqa: N802
        super().addSkip(test, reason)
        self._record(test, "skipped", str(reason))


def run(names: list[str], out: Path, start_method: str = "fork", verbosity: int = 1) -> dict[str, dict]:
    """Run the named tests of the suite (all when empty) and write their records to ``out``."""
    names = names or list(unittest.TestLoader().getTestCaseNames(TorchSuiteTest))
    tests = [TorchSuiteTest(name) for name in names]
    for test in tests:
        test.start_method = start_method
    suite = unittest.TestSuite(tests)
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=verbosity, resultclass=functools.partial(_RecordingResult, out=out))
    result = runner.run(suite)
    records = {name: result.records.get(name, {"outcome": "failed", "message": "no result", "seconds": 0}) for name in names}
    _write(out, records)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    parser.add_argument("--spawn", action="store_true", help="spawn the ranks instead of forking them")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("names", nargs="*", help="test methods (default: all)")
    args = parser.parse_args(argv)
    run(args.names, args.out, "spawn" if args.spawn else "fork", 2 if args.verbose else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
