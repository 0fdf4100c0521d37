"""Cross-rank agreement, stop causes, and the run-directory files the launcher reads.

* :class:`ControlChannel`: a tiny asynchronous all-reduce (MAX) over a CPU (gloo) group, started
  at the end of one exchange step and read at the end of the next: every rank reads the same
  flags at the same step, so all agree on when to stop or checkpoint, and the collective is
  hidden behind the steps in between. It never touches an accelerator. The exchange also carries
  rank 0's proposal for the number of steps until the following exchange, so the period adapts
  to the step time while staying identical on every rank, and rank 0's requested batch
  configuration (the other ranks offer zeros, so the maximum is rank 0's), so that every rank
  learns a batch change at the same step (:class:`trainer.stepping.StepLoop` says from which
  step it is in force).
* :class:`RunDir`: per node, ``pids/rank-<local rank>.pid`` (pid and kernel start time, so the
  launcher can end exactly its own workers) and ``markers/rank-<local rank>.json`` (why a worker
  exited), both written atomically.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from coadapt_common.atomic import write_text_atomic
from coadapt_common.procfs import process_start_time


class StopCause(enum.StrEnum):
    SIGNAL = "signal"  # SIGTERM (torchrun forwards it; a node agent sends it)
    NOTICE = "notice"  # a preemption notice file appeared
    CONTROLLER = "controller"  # the controller's reply asked to stop
    REQUEST = "request"  # the user script called ElasticJob.request_stop()
    PEER = "peer"  # another rank asked (seen by ranks that did not ask)


class ExitKind(enum.StrEnum):
    DONE = "done"  # training finished, final checkpoint saved
    STOPPED = "stopped"  # stopped at an agreed step with a checkpoint: relaunch to continue
    PEER_LOST = "peer_lost"  # a collective failed (another process or node went away)
    FAILED = "failed"  # any other uncaught exception


@dataclass(frozen=True)
class ControlDecision:
    """Agreed at an exchange: ``stop`` (any rank asked), ``checkpoint`` (rank 0 asked),
    ``next_every`` (rank 0's proposed steps between exchanges; 0 = keep the current period) and
    ``batch_size``/``accum_steps`` (rank 0's requested batch configuration; 0 = none)."""

    stop: bool = False
    checkpoint: bool = False
    next_every: int = 0
    batch_size: int = 0
    accum_steps: int = 0


class ControlChannel:
    """Step-lagged agreement among ranks (see module docstring)."""

    def __init__(self, group: Any, world_size: int) -> None:
        self._group = group
        self._world_size = world_size
        self._pending: tuple[Any, Any] | None = None

    def post(
        self,
        *,
        stop: bool,
        checkpoint: bool,
        next_every: int = 0,
        batch_size: int = 0,
        accum_steps: int = 0,
    ) -> None:
        """Offer this rank's flags for the step that just ended (non-blocking)."""
        import torch
        import torch.distributed as dist

        flags = torch.tensor(
            [int(stop), int(checkpoint), int(next_every), int(batch_size), int(accum_steps)],
            dtype=torch.int32,
        )
        if self._world_size == 1:
            self._pending = (None, flags)
            return
        work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        self._pending = (work, flags)

    def collect(self) -> ControlDecision:
        """The agreed flags of the last :meth:`post` (waits if still in flight)."""
        if self._pending is None:
            return ControlDecision()
        work, flags = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        stop, checkpoint, next_every, batch_size, accum_steps = flags.tolist()
        return ControlDecision(
            stop=bool(stop),
            checkpoint=bool(checkpoint),
            next_every=int(next_every),
            batch_size=int(batch_size),
            accum_steps=int(accum_steps),
        )

    def drain(self) -> None:
        """Wait for an in-flight post (before other collectives on the group)."""
        if self._pending is not None and self._pending[0] is not None:
            self._pending[0].wait()


@dataclass(frozen=True)
class ExitMarker:
    """Why one worker exited. ``rank`` is its local rank on the node (the file key)."""

    rank: int
    kind: ExitKind
    cause: str | None  # StopCause for STOPPED, exception type for the others
    initiated: bool  # this node asked to stop (notice, controller, request; not a signal)
    step: int
    checkpoint: str | None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ExitMarker:
        data = json.loads(text)
        return cls(
            rank=int(data["rank"]),
            kind=ExitKind(data["kind"]),
            cause=data.get("cause"),
            initiated=bool(data["initiated"]),
            step=int(data["step"]),
            checkpoint=data.get("checkpoint"),
        )


class RunDir:
    """The per-launch folder shared by the launcher and its local workers."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @property
    def pid_dir(self) -> Path:
        return self.root / "pids"

    @property
    def marker_dir(self) -> Path:
        return self.root / "markers"

    def write_pid(self, rank: int, pid: int | None = None) -> None:
        pid = os.getpid() if pid is None else pid
        write_text_atomic(self.pid_dir / f"rank-{rank}.pid", f"{pid} {process_start_time(pid)}\n")

    def pids(self) -> list[tuple[int, str | None]]:
        """``(pid, start_time)`` of every worker that registered."""
        out = []
        for path in sorted(self.pid_dir.glob("rank-*.pid")):
            try:
                pid_s, start = path.read_text().split()
                out.append((int(pid_s), None if start == "None" else start))
            except (OSError, ValueError):
                continue
        return out

    def write_marker(self, marker: ExitMarker) -> None:
        write_text_atomic(self.marker_dir / f"rank-{marker.rank}.json", marker.to_json())

    def clear_marker(self, rank: int) -> None:
        (self.marker_dir / f"rank-{rank}.json").unlink(missing_ok=True)

    def markers(self) -> list[ExitMarker]:
        out = []
        for path in sorted(self.marker_dir.glob("rank-*.json")):
            try:
                out.append(ExitMarker.from_json(path.read_text()))
            except (OSError, ValueError, KeyError):
                continue
        return out

    def clear(self) -> None:
        """Remove pid files and markers (before a new launch)."""
        for folder in (self.pid_dir, self.marker_dir):
            if folder.exists():
                for path in folder.iterdir():
                    path.unlink(missing_ok=True)
