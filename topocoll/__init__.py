"""topocoll: topology-aware collective communication.

``topo`` discovers and imports cluster topologies, ``solver`` synthesizes and verifies
collective schedules, ``collectives`` runs them through torch.distributed as the ``"topo"``
backend, ``bench`` measures them.

Importing topocoll registers the ``"topo"`` backend when torch is already imported (the usual
order in training scripts); when torch comes later, torch's extension autoloading registers it
(the ``torch.backends`` entry point, :mod:`topocoll._autoload`). The model and solver do not
need torch, so a bare ``import topocoll`` does not pay for importing it.
"""

import sys as _sys

__version__ = "0.1.0"

if "torch" in _sys.modules:
    import topocoll.collectives  # noqa: F401  (registers the "topo" backend)
