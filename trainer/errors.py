"""Trainer error root and its typed subclasses.

Every error ``trainer`` raises on purpose derives from :class:`TrainerError` (itself under
``coadapt_common.errors.CoadaptError``). This module is torch-free and cheap to import.
"""

from __future__ import annotations

from coadapt_common.errors import CoadaptError


class TrainerError(CoadaptError):
    """Root of errors raised by ``trainer``."""


class TrainerConfigError(TrainerError, ValueError):
    """A setting (argument or environment variable) is invalid; ``field`` names it."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


class TrainerUsageError(TrainerError, RuntimeError):
    """The library was used out of order (for example a step began before the last ended)."""


class ReportSchemaError(TrainerError, ValueError):
    """A report payload does not match the schema (wrong version, missing or mistyped field)."""


class ReportThrottledError(TrainerError, OSError):
    """The controller refused a report for now (HTTP 429): send none for ``retry_after_s``."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"the controller asks for no report for {retry_after_s:g} s (429)")
        self.retry_after_s = retry_after_s


class CheckpointError(TrainerError):
    """Root of checkpoint errors."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The named checkpoint object does not exist in the store."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint's bytes fail the header or checksum check, or cannot be deserialised."""


class CheckpointStorageError(CheckpointError):
    """The storage backend failed (I/O error, HTTP error, missing credentials or SDK)."""


class LaunchError(TrainerError):
    """The launcher could not start or supervise ``torchrun``."""
