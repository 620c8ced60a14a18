"""Copy the part of a machine's sysfs and procfs that topology discovery reads into a tarball.

The tarball unpacks to ``sys/`` and ``proc/`` trees that ``discover_host(sysfs_root=..., proc_root=...)``
reads as it reads the real ones: the PCI device links under ``sys/bus/pci/devices`` (symbolic
links kept as links), the attributes discovery reads of every PCI device and of each directory
above it, the NUMA nodes, the network and InfiniBand classes, and ``proc/cpuinfo``. Only named
attributes are read (never ``config``, ``rom`` or write-only files), so taking a snapshot is
harmless. Used by ``scripts/gpu-check`` to bring a real machine home as a test fixture.

usage: python scripts/sysfs_snapshot.py OUT.tar.gz [--sys /sys] [--proc /proc]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
from pathlib import Path

#: Attributes of a PCI device (or bridge) that discovery reads, plus the ones a reader of the
#: fixture wants to see (the current link, next to the maximum one).
PCI_ATTRIBUTES = (
    "class", "vendor", "device", "subsystem_vendor", "subsystem_device", "numa_node", "local_cpulist",
    "max_link_speed", "max_link_width", "current_link_speed", "current_link_width",
)
NODE_ATTRIBUTES = ("cpulist",)
NET_ATTRIBUTES = ("speed", "operstate", "type")
PORT_ATTRIBUTES = ("state", "rate", "link_layer")


class Snapshot:
    def __init__(self, sys_root: Path, proc_root: Path, tar: tarfile.TarFile):
        self.sys_root, self.proc_root, self.tar, self.seen = sys_root, proc_root, tar, set()

    def name(self, path: Path) -> str:
        """The name inside the tarball: ``sys/...`` or ``proc/...``."""
        for root, prefix in ((self.sys_root, "sys"), (self.proc_root, "proc")):
            try:
                return str(Path(prefix, path.relative_to(root)))
            except ValueError:
                continue
        raise ValueError(f"{path} is outside {self.sys_root} and {self.proc_root}")

    def add_dirs(self, name: str) -> None:
        parts = Path(name).parts
        for depth in range(1, len(parts)):
            sub = str(Path(*parts[:depth]))
            if sub not in self.seen:
                self.seen.add(sub)
                info = tarfile.TarInfo(sub)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                self.tar.addfile(info)

    def file(self, path: Path) -> None:
        try:
            data = path.read_bytes()
        except OSError:
            return  # absent or unreadable on this machine: discovery meets the same
        name = self.name(path)
        if name in self.seen:
            return
        self.add_dirs(name)
        self.seen.add(name)
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o444
        self.tar.addfile(info, io.BytesIO(data))

    def link(self, path: Path) -> None:
        name = self.name(path)
        if name in self.seen:
            return
        self.add_dirs(name)
        self.seen.add(name)
        info = tarfile.TarInfo(name)
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
        self.tar.addfile(info)

    def attributes(self, directory: Path, names: tuple[str, ...]) -> None:
        for attribute in names:
            self.file(directory / attribute)

    def device_chain(self, real: Path) -> None:
        """A device's attributes and those of every directory above it, up to ``devices/``."""
        devices = (self.sys_root / "devices").resolve()
        here = real
        while here != devices and devices in here.parents:
            self.attributes(here, PCI_ATTRIBUTES)
            here = here.parent

    def take(self) -> None:
        pci = self.sys_root / "bus" / "pci" / "devices"
        for entry in sorted(pci.iterdir()) if pci.is_dir() else []:
            self.link(entry)
            self.device_chain(entry.resolve())
        nodes = self.sys_root / "devices" / "system" / "node"
        for node in sorted(nodes.glob("node[0-9]*")) if nodes.is_dir() else []:
            self.attributes(node, NODE_ATTRIBUTES)
        for klass, names in (("net", NET_ATTRIBUTES), ("infiniband", ())):
            root = self.sys_root / "class" / klass
            for entry in sorted(root.iterdir()) if root.is_dir() else []:
                self.link(entry)
                real = entry.resolve()
                self.attributes(real, names)
                if (real / "device").is_symlink():
                    self.link(real / "device")
                for port in sorted((real / "ports").glob("*")) if (real / "ports").is_dir() else []:
                    self.attributes(port, PORT_ATTRIBUTES)
        self.file(self.proc_root / "cpuinfo")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the tarball to write (.tar.gz)")
    parser.add_argument("--sys", type=Path, default=Path("/sys"), help="sysfs root (default /sys)")
    parser.add_argument("--proc", type=Path, default=Path("/proc"), help="procfs root (default /proc)")
    args = parser.parse_args(argv)
    with tarfile.open(args.out, "w:gz") as tar:
        snapshot = Snapshot(args.sys, args.proc, tar)
        snapshot.take()
    print(f"wrote {args.out} ({len(snapshot.seen)} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
