"""Job logs as the API and ``coadapt logs`` read them, and text made safe for a terminal.

Logs are ``<logs_dir>/<job>/<instance_key>.log`` (what the agents write), read as one byte
stream in instance-key order, at most :data:`MAX_LOG_CHUNK_BYTES` per answer (``more`` says
there is more). An incomplete UTF-8 character at the end is left for the next read. Offsets into
the concatenation are stable while only the last file grows; to follow a job on several
instances, read each with ``instance=KEY`` (``instances`` lists them with their sizes). A log is
capped by its writer (:mod:`coadapt_common.logcap`): what it rotated out and dropped still
counts in the offsets and reads as one line that says how much is gone.
"""

from __future__ import annotations

import codecs
import contextlib
import os
from pathlib import Path
from typing import Final

from autoscaler.controller.client import LogChunk
from autoscaler.controller.jobbook import JOB_NAME_PATTERN
from coadapt_common.logcap import LogSegments, dropped_note
from coadapt_common.logcap import segments as log_segments
from trainer.launch import is_torchrun_exception

__all__ = ["MAX_LOG_CHUNK_BYTES", "TracebackCollapser", "printable", "read_job_logs"]

MAX_LOG_CHUNK_BYTES: Final = 1 << 20
"""The most log bytes one answer carries."""


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` as it may reach a user's terminal: every non-printable character (a control
    character, an escape sequence's ESC or CSI, a bidirectional override) shown as ``?``, so
    nothing it holds can change a terminal's title, clear its screen or colour a line. On one
    line (runs of white space, line breaks included, become one space: what an agent reports
    as a job's failure), or with ``lines`` its line breaks and tabs kept (``\r\n`` read as
    ``\n``: a job's log, ``coadapt logs``)."""
    if not lines:
        return "".join(c if c.isprintable() else "?" for c in " ".join(text.split()))
    text = text.replace("\r\n", "\n")
    return "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text)


def read_job_logs(
    logs_dir: Path, job: str, offset: int = 0, *, instance: str | None = None
) -> LogChunk:
    """Job ``job``'s logs under ``logs_dir`` (``<logs_dir>/<job>/<instance>.log``, what the
    agents write) from byte ``offset``, as ``GET /v1/jobs/{job}/logs`` answers them (only
    ``instance``'s file when given): the API and ``coadapt logs`` on the cluster's machine,
    whether or not the cluster is up. ``job`` must be a job name (:data:`JOB_NAME_PATTERN`:
    a safe folder name); ``ValueError`` otherwise."""
    if not JOB_NAME_PATTERN.fullmatch(job):
        raise ValueError(f"{job!r} is not a job name")
    files = _log_files(Path(logs_dir) / job)
    if instance is not None:
        files = [f for f in files if f[0] == instance]
    return _read_logs(job, files, offset)


def _log_files(folder: Path) -> list[tuple[str, LogSegments]]:
    """``(instance_key, segments)`` of the regular ``*.log`` files in ``folder``, by key
    (links and hidden files are skipped; each is read with what its capped writer rotated
    out and dropped: :func:`coadapt_common.logcap.segments`)."""
    out = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.startswith(".") or not entry.name.endswith(".log"):
                continue
            if not entry.is_file(follow_symlinks=False):
                continue
            out.append((entry.name[: -len(".log")], log_segments(Path(entry.path))))
    return sorted(out, key=lambda item: item[0])


def _read_logs(job: str, files: list[tuple[str, LogSegments]], offset: int) -> LogChunk:
    """Bytes ``offset``.. of the logs read in order as one stream (each up to the size it
    had when listed), at most :data:`MAX_LOG_CHUNK_BYTES`. A range a capped log dropped
    reads as one line that says how much is gone (:func:`coadapt_common.logcap.dropped_note`)
    and costs no bytes of the answer; offsets count every byte the job wrote."""
    chunks: list[bytes] = []
    want = MAX_LOG_CHUNK_BYTES
    start = 0  # where the current piece begins in the stream
    cursor = offset
    total = sum(seg.total_bytes for _, seg in files)
    for _, seg in files:
        pieces: list[tuple[Path | None, int]] = [(None, seg.dropped_bytes), *seg.files]
        for path, size in pieces:
            if want and start <= cursor < start + size:
                if path is None:
                    dropped = start + size - cursor
                    chunks.append(dropped_note(dropped, seg.max_bytes).encode())
                    cursor += dropped
                else:
                    count = min(start + size - cursor, want)
                    data = b""
                    with contextlib.suppress(FileNotFoundError), open(path, "rb") as handle:
                        handle.seek(cursor - start)
                        data = handle.read(count)
                    chunks.append(data)
                    want -= len(data)
                    cursor += len(data)
                    if len(data) < count:  # rotated or cut since listed: the next read
                        want = 0
            start += size
    raw = b"".join(chunks)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = decoder.decode(raw, final=False)
    held_back = len(decoder.getstate()[0])  # an incomplete character at the end
    next_offset = cursor - held_back
    return LogChunk(
        job=job,
        offset=offset,
        next_offset=next_offset,
        text=text,
        more=next_offset < total and want <= 0,
        instances=tuple((key, seg.total_bytes) for key, seg in files),
    )


_TRACEBACK: Final = "Traceback (most recent call last):"
_RULE: Final = "=" * 20


class TracebackCollapser:
    """What ``coadapt logs`` shows of a job's log: torchrun's own tracebacks (its
    ``ChildFailedError`` and rendezvous errors, :func:`trainer.launch.is_torchrun_exception`,
    with the ``====`` summary that follows one) are shown whole the first time each exception
    appears; a later one of the same exception is one line saying how many lines were left
    out. Everything else, the script's own output and tracebacks included, is kept as written.
    Fed text in pieces (:meth:`feed`, as a log is followed), it holds back a traceback until
    it has ended; :meth:`flush` gives what is held."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._held: list[str] = []  # the lines of a traceback (and summary) being read
        self._partial = ""  # the last line, not yet ended

    def feed(self, text: str) -> str:
        """The text to show for ``text`` (and what it completes of earlier pieces)."""
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()  # after the last line break: a line still being written
        out: list[str] = []
        for line in lines:
            out.extend(self._line(line))
        shown = "".join(x + "\n" for x in out)
        partial = self._partial
        if partial and not self._held and not _TRACEBACK.startswith(partial[: len(_TRACEBACK)]):
            shown, self._partial = shown + partial, ""  # shown now; the rest follows it
        return shown

    def flush(self) -> str:
        """Whatever is held back (a traceback cut off at the end of the log)."""
        held, self._held = self._held, []
        if self._partial:
            held.append(self._partial)
            self._partial = ""
        return "".join(x + "\n" for x in held)

    def _line(self, line: str) -> list[str]:
        held = self._held
        if not held:
            if line.startswith(_TRACEBACK):
                held.append(line)
                return []
            return [line]
        held.append(line)
        return self._advance()

    _exception_at: int | None = None

    def _advance(self) -> list[str]:
        """Decide on a held traceback once its exception line (and summary) has come."""
        held = self._held
        if self._exception_at is None:
            line = held[-1]
            if not line or line[0].isspace():
                return []  # still the stack
            self._exception_at = len(held) - 1
            name = line.split(":", 1)[0].strip()
            if not is_torchrun_exception(name):
                return self._release()
            return []
        # a torchrun exception: its summary (==== ... ====) follows, or nothing does
        after = held[self._exception_at + 1 :]
        if not after[0].startswith(_RULE):
            last = held.pop()
            return [*self._collapse(), *self._line(last)]
        if len(after) > 1 and after[-1].startswith(_RULE):
            return self._collapse()
        if len(after) > 200:  # not a summary after all
            return self._release()
        return []

    def _release(self) -> list[str]:
        held, self._held, self._exception_at = self._held, [], None
        return held

    def _collapse(self) -> list[str]:
        assert self._exception_at is not None
        name = self._held[self._exception_at].split(":", 1)[0].strip()
        if name not in self._seen:
            self._seen.add(name)
            return self._release()
        count = len(self._held)
        self._held, self._exception_at = [], None
        short = name.rsplit(".", 1)[-1]
        return [
            f"[coadapt logs: torchrun's {short} traceback again, as above: {count} lines left "
            "out; --raw shows them]"
        ]
