"""How full a disk is, and the one test of whether an error means it is full.

The controller keeps ``--min-free-mib`` free on its state folder's disk: below it, ``coadapt
up`` refuses to start, a running service stops its rounds (in one line and an event), and a node
agent starts no launcher (its log and checkpoints would fill the disk again).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Final

__all__ = ["DEFAULT_MIN_FREE_BYTES", "free_bytes", "is_disk_full"]

DEFAULT_MIN_FREE_BYTES: Final = 64 << 20
"""What the controller keeps free on its state folder's disk by default."""

_FULL_ERRNOS: Final = (errno.ENOSPC, errno.EDQUOT)
_SQLITE_FULL: Final = "database or disk is full"


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the disk that holds ``path`` (or its
    nearest existing parent); ``None`` when that cannot be read."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) says a disk or quota is full: an
    ``OSError`` ENOSPC/EDQUOT, or SQLite's ``database or disk is full``."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _FULL_ERRNOS:
            return True
        if _SQLITE_FULL in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False
