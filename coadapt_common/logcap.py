"""A job's log, capped: the writer process the node agent puts between a launcher and its log
file, and the one reading of what it leaves.

``python -m coadapt_common.logcap --max-bytes N PATH`` copies its standard input (a pipe: the
launcher's stdout and stderr) to ``PATH`` until every writer of the pipe has closed it. It is
its own process, in its own session, not the agent: an agent that dies (``kill -9``) or
restarts takes nothing of the job's output path with it, and a job cannot write past the cap
because it never holds the file, only the pipe. Layout, for ``PATH`` = ``<folder>/<name>``::

    <name>          the live file, up to N/2 bytes
    <name>.1        the previous one (rotation: the live file is renamed over it, so what it
                    held is dropped), up to N/2 bytes
    .<name>.json    what was dropped: ``dropped_bytes`` (every byte ever written to the
                    stream before ``<name>.1``'s first), ``max_bytes``, and the inodes of the
                    two files when it was written (a reader tells a rotation it raced from
                    a consistent view)
    .<name>.lock    one writer per log at a time (a relaunch's writer waits for the
                    previous one to drain)

So the files of one log never hold more than ``N`` bytes (plus the agent's own one-line notes),
and the stream's byte offsets stay stable: ``dropped_bytes + size(<name>.1) + size(<name>)``
is every byte written, and a reader that asks for a dropped range is told how much is gone
(:func:`segments`). When a write fails because the disk is full, the writer goes on reading
(the job never blocks on its log), counts what it could not write, and says so in the file once
there is room again.

Standard library only (it starts in tens of milliseconds next to every launcher).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from coadapt_common.atomic import rotate_file, write_json_atomic

__all__ = [
    "DEFAULT_LOG_MAX_BYTES",
    "LogSegments",
    "dropped_note",
    "logcap_argv",
    "main",
    "run_writer",
    "segments",
]

DEFAULT_LOG_MAX_BYTES: Final = 64 << 20
"""A job's log on one instance keeps at most this much (its latest output), by default."""
MIN_LOG_MAX_BYTES: Final = 64 << 10
_READ_BYTES: Final = 1 << 20
_PIPE_BYTES: Final = 1 << 20
_F_SETPIPE_SZ: Final = 1031
_FULL: Final = (errno.ENOSPC, errno.EDQUOT)


def older_path(path: Path) -> Path:
    return path.with_name(path.name + ".1")


def meta_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.json")


def _lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def logcap_argv(path: Path, max_bytes: int, *, python: str = sys.executable) -> list[str]:
    """The writer's command line for the log ``path``."""
    return [python, "-m", "coadapt_common.logcap", "--max-bytes", str(max_bytes), str(path)]


