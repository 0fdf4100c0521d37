"""The error root.

``CoadaptError`` is the root of every error coadapt raises on purpose. Each package has one root
beneath it (``autoscaler.errors.AutoscalerError``, ``providers.errors.ProviderError``,
``trainer.errors.TrainerError``); catch those (or this), never bare ``Exception``.
"""

from __future__ import annotations

__all__ = ["CoadaptError"]


class CoadaptError(Exception):
    """Root of all coadapt errors."""
