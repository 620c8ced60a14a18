"""PyTorch's whole distributed test suite on "topo" and on gloo, side by side.

The long slice of issue-style compatibility checking: every test method of
``torch.testing._internal.distributed.distributed_test.DistributedTest._DistTestBase`` (what
PyTorch's ``test_distributed_spawn.py`` runs), once per backend, through the runner the test
suite uses for its short slice (:func:`tests.collectives.test_torch_suite.run_suite`). It prints
the outcome counts per backend and every test whose outcome differs, and writes both:

* ``--out`` (JSON): every test's outcome, message and seconds on each backend;
* the same name with ``.md``: the counts and the table of differences, for people.

A test gloo passes and "topo" does not is a gap of "topo"; the runner runs tests PyTorch gates
to gloo alone on "topo" as well (``BACKEND_GATED``), so "topo" may pass tests gloo skips.

Usage::

    python benchmarks/torch_suite.py [--world-size 3] [--timeout-min 60]
        [--out benchmarks/results/torch_suite.json]

About 15-25 minutes per backend on 2 cores (each test starts its ranks afresh).
"""

from __future__ import annotations

import argparse
import collections
import os
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BACKENDS = ("gloo", "topo")
OUTCOMES = ("passed", "failed", "skipped")


def compare(results: dict[str, dict[str, dict]]) -> list[dict]:
    """The tests whose outcome differs between the backends, sorted by name."""
    names = sorted(set().union(*(set(tests) for tests in results.values())))
    missing = {"outcome": "not run", "message": "", "seconds": 0}
    rows = []
    for name in names:
        by_backend = {backend: results[backend].get(name, missing) for backend in BACKENDS}
        if len({r["outcome"] for r in by_backend.values()}) > 1:
            rows.append({"test": name, **{backend: by_backend[backend] for backend in BACKENDS}})
    return rows


def counts(tests: dict[str, dict]) -> dict[str, int]:
    """Tests per outcome (the three of :data:`OUTCOMES` always present)."""
    found = collections.Counter(r["outcome"] for r in tests.values())
    return {outcome: found.get(outcome, 0) for outcome in OUTCOMES} | {k: v for k, v in found.items() if k not in OUTCOMES}


def markdown(report: dict) -> str:
    lines = [
        f"# PyTorch's distributed tests on topo and gloo ({report['world_size']} ranks)",
        "",
        f"Command: `{report['command']}`",
        f"Host: {report['host']['cpus']} CPUs, Python {report['host']['python']}, torch {report['host']['torch']}.",
        "",
        "| backend | tests | passed | failed | skipped | minutes |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for backend in BACKENDS:
        c = report["counts"][backend]
        lines.append(
            f"| {backend} | {sum(c.values())} | {c['passed']} | {c['failed']} | {c['skipped']} | {report['minutes'][backend]:.1f} |"
        )
    gaps = [r for r in report["differences"] if r["gloo"]["outcome"] == "passed"]
    gated = sum(1 for r in gaps if r["topo"]["outcome"] == "skipped")
    lines += [
        "",
        f"Passed on gloo, not on topo: {len(gaps)}: {len(gaps) - gated} failed on topo, {gated} skipped by PyTorch's own gate on "
        "the backend's name (left gated where the test's body names gloo: `BACKEND_GATED` in "
        "`tests/collectives/torch_suite.py` lists the ungated ones and says why the others stay).",
        "",
    ]
    lines += ["| test | gloo | topo | topo's message |", "|---|---|---|---|"]
    for row in report["differences"]:
        message = (row["topo"]["message"] or row["gloo"]["message"]).replace("|", "\\|")[:200]
        lines.append(f"| `{row['test']}` | {row['gloo']['outcome']} | {row['topo']['outcome']} | {message} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=3, help="ranks per test (PyTorch's CI uses 2-4)")
    parser.add_argument("--timeout-min", type=float, default=60, help="stop a backend's runner after this; its finished tests still count")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "torch_suite.json")
    parser.add_argument("names", nargs="*", help="test methods (default: every one)")
    args = parser.parse_args(argv)

    import torch

    from tests.collectives.test_torch_suite import run_suite
    from topocoll.fileio import write_atomic

    results: dict[str, dict[str, dict]] = {}
    minutes: dict[str, float] = {}
    for backend in BACKENDS:
        print(f"running the suite on {backend} ({args.world_size} ranks) ...", file=sys.stderr, flush=True)
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"torch-suite-{backend}-") as workdir:
            results[backend] = run_suite(backend, args.world_size, Path(workdir), names=args.names, timeout_s=args.timeout_min * 60)
        minutes[backend] = (time.monotonic() - started) / 60
        print(f"  {backend}: {counts(results[backend])} in {minutes[backend]:.1f} min", file=sys.stderr, flush=True)

    report = {
        "benchmark": "torch_suite",
        "command": " ".join(["python benchmarks/torch_suite.py", *(argv if argv is not None else sys.argv[1:])]),
        "world_size": args.world_size,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
        "counts": {backend: counts(results[backend]) for backend in BACKENDS},
        "minutes": minutes,
        "differences": compare(results),
        "tests": results,
    }
    text = markdown(report)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out, json.dumps(report, indent=1, sort_keys=True) + "\n")
    write_atomic(args.out.with_suffix(".md"), text)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
