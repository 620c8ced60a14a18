"""Emulated hosts on one machine: network namespaces, veth pairs, bridges and tc shaping.

:class:`EmulatedCluster` brings up the network that :func:`topocoll.bench.scenario.network_plan`
plans, starts one *holder* process per host that owns the host's mount and UTS namespaces
(its private ``/dev/shm`` and its hostname), runs commands inside a host
(:meth:`EmulatedCluster.host_exec`) or one rank per host (:meth:`EmulatedCluster.run_ranks`),
and removes everything again. Every process it starts carries ``TOPOCOLL_EMULATE_RUN=<run id>``
in its environment, so that teardown finds and ends them even when the launcher died; deleting
a namespace deletes its interfaces, their veth peers and their qdiscs.

Rate shaping, as measured on the 2-core machine this was written on (kernel 6.18, iproute2
6.1): a Python TCP stream between two namespaces over a veth pair shaped by
``tbf rate R burst 64kb latency 50ms`` on both ends carried 191.4 Mbit/s of payload at
R = 200 Mbit/s and 47.9 Mbit/s at R = 50 Mbit/s, both 4.3 % below R: tbf counts whole
frames, and 1448 payload bytes travel in a 1514-byte frame (95.6 %), so the rate on the wire
is within 0.1 % of the setting. With the parameters :func:`~topocoll.bench.scenario.qdisc_commands`
uses (a 2 ms bucket, a 5 ms queue) and a bridge in the path, the rate test of the test suite
measures 76.6 Mbit/s of payload at 80 Mbit/s (95.7 %, the same frame overhead). Unshaped, the same stream ran at 13-15 Gbit/s, so the
CPU is not what limits a scenario of a few hundred Mbit/s. ``netem`` (rate or delay) could not
be measured there: that kernel has no ``sch_netem`` (only tbf, htb, pfifo, ingress and clsact).
tbf therefore sets every rate; delays use a netem root with the tbf as its child where the
kernel has netem, and a run with delays on a kernel without it is refused unless delays are
switched off (``apply_delays=False``, ``--no-delay``), which the truth topology then records.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import topocoll
from topocoll import fileio
from topocoll.bench.network_plan import DEFAULT_SUBNET_BASE, NetworkPlan, network_plan
from topocoll.bench.scenario import Scenario, check_ranks, scenario_topology
from topocoll.errors import EmulateError
from topocoll.topo.io import save_topology

__all__ = [
    "DEFAULT_STATE_DIR",
    "RUN_MARKER",
    "EmulatedCluster",
    "RunResult",
    "preflight",
    "list_states",
    "teardown_state",
    "TIMEOUT_EXIT_STATUS",
]

log = logging.getLogger(__name__)

#: Where ``up`` keeps state files and truth topologies (a tmpfs: nothing survives a reboot,
#: as nothing of a run does).
DEFAULT_STATE_DIR = Path("/run/topocoll-emulate")

#: Environment variable that marks every process of a run with its run id.
RUN_MARKER = "TOPOCOLL_EMULATE_RUN"

STATE_FORMAT = "topocoll.emulate-state/1"

#: Commands the emulation needs on the machine.
REQUIRED_TOOLS = ("ip", "tc", "unshare", "nsenter", "sysctl", "mount", "hostname")

#: The exit status of a run stopped by its timeout (the one of coreutils' ``timeout``).
TIMEOUT_EXIT_STATUS = 124

#: Seconds a rank (or holder) gets between SIGTERM and SIGKILL.
TERMINATE_GRACE_S = 3.0

#: Seconds a holder process gets to mount its /dev/shm and set its hostname.
HOLDER_READY_S = 10.0

#: Seconds one ``ip``/``tc`` command may take.
COMMAND_TIMEOUT_S = 20.0

# The holder: in new mount and UTS namespaces (inside the host's network namespace), a private
# tmpfs on /dev/shm, the host's name, an /etc/hosts naming every emulated host (so that 'h2'
# resolves, and addresses resolve back to names), then nothing but waiting (exec keeps the pid).
_HOLDER_SCRIPT = (
    'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && hostname "$1" && mount --bind "$2" /etc/hosts '
    "&& echo ready && exec sleep infinity"
)


# ------------------------------------------------------------------------------ checks
def preflight() -> None:
    """Refuse, with one line, where emulated hosts cannot be made.

    Raises
    ------
    EmulateError
        Not root, a required tool missing, or ``ip netns`` not working.
    """
    if os.geteuid() != 0:
        raise EmulateError("emulated hosts need root (network namespaces, tc, mounts); run as root")
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        raise EmulateError(f"missing command(s) {', '.join(missing)}: install iproute2 and util-linux")
    result = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if result.returncode != 0:
        raise EmulateError(f"'ip netns' does not work here: {_first_line(result.stderr)}")


def check_subnet_free(subnet_base: str) -> None:
    """Refuse a subnet base that the machine already routes or has addresses in.

    Raises
    ------
    EmulateError
        A route or an address of the machine's own namespace overlaps ``subnet_base``.
    """
    base = ipaddress.IPv4Network(subnet_base)
    result = subprocess.run(["ip", "-j", "-4", "route", "show", "table", "all"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    for route in json.loads(result.stdout or "[]"):
        dst = route.get("dst", "")
        if dst in ("", "default"):
            continue
        try:
            net = ipaddress.IPv4Network(dst, strict=False)
        except ValueError:
            continue
        if net.overlaps(base):
            raise EmulateError(f"subnet base {subnet_base} overlaps route {dst} of this machine; pick another with --subnet")


def _first_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
    log.debug("run: %s", " ".join(argv))
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if check and result.returncode != 0:
        raise EmulateError(f"{' '.join(argv)}: {_first_line(result.stderr)}")
    return result


# ----------------------------------------------------------------------- environment
def child_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of processes started in an emulated host.

    ``python`` and console scripts resolve to this interpreter (its directory first on
    ``PATH``), and ``PYTHONPATH`` starts with the directory holding this ``topocoll`` package,
    so that the child imports the same checkout as the launcher.
    """
    env = dict(os.environ if base is None else base)
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join([bindir, *[p for p in env.get("PATH", "").split(os.pathsep) if p and p != bindir]])
    package_parent = str(Path(topocoll.__file__).resolve().parent.parent)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != package_parent]
    env["PYTHONPATH"] = os.pathsep.join([package_parent, *rest])
    return env


