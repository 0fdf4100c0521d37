"""Checkpoints: a registry of state, one self-checking file per save, keep the last K.

File format (one object per checkpoint, named ``ckpt-<step:012d>.ckpt``)::

    COADAPT-CKPT 1\\n
    {"length": <bytes>, "sha256": "<hex>", "step": <step>}\\n
    <torch.save payload>

The payload is written in one atomic ``CheckpointStore.write`` after the digest is computed, so
a reader either sees a complete checkpoint or none; :func:`decode` re-checks length and digest,
so a truncated or bit-flipped object is detected. :meth:`CheckpointManager.load_latest` tries the
newest first and falls back to older ones, logging a warning that names each one it skipped.

The payload is unpickled with ``weights_only=False`` because it can hold arbitrary user objects:
only load checkpoints from storage you control.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    CheckpointStorageError,
    TrainerConfigError,
)
from trainer.storage import CheckpointStore

logger = logging.getLogger("trainer.checkpoint")

MAGIC = b"COADAPT-CKPT 1\n"
FORMAT_VERSION = 1
_NAME_RE = re.compile(r"^ckpt-(\d{12})\.ckpt$")


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:012d}.ckpt"


def step_of(name: str) -> int | None:
    """The step encoded in a checkpoint object name, or ``None`` for other objects."""
    match = _NAME_RE.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class CheckpointInfo:
    name: str
    step: int
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class RestoreInfo:
    """What :meth:`CheckpointManager.load_latest` used and what it skipped (newest first)."""

    checkpoint: CheckpointInfo
    skipped: tuple[tuple[str, str], ...]  # (name, reason)


def encode(payload: Any, step: int) -> tuple[bytes, CheckpointInfo]:
    """Serialise ``payload`` (``torch.save``) behind the checking header."""
    import torch

    buffer = io.BytesIO()
    torch.save(payload, buffer)
    body = buffer.getbuffer()
    digest = hashlib.sha256(body).hexdigest()
    header = json.dumps({"length": len(body), "sha256": digest, "step": step}, sort_keys=True)
    blob = b"".join([MAGIC, header.encode(), b"\n", body])
    return blob, CheckpointInfo(checkpoint_name(step), step, len(blob), digest)


def verify(blob: bytes, name: str = "<blob>") -> tuple[memoryview, CheckpointInfo]:
    """Check header, length and digest; return the payload bytes. Raises CheckpointCorruptError."""
    if not blob.startswith(MAGIC):
        raise CheckpointCorruptError(f"{name}: not a coadapt checkpoint (bad magic)")
    end = blob.find(b"\n", len(MAGIC))
    if end < 0:
        raise CheckpointCorruptError(f"{name}: truncated header")
    try:
        header = json.loads(blob[len(MAGIC) : end])
        length, digest, step = int(header["length"]), str(header["sha256"]), int(header["step"])
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointCorruptError(f"{name}: bad header ({e})") from e
    body = memoryview(blob)[end + 1 :]
    if len(body) != length:
        raise CheckpointCorruptError(f"{name}: {len(body)} payload bytes, header says {length}")
    actual = hashlib.sha256(body).hexdigest()
    if actual != digest:
        raise CheckpointCorruptError(f"{name}: checksum mismatch")
    return body, CheckpointInfo(name, step, len(blob), digest)


def decode(
    blob: bytes, name: str = "<blob>", map_location: Any = "cpu"
) -> tuple[Any, CheckpointInfo]:
    """Verify and unpickle a checkpoint blob."""
    import torch

    body, info = verify(blob, name)
    try:
        payload = torch.load(io.BytesIO(body), map_location=map_location, weights_only=False)
    except Exception as e:  # unpickling can raise nearly anything on garbage
        raise CheckpointCorruptError(f"{name}: cannot deserialise ({e})") from e
    return payload, info


class CheckpointManager:
    """Writes, lists, prunes and restores checkpoints in one store."""

    def __init__(self, store: CheckpointStore, *, keep_last: int = 3) -> None:
        if keep_last < 1:
            raise TrainerConfigError("must be >= 1", field="keep_last")
        self.store = store
        self.keep_last = keep_last

    def checkpoints(self) -> list[tuple[int, str]]:
        """``(step, name)`` of every checkpoint in the store, newest first."""
        found = []
        for name in self.store.names():
            step = step_of(name)
            if step is not None:
                found.append((step, name))
        return sorted(found, reverse=True)

    def write(self, blob: bytes, info: CheckpointInfo) -> None:
        """Store an encoded checkpoint atomically, then delete all but the newest K."""
        self.store.write(info.name, blob)
        for _, name in self.checkpoints()[self.keep_last :]:
            try:
                self.store.delete(name)
            except CheckpointStorageError as e:
                logger.warning("could not delete old checkpoint %s: %s", name, e)

    def read(self, name: str, map_location: Any = "cpu") -> tuple[Any, CheckpointInfo]:
        return decode(self.store.read(name), name, map_location)

    def load_latest(
        self,
        map_location: Any = "cpu",
        *,
        reader: Callable[[str], bytes] | None = None,
    ) -> tuple[Any, RestoreInfo] | None:
        """The newest checkpoint that verifies, or ``None`` if the store holds none.

        A corrupt or unreadable newer checkpoint is skipped with a warning naming it and the one
        used instead. If checkpoints exist but none verifies, raises ``CheckpointCorruptError``
        rather than silently starting over. ``reader`` overrides how bytes are fetched.
        """
        read = reader or self.store.read
        skipped: list[tuple[str, str]] = []
        for _, name in self.checkpoints():
            try:
                payload, info = decode(read(name), name, map_location)
            except (CheckpointCorruptError, CheckpointNotFoundError) as e:
                logger.warning("checkpoint %s is unusable (%s); trying the previous one", name, e)
                skipped.append((name, str(e)))
                continue
            if skipped:
                logger.warning(
                    "resuming from checkpoint %s (step %d) instead of the newer %s",
                    name,
                    info.step,
                    ", ".join(n for n, _ in skipped),
                )
            return payload, RestoreInfo(info, tuple(skipped))
        if skipped:
            raise CheckpointCorruptError(
                "no usable checkpoint: "
                + "; ".join(f"{name}: {reason}" for name, reason in skipped)
                + " (delete them to start fresh)"
            )
        return None
