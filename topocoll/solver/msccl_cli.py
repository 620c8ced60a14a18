"""``topocoll msccl``: a schedule as an MSCCL XML algorithm, checked by running it back."""

from __future__ import annotations

import argparse

from topocoll.errors import ScheduleError
from topocoll.fileio import check_output_path, write_atomic
from topocoll.solver import msccl
from topocoll.solver.bound import cut_bound
from topocoll.solver.schedule import load_schedule
from topocoll.solver.verify import require_topology_digest, verify
from topocoll.topo.io import load_topology
from topocoll.topo.model import NodeKind

EPILOG = """\
examples:
  topocoll msccl ar.json --topology node.xml -o allreduce.xml
  topocoll msccl ag.json --topology node.xml --chunks-per-loop 64 --dialect microsoft -o allgather.xml

The schedule is verified first; the program is then run back (each send meeting its receive)
and the schedule it carries out is verified too, so a file that does not implement the
collective is never written. Each chunk boundary moves to the nearest of --chunks-per-loop equal
chunks (default: as many as the schedule has chunks, halved until the file has at most 4096
XML elements, the most MSCCL's readers keep). MSCCL sends every transfer between two
GPUs on the transport NCCL picks for that pair, not along the schedule's paths; without
NVSwitches (whose planes NCCL uses together) the "program" line gives the share of the bound
left on one route a pair, next to the schedule's own.

Load it with MSCCL_ALGO_DIR (Azure's msccl-executor-nccl) or MSCCL_XML_FILES (Microsoft's msccl).
"""

def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``msccl`` to the ``topocoll`` parser."""
    p = subparsers.add_parser(
        "msccl",
        help="export a schedule as an MSCCL XML algorithm",
        description="Write a verified schedule as an MSCCL algorithm (XML) that NCCL runtimes with the MSCCL "
        "executor load, with channels and thread blocks assigned, and check it by running it back.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("schedule", metavar="SCHEDULE.json")
    p.add_argument("--topology", required=True, metavar="FILE", help="the topology the schedule was made for")
    p.add_argument("--chunks-per-loop", type=int, metavar="L", help="nchunksperloop (default: the schedule's chunk count, a multiple of the ranks, halved until the file fits)")
    p.add_argument("--dialect", choices=tuple(msccl.DIALECTS), default="azure", help="the executor: azure (msccl-executor-nccl, default) or microsoft (msccl)")
    p.add_argument("--proto", choices=("Simple", "LL", "LL128"), default="Simple", help="NCCL protocol (default Simple)")
    p.add_argument("-o", "--output", required=True, metavar="ALGO.xml")
    p.set_defaults(func=run_msccl)


def run_msccl(args: argparse.Namespace) -> int:
    """Handler of ``topocoll msccl``."""
    check_output_path(args.output, "-o", (".xml",))
    schedule = load_schedule(args.schedule)
    require_topology_digest(schedule, args.schedule)
    topology = load_topology(args.topology)
    verified = verify(schedule, topology)
    verified.raise_if_failed(args.schedule)
    program = msccl.to_msccl(schedule, args.chunks_per_loop, dialect=args.dialect, proto=args.proto)
    replayed = msccl.from_msccl(program.text, topology, schedule.ranks, schedule.root, source=args.output)
    check = verify(replayed, topology)
    if not check.ok:  # a defect of the export, never of the input: say so rather than write it
        raise ScheduleError(f"the exported program does not implement {schedule.collective.value}: {check.errors[0]}")
    original = verified.t_bw_s_per_byte
    bound = cut_bound(topology, schedule.collective, schedule.ranks, schedule.root).time_per_byte_s
    print(f"{'schedule':<12}{args.schedule}: {schedule.collective.value} over {schedule.world_size} ranks, {len(schedule.chunks)} chunks, "
          f"{len(schedule.steps)} steps, {100 * bound / original:.2f} % of bound")
    print(f"{'grid':<12}{program.chunks_per_loop} chunks per loop, boundaries moved by at most {program.max_shift:.2e} of the buffer")
    if topology.nodes_of(NodeKind.NVSWITCH):  # the model's switch planes are one transport to NCCL, which spreads over them
        one_path = "an NVSwitch system, where NCCL spreads a pair's traffic over the switch planes"
    else:
        one_path = f"{100 * bound / check.t_bw_s_per_byte:.2f} % of bound on one path a pair"
    print(f"{'program':<12}{program.channels} channels, up to {program.thread_blocks} thread blocks a GPU and {program.steps} steps a block, "
          f"{program.elements} XML elements; {one_path}")
    print(f"{'replayed':<12}{len(replayed.steps)} rounds, verified")
    if program.elements > msccl.MAX_ELEMENTS:
        print(f"{'warning':<12}{program.elements} XML elements, more than the {msccl.MAX_ELEMENTS} MSCCL's readers keep: "
              "lower --chunks-per-loop")
    write_atomic(args.output, program.text)
    print(f"{'wrote':<12}{args.output} ({args.dialect} dialect)")
    return 0
