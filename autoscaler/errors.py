"""The decision plane's errors, rooted at ``AutoscalerError``.

``AutoscalerError`` derives from :class:`coadapt_common.errors.CoadaptError`, the root of every
error coadapt raises on purpose (``providers.errors.ProviderError`` and
``trainer.errors.TrainerError`` are its siblings); catch those, never bare ``Exception``.
"""

from __future__ import annotations

from coadapt_common.errors import CoadaptError


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


class DuplicateOfferingError(TraceFormatError):
    """Two catalogue rows describe the same offering (provider, instance type, zone).

    ``path``/``line`` name the second row, ``other_path``/``other_line`` the first one.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str,
        line: int,
        other_path: str,
        other_line: int,
        field: str | None = None,
    ) -> None:
        super().__init__(message, path=path, line=line, field=field)
        self.other_path = other_path
        self.other_line = other_line
