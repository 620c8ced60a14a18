"""The ``"topo"`` backend of torch.distributed: its options and its registration.

``dist.init_process_group("topo", ...)`` (after ``import topocoll``) and
``dist.new_group(ranks, backend="topo")`` reach :func:`_create`, which reads the environment (the
one place the backend does: ``$TOPOCOLL_TOPOLOGY`` and the other variables of
:class:`~topocoll.collectives.topology_source.TopologySettings`, ``$TOPOCOLL_DEBUG``, torchrun's
restart count) and makes a :class:`~topocoll.collectives.process_group.TopoProcessGroup` with the
:class:`TopoOptions` given as ``pg_options``.

Every schedule is verified symbolically before it runs, whoever made it
(:mod:`topocoll.collectives.schedule_source`). A peer that dies, hangs or arrives after the timeout makes
the waiting ranks raise within the process-group timeout, naming that peer; the group is then
broken (:mod:`topocoll.collectives.header`), and every later call raises at once. Recover as
with c10d's own backends: ``dist.destroy_process_group()`` and a new ``init_process_group``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from topocoll.collectives.debug import DEBUG_ENV, configure_logging
from topocoll.collectives.schedule_source import DEFAULT_SEGMENT_BYTES, Planner
from topocoll.collectives.process_group import BACKEND_NAME, TopoProcessGroup
from topocoll.collectives.topology_source import TOPOLOGY_ENV, TopologySettings
from topocoll.errors import CollectiveError
from topocoll.topo.model import Topology

__all__ = ["BACKEND_NAME", "TOPOLOGY_ENV", "TopoOptions", "TopoProcessGroup", "register"]


@dataclass(frozen=True, slots=True)
class TopoOptions:
    """Options of a "topo" group, passed as ``pg_options`` to ``init_process_group`` / ``new_group``.

    Parameters
    ----------
    topology : Topology, optional
        Use this topology instead of ``$TOPOCOLL_TOPOLOGY`` / the flat one.
    planner : Planner, optional
        Make schedules with this instead of :func:`topocoll.solver.plan` (e.g. a baseline).
    segment_bytes : int or None
        Cut messages into segments of at most this many bytes so that reductions overlap the
        transfers (None: never cut). Default :data:`DEFAULT_SEGMENT_BYTES`.
    shared_memory : bool
        Move CPU data between ranks of one host through shared memory
        (:class:`~topocoll.collectives.shm.ShmTransport`) instead of gloo's loopback TCP
        (default; peers that cannot map each other's files still use gloo).
    probe : bool or None
        Measure the links when the group starts and plan on the calibrated topology
        (:meth:`~topocoll.collectives.process_group.TopoProcessGroup.probe`); None (default): as ``$TOPOCOLL_PROBE`` says.
    background : bool
        Run collectives on CPU tensors on the group's communication thread, so that
        ``async_op=True`` returns at once and ``wait()`` blocks (default); False runs each
        before it returns.
    dataflow : bool or None
        Run schedules on CPU tensors in data-flow order, each message posted once the data it
        needs arrived (:mod:`topocoll.collectives.dataflow`), wherever ranks reach each other
        through gloo (ranks sharing a host's memory stay in lock step); False: in lock step,
        step after step. None (default): as ``$TOPOCOLL_DATAFLOW`` says (``1``: data-flow),
        else lock step.
    """

    topology: Topology | None = None
    planner: Planner | None = None
    segment_bytes: int | None = DEFAULT_SEGMENT_BYTES
    shared_memory: bool = True
    probe: bool | None = None
    background: bool = True
    dataflow: bool | None = None


#: ``TOPOCOLL_DATAFLOW=1`` runs CPU schedules in data-flow order (see :class:`TopoOptions`).
DATAFLOW_ENV = "TOPOCOLL_DATAFLOW"


def dataflow_from_env(environ: Mapping[str, str]) -> bool:
    """Whether ``$TOPOCOLL_DATAFLOW`` asks for data-flow order (``1``, ``true``, ``yes``).

    Examples
    --------
    >>> dataflow_from_env({}), dataflow_from_env({"TOPOCOLL_DATAFLOW": " Yes"}), dataflow_from_env({"TOPOCOLL_DATAFLOW": "0"})
    (False, True, False)
    """
    return environ.get(DATAFLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def _create(options: Any, backend_options: Any = None) -> TopoProcessGroup:
    """Backend creator torch.distributed calls (extended API: it gets the global ranks)."""
    extra = backend_options if isinstance(backend_options, TopoOptions) else TopoOptions()
    configure_logging(os.environ.get(DEBUG_ENV))
    store = options.store
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is not None:
        # torchrun hands every attempt of an elastic run the same store (its agent's, unless
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): an attempt's keys must not meet the addresses and
        # digests its dead predecessor left there. The agent restarts all its workers together,
        # so the ranks of one attempt agree on the count.
        store = dist.PrefixStore(f"topocoll/attempt{attempt}", store)
    return TopoProcessGroup(
        store,
        options.group_rank,
        options.group_size,
        options.timeout,
        global_ranks=list(options.global_ranks_in_group) or None,
        topology=extra.topology,
        planner=extra.planner,
        segment_bytes=extra.segment_bytes,
        shared_memory=extra.shared_memory,
        probe=extra.probe,
        background=extra.background,
        dataflow=extra.dataflow if extra.dataflow is not None else dataflow_from_env(os.environ),
        settings=TopologySettings.from_env(os.environ),
    )


def register() -> None:
    """Register ``"topo"`` with torch.distributed (devices ``cpu`` and ``cuda``); idempotent."""
    plugins = getattr(dist.Backend, "_plugins", {})
    existing = plugins.get(BACKEND_NAME.upper())
    if existing is not None:
        if getattr(existing, "creator_fn", None) is not _create:
            raise CollectiveError(f"another backend is already registered as {BACKEND_NAME!r}")
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])
