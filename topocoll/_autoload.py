"""Registers the ``"topo"`` backend whenever torch is imported (torch's extension autoloading).

torch calls every entry point of the group ``torch.backends`` at the end of ``import torch``
(unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), so ``dist.init_process_group("topo")`` works in
any import order without making a bare ``import topocoll`` pay for importing torch. A failure
here must never break ``import torch``: it is reported as a warning instead.
"""

from __future__ import annotations

import warnings


def register() -> None:
    """Import :mod:`topocoll.collectives`, which registers the backend (idempotent)."""
    try:
        import topocoll.collectives  # noqa: F401
    except Exception as exc:  # pragma: no cover - only on a broken installation
        warnings.warn(f"topocoll: could not register the 'topo' backend: {exc}", RuntimeWarning, stacklevel=2)
