"""Reading and writing topology files in every supported format.

Formats (names used by :func:`sniff_format` and :func:`dumps_topology`):

``json``
    topocoll's topology JSON (contract 1 of the design).
``nccl-xml``
    NCCL topology XML (``NCCL_TOPO_FILE`` / ``NCCL_TOPO_DUMP_FILE``), read and written.
``nvidia-smi``
    The matrix printed by ``nvidia-smi topo -m`` (read only).
``rocm-smi``
    The output of ``rocm-smi --showtopo`` (read only).

The format of an input is told from its content, never from its name, so that a pasted
``topo.txt`` works. Known non-topology files (NCCL graph files, nccl-tests results, bandwidth
tables) are refused with a message saying what they are.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from topocoll import fileio
from topocoll.errors import FormatError, TopocollError
from topocoll.topo.model import Topology
from topocoll.topo.nccl_xml import parse_nccl_xml
from topocoll.topo.nccl_xml_export import to_nccl_xml
from topocoll.topo.safe_xml import root_tag
from topocoll.topo.nvidia_smi import parse_nvidia_smi
from topocoll.topo.rocm_smi import parse_rocm_smi

FORMATS = ("json", "nccl-xml", "nvidia-smi", "rocm-smi")
#: Output format by file extension.
EXTENSIONS = {".json": "json", ".xml": "nccl-xml"}

_NVIDIA_SMI = re.compile(r"^\s*GPU0\s+X(\s|$)", re.MULTILINE)
_ROCM_SMI = re.compile(r"ROCm System Management Interface|(Weight|Hops|Link Type) between two GPUs", re.IGNORECASE)
_NCCL_TESTS = re.compile(r"#\s*nThread\s+\d+|#wrong|\balgbw\b", re.IGNORECASE)
_BW_TABLE = re.compile(r"\|\s*Message Size|bus ?bandwidth|\bbusbw\b", re.IGNORECASE)


def sniff_format(text: str, source: str = "") -> str:
    """Tell the format of a topology file from its content.

    Parameters
    ----------
    text : str
        The file's content.
    source : str, optional
        File name to put in front of error messages.

    Returns
    -------
    str
        One of :data:`FORMATS`.

    Raises
    ------
    FormatError
        The content is not a topology in a known format; benchmark results and NCCL graph
        files are named as such.

    Examples
    --------
    >>> sniff_format('{"nodes": [], "links": []}')
    'json'
    """
    where = f"{source}: " if source else ""
    body = text.lstrip("\ufeff \t\r\n")
    if body.startswith(("{", "[")):
        return "json"
    if body.startswith("<"):
        tag = root_tag(body)
        if tag == "system":
            return "nccl-xml"
        if tag == "graphs":
            raise FormatError(
                f"{where}this is an NCCL graph file (<graphs>: the rings/trees NCCL chose, NCCL_GRAPH_FILE), "
                "not a topology"
            )
        raise FormatError(f"{where}XML with root element <{tag}> is not an NCCL topology (expected <system>)")
    if _NVIDIA_SMI.search(text):
        return "nvidia-smi"
    if _ROCM_SMI.search(text):
        return "rocm-smi"
    if _NCCL_TESTS.search(text):
        raise FormatError(f"{where}this is an nccl-tests result (all_reduce_perf output), not a topology")
    if _BW_TABLE.search(text):
        raise FormatError(f"{where}this is a bandwidth table (measured busbw by message size), not a topology")
    raise FormatError(
        f"{where}cannot tell the format: expected topology JSON, NCCL topology XML, "
        "'nvidia-smi topo -m' or 'rocm-smi --showtopo' output"
    )


def parse_topology(text: str, source: str = "<topology>", fmt: str | None = None) -> Topology:
    """Parse ``text`` in format ``fmt`` (sniffed when None).

    Raises
    ------
    FormatError, TopologyError
        With ``source`` and the element or line in the message.
    """
    fmt = fmt or sniff_format(text, source)
    if fmt == "json":
        return Topology.from_json(text, source)
    if fmt == "nccl-xml":
        return parse_nccl_xml(text, source)
    if fmt == "nvidia-smi":
        return parse_nvidia_smi(text, source)
    if fmt == "rocm-smi":
        return parse_rocm_smi(text, source)
    raise FormatError(f"{source}: unknown format {fmt!r}; known: {', '.join(FORMATS)}")


def load_topology(path: str | os.PathLike) -> Topology:
    """Read a topology file in any supported format.

    Parameters
    ----------
    path : path-like
        The file; its format is told from its content (:func:`sniff_format`).

    Returns
    -------
    Topology

    Raises
    ------
    FormatError
        Not a regular file, larger than :data:`~topocoll.fileio.TOPOLOGY_LIMIT_BYTES`, not
        UTF-8 text, nested too deeply, not a topology, or malformed; the message names the file.
    TopologyError
        The content violates the model; the message names the file.
    OSError
        The file does not exist or cannot be opened (left to the caller).

    See Also
    --------
    save_topology : the other way.
    """
    text = fileio.read_input(path, fileio.TOPOLOGY_LIMIT_BYTES, "topology file")
    return parse_topology(text, str(path))


def dumps_topology(topology: Topology, fmt: str) -> str:
    """The text of ``topology`` in output format ``fmt`` (``json`` or ``nccl-xml``).

    Raises
    ------
    FormatError
        Unknown or read-only format, or a topology the format cannot describe.
    """
    if fmt == "json":
        return topology.to_json()
    if fmt in ("nccl-xml", "xml"):
        return to_nccl_xml(topology)
    raise FormatError(f"cannot write format {fmt!r}; writable: json, nccl-xml")


def save_topology(topology: Topology, path: str | os.PathLike) -> None:
    """Write ``topology`` to ``path``, in the format its extension names (.json or .xml).

    The text is made in full before anything is written, and written atomically, so an error
    never leaves a partial file.

    Raises
    ------
    FormatError
        Unknown extension, or a topology the format cannot describe (the message names the
        file).

    See Also
    --------
    load_topology : the other way.
    """
    suffix = Path(path).suffix.lower()
    if suffix not in EXTENSIONS:
        raise FormatError(f"{path}: unknown output extension {suffix or '(none)'!r}; use .json or .xml")
    try:
        text = dumps_topology(topology, EXTENSIONS[suffix])
    except TopocollError as exc:
        raise type(exc)(f"{path}: {exc}") from None
    fileio.write_atomic(path, text)
