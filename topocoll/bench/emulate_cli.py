"""``topocoll emulate``: K emulated hosts on this machine, to measure topology effects.

Thin: parse, call :mod:`topocoll.bench.scenario` and :mod:`topocoll.bench.emulate`, print.
Refusals (a bad scenario, not root, a missing tool) are :class:`~topocoll.errors.TopocollError`
subclasses, which the main command prints as one line with exit status 2; they are all raised
before anything is created.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from topocoll.bench.emulate import (
    DEFAULT_STATE_DIR,
    RUN_MARKER,
    EmulatedCluster,
    child_environment,
    list_states,
    preflight,
    teardown_state,
)
from topocoll.bench.network_plan import DEFAULT_SUBNET_BASE, PORT_QUEUES
from topocoll.bench.scenario import check_ranks, describe, load_scenario, scenario_topology, shipped_scenarios
from topocoll.errors import EmulateError, UsageError
from topocoll.topo.io import save_topology

_EMULATE_HELP = f"""\
Emulate a cluster of K hosts on this machine: one network namespace per host (with its own
hostname and private /dev/shm), veth links shaped by tc to the scenario's rates and delays,
Linux bridges as switches, static routes where hosts share no switch. Needs root.

A scenario is a JSON file or a shipped name ({', '.join(shipped_scenarios())}); see
'topocoll emulate list'. The ground-truth topology of the emulated network is written for
every run (TOPOCOLL_TOPOLOGY in the ranks' environment).

examples:
  topocoll emulate list
  topocoll emulate show two-racks -o truth.json       # what would be emulated (no root needed)
  topocoll emulate run two-racks -- python -m topocoll.bench allreduce -b 1K -e 16M
  topocoll emulate run asym-ring --ranks 3 --timeout 300 --keep-truth ring.json -- python train.py
  topocoll emulate run two-racks --port-queue fair -- python -m topocoll.bench allgather -b 16M -e 64M
  topocoll emulate up multi-rail --name mr            # leave it up ...
  topocoll emulate exec mr h1 -- tc -s qdisc show dev eth0
  topocoll emulate down mr                            # ... and remove it (or: down --all)

On a kernel without the netem qdisc, scenarios with delays need --no-delay (rates only).
Switch ports are drop-tail queues, as Ethernet's are; --port-queue fair gives every flow (pair
of hosts) its own queue at each port, served in turn: the max-min sharing 'topocoll simulate'
assumes.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``topocoll emulate`` and its subcommands to the ``topocoll`` parser."""
    raw = argparse.RawDescriptionHelpFormatter
    emulate = subparsers.add_parser(
        "emulate", help="emulate K hosts with shaped links on this machine (namespaces, tc)", description=_EMULATE_HELP, formatter_class=raw
    )
    sub = emulate.add_subparsers(dest="emulate_command", required=True, metavar="SUBCOMMAND")

    listing = sub.add_parser("list", help="list the shipped scenarios and the emulated clusters that are up",
                             description="List the shipped scenarios and the clusters 'up' left running.")
    _state_dir_option(listing)
    listing.set_defaults(func=cmd_list)

    show = sub.add_parser(
        "show", help="summarize a scenario and write its ground-truth topology",
        description="Validate a scenario, print its hosts and links, and optionally write the topology of the "
        "emulated network (contract-1 JSON). Creates nothing; no root needed.\n\n"
        "examples:\n  topocoll emulate show asym-ring\n  topocoll emulate show my-scenario.json -o truth.json",
        formatter_class=raw,
    )
    show.add_argument("scenario", metavar="SCENARIO", help="scenario file or shipped name")
    show.add_argument("-o", "--output", metavar="FILE", help="write the truth topology here (.json or .xml)")
    show.add_argument("--no-delay", action="store_true", help="the truth of a rates-only run (latencies 0)")
    show.set_defaults(func=cmd_show)

    up = sub.add_parser(
        "up", help="bring an emulated cluster up and leave it running",
        description="Create the namespaces, links, shaping and routes of SCENARIO, print the cluster's name and "
        "truth-topology path, and leave it up until 'topocoll emulate down NAME'.\n\n"
        "examples:\n  topocoll emulate up two-racks --name racks\n  topocoll emulate exec racks h0 -- ip route\n"
        "  topocoll emulate down racks",
        formatter_class=raw,
    )
    up.add_argument("scenario", metavar="SCENARIO", help="scenario file or shipped name")
    up.add_argument("--name", help="name for 'down' and 'exec' (default SCENARIO-RUNID)")
    _bring_up_options(up)
    up.set_defaults(func=cmd_up)

    down = sub.add_parser(
        "down", help="remove an emulated cluster (or all of them)",
        description="Remove everything 'up' created for NAME (processes, namespaces, interfaces, qdiscs, files); "
        "goes on when a step fails and says which.\n\nexamples:\n  topocoll emulate down racks\n  topocoll emulate down --all",
        formatter_class=raw,
    )
    target = down.add_mutually_exclusive_group(required=True)
    target.add_argument("name", nargs="?", metavar="NAME", help="the cluster's name or run id")
    target.add_argument("--all", action="store_true", help="every cluster in the state directory")
    _state_dir_option(down)
    down.set_defaults(func=cmd_down)

    execute = sub.add_parser(
        "exec", help="run a command inside one host of a cluster that is up",
        description="Run CMD in HOST's network, mount and UTS namespaces (its addresses, its /dev/shm, its hostname).\n\n"
        "examples:\n  topocoll emulate exec racks h2 -- hostname\n  topocoll emulate exec racks h0 -- python -c 'import socket'",
        formatter_class=raw,
    )
    execute.add_argument("name", metavar="NAME", help="the cluster's name or run id")
    execute.add_argument("host", metavar="HOST", help="host name from the scenario")
    _state_dir_option(execute)
    execute.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to run")
    execute.set_defaults(func=cmd_exec)

    run = sub.add_parser(
        "run", help="bring a cluster up, run CMD as one rank per host, tear it down",
        description="Bring SCENARIO up, start CMD once per host (rank i on host i) with the variables of an "
        "env:// launch (RANK, WORLD_SIZE, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, MASTER_ADDR = host 0's eth0, "
        "MASTER_PORT, GLOO_SOCKET_IFNAME=eth0, TOPOCOLL_HOSTID, TOPOCOLL_TOPOLOGY = the truth topology, "
        "TOPOCOLL_EMULATE_SCENARIO), wait for all, and remove everything, also on failure, timeout or Ctrl-C.\n\n"
        "Every line a rank prints comes out prefixed with its host, '[h0] ...' (stdout to stdout, stderr to "
        "stderr). When a rank fails, the others are stopped; the exit status is the first failing rank's, "
        "124 on timeout, 0 when all succeeded. 'python' in CMD is this interpreter, importing this topocoll.\n\n"
        "examples:\n  topocoll emulate run uniform -- python -m topocoll.bench allreduce -b 1K -e 16M\n"
        "  topocoll emulate run two-racks --ranks 2 --timeout 120 -- python -c 'import os; print(os.environ[\"RANK\"])'\n"
        "  topocoll emulate run asym-ring --no-delay --keep-truth ring.json -- python train.py",
        formatter_class=raw,
    )
    run.add_argument("scenario", metavar="SCENARIO", help="scenario file or shipped name")
    _run_options(run)
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command every rank runs")
    run.set_defaults(func=cmd_run)


def _run_options(run: argparse.ArgumentParser) -> None:
    run.add_argument("--ranks", type=int, metavar="N", help="run N ranks on hosts 0..N-1 (default: every host)")
    run.add_argument("--timeout", type=float, metavar="S", help="stop the ranks after S seconds (exit status 124)")
    run.add_argument("--keep-truth", metavar="FILE", help="also write the truth topology to FILE, which stays after the run (the cluster's own copy goes with it)")
    _bring_up_options(run)


def _state_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR), metavar="DIR",
                        help=f"where state files and truth topologies are kept (default {DEFAULT_STATE_DIR})")


def _bring_up_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--subnet", default=DEFAULT_SUBNET_BASE, metavar="CIDR",
                        help=f"the /16 the hosts' addresses come from, one /24 per L2 domain (default {DEFAULT_SUBNET_BASE})")
    parser.add_argument("--no-delay", action="store_true", help="shape rates only, without netem delays")
    parser.add_argument("--port-queue", choices=PORT_QUEUES, default="fifo",
                        help="how a shaped port queues: fifo, one drop-tail queue as an Ethernet switch port "
                             "(default); fair, a queue per flow (pair of hosts) served in turn, the max-min "
                             "sharing 'topocoll simulate' assumes")
    _state_dir_option(parser)


def _command(args: argparse.Namespace, options: Callable[[argparse.ArgumentParser], None]) -> list[str]:
    """The command after ``--``; options between the positionals and ``--`` are parsed here
    (argparse hands everything after the positionals over unparsed)."""
    rest = list(args.command)
    if "--" in rest:
        cut = rest.index("--")
        given, command = rest[:cut], rest[cut + 1 :]
    elif rest and rest[0].startswith("-"):
        raise UsageError(f"put the command after '--' (got {' '.join(rest)!r})")
    else:
        given, command = [], rest
    if given:
        late = argparse.ArgumentParser(prog="topocoll emulate", add_help=False, exit_on_error=False)
        options(late)
        try:
            _, unknown = late.parse_known_args(given, namespace=args)
        except argparse.ArgumentError as exc:
            raise UsageError(str(exc)) from None
        if unknown:
            raise UsageError(f"unknown option {unknown[0]!r} (options go before '--', the command after it)")
    if not command:
        raise UsageError("no command given; put it after '--', e.g. -- python train.py")
    return command


@contextmanager
def _signals_interrupt() -> Iterator[Callable[[], int | None]]:
    """SIGINT and SIGTERM raise KeyboardInterrupt once; later ones are ignored so that
    teardown runs to its end. Yields a function giving the signal received, if any."""
    received: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if not received:
            received.append(signum)
            raise KeyboardInterrupt

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: received[0] if received else None
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


# ------------------------------------------------------------------------ handlers
def cmd_list(args: argparse.Namespace) -> int:
    """``topocoll emulate list``."""
    print("shipped scenarios:")
    for name in shipped_scenarios():
        print(f"  {next(iter(describe(load_scenario(name))))[len('scenario '):]}")
    states = list_states(args.state_dir)
    print(f"up in {args.state_dir}:" if states else f"no emulated cluster is up in {args.state_dir}")
    for state in states:
        print(f"  {state['name']} (run {state['run_id']}, scenario {state['scenario']}): truth {state['truth']}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """``topocoll emulate show SCENARIO [-o FILE]``."""
    scenario = load_scenario(args.scenario)
    for line in describe(scenario):
        print(line)
    topology = scenario_topology(scenario, delays_applied=not args.no_delay)
    if args.output:
        save_topology(topology, args.output)
        print(f"wrote {args.output}: truth topology, {len(topology.nodes)} nodes, {len(topology.links)} links, {topology.digest()[:19]}...")
    return 0


def _cluster(args: argparse.Namespace, name: str | None = None) -> EmulatedCluster:
    return EmulatedCluster(load_scenario(args.scenario), name=name, state_dir=args.state_dir,
                           subnet_base=args.subnet, apply_delays=not args.no_delay, port_queue=args.port_queue)


def cmd_up(args: argparse.Namespace) -> int:
    """``topocoll emulate up SCENARIO [--name NAME]``."""
    cluster = _cluster(args, args.name)
    with _signals_interrupt():
        cluster.up()
    print(f"up: {cluster.name} (run {cluster.run_id}, scenario {cluster.scenario.name}, {cluster.plan.port_queue} port queues)")
    print(f"truth topology: {cluster.truth_path}")
    for host, ns in cluster.plan.host_namespaces:
        addresses = ", ".join(f"{n.ifname} {n.address}" for n in cluster.plan.nics_of(host))
        print(f"  {host}: namespace {ns}: {addresses}")
    print(f"enter a host: topocoll emulate exec {cluster.name} {cluster.scenario.hosts[0]} -- CMD")
    print(f"remove it:    topocoll emulate down {cluster.name}")
    return 0


def _find_state(name: str, state_dir: str) -> dict:
    for state in list_states(state_dir):
        if name in (state.get("name"), state.get("run_id")):
            return state
    raise EmulateError(f"no emulated cluster {name!r} is up in {state_dir} (see 'topocoll emulate list')")


def cmd_down(args: argparse.Namespace) -> int:
    """``topocoll emulate down NAME | --all``."""
    preflight()
    states = list_states(args.state_dir) if args.all else [_find_state(args.name, args.state_dir)]
    status = 0
    for state in states:
        problems = teardown_state(state)
        for problem in problems:
            print(f"topocoll emulate: {state['name']}: {problem}", file=sys.stderr)
        print(f"down: {state['name']}" + (" (with problems above)" if problems else ""))
        status = status or (1 if problems else 0)
    if args.all and not states:
        print(f"no emulated cluster is up in {args.state_dir}")
    return status


def cmd_exec(args: argparse.Namespace) -> int:
    """``topocoll emulate exec NAME HOST -- CMD``."""
    command = _command(args, _state_dir_option)
    state = _find_state(args.name, args.state_dir)
    host = state["hosts"].get(args.host)
    if host is None or not host.get("holder_pid"):
        raise EmulateError(f"{state['name']}: no host {args.host!r}; hosts: {', '.join(state['hosts'])}")
    env = child_environment()
    env[RUN_MARKER] = state["run_id"]
    argv = ["nsenter", "-t", str(host["holder_pid"]), "-n", "-m", "-u", f"--wd={os.getcwd()}", "--", *command]
    return subprocess.run(argv, env=env).returncode


def cmd_run(args: argparse.Namespace) -> int:
    """``topocoll emulate run SCENARIO [--ranks N] [--timeout S] [--keep-truth F] -- CMD ...``."""
    command = _command(args, _run_options)
    cluster = _cluster(args)
    check_ranks(cluster.scenario, args.ranks)
    if args.keep_truth and Path(args.keep_truth).suffix.lower() not in (".json", ".xml"):
        raise UsageError(f"--keep-truth {args.keep_truth}: use a .json or .xml file")
    with _signals_interrupt() as received:
        try:
            with cluster:
                if args.keep_truth:
                    save_topology(scenario_topology(cluster.scenario, delays_applied=not args.no_delay), args.keep_truth)
                print(f"topocoll emulate: {cluster.name} up; truth topology {cluster.truth_path}", file=sys.stderr, flush=True)
                result = cluster.run_ranks(command, ranks=args.ranks, timeout_s=args.timeout)
            return result.returncode
        except KeyboardInterrupt:
            signum = received() or signal.SIGINT
            print(f"topocoll emulate: interrupted ({signal.Signals(signum).name}); emulated hosts removed", file=sys.stderr)
            return 128 + int(signum)
