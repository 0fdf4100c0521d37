"""``python -m trainer.launch`` / ``coadapt-launch``: run a training script under torchrun.

One launcher runs per node and job. It starts ``torchrun`` (c10d rendezvous; the workers pick
gloo on CPU, NCCL on GPU) with the environment of :mod:`trainer.env`, supervises it, and decides
what an exit means from the exit markers the workers leave in the run directory::

    python -m trainer.launch --job-id j1 --nproc-per-node 2 [--nnodes 1:4 --rdzv-endpoint H:P] \\
        [--checkpoint-uri s3://bucket/j1] [--controller-url http://ctl:8080] \\
        [--batch-size 256 --accum-steps 2] [--max-restarts 3] [--] script.py [script args...]

Everything after ``--`` (the node agent always writes one) is the script and its arguments,
never a launcher option, whatever it starts with; the script itself may not start with ``-``
(it would be read as an option by torchrun or by the interpreter).

Exit status (:class:`ExitCode`):

* ``0`` DONE: training finished (every local worker marked done).
* ``75`` STOPPED: the job checkpointed and stopped because this launcher got SIGTERM/SIGINT, a
  preemption notice appeared (``--stop-file``), or the controller asked. Relaunch it, at any
  world size, to continue. This never counts as a failure.
* ``1`` FAILED: workers failed more than ``--max-restarts`` times, or failed twice in a row the
  same way (same exit status and exit-marker causes: a deterministic failure that a retry
  cannot fix); the cause is logged on one line.
* ``2`` usage error, found before anything is launched (:func:`preflight`): a missing script, a
  local checkpoint folder that is a file, a bad ``--nnodes``/``--batch-size``/``--rdzv-endpoint``.

Stopping: the first SIGTERM/SIGINT asks the workers to checkpoint and stop; they get
``--shutdown-timeout-s`` (default 60 s) to do it, then the launcher kills them. A signal
repeated within that grace (a node agent and its instance's provider both asking, one right
after the other) changes nothing: only a second Ctrl-C (SIGINT after SIGINT) kills at once, and
a launch with no registered worker alive (nothing to checkpoint: torchrun starting, or stuck
in a rendezvous whose peers left) is killed by a repeated signal, or ``NOTHING_TO_SAVE_S``
after the first.

A job whose workers all finished is DONE even if a signal arrived meanwhile: a SIGTERM that comes
after the last step does not turn a finished job into a stopped one.

Restarts: torchrun itself runs with ``--max-restarts 0``; the launcher relaunches it. A *failure*
(a worker raised, crashed or was killed, with no stop marker) consumes one unit of the
``--max-restarts`` budget. A *rescale* (workers stopped with a checkpoint because another node
asked, or lost a peer that went away) relaunches without consuming the budget; with
``--nnodes MIN:MAX`` the new rendezvous then forms with whichever nodes are present, which is how a
multi-node job shrinks or grows. Worker processes run in their own sessions (torchrun starts
them so), so the launcher records their pids and ends any that outlive torchrun.

The launcher never imports torch (it would cost seconds on every restart).
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coadapt_common.atomic import write_json_atomic
from coadapt_common.clock import Clock, SystemClock
from coadapt_common.procfs import is_running, process_start_time, read_stat
from trainer import env as envvars
from trainer import preload
from trainer.control import ExitKind, ExitMarker, RunDir
from trainer.errors import LaunchError, TrainerConfigError

logger = logging.getLogger("trainer.launch")

NOTHING_TO_SAVE_S = 10.0
"""How long after a stop request torchrun may go on with no registered worker alive (it may
be in a rendezvous whose peers are gone) before the launcher kills it: there is nothing to
checkpoint, so the grace of ``--shutdown-timeout-s`` is not waited out."""

EXIT_FILE = "launcher-exit.json"
"""With ``--run-dir``, the launcher writes its exit status there as it exits: ``{"status": N}``
(a node agent that restarted and adopted it reads it: it is not that agent's child)."""

#: Thread-pool sizes set to 1 for the preload server (see ``_start_preload``).
_SINGLE_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class StderrCopier:
    """Copies torchrun's stderr (its workers write there too) to this launcher's, line by
    line, in a daemon thread, except what torchrun prints when the stop this launcher
    forwarded reaches it: its "death signal" warnings, and the traceback of the
    ``SignalException`` it raises, are said in one line instead. Everything else (a worker's
    own traceback included) is copied as it is. ``stopping()`` says whether this launcher has
    asked for a stop."""

    _DEATH_NOTES = (b"death signal, shutting down workers", b"closing signal SIGTERM")
    _MAX_HELD_LINES = 400

    def __init__(self, pipe: typing.IO[bytes], stopping: typing.Callable[[], bool]) -> None:
        import threading

        self._pipe = pipe
        self._stopping = stopping
        self._out = sys.stderr.buffer
        self._thread = threading.Thread(target=self._copy, name="torchrun-stderr", daemon=True)
        self._thread.start()

    def _write(self, lines: Sequence[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._out.write(b"".join(lines))
            self._out.flush()

    def _copy(self) -> None:
        held: list[bytes] | None = None  # a traceback being read
        with contextlib.suppress(OSError, ValueError):
            for line in iter(self._pipe.readline, b""):
                if held is None:
                    if line.startswith(b"Traceback (most recent call last):"):
                        held = [line]
                    elif not (self._stopping() and any(n in line for n in self._DEATH_NOTES)):
                        self._write([line])
                    continue
                held.append(line)
                if line[:1] in (b" ", b"\t") and len(held) < self._MAX_HELD_LINES:
                    continue
                if b"SignalException" in line and self._stopping():
                    text = line.decode(errors="replace").strip().rsplit(":", 1)[-1].strip()
                    logger.info(
                        "torchrun stopped by signal %s (the stop this launcher forwarded; "
                        "not a failure)",
                        text or "?",
                    )
                else:
                    self._write(held)
                held = None
        if held:
            self._write(held)

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the copy to reach the end of the pipe."""
        self._thread.join(timeout_s)


class ExitCode(enum.IntEnum):
    DONE = 0
    FAILED = 1
    USAGE = 2
    STOPPED = 75  # EX_TEMPFAIL: stopped with a checkpoint, relaunch to continue


class Verdict(enum.StrEnum):
    DONE = "done"
    STOPPED = "stopped"  # exit 75, do not relaunch here
    RESCALE = "rescale"  # relaunch now, not a failure
    FAILURE = "failure"  # relaunch if the budget allows


@dataclass(frozen=True)
class LaunchConfig:
    """Everything one launcher needs; ``nnodes`` is ``"N"`` or ``"MIN:MAX"``."""

    script: str
    script_args: tuple[str, ...] = ()
    job_id: str = envvars.DEFAULT_JOB_ID
    nproc_per_node: int = 1
    nnodes: str = "1"
    rdzv_endpoint: str | None = None
    max_restarts: int = 3
    max_rescales: int = -1
    checkpoint_uri: str | None = None
    controller_url: str | None = None
    report_file: str | None = None
    report_interval_s: float | None = None
    batch_size: int | None = None
    accum_steps: int | None = None
    run_dir: str | None = None
    stop_file: str | None = None
    shutdown_timeout_s: int = 60
    monitor_interval_s: float = 0.1
    omp_num_threads: int | None = None
    preload: bool = True
    preload_modules: tuple[str, ...] = ()
    extra_torchrun_args: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.script or self.script.startswith("-"):
            raise TrainerConfigError(
                f"the script must be a path, not an option: {self.script!r}", field="script"
            )
        if self.nproc_per_node < 1:
            raise TrainerConfigError("must be >= 1", field="nproc_per_node")
        if self.max_restarts < 0:
            raise TrainerConfigError("must be >= 0", field="max_restarts")
        parts = self.nnodes.split(":")
        if not 1 <= len(parts) <= 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
            raise TrainerConfigError(f"expected N or MIN:MAX, got {self.nnodes!r}", field="nnodes")
        if len(parts) == 2 and int(parts[0]) > int(parts[1]):
            raise TrainerConfigError(f"MIN > MAX in {self.nnodes!r}", field="nnodes")
        if self.accum_steps is not None and self.batch_size is None:
            raise TrainerConfigError("needs --batch-size", field="accum_steps")
        for name in ("batch_size", "accum_steps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise TrainerConfigError(f"must be >= 1, got {value}", field=name)

    @property
    def elastic(self) -> bool:
        parts = self.nnodes.split(":")
        return len(parts) == 2 and parts[0] != parts[1]


def preflight(config: LaunchConfig, cwd: str | None = None) -> None:
    """Check what can be checked before launching; raises :class:`TrainerConfigError`.

    The script must be a file; a local ``--checkpoint-uri`` (a path or ``file://``; default
    ``checkpoints/JOB_ID``) must not be, or lie under, an existing non-folder; ``--rdzv-endpoint``
    must be ``HOST:PORT`` with a port in 1-65535 and a host that resolves.
    """
    base = Path(cwd or os.getcwd())
    script = base / config.script
    if not script.is_file():
        what = "is a folder" if script.is_dir() else "no such file"
        raise TrainerConfigError(f"{config.script}: {what}", field="script")
    uri = config.checkpoint_uri or str(Path("checkpoints") / config.job_id)
    if "://" not in uri or uri.startswith("file://"):
        path = base / uri.removeprefix("file://")
        for folder in (path, *path.parents):
            if folder.exists():
                if not folder.is_dir():
                    raise TrainerConfigError(
                        f"{uri}: {folder} exists and is not a folder", field="checkpoint_uri"
                    )
                break
    if config.rdzv_endpoint is not None:
        host, sep, port = config.rdzv_endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise TrainerConfigError(
                f"expected HOST:PORT, got {config.rdzv_endpoint!r}", field="rdzv_endpoint"
            )
        try:
            socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
        except OSError as e:
            raise TrainerConfigError(
                f"cannot resolve host {host!r}: {e}", field="rdzv_endpoint"
            ) from e


def failure_signature(markers: Sequence[ExitMarker], returncode: int) -> tuple[object, ...]:
    """What identifies one failure: the exit status and the failed workers' causes. Pure."""
    causes = sorted((m.rank, m.cause or "") for m in markers if m.kind is ExitKind.FAILED)
    return (returncode, tuple(causes))


def is_torchrun_exception(name: str) -> bool:
    """Whether an exception's (qualified) name is one torchrun raises about its workers
    (``ChildFailedError``, ``RendezvousClosedError``, the rest of ``torch.distributed.elastic``),
    never a worker's own. Pure."""
    return (
        "ChildFailedError" in name
        or name.startswith("torch.distributed.elastic.")
        or name.startswith("Rendezvous")
    )


NO_MARKER = "the script failed before trainer.init (no exit marker)"
"""What a failure that left no exit marker is: the trainer leaves one for any exception raised
after trainer.init (its excepthook, also under the preload server, or ``with``), so a worker
that failed without one failed before it (an import, the arguments) or was killed."""

CAUSE_PREFIX = "coadapt-launch: failed: "
"""The launcher's last line on stderr when it exits with a failure (1) or a usage error (2):
this prefix, then why, in one line (:func:`failure_phrase`, or the usage error). The node
agent reads it back from the job's log (:func:`autoscaler.controller.agent.failure_cause`)."""


def failure_phrase(signature: tuple[object, ...], markers: Sequence[ExitMarker] = ()) -> str:
    """Why one run failed, without its exit status: :data:`NO_MARKER`, or, for each distinct
    exception the workers' exit markers name, the phase it was raised in (``in its training
    loop at step N`` once a step was taken, else ``after trainer.init, before its first
    step``; ``markers``, when given, have the steps) and the script's own exception line."""
    _returncode, causes = signature
    if not causes:
        return NO_MARKER
    steps: dict[str, int] = {}
    for m in markers:
        if m.kind is ExitKind.FAILED:
            steps[m.cause or ""] = max(steps.get(m.cause or "", 0), m.step)
    parts = []
    for cause in sorted({cause for _rank, cause in causes}):  # type: ignore[attr-defined]
        step = steps.get(cause)
        if step is None:
            parts.append(f"the script raised after trainer.init: {cause}")
        elif step > 0:
            parts.append(f"the script raised in its training loop at step {step}: {cause}")
        else:
            parts.append(f"the script raised after trainer.init, before its first step: {cause}")
    return "; ".join(parts)


def describe_failure(signature: tuple[object, ...], markers: Sequence[ExitMarker] = ()) -> str:
    """One line for :func:`failure_signature`'s value: the exit status and
    :func:`failure_phrase`."""
    returncode, causes = signature
    if not causes:
        return f"exit status {returncode}, {NO_MARKER}; its traceback is above"
    return f"exit status {returncode}: {failure_phrase(signature, markers)}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def torchrun_command(
    config: LaunchConfig, endpoint: str, python: str = sys.executable
) -> list[str]:
    """The ``torchrun`` command line for one launch."""
    rdzv_conf = "keep_alive_interval=1,keep_alive_max_attempt=3"
    if config.elastic:
        rdzv_conf += ",last_call_timeout=1"
    return [
        python,
        *(["-m", "trainer.preload", "run"] if config.preload else []),  # forked, torch imported
        "-m",
        "torch.distributed.run",
        f"--nnodes={config.nnodes}",
        f"--nproc-per-node={config.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={config.job_id}",
        f"--rdzv-conf={rdzv_conf}",
        "--max-restarts=0",
        f"--monitor-interval={config.monitor_interval_s}",
        f"--shutdown-timeout={config.shutdown_timeout_s}",
        *config.extra_torchrun_args,
        *(["--module", "trainer.preload", "run"] if config.preload else []),
        config.script,
        *config.script_args,
    ]


def worker_environment(
    config: LaunchConfig, run_dir: str, attempt: int, base: Mapping[str, str]
) -> dict[str, str]:
    """The environment torchrun (and so every worker) gets."""
    env = dict(base)
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if "OMP_NUM_THREADS" not in env or config.omp_num_threads is not None:
        cores = os.cpu_count() or 1
        threads = config.omp_num_threads or max(1, cores // config.nproc_per_node)
        env["OMP_NUM_THREADS"] = str(threads)
    env[envvars.JOB_ID] = config.job_id
    env[envvars.RUN_DIR] = run_dir
    env[envvars.ATTEMPT] = str(attempt)
    optional = {
        envvars.CHECKPOINT_URI: config.checkpoint_uri,
        envvars.CONTROLLER_URL: config.controller_url,
        envvars.REPORT_FILE: config.report_file,
        envvars.REPORT_INTERVAL_S: config.report_interval_s,
        envvars.BATCH_SIZE: config.batch_size,
        envvars.ACCUM_STEPS: config.accum_steps,
        envvars.STOP_FILE: config.stop_file,
    }
    for name, value in optional.items():
        if value is not None:
            env[name] = str(value)
    # Let the workers import the project the launcher was started from.
    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    return env


def classify(markers: Sequence[ExitMarker], returncode: int, signalled: bool) -> Verdict:
    """What one torchrun run's end means (see module docstring). Pure."""
    kinds = {m.kind for m in markers}
    if markers and kinds == {ExitKind.DONE}:
        return Verdict.DONE  # finished before any signal could stop it
    if ExitKind.FAILED in kinds:
        return Verdict.FAILURE
    if ExitKind.STOPPED in kinds:
        if signalled or any(m.initiated for m in markers):
            return Verdict.STOPPED
        return Verdict.RESCALE
    if ExitKind.PEER_LOST in kinds:
        return Verdict.STOPPED if signalled else Verdict.RESCALE
    if signalled:
        return Verdict.STOPPED
    if returncode == 0:
        return Verdict.DONE
    return Verdict.FAILURE


def end_processes(
    pids: Sequence[tuple[int, str | None]], *, grace_s: float = 5.0, clock: Clock | None = None
) -> list[int]:
    """SIGTERM, then after ``grace_s`` SIGKILL, every listed process that is still the same
    process (pid and kernel start time match). Returns the pids that had to be signalled."""
    clock = clock or SystemClock()
    alive = [
        pid
        for pid, start in pids
        if process_start_time(pid) is not None
        and (start is None or process_start_time(pid) == start)
    ]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = clock.monotonic_s() + grace_s
    remaining = list(alive)
    while remaining and clock.monotonic_s() < deadline:
        remaining = [pid for pid in remaining if is_running(read_stat(pid))]
        if remaining:
            clock.sleep(0.05)
    for pid in remaining:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return alive


def _signal_all(pids: Sequence[tuple[int, str | None]], signum: int) -> bool:
    """Signal every listed process that is still the same process; False if none was."""
    sent = False
    for pid, start in pids:
        if start is not None and process_start_time(pid) != start:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
            sent = True
    return sent


class Launcher:
    """Runs and re-runs torchrun for one job on this node (see module docstring)."""

    def __init__(
        self,
        config: LaunchConfig,
        *,
        clock: Clock | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self._clock = clock or SystemClock()
        self._environ = dict(os.environ if environ is None else environ)
        self._signalled = 0
        self._first_signal: int | None = None
        self._stop_asked_at: float | None = None  # monotonic, the first stop request
        self._told: set[tuple[int, str | None]] = set()  # workers this launcher signalled
        self._proc: subprocess.Popen[bytes] | None = None
        self._run_dir: Path | None = None
        self._failure: tuple[object, ...] = ()
        self.attempts = 0
        self.failures = 0
        self.rescales = 0
        self.failure_phrase = ""  # why the last failed run failed (failure_phrase)
        self.verdicts: list[Verdict] = []
        self.last_failure: tuple[object, ...] | None = None

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signalled += 1
        if self._first_signal is None:
            self._first_signal = signum
            self._stop_asked_at = self._clock.monotonic_s()
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        if self._signalled == 1:
            if self._finished_workers() is not None or self._all_done():
                # Every worker has finished training (and saved): torchrun and the workers are
                # only exiting, and _wait ends torchrun. Signalling now would only make them
                # die by SIGTERM and torchrun print a ChildFailedError for a job that is over.
                logger.info("signal %d: the workers have already finished", signum)
                self._told.update(RunDir(self._run_dir).pids() if self._run_dir else [])
                return
            logger.warning(
                "signal %d: asking the workers to checkpoint and stop (they have %d s)",
                signum,
                self.config.shutdown_timeout_s,
            )
            # Straight to the workers when all have registered: they stop at an agreed step and
            # exit 0, and torchrun ends cleanly. Otherwise through torchrun, which forwards it.
            pids = RunDir(self._run_dir).pids() if self._run_dir else []
            self._told.update(pids)
            if len(pids) >= self.config.nproc_per_node and _signal_all(pids, signal.SIGTERM):
                return
            proc.send_signal(signal.SIGTERM)
        elif signum == signal.SIGINT and self._first_signal == signal.SIGINT:
            logger.warning("second Ctrl-C: killing torchrun and the workers")
            self._kill(proc)
        elif not self._checkpointing():
            logger.warning(
                "signal %d again: no worker is running, nothing to checkpoint: killing torchrun",
                signum,
            )
            self._kill(proc)
        else:
            # A stop is already under way: a repeated request (an agent and its instance
            # both asking, one right after the other) must not cost the job its checkpoint.
            # _wait kills the workers once the grace has run out.
            left = self.config.shutdown_timeout_s - self._stopping_for_s()
            logger.info(
                "signal %d again: already stopping; the workers have %.0f s left to checkpoint",
                signum,
                max(0.0, left),
            )

    def _checkpointing(self) -> bool:
        """Some registered worker of this launch is alive: a stop may be saving its
        checkpoint. (A worker registers before it restores: one that has not has trained
        nothing since the last checkpoint.)"""
        if self._run_dir is None:
            return False
        return any(is_running(read_stat(pid)) for pid, _ in RunDir(self._run_dir).pids())

    def _stopping_for_s(self) -> float:
        if self._stop_asked_at is None:
            return 0.0
        return self._clock.monotonic_s() - self._stop_asked_at

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.kill()
        if self._run_dir:
            _signal_all(RunDir(self._run_dir).pids(), signal.SIGKILL)

    def run(self) -> int:
        """Supervise until done, stopped or out of restarts; returns the exit status."""
        config = self.config
        own_run_dir = config.run_dir is None
        run_dir = Path(config.run_dir or tempfile.mkdtemp(prefix=f"coadapt-{config.job_id}-"))
        endpoint = config.rdzv_endpoint or f"127.0.0.1:{free_port()}"
        handled = (signal.SIGTERM, signal.SIGINT)
        previous = {s: signal.signal(s, self._on_signal) for s in handled}
        if config.controller_url is None:
            report = config.report_file or str(Path("coadapt-reports") / f"{config.job_id}.jsonl")
            logger.info(
                "standalone (no --controller-url): reports go to %s, checkpoints to %s",
                Path(report).absolute(),
                config.checkpoint_uri or Path("checkpoints", config.job_id).absolute(),
            )
        try:
            while True:
                verdict = self._run_once(run_dir, endpoint)
                self.verdicts.append(verdict)
                if verdict is Verdict.DONE:
                    return ExitCode.DONE
                if verdict is Verdict.STOPPED:
                    return ExitCode.STOPPED
                if verdict is Verdict.RESCALE:
                    self.rescales += 1
                    if 0 <= config.max_rescales < self.rescales:
                        logger.error("more than %d rescales; stopping", config.max_rescales)
                        return ExitCode.STOPPED
                    logger.warning("rescale: relaunching (not counted as a failure)")
                    continue
                self.failures += 1
                signature = self._failure
                if signature == self.last_failure:
                    logger.error(
                        "fatal: the same failure twice in a row, not retrying: %s",
                        describe_failure(signature),
                    )
                    return ExitCode.FAILED
                self.last_failure = signature
                if self.failures > config.max_restarts:
                    logger.error(
                        "worker failure %d > --max-restarts %d", self.failures, config.max_restarts
                    )
                    return ExitCode.FAILED
                logger.warning(
                    "worker failure %d of %d allowed; relaunching",
                    self.failures,
                    config.max_restarts,
                )
                self._clock.sleep(min(30.0, 1.0 * self.failures))
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            if own_run_dir:
                shutil.rmtree(run_dir, ignore_errors=True)

    def _run_once(self, run_dir: Path, endpoint: str) -> Verdict:
        rd = RunDir(run_dir)
        rd.clear()
        self._run_dir = run_dir
        command = torchrun_command(self.config, endpoint)
        env = worker_environment(self.config, str(run_dir), self.attempts, self._environ)
        self.attempts += 1
        server = self._start_preload(run_dir, env) if self.config.preload else None
        try:
            self._proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
        except OSError as e:
            self._stop_preload(server)
            raise LaunchError(f"cannot start torchrun: {e}") from e
        assert self._proc.stderr is not None
        copier = StderrCopier(self._proc.stderr, lambda: self._signalled > 0)
        if self._signalled:  # a signal arrived while starting
            self._proc.send_signal(signal.SIGTERM)
        returncode = self._wait(self._proc)
        logger.info("torchrun (pid %d) exited with %d", self._proc.pid, returncode)
        self._proc = None
        leftovers = end_processes(rd.pids(), clock=self._clock)
        self._stop_preload(server)
        copier.join(timeout_s=5.0)
        if leftovers:
            logger.warning("ended %d worker process(es) that outlived torchrun", len(leftovers))
        markers = rd.markers()
        verdict = classify(markers, returncode, self._signalled > 0)
        self._failure = failure_signature(markers, returncode)
        logger.info("verdict: %s", verdict)
        if verdict is Verdict.FAILURE:
            self.failure_phrase = failure_phrase(self._failure, markers)
            logger.warning("worker failure: %s", describe_failure(self._failure, markers))
        return verdict

    def _start_preload(self, run_dir: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start the preload server (see trainer.preload) alongside torchrun."""
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / "preload.sock"
        own_dir = None
        if len(str(path)) > 100:  # AF_UNIX path limit
            own_dir = tempfile.mkdtemp(prefix="coadapt-")
            path = Path(own_dir) / "preload.sock"
        env[preload.SOCKET_ENV] = str(path)
        modules = (*preload.DEFAULT_MODULES, *self.config.preload_modules)
        command = [sys.executable, "-u", "-m", "trainer.preload", "serve", str(path), *modules]
        # The server itself runs single-threaded: a BLAS/OpenMP pool started while it imports
        # would be forked into every worker (it warned "forking with N native threads"). Each
        # forked worker then sets torch's threads from its own OMP_NUM_THREADS.
        server_env = {**env, **dict.fromkeys(_SINGLE_THREAD_VARS, "1")}
        server = subprocess.Popen(
            command, env=server_env, stdin=subprocess.PIPE, start_new_session=True
        )
        server.coadapt_socket_dir = own_dir  # type: ignore[attr-defined]
        return server

    def _stop_preload(self, server: subprocess.Popen[bytes] | None) -> None:
        """End the server after torchrun: at once if it has no child left (the usual case),
        else after it has ended its children (a worker forked before registering a pid)."""
        if server is None:
            return
        with contextlib.suppress(OSError):
            if server.stdin is not None:
                server.stdin.close()  # EOF: it stops serving and ends its children
        try:
            server.wait(timeout=3)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        socket_dir = Path(getattr(server, "coadapt_socket_dir", "") or "")
        if socket_dir.name.startswith("coadapt-"):
            shutil.rmtree(socket_dir, ignore_errors=True)

    def _wait(self, proc: subprocess.Popen[bytes]) -> int:
        """Wait for torchrun, but not for its teardown or exit barrier once its workers are done.

        When every local worker has exited with a final marker, torchrun has nothing left to
        do but pass its exit barrier with the other nodes' agents and tear its interpreter down
        (~1 s). After a stop this launcher asked for, it is ended after 0.2 s (one node) or 2 s
        (several: enough for the agents to pass the barrier together). Otherwise it is given
        30 s: it may be starting a new worker generation for a membership change (whose workers
        clear their markers when they start), and only a barrier whose peer died waits longer.
        """
        finished_since: float | None = None
        while True:
            try:
                return proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
            if self._signalled:
                self._tell_late_workers()
            if self._signalled and self._stopping_for_s() > self.config.shutdown_timeout_s:
                logger.warning(
                    "the workers did not checkpoint and stop within %d s: killing them",
                    self.config.shutdown_timeout_s,
                )
                self._kill(proc)
                return proc.wait()
            kinds = self._finished_workers()
            if kinds is None:
                finished_since = None
                if (
                    self._signalled
                    and self._stopping_for_s() > NOTHING_TO_SAVE_S
                    and not self._checkpointing()
                ):
                    logger.warning(
                        "torchrun still runs %.0f s after the stop with no worker to "
                        "checkpoint: killing it",
                        NOTHING_TO_SAVE_S,
                    )
                    self._kill(proc)
                    return proc.wait()
                continue
            now = self._clock.monotonic_s()
            finished_since = now if finished_since is None else finished_since
            alone = self.config.nnodes == "1"
            grace = (0.2 if alone else 2.0) if self._signalled else 30.0
            if now - finished_since >= grace:
                logger.info("workers finished (%s); ending torchrun", sorted(kinds))
                proc.kill()
                proc.wait()
                return 0 if ExitKind.FAILED not in kinds else 1

    def _tell_late_workers(self) -> None:
        """After a stop, SIGTERM each worker that registered since: one that torchrun was
        starting when the stop came may never be signalled by torchrun (its handler can run before
        it holds the new workers' handles), and would otherwise train on to the end."""
        if self._run_dir is None:
            return
        late = [p for p in RunDir(self._run_dir).pids() if p not in self._told]
        if late:
            self._told.update(late)
            _signal_all(late, signal.SIGTERM)

    def _all_done(self) -> bool:
        """Every local worker has written a DONE marker (it may still be exiting)."""
        if self._run_dir is None:
            return False
        markers = RunDir(self._run_dir).markers()
        ranks = {m.rank for m in markers if m.kind is ExitKind.DONE}
        return ranks == set(range(self.config.nproc_per_node))

    def _finished_workers(self) -> set[ExitKind] | None:
        """The exit kinds if every local worker has a marker and has exited, else ``None``."""
        if self._run_dir is None:
            return None
        rd = RunDir(self._run_dir)
        markers = rd.markers()
        if {m.rank for m in markers} != set(range(self.config.nproc_per_node)):
            return None
        if any(is_running(read_stat(pid)) for pid, _ in rd.pids()):
            return None
        return {m.kind for m in markers}


def parse_args(argv: Sequence[str] | None = None) -> LaunchConfig:
    p = argparse.ArgumentParser(
        prog="coadapt-launch", description="Run an elastic coadapt training script under torchrun."
    )
    p.add_argument(
        "--job-id",
        default=os.environ.get(envvars.JOB_ID, envvars.DEFAULT_JOB_ID),
        help="job name; names the default checkpoint folder and the reports (default: %(default)s)",
    )
    p.add_argument(
        "--nproc-per-node", type=int, default=1, help="worker processes here (default: 1)"
    )
    p.add_argument("--nnodes", default="1", help="N or MIN:MAX nodes (default: 1)")
    p.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT (default: a free local port)")
    p.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="relaunches after worker failures; rescales do not count (default: 3)",
    )
    p.add_argument(
        "--max-rescales",
        type=int,
        default=-1,
        help="relaunches for rescales; -1: unlimited (default)",
    )
    p.add_argument(
        "--checkpoint-uri",
        default=None,
        help="folder, file://, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX "
        "(default: checkpoints/JOB_ID)",
    )
    p.add_argument("--controller-url", default=None, help="http(s) URL (default: none, standalone)")
    p.add_argument(
        "--report-file",
        default=None,
        help="standalone: append JSON-lines reports here "
        "(default: coadapt-reports/JOB_ID.jsonl in the working folder)",
    )
    p.add_argument(
        "--report-interval-s",
        type=float,
        default=None,
        help="seconds between reports (default: 30)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="global batch size, samples, >= 1 (default: the script's initial_batch_size)",
    )
    p.add_argument(
        "--accum-steps", type=int, default=None, help="gradient-accumulation steps (default: 1)"
    )
    p.add_argument(
        "--run-dir", default=None, help="pid and exit-marker folder (default: a temporary folder)"
    )
    p.add_argument(
        "--stop-file", default=None, help="preemption notice: stop when it exists (default: none)"
    )
    p.add_argument(
        "--shutdown-timeout-s",
        type=int,
        default=60,
        help="seconds workers get to save and exit on SIGTERM before they are killed (default: 60)",
    )
    p.add_argument(
        "--monitor-interval-s",
        type=float,
        default=0.1,
        help="torchrun's poll period, seconds (default: 0.1)",
    )
    p.add_argument(
        "--omp-num-threads",
        type=int,
        default=None,
        help="threads per worker (default: $OMP_NUM_THREADS, else CPU cores / --nproc-per-node)",
    )
    p.add_argument(
        "--no-preload",
        dest="preload",
        action="store_false",
        help="start every worker as a fresh interpreter (default: fork them from a server "
        "that has imported torch)",
    )
    p.add_argument(
        "--preload-module",
        action="append",
        default=[],
        help="also pre-import this module in the fork server (repeatable; default: none)",
    )
    p.add_argument(
        "--torchrun-arg",
        action="append",
        default=[],
        help="extra torchrun argument (repeatable; default: none)",
    )
    p.add_argument("script", help="the training script (imports trainer)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    args = p.parse_args(argv)
    return LaunchConfig(
        script=args.script,
        script_args=tuple(args.script_args),
        job_id=args.job_id,
        nproc_per_node=args.nproc_per_node,
        nnodes=args.nnodes,
        rdzv_endpoint=args.rdzv_endpoint,
        max_restarts=args.max_restarts,
        max_rescales=args.max_rescales,
        checkpoint_uri=args.checkpoint_uri,
        controller_url=args.controller_url,
        report_file=args.report_file,
        report_interval_s=args.report_interval_s,
        batch_size=args.batch_size,
        accum_steps=args.accum_steps,
        run_dir=args.run_dir,
        stop_file=args.stop_file,
        shutdown_timeout_s=args.shutdown_timeout_s,
        monitor_interval_s=args.monitor_interval_s,
        omp_num_threads=args.omp_num_threads,
        preload=args.preload,
        preload_modules=tuple(args.preload_module),
        extra_torchrun_args=tuple(args.torchrun_arg),
    )


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s coadapt-launch %(levelname)s %(message)s"
    )
    try:
        config = parse_args(argv)
        preflight(config)
    except TrainerConfigError as e:
        print(f"{CAUSE_PREFIX}{e}", file=sys.stderr, flush=True)  # one line, the cause
        return ExitCode.USAGE
    launcher = Launcher(config)
    try:
        code = int(launcher.run())
        cause = launcher.failure_phrase
    except LaunchError as e:
        code, cause = ExitCode.FAILED, str(e)
    if code == ExitCode.FAILED and cause:
        print(f"{CAUSE_PREFIX}{cause}", file=sys.stderr, flush=True)
    if config.run_dir is not None:  # whoever adopts this launcher reads how it ended
        with contextlib.suppress(OSError):
            write_json_atomic(Path(config.run_dir) / EXIT_FILE, {"status": code})
    return code


if __name__ == "__main__":
    sys.exit(main())
