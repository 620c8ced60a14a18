"""``TOPOCOLL_DEBUG``: what the backend says about its choices, as ``NCCL_DEBUG`` does for NCCL.

``TOPOCOLL_DEBUG=INFO`` makes every rank log, at group creation, the topology summary, where
the topology came from and which node it runs on, and rank 0 log, for every collective and
size bucket it plans, the schedule it chose and its share of the cut bound. ``WARN`` logs only
warnings (a topology whose links are partly unknown, discovery that could not read
something); ``TRACE`` adds the details of every schedule exchange. Lines go to standard error
as ``host:pid topocoll LEVEL message``. Without the variable topocoll leaves logging to the
application (the ``topocoll`` logger, which has no handler of its own).
"""

from __future__ import annotations

import logging
import socket

__all__ = ["DEBUG_ENV", "configure_logging"]

DEBUG_ENV = "TOPOCOLL_DEBUG"
"""Environment variable with the log level (NCCL's names: VERSION, WARN, INFO, TRACE)."""

_LEVELS = {
    "VERSION": logging.WARNING,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "INFO": logging.INFO,
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
}


class _Handler(logging.StreamHandler):
    """The handler :func:`configure_logging` installs (told apart from the application's)."""


def configure_logging(value: str | None) -> None:
    """Send the ``topocoll`` logger's records of level ``value`` and above to standard error.

    Parameters
    ----------
    value : str or None
        ``$TOPOCOLL_DEBUG``; None or empty leaves logging as it is. An unknown level name is
        taken as INFO, with a warning.
    """
    if not value:
        return
    root = logging.getLogger("topocoll")
    level = _LEVELS.get(value.strip().upper())
    if not any(isinstance(handler, _Handler) for handler in root.handlers):
        handler = _Handler()
        handler.setFormatter(logging.Formatter(f"{socket.gethostname()}:%(process)d topocoll %(levelname)s %(message)s"))
        root.addHandler(handler)
    root.setLevel(level if level is not None else logging.INFO)
    if level is None:
        root.warning("%s=%r is not a level (VERSION, WARN, INFO, TRACE); using INFO", DEBUG_ENV, value)
