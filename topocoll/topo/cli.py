"""``topocoll topo``: convert, inspect, draw and generate topologies.

Handlers parse nothing themselves: they get the argparse namespace, do the work through the
library, print with rich, and return an exit status. User errors are raised as
:class:`~topocoll.errors.TopocollError` subclasses, which the main command turns into one
line on stderr and exit status 2. Every output is checked before any work starts and written
atomically, so a failed command leaves no file behind.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections import defaultdict

from topocoll.errors import FormatError
from topocoll.fileio import check_output_path
from topocoll.topo import bandwidth as bw
from topocoll.topo.cluster import DEFAULT_SWITCH_RADIX, SUPERPOD_SU_NODES, Network, make_cluster
from topocoll.topo.model import LinkKind, NodeKind, Topology, natural_key
from topocoll.topo.presets import PRESETS, get_preset

log = logging.getLogger(__name__)

#: Extensions ``save_topology`` understands (checked before any work starts).
TOPOLOGY_EXTENSIONS = (".json", ".xml")

#: Rows shown per table before ``show`` summarizes the rest (``--all`` shows every row).
DEFAULT_MAX_ROWS = 32

_TOPO_HELP = """\
Read, convert, inspect, draw and generate topologies.

examples:
  topocoll topo show NCCL_TOPO.xml                 # summary of a topology file
  topocoll topo show dgx.json --png dgx.png        # ... and a picture of it
  topocoll topo convert nvidia-smi-topo.txt -o node.json
  topocoll topo preset dgx-h100 -o h100.json
  topocoll topo preset dgx-a100 --nodes 16 --network fat-tree --oversubscription 2 -o a100x16.json
  topocoll topo list-presets
  topocoll topo discover -o node.json              # this machine (NVML, sysfs)
  topocoll topo merge $NCCL_TOPO_FILE node.json -o complete.json
