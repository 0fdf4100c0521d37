"""Atomic file writes shared by the CLI, the simulator, the benchmarks and the local provider."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["write_json_atomic"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json_atomic(
    path: str | Path, payload: Any, *, indent: int | None = 1, durable: bool = False
) -> None:
    """Write ``payload`` as JSON (sorted keys, no NaN) to ``path`` atomically.

    The bytes go to a temporary file in the same folder, which is then renamed over ``path``:
    readers see the old file or the complete new one, never a partial one, and a failure
    leaves no temporary file behind. Missing parent folders are created. The file gets the
    usual permissions (0666 less the umask), not the temporary file's 0600. ``durable``
    also fsyncs the file before the rename (state that must survive a power loss).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=indent, sort_keys=True, allow_nan=False)
            handle.write("\n")
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
