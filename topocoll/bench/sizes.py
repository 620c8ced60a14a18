"""Message sizes as nccl-tests spells them: ``8``, ``128K``, ``1.5M``, ``8G`` (binary units).

:func:`sweep` reproduces nccl-tests' loop: from ``-b`` to ``-e`` inclusive, multiplying by ``-f``
when it is greater than 1, else adding ``-i`` bytes.
"""

from __future__ import annotations

from topocoll.bench.collective_table import BenchArgumentError
from topocoll.units import parse_size

__all__ = ["parse_size", "sweep", "parse_size_range"]


def sweep(min_bytes: int, max_bytes: int, step_factor: int = 1, step_bytes: int = 1 << 20) -> tuple[int, ...]:
    """The sizes nccl-tests visits for ``-b min -e max -f factor -i step``.

    Raises
    ------
    BenchArgumentError
        ``min > max``, a negative size, or a sweep that would never advance.

    Examples
    --------
    >>> sweep(8, 64, step_factor=2)
    (8, 16, 32, 64)
    >>> sweep(100, 350, step_bytes=100)
    (100, 200, 300)
    """
    if min_bytes < 0 or max_bytes < 0:
        raise BenchArgumentError(f"sizes must be >= 0 bytes, got {min_bytes} and {max_bytes}")
    if min_bytes > max_bytes:
        raise BenchArgumentError(f"invalid sizes for 'minbytes' and 'maxbytes': {min_bytes} > {max_bytes}")
    if step_factor > 1:
        if min_bytes == 0:
            raise BenchArgumentError("a size factor (-f) needs a minimum size (-b) above 0")
    elif step_bytes <= 0 and min_bytes < max_bytes:
        raise BenchArgumentError(f"the size increment (-i) must be > 0 bytes, got {step_bytes}")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        if step_factor > 1:
            size *= step_factor
        elif step_bytes > 0:
            size += step_bytes
        else:
            break
    return tuple(sizes)


def parse_size_range(text: str, default_factor: int = 2) -> tuple[int, ...]:
    """Sizes of ``topocoll simulate --sizes``: ``MIN:MAX[:FACTOR]``, a comma list, or one size.

    Examples
    --------
    >>> parse_size_range("1K:8K")
    (1024, 2048, 4096, 8192)
    >>> parse_size_range("1K:16K:4")
    (1024, 4096, 16384)
    >>> parse_size_range("1M,8,2K")
    (8, 2048, 1048576)
    """
    text = str(text).strip()
    if "," in text:
        return tuple(sorted({parse_size(part, "size") for part in text.split(",") if part.strip()}))
    parts = text.split(":")
    if len(parts) == 1:
        return (parse_size(parts[0], "size"),)
    if len(parts) not in (2, 3):
        raise BenchArgumentError(f"invalid size range {text!r}: expected MIN:MAX[:FACTOR] or a comma-separated list")
    factor = default_factor
    if len(parts) == 3:
        try:
            factor = int(parts[2])
        except ValueError:
            raise BenchArgumentError(f"invalid size range {text!r}: the factor must be an integer") from None
        if factor < 2:
            raise BenchArgumentError(f"invalid size range {text!r}: the factor must be >= 2")
    return sweep(parse_size(parts[0], "minimum size"), parse_size(parts[1], "maximum size"), step_factor=factor)
