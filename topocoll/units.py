"""Sizes and rates as people write and read them.

Inside topocoll everything is bytes, bytes per second and seconds. Sizes on command lines
follow nccl-tests (``8``, ``128K``, ``1.5M``, ``8G``: powers of 1024); reports print GB/s
with GB = 1e9 bytes (nccl-tests' and the vendors' convention) and times in µs.
"""

from __future__ import annotations

import re

from topocoll.errors import UsageError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
GB = 1e9
"""Bytes in a GB: nccl-tests and the vendors' whitepapers count GB as 1e9 bytes."""


def parse_size(text: str, what: str = "size") -> int:
    """Bytes of ``text``: a number with an optional K/M/G/T suffix (powers of 1024).

    Parameters
    ----------
    text : str
        ``"8"``, ``"128M"``, ``"1.5k"``, ``"4GiB"``.
    what : str
        Name used in the error message (``"minbytes"``, ...).

    Returns
    -------
    int
        Bytes, rounded down as nccl-tests does.

    Raises
    ------
    UsageError
        Not a size.

    Examples
    --------
    >>> parse_size("128M")
    134217728
    >>> parse_size("1.5K")
    1536
    """
    match = _SIZE.match(str(text))
    if not match:
        raise UsageError(f"invalid {what} {text!r}: expected a number of bytes with an optional K, M or G suffix")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.upper()])


def format_size(size_bytes: float) -> str:
    """``134217728`` -> ``"128 MiB"``; exact multiples get the largest binary unit.

    See Also
    --------
    size_label : the short form of plots and tables (``"128M"``).
    """
    size = int(size_bytes)
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def size_label(size_bytes: int) -> str:
    """Short binary label for plots: ``8``, ``4K``, ``128M``, ``1.5G`` (nccl-tests' spelling).

    Examples
    --------
    >>> [size_label(s) for s in (8, 1536, 128 << 20)]
    ['8', '1.5K', '128M']
    """
    for unit in ("T", "G", "M", "K"):
        scale = _UNITS[unit]
        if size_bytes >= scale:
            return f"{size_bytes / scale:g}{unit}"
    return str(size_bytes)


def format_bandwidth(bw_bytes_per_s: float) -> str:
    """Bytes per second as GB/s (1e9) with two decimals."""
    return f"{bw_bytes_per_s / GB:.2f} GB/s"


def format_time(time_s: float) -> str:
    """Seconds as µs, ms or s, whichever reads best."""
    if time_s < 1e-3:
        return f"{time_s * 1e6:.1f} µs"
    if time_s < 1:
        return f"{time_s * 1e3:.2f} ms"
    return f"{time_s:.2f} s"
