"""Who this process is: its machine and the NUMA node of the CPUs it may run on.

A rank of a process group publishes these (with its device, which the torch side knows) so
that the group can place every rank on the right node of the topology instead of guessing from
rank numbers. Like :mod:`topocoll.topo.discover`, this module reads the host; it reads only the
few files named below, under injectable roots so tests can pass a fake tree.

Two processes are on the same machine when they have the same host *key*: the host name and
the kernel's boot id (``/proc/sys/kernel/random/boot_id``), as NCCL tells hosts apart
(``getHostHash`` in its ``src/misc/utils.cc`` hashes the host name and the boot id). The host
name alone is not enough (containers on different machines are often all called
``localhost``), the boot id alone is not either (network namespaces of one kernel that stand
for different hosts share it but have their own host names). An override (``override=``, set by
the caller from ``$TOPOCOLL_HOSTID``, as ``NCCL_HOSTID`` does for NCCL) replaces both.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["HostIdentity", "host_identity", "numa_of_cpus", "parse_cpu_list", "process_cpus"]


@dataclass(frozen=True, slots=True)
class HostIdentity:
    """The machine a process runs on.

    Parameters
    ----------
    name : str
        Host name, for messages and as the ``host_id`` of the machine's topology nodes.
    key : str
        Equal for two processes exactly when they share the machine.
    """

    name: str
    key: str


def host_identity(proc_root: str | Path = "/proc", *, override: str | None = None) -> HostIdentity:
    """This machine's :class:`HostIdentity`.

    Parameters
    ----------
    proc_root : path
        Root of the proc file system (tests pass a fake one).
    override : str, optional
        Use this as both name and key (``$TOPOCOLL_HOSTID``).

    Examples
    --------
    >>> host_identity(override="node7")
    HostIdentity(name='node7', key='node7')
    """
    if override:
        return HostIdentity(override, override)
    name = socket.gethostname() or "localhost"
    try:
        boot_id = (Path(proc_root) / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError as exc:
        log.warning("cannot read the boot id (%s): hosts are told apart by host name alone", exc)
        boot_id = ""
    return HostIdentity(name, f"{name}/{boot_id}" if boot_id else name)


def parse_cpu_list(text: str) -> frozenset[int]:
    """The CPUs of a sysfs CPU list such as ``"0-3,8,10-11"``.

    Raises
    ------
    ValueError
        The text is not a CPU list.

    Examples
    --------
    >>> sorted(parse_cpu_list("0-2,5"))
    [0, 1, 2, 5]
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        low, high = int(first), int(last or first)
        if low < 0 or high < low:
            raise ValueError(f"bad CPU range {part!r}")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def numa_of_cpus(cpus: Iterable[int], sysfs_root: str | Path = "/sys") -> int | None:
    """The NUMA node holding most of ``cpus`` (a process's affinity), or None when unknown.

    Reads ``<sysfs>/devices/system/node/node<k>/cpulist``. Ties go to the lowest node; a
    machine that lists no NUMA node (or CPUs no node lists) gives None.

    Parameters
    ----------
    cpus : iterable of int
        CPU numbers, e.g. ``os.sched_getaffinity(0)``.
    sysfs_root : path
        Root of the sysfs tree.
    """
    wanted = set(cpus)
    counts: Counter[int] = Counter()
    root = Path(sysfs_root) / "devices" / "system" / "node"
    try:
        entries = sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:]))
    except (OSError, ValueError):
        return None
    for entry in entries:
        try:
            members = parse_cpu_list((entry / "cpulist").read_text())
        except (OSError, ValueError) as exc:
            log.warning("cannot read %s/cpulist: %s", entry.name, exc)
            continue
        shared = len(members & wanted)
        if shared:
            counts[int(entry.name[4:])] = shared
    if not counts:
        return None
    best = max(counts.values())
    return min(node for node, count in counts.items() if count == best)


def process_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity)."""
    return frozenset(os.sched_getaffinity(0))
