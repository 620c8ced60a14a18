"""File output helpers shared by the command-line tools.

Outputs are written to a temporary file beside the target and renamed into place, so that an
error never leaves a half-written file behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
