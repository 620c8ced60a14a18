"""topocoll: topology-aware collective communication.

``topo`` discovers and imports cluster topologies, ``solver`` synthesizes and verifies
collective schedules, ``collectives`` runs them through torch.distributed as the ``"topo"``
backend, ``bench`` measures them.
"""

__version__ = "0.1.0"
