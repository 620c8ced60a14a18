"""``topocoll topo probe``: measure the links between the ranks of a job and write the
calibrated topology.

Started once per rank by a launcher (``torchrun``, ``mpirun``, ``topocoll emulate run``), like
``topocoll-bench``. The ranks form a ``topo`` group (which finds the topology as it always does:
``$TOPOCOLL_TOPOLOGY``, or discovery of every machine), measure it
(:mod:`topocoll.collectives.probe`), and rank 0 writes the calibrated topology and prints what
was measured. Progress goes to stderr on rank 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from topocoll.errors import UsageError

EPILOG = """\
what is measured:
  one rank per machine sends to every other one alone, then two at once into and out of each
  machine, then several across each link that machines share (a switch-to-switch link); the
  rates say which link limited each flow, and that link's capacity replaces its nominal one.
  Links that were never the limit keep their nominal figures (the notes list them).

examples:
  torchrun --nproc-per-node 2 -m topocoll.cli topo probe -o probed.json
  mpirun -np 4 topocoll topo probe -o probed.json --target-s 0.5
  topocoll emulate run two-racks -- topocoll topo probe -o probed.json
  TOPOCOLL_PROBE=1 ...                 # the topo backend probes by itself at start-up
"""


def register(topo_subparsers: argparse._SubParsersAction) -> None:
    """Add ``probe`` to the ``topocoll topo`` subcommands."""
    probe = topo_subparsers.add_parser(
        "probe",
        help="measure the links between the ranks of a job (under a launcher) and write the calibrated topology",
        description="Measure bandwidth and latency between the ranks of a job with point-to-point messages "
        "and write the topology with the measured capacities. Run it once per rank under torchrun, mpirun "
        "or topocoll emulate run.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    probe.add_argument("-o", "--output", metavar="OUT", required=True, help="calibrated topology to write (.json or .xml), by rank 0")
    probe.add_argument("--target-s", type=float, default=0.25, metavar="S", help="about how long each timed experiment lasts (default 0.25)")
    probe.add_argument("--max-bytes", default="64M", metavar="N", help="most bytes per flow (K/M/G suffixes; default 64M)")
    probe.add_argument("--timeout-s", type=float, default=120.0, metavar="S", help="longest wait for one message before every rank gives up (default 120)")
    probe.set_defaults(func=cmd_probe)


def cmd_probe(args: argparse.Namespace) -> int:
    """``topocoll topo probe -o OUT``: run on every rank of a job."""
    from topocoll.bench.launch import LaunchMethod, detect_launch, init_distributed
    from topocoll.collectives.probe import ProbeSettings
    from topocoll.topo.io import EXTENSIONS, save_topology
    from topocoll.units import parse_size

    if Path(args.output).suffix.lower() not in EXTENSIONS:
        raise UsageError(f"{args.output}: unknown output extension; use .json or .xml")
    settings = ProbeSettings(target_s=args.target_s, max_bytes=parse_size(args.max_bytes), initial_bytes=min(1 << 20, parse_size(args.max_bytes)))
    launch = detect_launch()
    if launch.method is LaunchMethod.SINGLE or launch.world_size < 2:
        raise UsageError("probing needs at least 2 ranks: start it with torchrun, mpirun or topocoll emulate run")
    import torch.distributed as dist

    from topocoll.collectives import TopoOptions

    init_distributed(launch, "topo", args.timeout_s, TopoOptions(probe=False))
    try:
        group = dist.group.WORLD
        say = (lambda line: print(line, file=sys.stderr, flush=True)) if launch.rank == 0 else None
        result = group.probe(settings, progress=say)
        if launch.rank == 0:
            save_topology(result.topology, args.output)
            for note in result.notes:
                print(f"  {note}")
            print(f"wrote {args.output}: {len(result.measured)} link(s) measured")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0
