"""The agent process that *is* a local instance (``providers.local.LocalProvider``).

Started detached (own session and process group), as a script so that it imports nothing but
the standard library (no package ``__init__`` runs in the instance)::

    python .../providers/local_agent.py --instance-id ID --agent-dir DIR --gpus N
        [--heartbeat-s S] [--user-data-file FILE]

Contract with the provider:

* On start it writes ``DIR/agent.json`` (atomically: tmp + rename) with its pid, pgid, GPU slot
  count and ``state: "running"``, then rewrites it every ``heartbeat_s`` with a fresh
  ``heartbeat_at_s`` (wall-clock; the agent is "the machine", it has no injected clock). A
  failed write is reported on stderr (``agent.log``) and retried next beat: an instance does
  not die because its status file could not be written.
* If ``--user-data-file`` names a non-empty file, its text is run as ``/bin/sh -c`` in the
  agent's own process group (the instance's workload, later the torchrun agent), with
  ``COADAPT_INSTANCE_ID`` and ``COADAPT_GPU_SLOTS`` in its environment. The agent outlives the
  workload and records its exit code.
* A workload that fails (exits non-zero or is killed) while the agent is not stopping is
  started again after ``RESTART_DELAY_S``, as a machine's init restarts a crashed service, at
  most ``MAX_RESTARTS`` times in ``RESTART_WINDOW_S`` (then it stays down); one that exits 0 is
  done. ``workload_restarts`` counts the restarts.
* On SIGTERM or SIGINT it passes SIGTERM to the workload, waits up to ``--stop-grace-s`` for it
  (then SIGKILL), writes ``state: "stopped"`` and exits 0.

Only the standard library is imported, so an agent starts in tens of milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

INSTANCE_ENV = "COADAPT_LOCAL_INSTANCE"  # marks the agent and its workload (set by the provider)
RESTART_DELAY_S = 1.0
RESTART_WINDOW_S = 60.0
MAX_RESTARTS = 5


def _write_state_file(path: Path, payload: dict[str, Any]) -> None:
    """Atomic, durable write (tmp + fsync + rename); stdlib only, unlike the package's
    ``coadapt_common.atomic`` (this script must not import the package). The one documented
    second atomic writer: ``tests/test_imports.py`` allows it here and nowhere else."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class Agent:
    """One instance: heartbeats, an optional workload, a clean stop on SIGTERM."""

    def __init__(
        self,
        instance_id: str,
        agent_dir: Path,
        gpus: int,
        heartbeat_s: float,
        stop_grace_s: float,
        user_data: str,
    ) -> None:
        self.instance_id = instance_id
        self.agent_dir = agent_dir
        self.gpus = gpus
        self.heartbeat_s = heartbeat_s
        self.stop_grace_s = stop_grace_s
        self.user_data = user_data
        self.started_at_s = time.time()
        self.workload: subprocess.Popen[bytes] | None = None
        self.workload_exit: int | None = None
        self.workload_restarts = 0
        self._restarted_at: list[float] = []
        self._restart_at: float | None = None
        self._stop_signal: int | None = None

    def _state(self, state: str) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "pid": os.getpid(),
            "pgid": os.getpgid(0),
            "gpu_slots": self.gpus,
            "state": state,
            "started_at_s": self.started_at_s,
            "heartbeat_at_s": time.time(),
            "workload_pid": None if self.workload is None else self.workload.pid,
            "workload_exit": self.workload_exit,
            "workload_restarts": self.workload_restarts,
            "stop_signal": self._stop_signal,
        }

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._stop_signal = signum

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        if self.user_data.strip():
            self._start_workload()
        state_path = self.agent_dir / "agent.json"
        while self._stop_signal is None:
            if self.workload is not None and self.workload_exit is None:
                self.workload_exit = self.workload.poll()
                if self.workload_exit not in (None, 0):
                    self._restart_at = self._may_restart()
            if self._restart_at is not None and time.monotonic() >= self._restart_at:
                self._restart_at = None
                self.workload_restarts += 1
                self._start_workload()
            self._report(state_path, "running")
            wait_s = self.heartbeat_s
            if self._restart_at is not None:
                wait_s = max(0.0, min(wait_s, self._restart_at - time.monotonic()))
            # Returns early when a signal arrives (the wakeup fd becomes readable).
            readable, _, _ = select.select([wake_r], [], [], wait_s)
            if readable:
                os.read(wake_r, 512)
        self._stop_workload()
        self._report(state_path, "stopped")
        return 0

    def _start_workload(self) -> None:
        env = dict(os.environ)
        env["COADAPT_INSTANCE_ID"] = self.instance_id
        env["COADAPT_GPU_SLOTS"] = str(self.gpus)
        self.workload_exit = None
        self.workload = subprocess.Popen(
            ["/bin/sh", "-c", self.user_data],
            cwd=self.agent_dir,
            env=env,
            stdin=subprocess.DEVNULL,
        )

    def _may_restart(self) -> float | None:
        """When to start a failed workload again (``None``: it has failed too often)."""
        now = time.monotonic()
        self._restarted_at = [t for t in self._restarted_at if now - t < RESTART_WINDOW_S]
        if len(self._restarted_at) >= MAX_RESTARTS:
            print(
                f"local agent {self.instance_id}: the workload failed {MAX_RESTARTS} times in "
                f"{RESTART_WINDOW_S:.0f} s (last exit {self.workload_exit}); not restarting it",
                file=sys.stderr,
                flush=True,
            )
            return None
        self._restarted_at.append(now)
        return now + RESTART_DELAY_S

    def _report(self, path: Path, state: str) -> None:
        try:
            _write_state_file(path, self._state(state))
        except OSError as err:
            print(f"local agent {self.instance_id}: cannot write {path}: {err}", file=sys.stderr)

    def _stop_workload(self) -> None:
        if self.workload is None or self.workload.poll() is not None:
            if self.workload is not None:
                self.workload_exit = self.workload.returncode
            return
        self.workload.terminate()
        try:
            self.workload_exit = self.workload.wait(timeout=self.stop_grace_s)
        except subprocess.TimeoutExpired:
            self.workload.kill()
            self.workload_exit = self.workload.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="local_agent.py", description=__doc__)
    parser.add_argument("--instance-id", required=True)
    parser.add_argument("--agent-dir", required=True, type=Path)
    parser.add_argument("--gpus", required=True, type=int)
    parser.add_argument("--heartbeat-s", type=float, default=2.0)
    parser.add_argument("--stop-grace-s", type=float, default=5.0)
    parser.add_argument("--user-data-file", type=Path, default=None)
    args = parser.parse_args(argv)
    user_data = ""
    if args.user_data_file is not None and args.user_data_file.exists():
        user_data = args.user_data_file.read_text(encoding="utf-8")
    agent = Agent(
        instance_id=args.instance_id,
        agent_dir=args.agent_dir,
        gpus=args.gpus,
        heartbeat_s=args.heartbeat_s,
        stop_grace_s=args.stop_grace_s,
        user_data=user_data,
    )
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