"""


def register(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Add ``topocoll topo`` and its subcommands to the ``topocoll`` parser; returns the
    ``topo`` subcommands (commands that run under a launcher, ``probe``, are added by bench/)."""
    topo = subparsers.add_parser(
        "topo",
        help="read, convert, show, draw and generate topologies",
        description=_TOPO_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = topo.add_subparsers(dest="topo_command", required=True, metavar="SUBCOMMAND")
    raw = argparse.RawDescriptionHelpFormatter

    convert = sub.add_parser(
        "convert",
        help="convert a topology file (JSON, NCCL XML, nvidia-smi or rocm-smi text) to JSON or NCCL XML",
        description="Convert a topology file. The input format is recognized from its content "
        "(topology JSON, NCCL topology XML, `nvidia-smi topo -m` or `rocm-smi --showtopo` text); "
        "the output format from the extension of OUT (.json or .xml).\n\n"
        "examples:\n  topocoll topo convert NCCL_TOPO.xml -o node.json\n  topocoll topo convert node.json -o node.xml",
        formatter_class=raw,
    )
    convert.add_argument("input", metavar="IN", help="topology file to read")
    convert.add_argument("-o", "--output", metavar="OUT", required=True, help="file to write (.json or .xml)")
    convert.set_defaults(func=cmd_convert)

    show = sub.add_parser(
        "show",
        help="summarize a topology: GPUs, links by kind, NVLinks per GPU, NICs, NUMA, notes",
        description="Print a summary of a topology file (any format `convert` reads).\n\n"
        "examples:\n  topocoll topo show NCCL_TOPO.xml\n  topocoll topo show cluster.json --png cluster.png",
        formatter_class=raw,
    )
    show.add_argument("input", metavar="IN", help="topology file to read")
    show.add_argument("--png", metavar="FILE", help="also draw the topology to this PNG file")
    show.add_argument("--all", action="store_true", help=f"list every GPU and NIC (default: the first {DEFAULT_MAX_ROWS})")
    show.set_defaults(func=cmd_show)

    preset = sub.add_parser(
        "preset",
        help="write the topology of a known system, or of a cluster of them",
        description="Write the topology of a known system (see `topocoll topo list-presets`), or of "
        "K such machines joined by a rail-optimized, fat-tree or SuperPOD (scalable units) network of "
        "two or three switch tiers. Ranks are numbered node-major; machine k's nodes are named "
        "n{k}.gpu0, n{k}.nic0, ... --alloc-nodes / --alloc-gpus keep the part of the cluster one job "
        "gets from a scheduler: random machines, and random GPUs of each.\n\n"
        "examples:\n  topocoll topo preset dgx-h100 -o h100.json\n"
        "  topocoll topo preset dgx-h100 --nodes 4 -o h100x4.json\n"
        "  topocoll topo preset dgx-a100 --nodes 16 --network fat-tree --oversubscription 2 -o a100.json\n"
        "  topocoll topo preset dgx-h100 --nodes 1024 --network superpod -o superpod-8192.json\n"
        "  topocoll topo preset dgx-h100 --nodes 128 --alloc-nodes 12 --alloc-gpus 4 --seed 3 -o job.json\n"
        "  topocoll topo preset dgx-h100 --nodes 8 --alloc-gpus 8,8,1 -o uneven.json\n"
        "  topocoll topo preset pcie-8gpu --nodes 2 --nics-per-node 1 --nic-gbit 100 -o pcie.xml --png pcie.png",
        formatter_class=raw,
    )
    preset.add_argument("name", metavar="NAME", help=f"preset name: {', '.join(PRESETS)}")
    preset.add_argument("--nodes", type=int, default=1, metavar="K", help="number of machines (default 1: the machine alone)")
    preset.add_argument("--nics-per-node", type=int, metavar="N", help="network adapters per machine (default: the system's)")
    preset.add_argument(
        "--network", choices=[n.value for n in Network], default=Network.RAIL.value, help="fabric joining the machines (default rail)"
    )
    preset.add_argument("--nic-gbit", type=float, metavar="G", help="NIC port speed in Gbit/s (default: the system's adapters)")
    preset.add_argument(
        "--oversubscription", type=float, default=1.0, metavar="R",
        help="leaf down/up bandwidth ratio where spines are needed (default 1.0, non-blocking)",
    )
    preset.add_argument(
        "--switch-radix", type=int, default=DEFAULT_SWITCH_RADIX, metavar="P",
        help=f"ports per network switch (default {DEFAULT_SWITCH_RADIX})",
    )
    preset.add_argument(
        "--tiers", type=int, metavar="T",
        help="switch tiers where spines are needed: 2 or 3 (default: 3 exactly when the leaves outnumber a spine's ports)",
    )
    preset.add_argument(
        "--su-nodes", type=int, default=SUPERPOD_SU_NODES, metavar="M",
        help=f"machines per scalable unit of --network superpod (default {SUPERPOD_SU_NODES})",
    )
    preset.add_argument("--alloc-nodes", type=int, metavar="J", help="keep J machines, chosen at random (a job's allocation)")
    preset.add_argument(
        "--alloc-gpus", type=_gpu_counts, metavar="G[,G...]",
        help="keep G GPUs of each kept machine, chosen at random; or one count per machine (8,8,1: two whole machines and "
        "one GPU of a third, as schedulers hand out jobs that do not fill machines)",
    )
    preset.add_argument("--seed", type=int, default=0, help="seed of the allocation's random choices (default 0)")
    preset.add_argument("-o", "--output", metavar="OUT", required=True, help="file to write (.json or .xml)")
    preset.add_argument("--png", metavar="FILE", help="also draw the topology to this PNG file")
    preset.set_defaults(func=cmd_preset)

    merge = sub.add_parser(
        "merge",
        help="complete a topology file with another of the same machine (e.g. a cloud NCCL_TOPO_FILE with discovery)",
        description="Complete GIVEN (kept where both say something) with what COMPLETING knows about the "
        "same machine: nodes matched by PCI bus id (CPUs by NUMA node), links added where GIVEN says "
        "nothing of their kind (NVLinks of GPUs it lists none for, PCIe links of devices it does not "
        "place, network links of NICs without one). Made for cloud NCCL topology files that leave out "
        "the NVLinks: run 'topocoll topo discover' on one machine and merge.\n\n"
        "examples:\n  topocoll topo discover -o node.json            # on the GPU machine\n"
        "  topocoll topo merge $NCCL_TOPO_FILE node.json -o complete.json\n"
        "  topocoll synthesize --topology complete.json --collective allreduce",
        formatter_class=raw,
    )
    merge.add_argument("given", metavar="GIVEN", help="the authoritative topology file (any format convert reads)")
    merge.add_argument("completing", metavar="COMPLETING", help="the topology that fills it in (e.g. discovered)")
    merge.add_argument("-o", "--output", metavar="OUT", required=True, help="file to write (.json or .xml)")
    merge.set_defaults(func=cmd_merge)

    listing = sub.add_parser("list-presets", help="list the known systems", description="List the presets with a description each.")
    listing.set_defaults(func=cmd_list_presets)

    discover = sub.add_parser(
        "discover",
        help="discover this machine (GPUs, NVLinks, PCIe tree, NUMA nodes, NICs) and write its topology",
        description="Discover this machine as NCCL sees it: GPUs and NVLinks through NVML (nvidia-ml-py), "
        "the PCIe switch tree, NUMA nodes and NICs through sysfs, the CPU model from /proc/cpuinfo; "
        "write the topology. A machine without GPUs (or without NVML) is written as its NUMA layout "
        "and NICs, and the notes say what could not be learnt; the topo backend places CPU ranks on "
        "it at run time. --flat-world-size N writes the shared-memory fallback for N processes "
        "instead of discovering.\n\n"
        "examples:\n  topocoll topo discover -o node.json\n  topocoll topo discover -o node.xml --png node.png\n"
        "  topocoll topo discover --flat-world-size 4 -o flat.json",
        formatter_class=raw,
    )
    discover.add_argument("-o", "--output", metavar="OUT", required=True, help="file to write (.json or .xml)")
    discover.add_argument("--flat-world-size", type=int, metavar="N", help="write a flat topology of N CPU processes instead of discovering")
    discover.add_argument("--png", metavar="FILE", help="also draw the topology to this PNG file")
    discover.set_defaults(func=cmd_discover)
    return sub


# ---------------------------------------------------------------------------- handlers
def cmd_convert(args: argparse.Namespace) -> int:
    """``topocoll topo convert IN -o OUT``."""
    from topocoll.topo.io import load_topology, save_topology

    check_output_path(args.output, "-o", TOPOLOGY_EXTENSIONS)
    topology = load_topology(args.input)
    save_topology(topology, args.output)
    _console().print(f"wrote {args.output}: {_counts_line(topology)}")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    """``topocoll topo merge GIVEN COMPLETING -o OUT``."""
    from topocoll.topo.io import load_topology, save_topology
    from topocoll.topo.merge import merge_topologies

    check_output_path(args.output, "-o", TOPOLOGY_EXTENSIONS)
    merged = merge_topologies(load_topology(args.given), load_topology(args.completing))
    save_topology(merged, args.output)
    print_summary(merged, max_rows=DEFAULT_MAX_ROWS)
    _console().print(f"wrote {args.output}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """``topocoll topo show IN [--png FILE]``."""
    from topocoll.topo.io import load_topology

    if args.png:
        check_output_path(args.png, "--png", (".png",))
    topology = load_topology(args.input)
    if args.png:
        from topocoll.topo.draw import draw_topology

        draw_topology(topology, args.png)
    print_summary(topology, max_rows=None if args.all else DEFAULT_MAX_ROWS)
    if args.png:
        _console().print(f"drew {args.png}")
    return 0


def cmd_preset(args: argparse.Namespace) -> int:
    """``topocoll topo preset NAME ... -o OUT``."""
    from topocoll.topo.io import save_topology

    check_output_path(args.output, "-o", TOPOLOGY_EXTENSIONS)
    if args.png:
        check_output_path(args.png, "--png", (".png",))
    spec = get_preset(args.name)
    nic_bw = None
    if args.nic_gbit is not None:
        if not (math.isfinite(args.nic_gbit) and args.nic_gbit > 0):
            raise FormatError(f"--nic-gbit must be a positive number, got {args.nic_gbit}")
        nic_bw = bw.net_bw_bytes_per_s(args.nic_gbit * 1e9)
    topology = make_cluster(
        spec,
        args.nodes,
        nics_per_node=args.nics_per_node,
        network=args.network,
        nic_bw_bytes_per_s=nic_bw,
        oversubscription=args.oversubscription,
        switch_radix=args.switch_radix,
        tiers=args.tiers,
        su_nodes=args.su_nodes,
    )
    if args.alloc_nodes is not None or args.alloc_gpus is not None:
        from topocoll.topo.allocation import allocate

        topology = allocate(topology, args.alloc_nodes, args.alloc_gpus, seed=args.seed)
    save_topology(topology, args.output)
    if args.png:
        from topocoll.topo.draw import draw_topology

        draw_topology(topology, args.png)
    _console().print(f"wrote {args.output}: {_counts_line(topology)}")
    return 0


def cmd_list_presets(args: argparse.Namespace) -> int:
    """``topocoll topo list-presets``."""
    from rich.table import Table

    table = Table(title="presets", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("GPUs", justify="right")
    table.add_column("NICs", justify="right")
    table.add_column("description")
    for spec in PRESETS.values():
        table.add_row(spec.name, str(spec.gpus), str(spec.nics), spec.description)
    _console().print(table)
    return 0


def cmd_discover(args: argparse.Namespace) -> int:
    """``topocoll topo discover -o OUT``."""
    from topocoll.topo.discover import discover_host, flat_topology
    from topocoll.topo.io import save_topology

    check_output_path(args.output, "-o", TOPOLOGY_EXTENSIONS)
    if args.png:
        check_output_path(args.png, "--png", (".png",))
    if args.flat_world_size is not None:
        topology = flat_topology(args.flat_world_size)
    else:
        topology = discover_host()
    save_topology(topology, args.output)
    if args.png:
        from topocoll.topo.draw import draw_topology

        draw_topology(topology, args.png)
    print_summary(topology, max_rows=DEFAULT_MAX_ROWS)
    _console().print(f"wrote {args.output}")
    return 0


# ---------------------------------------------------------------------------- summary
def print_summary(topology: Topology, max_rows: int | None = DEFAULT_MAX_ROWS) -> None:
    """Print the tables of ``topocoll topo show`` for ``topology`` to standard output.

    Parameters
    ----------
    topology : Topology
    max_rows : int, optional
        Rows shown per GPU/NIC table; ``None`` shows all.
    """
    from rich.table import Table

    console = _console()
    console.print(f"[bold]{topology.name or 'topology'}[/bold]  {_counts_line(topology)}")
    console.print(f"digest {topology.digest()}")

    pairs = _undirected_pairs(topology)
    links = Table(title="links by kind", title_justify="left")
    for column, justify in (("kind", "left"), ("physical links", "right"), ("node pairs", "right"), ("total GB/s (one direction)", "right")):
        links.add_column(column, justify=justify)
    by_kind: dict[LinkKind, list[tuple[int, float]]] = defaultdict(list)
    for (kind, count, bw_value) in pairs.values():
        by_kind[kind].append((count, bw_value))
    for kind in LinkKind:
        if kind in by_kind:
            entries = by_kind[kind]
            links.add_row(kind.value, str(sum(c for c, _ in entries)), str(len(entries)), _gb(sum(b for _, b in entries)))
    console.print(links)

    out_links: dict[str, list] = defaultdict(list)
    for link in topology.links:
        out_links[link.src].append(link)

    gpus = topology.nodes_of(NodeKind.GPU, NodeKind.HOST)
    if gpus:
        table = Table(title="ranks (GPUs / host processes)", title_justify="left")
        for column in ("node", "rank", "host", "NUMA", "name", "NVLinks", "NVLink GB/s", "xGMI GB/s", "PCIe GB/s"):
            table.add_column(column, justify="right" if column not in ("node", "host", "name") else "left")
        ordered = sorted(gpus, key=lambda n: (n.rank is None, n.rank if n.rank is not None else 0, natural_key(n.id)))
        for node in _limit(ordered, max_rows):
            mine = out_links[node.id]
            nvlinks = [l for l in mine if l.kind is LinkKind.NVLINK]
            table.add_row(
                node.id,
                _opt(node.rank),
                node.host_id or "",
                _opt(node.numa),
                node.name or "",
                str(sum(l.count for l in nvlinks)) if nvlinks else "0",
                _gb(sum(l.bw_bytes_per_s for l in nvlinks)) if nvlinks else "-",
                _sum_kind(mine, LinkKind.XGMI),
                _sum_kind(mine, LinkKind.PCIE),
            )
        _add_more_row(table, len(ordered), max_rows)
        console.print(table)

    nics = topology.nodes_of(NodeKind.NIC)
    if nics:
        table = Table(title="NICs", title_justify="left")
        for column in ("node", "host", "NUMA", "name", "attached to", "network GB/s"):
            table.add_column(column, justify="right" if column in ("NUMA", "network GB/s") else "left")
        for node in _limit(list(nics), max_rows):
            mine = out_links[node.id]
            attached = ", ".join(l.dst for l in mine if l.kind is not LinkKind.NET) or "-"
            net = [l for l in mine if l.kind is LinkKind.NET]
            speed = _gb(sum(l.bw_bytes_per_s for l in net)) if net else "no network link"
            table.add_row(node.id, node.host_id or "", _opt(node.numa), node.name or "", attached, speed)
        _add_more_row(table, len(nics), max_rows)
        console.print(table)

    numa: dict[tuple[str, int], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for node in topology.nodes:
        if node.numa is not None and node.kind in (NodeKind.GPU, NodeKind.NIC, NodeKind.HOST):
            numa[(node.host_id or "", node.numa)][node.kind.value].append(node.id)
    if numa:
        table = Table(title="NUMA", title_justify="left")
        for column in ("host", "NUMA", "GPUs / ranks", "NICs"):
            table.add_column(column, justify="right" if column == "NUMA" else "left")
        keys = sorted(numa, key=lambda k: (natural_key(k[0]), k[1]))
        for host, node_numa in _limit(keys, max_rows):
            members = numa[(host, node_numa)]
            table.add_row(host, str(node_numa), _ids(members["gpu"] + members["host"]), _ids(members["nic"]))
        _add_more_row(table, len(keys), max_rows)
        console.print(table)

    if topology.notes:
        console.print("[bold]not known from the source:[/bold]")
        for note in topology.notes:
            console.print(f"  - {note}", markup=False, highlight=False)
    from topocoll.topo.merge import planning_warnings

    for warning in planning_warnings(topology):
        print(f"topocoll: warning: {warning}", file=sys.stderr)


# ---------------------------------------------------------------------------- helpers
def _gpu_counts(text: str) -> int | tuple[int, ...]:
    """``--alloc-gpus``: one count (every machine) or a comma-separated count per machine."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a GPU count or counts separated by commas (8,8,1), got {text!r}") from None
    return counts[0] if len(counts) == 1 else counts


def _console():
    from rich.console import Console

    return Console(file=sys.stdout, width=None if sys.stdout.isatty() else 140, highlight=False)


def _undirected_pairs(topology: Topology) -> dict[tuple[str, str], tuple[LinkKind, int, float]]:
    """Kind, physical link count and one-direction bandwidth per unordered node pair."""
    pairs: dict[tuple[str, str], tuple[LinkKind, int, float]] = {}
    for link in topology.links:
        key = (link.src, link.dst) if natural_key(link.src) <= natural_key(link.dst) else (link.dst, link.src)
        old = pairs.get(key)
        if old is None:
            pairs[key] = (link.kind, link.count, link.bw_bytes_per_s)
        else:
            pairs[key] = (old[0], max(old[1], link.count), max(old[2], link.bw_bytes_per_s))
    return pairs


def _counts_line(topology: Topology) -> str:
    return ", ".join(f"{count} {kind}" for kind, count in topology.summary_counts().items()) + f", {len(topology.links)} directed links"


def _gb(value: float) -> str:
    return f"{value / bw.GB:,.1f}"


def _opt(value: object) -> str:
    return "?" if value is None else str(value)


def _sum_kind(links: list, kind: LinkKind) -> str:
    chosen = [l.bw_bytes_per_s for l in links if l.kind is kind]
    return _gb(sum(chosen)) if chosen else "-"


def _ids(ids: list[str]) -> str:
    ids = sorted(ids, key=natural_key)
    return ", ".join(ids[:8]) + (f" (+{len(ids) - 8})" if len(ids) > 8 else "")


def _limit(items: list, max_rows: int | None) -> list:
    return items if max_rows is None else items[:max_rows]


def _add_more_row(table, total: int, max_rows: int | None) -> None:
    if max_rows is not None and total > max_rows:
        table.add_row(f"... {total - max_rows} more (--all)", *[""] * (len(table.columns) - 1))
