"""Running schedules: lowering, the executor and the ``"topo"`` torch.distributed backend.

- :mod:`~topocoll.collectives.lower`: a schedule -> one :class:`RankProgram` per rank (pure).
- :mod:`~topocoll.collectives.executor`: runs a program with point-to-point messages of an
  inner backend (gloo for CPU tensors, NCCL for CUDA tensors).
- :mod:`~topocoll.collectives.backend`: :class:`TopoProcessGroup`, registered as ``"topo"``.

Importing this package registers the backend (idempotently), so that
``dist.init_process_group("topo", ...)`` works.
"""

from topocoll.collectives.backend import BACKEND_NAME, TOPOLOGY_ENV, TopoOptions, TopoProcessGroup, register
from topocoll.collectives.executor import Executor, Reduction
from topocoll.collectives.lower import ProgramStep, RankProgram, Recv, Send, lower, lower_all
from topocoll.collectives.work import TopoWork

__all__ = [
    "BACKEND_NAME",
    "TOPOLOGY_ENV",
    "Executor",
    "ProgramStep",
    "RankProgram",
    "Recv",
    "Reduction",
    "Send",
    "TopoOptions",
    "TopoProcessGroup",
    "TopoWork",
    "lower",
    "lower_all",
    "register",
]

register()
