"""Atomic file writes: the one implementation the CLI, the simulator, the benchmarks, the local
provider and the trainer (run directory, local checkpoint store) all use.

(``providers/local_agent.py`` keeps its own few lines: it runs as a standalone script and must
not import the package.)
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["rotate_file", "write_bytes_atomic", "write_json_atomic", "write_text_atomic"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(
    path: str | Path,
    data: bytes,
    *,
    durable: bool = False,
    mode: int | None = None,
    replace: bool = True,
) -> None:
    """Write ``data`` to ``path`` atomically.

    The bytes go to a temporary file in the same folder (named ``.<name>.<random>.tmp``, so
    listings that skip dot-files never see it), which is then renamed over ``path``: readers
    see the old file or the complete new one, never a partial one, and a failure leaves no
    temporary file behind (the exception propagates unchanged). Missing parent folders are
    created. The file gets the usual permissions (0666 less the umask), or exactly ``mode``
    when given (a secret: the temporary file is created 0600, so it is never readable by
    others, even briefly). ``durable`` also fsyncs the file before the rename and the folder
    after it (state that must survive a power loss). With ``replace=False`` an existing
    ``path`` is never replaced: ``FileExistsError`` (the new file is linked into place).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, (0o666 & ~_umask()) if mode is None else mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # FileExistsError if path exists
            Path(tmp).unlink()
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(path.parent)


def write_text_atomic(path: str | Path, text: str, *, durable: bool = False) -> None:
    """:func:`write_bytes_atomic` of ``text`` encoded as UTF-8."""
    write_bytes_atomic(path, text.encode("utf-8"), durable=durable)


def write_json_atomic(
    path: str | Path, payload: Any, *, indent: int | None = 1, durable: bool = False
) -> None:
    """Write ``payload`` as JSON (sorted keys, no NaN, a final newline) to ``path`` atomically
    (see :func:`write_bytes_atomic`). A payload that is not JSON (e.g. NaN) raises
    ``ValueError``/``TypeError`` before anything is written."""
    text = json.dumps(payload, indent=indent, sort_keys=True, allow_nan=False) + "\n"
    write_text_atomic(path, text, durable=durable)


def rotate_file(path: str | Path, older: str | Path) -> None:
    """Rename ``path`` over ``older`` (what ``older`` held is gone): a log's rotation
    (:mod:`coadapt_common.logcap`). Readers that hold either file open keep reading it."""
    os.replace(path, older)
