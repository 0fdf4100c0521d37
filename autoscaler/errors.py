"""Error roots.

``CoadaptError`` is the root of every error coadapt raises on purpose. Each package has one
root beneath it (``AutoscalerError`` here, ``providers.errors.ProviderError``,
``trainer.errors.TrainerError``); catch those, never bare ``Exception``.
"""

from __future__ import annotations


class CoadaptError(Exception):
    """Root of all coadapt errors."""


class AutoscalerError(CoadaptError):
    """Root of errors raised by the decision plane (``autoscaler``)."""


class InvalidInputError(AutoscalerError, ValueError):
    """Input rejected before any computation: names the offending field."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class TraceFormatError(AutoscalerError, ValueError):
    """A trace or workload file is malformed: names the file, line (1-based) and field."""

    def __init__(
        self, message: str, *, path: str, line: int | None = None, field: str | None = None
    ) -> None:
        where = path if line is None else f"{path}:{line}"
        if field is not None:
            where += f" [{field}]"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.field = field
