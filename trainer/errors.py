"""Trainer error root."""

from __future__ import annotations

from autoscaler.errors import CoadaptError


class TrainerError(CoadaptError):
    """Root of errors raised by ``trainer``."""
