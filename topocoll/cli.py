"""The ``topocoll`` command: topology tools, synthesis, verification and simulation.

This module only parses arguments and reports errors; each area registers its subcommands
from its own ``cli`` module. Any :class:`~topocoll.errors.TopocollError` or unreadable file
becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys

from topocoll import __version__
from topocoll.errors import TopocollError

DESCRIPTION = """\
topocoll finds the topology of a GPU cluster, synthesizes collective schedules that use every
path of it, proves how close they are to the physical optimum, and runs them.

typical use:
  topocoll topo show NCCL_TOPO.xml            # what is in this machine?
  topocoll topo preset dgx-h100 --nodes 4 -o cluster.json
  topocoll synthesize --topology cluster.json --collective allreduce -o ar.json
  topocoll verify ar.json --topology cluster.json
  topocoll simulate --topology cluster.json --collective allreduce --sizes 1K:1G
  topocoll route --topology cluster.json --pattern zipf -o a2a.json   # a skewed all-to-all
  topocoll msccl ar.json --topology cluster.json -o allreduce.xml     # for NCCL's MSCCL executor
  torchrun --nproc-per-node 2 -m topocoll.cli topo probe -o probed.json
  topocoll emulate run two-racks -- python -m topocoll.bench allreduce   # K emulated hosts (root)
"""


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every subcommand registered."""
    from topocoll.bench import emulate_cli, probe_cli, simulate_cli
    from topocoll.solver import cli as solver_cli
    from topocoll.solver import msccl_cli, route_cli
    from topocoll.topo import cli as topo_cli

    parser = argparse.ArgumentParser(
        prog="topocoll", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"topocoll {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and solver details to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    probe_cli.register(topo_cli.register(sub))
    solver_cli.register(sub)
    route_cli.register(sub)
    msccl_cli.register(sub)
    simulate_cli.register(sub)
    emulate_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``topocoll`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except TopocollError as exc:
        print(f"topocoll: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"topocoll: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("topocoll: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
