"""Hostile input files made in a test's ``tmp_path``, and the check that a command refused one.

Every file builder returns the path to pass on the command line and a fragment of the one-line
error expected for it. Deep nesting goes far past Python's recursion limit (1000 by default),
so a recursive parser or walk would fail, not merely slow down. Tampered schedules start from
a real synthesized one and change it so that it still parses but computes the wrong thing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from topocoll.topo.safe_xml import MAX_XML_ATTRIBUTE_CHARS, MAX_XML_DEPTH

DEEP_LEVELS = 5000
"""Nesting of the deep files: five times Python's default recursion limit."""

ZERO_DEVICE = Path("/dev/zero")


def deep_xml(directory: Path) -> tuple[Path, str]:
    """NCCL XML whose ``<pci>`` elements nest :data:`DEEP_LEVELS` levels."""
    path = directory / "deep.xml"
    pci = '<pci busid="0000:01:00.0" class="0x060400" link_speed="16 GT/s" link_width="16">'
    path.write_text(f'<system version="1"><cpu numaid="0">{pci * DEEP_LEVELS}{"</pci>" * DEEP_LEVELS}</cpu></system>\n')
    return path, f"is nested deeper than {MAX_XML_DEPTH} levels"


def deep_json(directory: Path) -> tuple[Path, str]:
    """A JSON object whose ``nodes`` list holds lists nested :data:`DEEP_LEVELS` levels."""
    path = directory / "deep.json"
    path.write_text('{"nodes": ' + "[" * DEEP_LEVELS + "]" * DEEP_LEVELS + ', "links": []}\n')
    return path, "JSON nested deeper than"


def huge_attribute_xml(directory: Path) -> tuple[Path, str]:
    """NCCL XML with one attribute value a character longer than the limit."""
    path = directory / "huge.xml"
    path.write_text(f'<system version="1"><cpu numaid="0" vendor="{"A" * (MAX_XML_ATTRIBUTE_CHARS + 1)}"/></system>\n')
    return path, f"(at most {MAX_XML_ATTRIBUTE_CHARS:,})"


def not_utf8(directory: Path) -> tuple[Path, str]:
    """A file with a byte that no UTF-8 text holds."""
    path = directory / "latin1.json"
    path.write_bytes(b'{"name": "caf\xe9"}\n')
    return path, "not UTF-8 text (byte 13"


def fifo(directory: Path) -> tuple[Path, str]:
    """A named pipe nobody writes to: opening it for reading would block forever."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes on this platform")
    path = directory / "pipe.json"
    os.mkfifo(path)
    return path, "not a regular file (a FIFO)"


def zero_device(directory: Path) -> tuple[Path, str]:
    """``/dev/zero``: endless bytes."""
    if not ZERO_DEVICE.exists():
        pytest.skip(f"no {ZERO_DEVICE} on this platform")
    return ZERO_DEVICE, "not a regular file (a character device)"


def a_directory(directory: Path) -> tuple[Path, str]:
    """A directory where a file is expected."""
    path = directory / "folder.json"
    path.mkdir()
    return path, "not a regular file (a directory)"


Builder = Callable[[Path], tuple[Path, str]]

TOPOLOGY_FILES: dict[str, Builder] = {
    "deep-xml": deep_xml,
    "deep-json": deep_json,
    "huge-attribute": huge_attribute_xml,
    "not-utf8": not_utf8,
    "fifo": fifo,
    "dev-zero": zero_device,
    "directory": a_directory,
}
"""Every hostile topology file, by name (for ``pytest.mark.parametrize``)."""

SCHEDULE_FILES: dict[str, Builder] = {
    "deep-json": deep_json,
    "not-utf8": not_utf8,
    "fifo": fifo,
    "dev-zero": zero_device,
    "directory": a_directory,
}
"""Every hostile schedule file, by name."""


def assert_one_line_error(status: int, stderr: str, prog: str, fragment: str) -> None:
    """Exit status 2, and exactly one line on stderr: ``PROG: error: ...FRAGMENT...``."""
    assert "Traceback" not in stderr, stderr[-2000:]
    lines = stderr.splitlines()
    assert len(lines) == 1, lines[:5]
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    assert fragment in lines[0], lines[0]
    assert status == 2, (status, lines[0])


# --------------------------------------------------------------------------- schedule files

SCHEDULE_WORLD = 4
"""Ranks of the synthesized schedule (the benchmark's flat CPU topology of 4)."""


def synthesized_files(directory: Path) -> tuple[Path, Path]:
    """A flat topology of :data:`SCHEDULE_WORLD` CPU ranks and the allreduce schedule topocoll
    synthesizes (and verifies) for it, written as ``topocoll synthesize`` writes them."""
    from topocoll.solver import plan
    from topocoll.topo.discover import flat_topology

    topology = flat_topology(SCHEDULE_WORLD)
    topology_path = directory / "flat.json"
    topology_path.write_text(topology.to_json())
    schedule_path = directory / "allreduce.json"
    schedule_path.write_text(plan(topology, "allreduce").to_json())
    return topology_path, schedule_path


def changed_destination(data: dict) -> dict:
    """The first transfer of the last step goes to another rank, along a path that exists."""
    transfer = data["steps"][-1][0]
    other = next(r for r in range(len(data["ranks"])) if r not in (transfer["src"], transfer["dst"]))
    transfer["dst"] = other
    transfer["path"] = [*transfer["path"][:-1], data["ranks"][other]]
    return data


def reduce_made_copy(data: dict) -> dict:
    """The first ``reduce`` becomes a ``copy``: one contribution is overwritten, not added."""
    transfer = next(t for step in data["steps"] for t in step if t["op"] == "reduce")
    transfer["op"] = "copy"
    return data


def dropped_step(data: dict) -> dict:
    """The last step is left out."""
    del data["steps"][-1]
    return data


def without_digest(data: dict) -> dict:
    """The topology digest is left out (the file format allows it; the checks do not)."""
    del data["topology_digest"]
    return data


TAMPERINGS: dict[str, Callable[[dict], dict]] = {
    "changed-destination": changed_destination,
    "reduce-made-copy": reduce_made_copy,
    "dropped-step": dropped_step,
}
"""Changes that keep a schedule well-formed JSON but make it compute the wrong thing."""


def tampered_file(schedule_path: Path, change: Callable[[dict], dict], name: str = "tampered.json") -> Path:
    """A copy of ``schedule_path`` beside it, changed by ``change``."""
    data = json.loads(schedule_path.read_text())
    path = schedule_path.with_name(name)
    path.write_text(json.dumps(change(data)))
    return path