def grow_pipe(fd: int) -> None:
    """Ask for a 1 MiB pipe buffer (fewer, larger reads); the default is kept if refused."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_BYTES)


def _human(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def dropped_note(dropped_bytes: int, max_bytes: int | None) -> str:
    """The line a reader shows where bytes of a log were dropped."""
    cap = f" (it keeps the last {_human(max_bytes)})" if max_bytes else ""
    return (
        f"[coadapt: {_human(dropped_bytes)} of this log were dropped here: the job wrote more "
        f"than its log cap{cap}; coadapt up --job-log-max-mib sets it]\n"
    )


@dataclass(frozen=True)
class LogSegments:
    """One capped log as a stream: ``dropped_bytes`` gone, then ``files`` ((path, size) in
    order). ``max_bytes``: the cap it was written under (``None``: written without one)."""

    dropped_bytes: int
    files: tuple[tuple[Path, int], ...]
    max_bytes: int | None

    @property
    def total_bytes(self) -> int:
        return self.dropped_bytes + sum(size for _, size in self.files)


def _read_meta(path: Path) -> dict[str, int] | None:
    try:
        raw = json.loads(meta_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    out = {k: v for k, v in raw.items() if isinstance(v, int) and not isinstance(v, bool)}
    return out if out.get("dropped_bytes", -1) >= 0 else None


def _stat(path: Path) -> os.stat_result | None:
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        st = os.stat(path, follow_symlinks=False)
        if not os.path.islink(path):
            return st
    return None


def segments(path: Path, *, tries: int = 5) -> LogSegments:
    """The log at ``path`` as a stream (see the module docstring). A view raced by a rotation
    (the inodes in ``.<name>.json`` are not those of the files) is read again, up to
    ``tries`` times; a log written without the writer (no ``.<name>.json``) is its files
    with nothing dropped."""
    older = older_path(path)
    for attempt in range(tries):
        meta = _read_meta(path)
        st_old, st_live = _stat(older), _stat(path)
        files = tuple((p, st.st_size) for p, st in ((older, st_old), (path, st_live)) if st)
        if meta is None:
            return LogSegments(0, files, None)
        same = meta.get("older_ino") == (st_old.st_ino if st_old else 0) and meta.get(
            "live_ino"
        ) == (st_live.st_ino if st_live else 0)
        if same or attempt == tries - 1:
            return LogSegments(meta["dropped_bytes"], files, meta.get("max_bytes"))
        time.sleep(0.01)
    raise AssertionError("unreachable")


class _Writer:
    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.segment_bytes = max(1, max_bytes // 2)
        meta = _read_meta(path)
        self.dropped = meta["dropped_bytes"] if meta else 0
        self.unwritten = 0  # bytes lost to a full disk, not yet said in the file
        self.fd = self._open()
        self._save()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def _save(self) -> None:
        st_old, st_live = _stat(older_path(self.path)), _stat(self.path)
        meta = {
            "dropped_bytes": self.dropped,
            "max_bytes": self.max_bytes,
            "older_ino": st_old.st_ino if st_old else 0,
            "live_ino": st_live.st_ino if st_live else 0,
        }
        with contextlib.suppress(OSError):  # a full disk: readers fall back to the files
            write_json_atomic(meta_path(self.path), meta, indent=None)

    def _rotate(self) -> None:
        st_old = _stat(older_path(self.path))
        rotate_file(self.path, older_path(self.path))
        self.dropped += st_old.st_size if st_old else 0
        os.close(self.fd)
        self.fd = self._open()
        self._save()

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def write(self, data: bytes) -> None:
        while data:
            room = self.segment_bytes - os.fstat(self.fd).st_size
            if room <= 0:
                self._rotate()
                continue
            piece, data = data[:room], data[room:]
            try:
                if self.unwritten:
                    lost = _human(self.unwritten)
                    note = f"[coadapt: {lost} of this log were lost: the disk was full]\n"
                    self._write_all(note.encode())
                    self.unwritten = 0
                self._write_all(piece)
            except OSError as e:
                if e.errno not in _FULL:
                    raise
                self.unwritten += len(piece)


def run_writer(source_fd: int, path: Path, max_bytes: int) -> int:
    """Copy ``source_fd`` to the capped log ``path`` until end of file; the exit status."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(_lock_path(path), "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # the previous writer of this log drained
        writer = _Writer(path, max_bytes)
        try:
            while data := os.read(source_fd, _READ_BYTES):
                writer.write(data)
        finally:
            os.close(writer.fd)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3 or args[0] != "--max-bytes" or not args[1].isdigit():
        print("usage: python -m coadapt_common.logcap --max-bytes N PATH", file=sys.stderr)
        return 2
    max_bytes = int(args[1])
    if max_bytes < MIN_LOG_MAX_BYTES:
        print(f"coadapt logcap: --max-bytes must be at least {MIN_LOG_MAX_BYTES}", file=sys.stderr)
        return 2
    try:
        return run_writer(sys.stdin.fileno(), Path(args[2]), max_bytes)
    except OSError as e:
        print(f"coadapt logcap: {args[2]}: {e}", file=sys.stderr)
        with contextlib.suppress(OSError):  # never leave the job writing into a closed pipe
            while os.read(sys.stdin.fileno(), _READ_BYTES):
                pass
        return 1


if __name__ == "__main__":
    sys.exit(main())
