"""File input and output helpers shared by every loader and command-line tool.

Inputs (topology and schedule files) are read by :func:`read_input` only: regular files of a
bounded size, decoded as UTF-8, so that a FIFO, a device such as ``/dev/zero`` or a huge file
is refused with one line instead of blocking or filling memory. JSON text is parsed by
:func:`loads_json`, which turns nesting too deep for Python's parser into a
:class:`~topocoll.errors.FormatError`.

Outputs are written to a temporary file beside the target and renamed into place, so that an
error never leaves a half-written file behind.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

from topocoll.errors import FormatError, UsageError

MIB = 1 << 20

TOPOLOGY_LIMIT_BYTES = 64 * MIB
"""Largest topology file read (64 MiB).

The real files kept in ``tests/data/topologies`` are at most 12 kB (one 8-GPU machine in NCCL
XML), and the JSON of a 1024-GPU cluster (``topocoll topo preset dgx-h100 --nodes 128
--network fat-tree``) is 3.9 MB, so 64 MiB fits clusters of about 16,000 GPUs while a file far
beyond any machine is refused before it is read."""

SCHEDULE_LIMIT_BYTES = 1024 * MIB
"""Largest schedule file read (1 GiB).

Schedules grow with the square of the rank count (a ring allreduce has ``2 N (N - 1)``
transfers): 2.5 MB at 128 ranks, about 200 MB for a 1024-rank allreduce. 1 GiB leaves room for
about 2048 ranks; parsing costs several times the file size in memory, so this is also the
bound on what a schedule can make a loader allocate."""

_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _check_regular(path: str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _FILE_KINDS if test(mode)), "a special file")
        raise FormatError(f"{path}: not a regular file ({kind})")


def _check_size(path: str, size_bytes: int, limit_bytes: int, what: str) -> None:
    if size_bytes > limit_bytes:
        raise FormatError(
            f"{path}: {size_bytes:,} bytes is more than the {limit_bytes:,} bytes allowed for a {what}"
        )


def read_input(path: str | os.PathLike, limit_bytes: int, what: str = "file") -> str:
    """The text of the input file ``path``: a regular file of at most ``limit_bytes``, in UTF-8.

    The path is stat'ed before it is opened, so a FIFO or a device is refused without blocking;
    the file is then opened non-blocking and checked again on the open descriptor (it may have
    been replaced in between), and at most ``limit_bytes + 1`` bytes are read (it may grow).

    Parameters
    ----------
    path : path-like
        The file.
    limit_bytes : int
        Largest accepted size, e.g. :data:`TOPOLOGY_LIMIT_BYTES` or :data:`SCHEDULE_LIMIT_BYTES`.
    what : str
        What the file is, for the message about its size ("topology file", ...).

    Returns
    -------
    str
        The decoded text.

    Raises
    ------
    FormatError
        ``"PATH: not a regular file (a FIFO)"``, a size over the limit, or bytes that are not
        UTF-8 (the message gives the offset of the first bad byte).
    OSError
        The file does not exist or cannot be opened (left to the caller).

    Examples
    --------
    >>> read_input("/dev/null", 10)
    Traceback (most recent call last):
    ...
    topocoll.errors.FormatError: /dev/null: not a regular file (a character device)
    """
    name = str(path)
    _check_regular(name, os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        _check_regular(name, info.st_mode)
        _check_size(name, info.st_size, limit_bytes, what)
        data = handle.read(limit_bytes + 1)
    _check_size(name, len(data), limit_bytes, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{name}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def loads_json(text: str, source: str, **options: Any) -> Any:
    """``json.loads(text, **options)``, with nesting too deep for the parser as a FormatError.

    Python's ``json`` recurses once per nested array or object and raises ``RecursionError``
    near the interpreter's recursion limit (``sys.getrecursionlimit()``, 1000 by default).
    topocoll's topology and schedule files nest at most five levels deep, so only a hostile or
    corrupted file gets there; this is the one place that says so. Malformed JSON is left to
    the caller (``json.JSONDecodeError``), which knows what the file should hold.

    Raises
    ------
    FormatError
        ``"SOURCE: JSON nested deeper than ... levels"``.
    json.JSONDecodeError
        Malformed JSON.
    """
    try:
        return json.loads(text, **options)
    except RecursionError:
        raise FormatError(
            f"{source}: JSON nested deeper than the parser allows (about {sys.getrecursionlimit()} levels); "
            "topology and schedule files nest at most 5 levels"
        ) from None


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` to ``path`` all at once (temporary file + rename).

    Parameters
    ----------
    path : path-like
        Destination; its directory must exist.
    data : str or bytes
        Text is written as UTF-8.
    """
    target = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        # mkstemp creates the file private (0600); give it the permissions a plain open()
        # would have under the current umask.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_output_path(path: str | os.PathLike, option: str | None = None, extensions: tuple[str, ...] | None = None) -> None:
    """Refuse an output path before any work is done: a folder that does not exist, or (with
    ``extensions``) a name that does not end in one of them.

    Parameters
    ----------
    path : str or path-like
    option : str, optional
        The command-line option that named it (``"-o"``, ``"--plot"``), for the message.
    extensions : tuple of str, optional
        Lower-case suffixes accepted (``(".json", ".xml")``).

    Raises
    ------
    UsageError
        ``"[OPTION ]PATH: directory D does not exist"`` or ``"...: unknown output extension"``.
    """
    target = Path(path)
    label = f"{option} {path}" if option else str(path)
    if extensions is not None and target.suffix.lower() not in extensions:
        raise UsageError(f"{label}: unknown output extension {target.suffix or '(none)'!r}; use {' or '.join(extensions)}")
    parent = target.resolve().parent
    if not parent.is_dir():
        raise UsageError(f"{label}: directory {parent} does not exist")