def _pids_with_marker(run_id: str) -> list[int]:
    needle = f"{RUN_MARKER}={run_id}".encode()
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _end_processes(pids: Sequence[int], grace_s: float = TERMINATE_GRACE_S) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``, to each pid (ignoring the ones already gone)."""
    alive = list(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in alive if _alive(pid)]
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# ---------------------------------------------------------------------------- state
def list_states(state_dir: str | os.PathLike = DEFAULT_STATE_DIR) -> list[dict[str, Any]]:
    """The state records of the runs in ``state_dir`` (each with its ``path``), by name."""
    folder = Path(state_dir)
    states = []
    if folder.is_dir():
        for path in sorted(folder.glob("*.state.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                log.warning("%s: unreadable state file, skipped", path)
                continue
            if isinstance(data, dict) and data.get("format") == STATE_FORMAT:
                data["path"] = str(path)
                states.append(data)
    return sorted(states, key=lambda s: s.get("name", ""))


def teardown_state(state: Mapping[str, Any]) -> list[str]:
    """Remove everything a state record lists; go on past failures.

    Ends the run's processes (those marked with its run id), deletes its namespaces (with
    their interfaces and qdiscs), then its files and the state file itself.

    Returns
    -------
    list of str
        One line per step that failed (empty when all went).
    """
    problems: list[str] = []
    run_id = state.get("run_id", "")
    try:
        if run_id:
            _end_processes(_pids_with_marker(run_id))
    except Exception as exc:  # noqa: BLE001 - teardown goes on whatever failed
        problems.append(f"ending processes of run {run_id}: {exc}")
    existing = set(_netns_list())
    for ns in state.get("namespaces", []):
        if ns not in existing:
            continue
        try:
            _run(["ip", "netns", "delete", ns])
        except Exception as exc:  # noqa: BLE001
            problems.append(str(exc))
    for name in [*state.get("files", []), state.get("path")]:
        if name:
            try:
                Path(name).unlink(missing_ok=True)
            except OSError as exc:
                problems.append(f"{name}: {exc.strerror}")
    for problem in problems:
        log.warning("teardown: %s", problem)
    return problems


def _netns_list() -> list[str]:
    result = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    return [line.split()[0] for line in result.stdout.splitlines() if line.strip()]


# --------------------------------------------------------------------------- cluster
#: The topo backend's topology variable: the truth unless the caller set one.
TOPOLOGY_VARIABLE = "TOPOCOLL_TOPOLOGY"


@dataclass(frozen=True, slots=True)
class RunResult:
    """Outcome of :meth:`EmulatedCluster.run_ranks`.

    Parameters
    ----------
    returncode : int
        0 when every rank succeeded; the first failing rank's status (128 + signal for a
        signal); :data:`TIMEOUT_EXIT_STATUS` when the timeout passed.
    rank_returncodes : tuple of int or None
        Each rank's status; None for a rank that was still running when stopped.
    failed_rank : int or None
        The first rank that failed, if any.
    timed_out : bool
    """

    returncode: int
    rank_returncodes: tuple[int | None, ...]
    failed_rank: int | None
    timed_out: bool


class EmulatedCluster:
    """K emulated hosts on this machine, made from a scenario; a context manager.

    Parameters
    ----------
    scenario : Scenario
    name : str, optional
        Name of the run for ``topocoll emulate down NAME`` (default ``<scenario>-<run id>``).
    state_dir : path-like
        Where the state file and the truth topology go.
    subnet_base : str
        The /16 the hosts' addresses come from; refused when the machine routes it.
    apply_delays : bool
        Emulate the links' delays with netem (False: rates only).
    port_queue : str
        How shaped ports queue: ``fifo`` (drop-tail, an Ethernet switch) or ``fair`` (a queue
        per flow, a pair of hosts, served in turn); see :data:`topocoll.bench.network_plan.PORT_QUEUES`.
    run_id : str, optional
        4-6 hex digits; drawn at random by default.

    Examples
    --------
    >>> with EmulatedCluster(load_scenario("two-racks")) as cluster:  # doctest: +SKIP
    ...     cluster.host_exec("h0", ["tc", "-s", "qdisc", "show", "dev", "eth0"]).stdout
    ...     cluster.run_ranks(["python", "train.py"]).returncode
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        name: str | None = None,
        state_dir: str | os.PathLike = DEFAULT_STATE_DIR,
        subnet_base: str = DEFAULT_SUBNET_BASE,
        apply_delays: bool = True,
        port_queue: str = "fifo",
        run_id: str | None = None,
    ) -> None:
        self.scenario = scenario
        self.run_id = run_id or secrets.token_hex(3)
        self.plan: NetworkPlan = network_plan(
            scenario, self.run_id, subnet_base=subnet_base, apply_delays=apply_delays, port_queue=port_queue
        )
        self.name = name or f"{scenario.name}-{self.run_id}"
        self.state_dir = Path(state_dir)
        self.subnet_base = subnet_base
        self.truth_path = self.state_dir / f"{self.run_id}.truth.json"
        self.state_path = self.state_dir / f"{self.run_id}.state.json"
        self.hosts_path = self.state_dir / f"{self.run_id}.hosts"
        self._holders: dict[str, int] = {}
        self._holder_procs: list[subprocess.Popen] = []
        self._up = False

    # ------------------------------------------------------------------ life cycle
    def __enter__(self) -> "EmulatedCluster":
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        """Create the namespaces, links, qdiscs, routes and holder processes.

        Raises
        ------
        EmulateError
            Any refusal of :func:`preflight`, a clashing name or subnet, a kernel without
            netem for a scenario with delays, or a failing command; whatever was made is
            removed before it is raised.
        """
        preflight()
        check_subnet_free(self.subnet_base)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if any(s.get("name") == self.name for s in list_states(self.state_dir)):
            raise EmulateError(f"an emulated cluster named {self.name!r} is already up; 'topocoll emulate down {self.name}' first")
        clash = set(self.plan.namespaces) & set(_netns_list())
        if clash:
            raise EmulateError(f"namespace {sorted(clash)[0]} already exists; pick another run id")
        self._write_state()  # before anything exists, so that a crash leaves a record to clean up
        try:
            commands = self.plan.setup_commands()
            n_ns = 2 * len(self.plan.namespaces)
            for argv in commands[:n_ns]:
                _run(argv)
            if self.plan.apply_delays and any(link.delay_s > 0 for link in self.scenario.links):
                self._check_netem()
            for argv in commands[n_ns:]:
                _run(argv)
            save_topology(scenario_topology(self.scenario, delays_applied=self.plan.apply_delays), self.truth_path)
            fileio.write_atomic(self.hosts_path, self.plan.hosts_file())
            for host in self.scenario.hosts:
                self._start_holder(host)
            self._write_state()
            self._up = True
        except BaseException:
            self.down()
            raise

    def _check_netem(self) -> None:
        fab = self.plan.fabric_namespace
        probe = _run(["tc", "-n", fab, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1us"], check=False)
        if probe.returncode != 0:
            raise EmulateError(
                "the scenario's links have delays but this kernel has no netem qdisc (sch_netem); "
                "load it (modprobe sch_netem) or emulate rates only with --no-delay"
            )
        _run(["tc", "-n", fab, "qdisc", "del", "dev", "lo", "root"], check=False)

    def _start_holder(self, host: str) -> None:
        ns = self.plan.namespace(host)
        argv = ["ip", "netns", "exec", ns, "unshare", "-m", "-u", "--propagation", "private", "--", "sh", "-c", _HOLDER_SCRIPT, "sh", host, str(self.hosts_path)]
        env = {**os.environ, RUN_MARKER: self.run_id}
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
        self._holder_procs.append(proc)
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            ready = sel.select(HOLDER_READY_S)
        line = proc.stdout.readline().decode(errors="replace").strip() if ready else ""
        if line != "ready":
            proc.kill()
            err = proc.stderr.read().decode(errors="replace") if proc.poll() is not None else "no answer"
            raise EmulateError(f"host {host}: cannot make its mount and UTS namespaces: {_first_line(err)}")
        self._holders[host] = proc.pid

    def _write_state(self) -> None:
        state = {
            "format": STATE_FORMAT,
            "name": self.name,
            "run_id": self.run_id,
            "scenario": self.scenario.name,
            "namespaces": list(self.plan.namespaces),
            "hosts": {host: {"namespace": ns, "holder_pid": self._holders.get(host)} for host, ns in self.plan.host_namespaces},
            "files": [str(self.truth_path), str(self.hosts_path)],
            "truth": str(self.truth_path),
            "addresses": {n.host + "." + n.ifname: n.address for n in self.plan.nics},
        }
        fileio.write_atomic(self.state_path, json.dumps(state, indent=2, sort_keys=True) + "\n")

    def down(self) -> list[str]:
        """Remove everything of this run (processes, namespaces, files); goes on past failures.

        Returns
        -------
        list of str
            The steps that failed (empty when all went).
        """
        problems = teardown_state(
            {
                "run_id": self.run_id,
                "namespaces": list(self.plan.namespaces),
                "files": [str(self.truth_path), str(self.hosts_path)],
                "path": str(self.state_path),
            }
        )
        for proc in self._holder_procs:
            with contextlib.suppress(Exception):
                proc.wait(timeout=1)
                proc.stdout.close()
                proc.stderr.close()
        self._holder_procs.clear()
        self._holders.clear()
        self._up = False
        return problems

    def renew_queues(self) -> None:
        """Replace every shaped port's queues with new ones, as :meth:`up` made them.

        A cluster's queues carry something from one run to the next that neither the counters
        of ``tc -s`` nor TCP's saved metrics show: measured on ``two-racks`` with ``fair`` ports,
        one ``topocoll-bench reduce_scatter -b 16M -e 64M`` process after another on the same
        cluster took 5.88-5.89 s per 64 MiB call in the first process and 6.56-6.59 s (in
        place 7.04 s) in the second, in three clusters, also with
        ``net.ipv4.tcp_no_metrics_save=1``; with the queues renewed between the two, the
        second took 5.88 s too. Benchmarks renew them before each process, so that every
        measurement meets the network a new cluster offers.

        Raises
        ------
        EmulateError
            The cluster is not up, or a ``tc`` command fails.
        """
        if not self._up:
            raise EmulateError(f"emulated cluster {self.name!r} is not up")
        for argv in self.plan.requeue_commands():
            _run(argv)

    # ----------------------------------------------------------------- using hosts
    def host_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run in ``host``'s network, mount and UTS namespaces."""
        if host not in self._holders:
            raise EmulateError(f"host {host!r} is not up in {self.name}")
        return ["nsenter", "-t", str(self._holders[host]), "-n", "-m", "-u", f"--wd={os.getcwd()}", "--", *argv]

    def host_popen(self, host: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` in ``host`` (its own process group) and return the Popen."""
        child_env = child_environment(env)
        child_env[RUN_MARKER] = self.run_id
        return subprocess.Popen(self.host_argv(host, argv), env=child_env, start_new_session=True, **kwargs)

    def host_exec(self, host: str, argv: Sequence[str], *, timeout_s: float = 60.0, check: bool = False, **kwargs: Any) -> subprocess.CompletedProcess:
        """Run ``argv`` in ``host`` to completion and return its result (text output captured).

        Parameters
        ----------
        host : str
        argv : sequence of str
            E.g. ``["tc", "-s", "qdisc", "show", "dev", "eth0"]``.
        timeout_s : float
            Killed (and ``subprocess.TimeoutExpired`` raised) after this long.
        check : bool
            Raise ``subprocess.CalledProcessError`` on a non-zero status.
        """
        env = child_environment(kwargs.pop("env", None))
        env[RUN_MARKER] = self.run_id
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.host_argv(host, argv), env=env, timeout=timeout_s, check=check, **kwargs)

    def interface_stats(self, host: str, ifname: str) -> int:
        """Bytes sent so far by ``host``'s interface ``ifname``."""
        result = _run(["ip", "-n", self.plan.namespace(host), "-j", "-s", "link", "show", "dev", ifname])
        return int(json.loads(result.stdout)[0]["stats64"]["tx"]["bytes"])

    def free_port(self, host: str) -> int:
        """A TCP port nothing listens on in ``host`` (the kernel's choice, bound there)."""
        code = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
        return int(self.host_exec(host, [sys.executable, "-c", code], check=True).stdout.strip())

    def rank_environment(self, rank: int, world_size: int, master_port: int) -> dict[str, str]:
        """The variables a torchrun/env:// program needs, for rank ``rank`` on host ``rank``."""
        host = self.scenario.hosts[rank]
        return {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": self.plan.address(self.scenario.hosts[0], "eth0"),
            "MASTER_PORT": str(master_port),
            "GLOO_SOCKET_IFNAME": "eth0",
            "NCCL_SOCKET_IFNAME": "eth0",
            "NCCL_HOSTID": host,
            "TOPOCOLL_HOSTID": host,
            "TOPOCOLL_TOPOLOGY": str(self.truth_path),
            "TOPOCOLL_EMULATE_SCENARIO": self.scenario.name,
        }

    def run_ranks(
        self,
        argv: Sequence[str],
        *,
        ranks: int | None = None,
        timeout_s: float | None = None,
        stdout: IO[str] | None = None,
        stderr: IO[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Run ``argv`` once per host, rank i on host i, and wait for all.

        Each rank's output lines are written to ``stdout`` / ``stderr`` (default: ours)
        prefixed with ``[<host>] ``. When a rank fails or the timeout passes, the others are
        ended (SIGTERM to their process groups, SIGKILL after a grace period).

        Parameters
        ----------
        argv : sequence of str
        ranks : int, optional
            How many ranks (hosts 0..ranks-1); default every host.
        timeout_s : float, optional
        stdout, stderr : text streams, optional
        env : mapping, optional
            Base environment (default ours); the rank variables of :meth:`rank_environment`
            are added (``TOPOCOLL_TOPOLOGY`` only when the base has none: a topology the
            caller chose, e.g. a probed one, is kept), and ``OMP_NUM_THREADS`` = cores / ranks unless set (the ranks share
            this machine's cores, as torchrun's co-located ranks do).

        Returns
        -------
        RunResult
        """
        world = check_ranks(self.scenario, ranks)
        out = stdout or sys.stdout
        err = stderr or sys.stderr
        port = self.free_port(self.scenario.hosts[0])
        base = dict(os.environ if env is None else env)
        base.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
        lock = threading.Lock()
        procs: list[subprocess.Popen] = []
        pumps: list[threading.Thread] = []
        codes: list[int | None] = [None] * world
        failed: int | None = None
        timed_out = False
        try:
            for rank in range(world):
                host = self.scenario.hosts[rank]
                rank_env = self.rank_environment(rank, world, port)
                if base.get(TOPOLOGY_VARIABLE):  # a topology the caller chose (a probed one) wins
                    rank_env[TOPOLOGY_VARIABLE] = base[TOPOLOGY_VARIABLE]
                proc = self.host_popen(
                    host, argv, env={**base, **rank_env},
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                )
                procs.append(proc)
                for pipe, sink in ((proc.stdout, out), (proc.stderr, err)):
                    pump = threading.Thread(target=_pump, args=(pipe, sink, f"[{host}] ", lock), daemon=True)
                    pump.start()
                    pumps.append(pump)
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while any(c is None for c in codes):
                for rank, proc in enumerate(procs):
                    if codes[rank] is None and proc.poll() is not None:
                        codes[rank] = _status(proc.returncode)
                        if codes[rank] != 0 and failed is None:
                            failed = rank
                if failed is not None:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.05)
        finally:
            _end_groups([p for p, c in zip(procs, codes) if c is None])
            for pump in pumps:
                pump.join(timeout=2)
        if timed_out:
            with lock:
                print(f"topocoll emulate: timeout after {timeout_s:g} s, ranks stopped", file=err, flush=True)
            return RunResult(TIMEOUT_EXIT_STATUS, tuple(codes), failed, True)
        returncode = 0 if failed is None else int(codes[failed] or 1)
        if failed is not None:
            with lock:
                print(f"topocoll emulate: rank {failed} ({self.scenario.hosts[failed]}) exited with {returncode}, others stopped", file=err, flush=True)
        return RunResult(returncode, tuple(codes), failed, False)


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _pump(pipe: IO[bytes], sink: IO[str], prefix: str, lock: threading.Lock) -> None:
    with contextlib.suppress(ValueError, OSError):
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            with lock:
                sink.write(f"{prefix}{line}\n")
                sink.flush()
    with contextlib.suppress(OSError):
        pipe.close()


def _end_groups(procs: Sequence[subprocess.Popen]) -> None:
    """SIGTERM to each process group, SIGKILL after the grace period, then reap."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=TERMINATE_GRACE_S)
