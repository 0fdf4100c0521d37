"""The node agent's core: the controller's assignments in, launcher processes out.

One agent runs on each instance. Each round it reads what the controller assigned to its
instance (:class:`JobAssignment`: the job, its GPUs here, every instance of the job with its
GPUs, the rendezvous endpoint), and :func:`plan` decides, as a pure function of what is
assigned and what runs, what to do (:class:`AgentAction`):

* assigned, not running -> ``start``;
* running, no longer assigned -> ``stop`` (the launcher checkpoints and exits 75);
* running with another allocation (GPUs here, the set of instances, the rendezvous) ->
  ``restart``: stop with a checkpoint, start again on the new allocation (the job resumes from
  the checkpoint at the new size).

:class:`Supervisor` carries the actions out, one ``trainer.launch`` launcher per job, each in
its own session and process group, logs to :meth:`Supervisor.log_path`. Every process it
starts, and every process they start (torchrun's workers start their own sessions), carries
``COADAPT_AGENT_ID=<agent id>`` in its environment; :meth:`Supervisor.sweep` ends every
process that carries it, so nothing is left behind when the agent stops. An agent that
restarts after a crash (kill -9) first adopts the launchers its previous life left running
(:meth:`Supervisor.adopt`, from ``processes.json``: same pid, same kernel start time, same
marker), so their jobs go on untouched, and ends every other process that life left; it tells
the controller which jobs it adopted and which it found gone (they start again from their
checkpoints), which records the restart. Each launcher's run folder (pids, exit markers, its
exit status) is ``<work_dir>/runs/<job>``, removed when the job ends here. Stopping is SIGTERM to
the launcher (it asks its workers to checkpoint, and gives them ``stop_grace_s``, default
:data:`STOP_GRACE_S`, which the agent passes it as ``--shutdown-timeout-s``), a wait of that
grace plus :data:`KILL_MARGIN_S`, then SIGKILL to the group and a sweep. :func:`exit_outcome`
reads a launcher's exit status: ``0`` done, ``75`` stopped (a checkpointed stop: never a
failure), anything else failed.

Credentials (:mod:`autoscaler.controller.credentials`): the agent calls the API with its
instance's own credential, renewed when the controller's heartbeat answer carries a new one
(after a rotation of the agent key). It never hands that credential to a job. Each assignment
carries its job's report credential; the supervisor writes it to a 0600 file of that job
(``<work_dir>/credentials/<job>.token``, rewritten when the controller hands out a new one)
and gives the launcher the file's path in ``COADAPT_REPORT_TOKEN_FILE``: the trainer reads it
before each report. A job's command follows the launcher's options after ``--``, so nothing
in it is ever read as a launcher option (:func:`launch_argv`). With ``storage`` (a cloud node:
:mod:`autoscaler.controller.job_storage`) each job is also handed a credential for its own
checkpoints only: minted before it starts (a job whose credential cannot be made does not start;
the agent says why once, and tries again at the next step), written to a 0600 file of the job
(:meth:`Supervisor.storage_paths`; on AWS with an ``AWS_CONFIG_FILE`` whose
``credential_process`` reads it), renewed there at 2/3 of its lifetime by every
:meth:`AgentRunner.step` (:meth:`Supervisor.renew_storage_credentials`), and the job starts
without the agent's own cloud credential variables (:data:`CLOUD_CREDENTIAL_ENV`).

A launcher's output goes through a pipe to a capped log writer of its own
(:mod:`coadapt_common.logcap`), which writes :meth:`Supervisor.log_path`: not the agent, so an
agent that dies does not cut a job's output. With ``isolate`` (an agent run as root) the
launcher runs as the job's own unprivileged user (:mod:`coadapt_common.jobexec`): its
checkpoint folder mounted for it, its home and report credential in a folder of its own, the
agent's credential and folders out of its reach.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Final

import trainer
from autoscaler.controller.client import ApiClient, ApiError
from autoscaler.controller.job_storage import (
    JobCredential,
    JobCredentialError,
    JobCredentialSource,
)
from autoscaler.errors import InvalidInputError
from coadapt_common.atomic import rotate_file, write_bytes_atomic, write_json_atomic
from coadapt_common.clock import Clock
from coadapt_common.diskspace import free_bytes, is_disk_full
from coadapt_common.jobexec import job_uid, jobexec_argv
from coadapt_common.logcap import DEFAULT_LOG_MAX_BYTES, grow_pipe, logcap_argv, older_path
from coadapt_common.procfs import (
    PROC_ROOT,
    is_running,
    process_start_time,
    read_proc_strings,
    read_stat,
)
from providers.errors import ProviderError
from trainer.env import REPORT_TOKEN_FILE
from trainer.launch import (
    CAUSE_PREFIX,
    EXIT_FILE,
    NO_MARKER,
    ExitCode,
    is_torchrun_exception,
)

__all__ = [
    "AGENT_ENV",
    "ActionKind",
    "Adoption",
    "AgentAction",
    "AgentRunner",
    "JobAssignment",
    "Outcome",
    "Supervisor",
    "deterministic_reason",
    "exit_outcome",
    "launch_argv",
    "notice_source",
    "plan",
]

log = logging.getLogger(__name__)

AGENT_ENV: Final = "COADAPT_AGENT_ID"
"""Environment marker of every process an agent starts (and their children)."""

STOPPED_EXIT: Final = 75  # trainer.launch.ExitCode.STOPPED

STOP_GRACE_S: Final = 60.0
"""A job's checkpoint grace: how long its workers have, once asked to stop, to save a
checkpoint and exit before their launcher kills them (the launcher's
``--shutdown-timeout-s``). The local provider's own grace is longer (``service.py``)."""
RENEW_RETRY_S: Final = 60.0
"""After a failed renewal of a job's checkpoint credential, how long before it is tried again
(the credential it has is still good for a third of its life: minutes)."""
KILL_MARGIN_S: Final = 10.0
"""After the grace, how long a launcher has to end torchrun and exit before the agent kills
its process group."""


@dataclass(frozen=True)
class JobAssignment:
    """One job assigned to this instance. ``nodes``: every instance of the job and its GPUs,
    in rank order (this one included); ``rendezvous``: ``HOST:PORT`` of the c10d rendezvous;
    ``command``: the training script and its arguments (what follows the launcher's
    options, after ``--``); ``report_token``: the job's report credential (not part of the
    allocation: a new one is handed to the running job, which is not restarted)."""

    job: str
    gpus: int
    nodes: tuple[tuple[str, int], ...]
    rendezvous: str
    command: tuple[str, ...]
    checkpoint_uri: str | None = None
    batch: tuple[int, int] | None = None
    report_token: str | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise InvalidInputError(f"{self.job}: gpus must be >= 1", field="gpus")
        if not self.command:
            raise InvalidInputError(f"{self.job}: no command to run", field="command")
        object.__setattr__(self, "nodes", tuple((str(k), int(g)) for k, g in self.nodes))
        object.__setattr__(self, "command", tuple(self.command))
        if self.batch is not None:
            size, accum = (int(v) for v in self.batch)
            if size < 1 or accum < 1:
                raise InvalidInputError(f"{self.job}: bad batch {self.batch!r}", field="batch")
            object.__setattr__(self, "batch", (size, accum))

    @property
    def allocation(self) -> tuple[object, ...]:
        """What a change of restarts the job: GPUs here, the instances, the rendezvous. (A
        new ``batch`` does not: a running job gets it in its report replies.)"""
        return (self.gpus, self.nodes, self.rendezvous)


class ActionKind(StrEnum):
    START = "start"
    STOP = "stop"
    RESTART = "restart"


@dataclass(frozen=True)
class AgentAction:
    kind: ActionKind
    job: str
    assignment: JobAssignment | None = None
    reason: str = ""


def plan(
    assigned: Mapping[str, JobAssignment], running: Mapping[str, JobAssignment]
) -> list[AgentAction]:
    """What to do so that what runs is what is assigned (see the module docstring); in job
    order, stops first (they free the GPUs the starts need)."""
    stops, starts = [], []
    for job in sorted(set(running) - set(assigned)):
        stops.append(AgentAction(ActionKind.STOP, job, None, "no longer assigned here"))
    for job in sorted(assigned):
        want = assigned[job]
        have = running.get(job)
        if have is None:
            starts.append(AgentAction(ActionKind.START, job, want, "assigned here"))
        elif have.allocation != want.allocation:
            stops.append(AgentAction(ActionKind.RESTART, job, want, "allocation changed"))
    return stops + starts


class Outcome(StrEnum):
    DONE = "done"
    STOPPED = "stopped"
    FAILED = "failed"


def exit_outcome(returncode: int) -> Outcome:
    """A launcher's exit status read: 0 done, 75 stopped with a checkpoint, else failed (a
    signal, negative here, is a failure unless the agent sent it: see Supervisor.stop)."""
    if returncode == 0:
        return Outcome.DONE
    if returncode == STOPPED_EXIT:
        return Outcome.STOPPED
    return Outcome.FAILED


MAX_CAUSE_CHARS: Final = 300
"""The longest failure cause an agent reports (the store keeps reasons on one line)."""
_CAUSE_TAIL_BYTES: Final = 16 * 1024  # how much of a log's end is read for the cause
_EXCEPTION_LINE: Final = re.compile(
    r"^(\[[^\]]*\]:?\s*)?([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Failure|Warning))(:.*)?$"
)


def failure_cause(log: Path, returncode: int) -> str:
    """Why a launcher failed, in one line for ``coadapt status``: its exit status (or the
    signal that ended it), then the launcher's own cause line (:data:`trainer.launch.CAUSE_PREFIX`:
    the script's exception line and the phase it was raised in, or the usage error), else the
    last Python exception line of its log (the last line written, when none looks like one),
    cut to :data:`MAX_CAUSE_CHARS`. When the launcher says the script failed before
    trainer.init, the log's last exception line says how. torchrun's own exceptions
    (``ChildFailedError``, ``RendezvousClosedError`` and the rest of
    ``torch.distributed.elastic``) are never the cause: the worker's exception is. A failure
    that cannot succeed when run again (:func:`deterministic_reason`) says so, and that it is
    not retried."""
    if returncode < 0:
        try:
            how = f"ended by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"ended by signal {-returncode}"
    else:
        how = f"exit status {returncode}"
    try:
        with open(log, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - _CAUSE_TAIL_BYTES))
            raw = handle.read()
    except OSError:
        return how
    if len(raw) < _CAUSE_TAIL_BYTES:  # just rotated: the end of the previous file too
        with contextlib.suppress(OSError), open(older_path(log), "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - _CAUSE_TAIL_BYTES + len(raw)))
            raw = handle.read() + raw
    tail = raw.decode("utf-8", "replace")
    lines = [" ".join(x.split()) for x in tail.splitlines() if x.strip()]
    raised = [
        m.group(0)[len(m.group(1) or "") :]
        for m in map(_EXCEPTION_LINE.match, lines)
        if m is not None and not is_torchrun_exception(m.group(2))
    ]
    told = [x[len(CAUSE_PREFIX) :] for x in lines if x.startswith(CAUSE_PREFIX)]
    if told and told[-1] == NO_MARKER and raised:
        last = f"{NO_MARKER}: {raised[-1]}"
    elif told:
        last = told[-1]
    else:
        last = raised[-1] if raised else (lines[-1] if lines else "")
    why = deterministic_reason(returncode, last)
    suffix = f" (deterministic: {why}; not retried)" if why else ""
    room = MAX_CAUSE_CHARS - len(how) - len(suffix) - 2
    if len(last) > room:
        last = last[: max(0, room - 3)] + "..."
    return f"{how}: {last}{suffix}" if last else f"{how}{suffix}"


DETERMINISTIC_EXCEPTIONS: Final = ("ModuleNotFoundError",)
"""Exceptions a script raises the same way however often it runs (a missing module)."""


def deterministic_reason(returncode: int, cause: str) -> str | None:
    """Why a failure cannot succeed when run again, or ``None`` when it may: the launcher's
    usage error (exit status 2: the script or its options are wrong, found before anything
    ran), or a cause naming one of :data:`DETERMINISTIC_EXCEPTIONS`. Such a job is failed at
    once (:func:`~autoscaler.controller.loop.record_job_exit`), not retried. Pure."""
    if returncode == ExitCode.USAGE:
        return f"the launcher refused the job's command (exit status {int(ExitCode.USAGE)})"
    for name in DETERMINISTIC_EXCEPTIONS:
        if re.search(rf"\b{name}\b", cause):
            return f"{name}: a module the script imports is not installed"
    return None


def launch_argv(
    a: JobAssignment,
    *,
    controller_url: str | None,
    python: str = sys.executable,
    extra: Sequence[str] = (),
    stop_grace_s: float | None = None,
) -> list[str]:
    """The launcher command for ``a`` on this instance (one launcher per job and node): the
    launcher's options (a planned batch starts the launch with it: ``--batch-size``,
    ``--accum-steps``; ``stop_grace_s``, the job's checkpoint grace, as
    ``--shutdown-timeout-s``), ``extra`` (more of them), then ``--`` and the job's command, so
    that nothing in the command is ever read as a launcher option, whatever it starts with. No
    credential is on it: the launcher's environment names the report credential's file."""
    argv = [python, "-m", "trainer.launch", "--job-id", a.job, "--nproc-per-node", str(a.gpus)]
    argv += ["--nnodes", str(len(a.nodes)), "--rdzv-endpoint", a.rendezvous]
    if a.checkpoint_uri:
        argv += ["--checkpoint-uri", a.checkpoint_uri]
    if a.batch is not None:
        argv += ["--batch-size", str(a.batch[0]), "--accum-steps", str(a.batch[1])]
    if controller_url:
        argv += ["--controller-url", controller_url]
    if stop_grace_s is not None:
        argv += ["--shutdown-timeout-s", str(max(1, math.ceil(stop_grace_s)))]
    return [*argv, *extra, "--", *a.command]


@dataclass
class _Proc:
    """A launcher: started by this agent (``popen``) or adopted from its previous life
    (``popen`` ``None``: not this process's child, its exit status is read from its run
    folder's ``launcher-exit.json``)."""

    assignment: JobAssignment
    popen: subprocess.Popen[bytes] | None
    pid: int
    stopping: bool = False
    started: str | None = None  # the kernel's start time of ``pid``
    run_dir: Path | None = None
    space: Path | None = None  # an isolated job's own folder (Supervisor.isolate)
    storage_renew_s: float = 0.0  # when its checkpoint credential is renewed (Supervisor.storage)
    writer: subprocess.Popen[bytes] | None = None  # its log writer (coadapt_common.logcap)

    def poll(self) -> int | None:
        """Its exit status once it has exited, else ``None``."""
        if self.popen is not None:
            return self.popen.poll()
        if is_running(read_stat(self.pid)) and process_start_time(self.pid) == self.started:
            return None
        return _recorded_exit(self.run_dir)


LOST_EXIT: Final = 1
"""The exit status given to an adopted launcher that ended without recording one (killed)."""
MAX_ADOPTED: Final = 256
"""The most launchers an agent adopts from its previous life's record (the rest are ended)."""


def _recorded_exit(run_dir: Path | None) -> int:
    """The exit status a launcher recorded in ``run_dir``, else :data:`LOST_EXIT`."""
    if run_dir is None:
        return LOST_EXIT
    try:
        data = json.loads((run_dir / EXIT_FILE).read_text(encoding="utf-8"))
        status = data["status"]
    except (OSError, ValueError, KeyError, TypeError):
        return LOST_EXIT
    return status if isinstance(status, int) and -255 <= status <= 255 else LOST_EXIT


@dataclass(frozen=True)
class Adoption:
    """What a restarted agent found of its previous life: the jobs whose launchers it
    adopted (still running) and the jobs whose launchers were gone (started again, from their
    checkpoints, if still assigned here)."""

    adopted: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()

    def to_json(self) -> dict[str, list[str]]:
        return {"adopted": list(self.adopted), "lost": list(self.lost)}


@dataclass
class Supervisor:
    """Launcher processes of one agent (see the module docstring). ``argv_for`` builds a
    job's command line (default: :func:`launch_argv` without a controller URL, with
    ``stop_grace_s``; an ``argv_for`` of one's own passes it too); ``stop_grace_s``: the
    jobs' checkpoint grace (:data:`STOP_GRACE_S`)."""

    agent_id: str
    work_dir: Path
    stop_grace_s: float = STOP_GRACE_S
    argv_for: Callable[[JobAssignment], list[str]] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    logs_dir: Path | None = None
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    isolate: bool = False
    checkpoint_root: Path | None = None
    min_free_bytes: int = 0
    storage: JobCredentialSource | None = None
    _procs: dict[str, _Proc] = field(default_factory=dict, init=False)
    _refused: dict[str, str] = field(default_factory=dict, init=False)
    _renewal_said: dict[str, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.work_dir = Path(self.work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)

    # ---- state -----------------------------------------------------------------------------

    @property
    def running(self) -> dict[str, JobAssignment]:
        """What runs now, by job."""
        return {job: p.assignment for job, p in self._procs.items()}

    def log_path(self, job: str) -> Path:
        """``<logs_dir>/<job>/<agent id>.log`` (where the API reads job logs), else
        ``<work_dir>/logs/<job>.log``."""
        if self.logs_dir is not None:
            path = Path(self.logs_dir) / job / f"{self.agent_id}.log"
        else:
            path = self.work_dir / "logs" / f"{job}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def credential_path(self, job: str) -> Path:
        """Where ``job``'s report credential is kept while it runs here (0600; an isolated
        job's is in its own folder, readable by its user only)."""
        proc = self._procs.get(job)
        if proc is not None and proc.space is not None:
            return proc.space / "report.token"
        return self.work_dir / "credentials" / f"{job}.token"

    def _write_credential(self, a: JobAssignment, space: Path | None = None) -> dict[str, str]:
        """Write ``a``'s report credential to its file; the environment that names it."""
        if a.report_token is None:
            return {}
        path = space / "report.token" if space is not None else self.credential_path(a.job)
        _write_private(path, (a.report_token + "\n").encode(), a.job, space is not None)
        return {REPORT_TOKEN_FILE: str(path)}

    def storage_paths(self, job: str, space: Path | None = None) -> tuple[Path, Path]:
        """Where ``job``'s checkpoint credential and its AWS config file are kept while it
        runs here (0600; in an isolated job's folder, ``space``, they are its user's)."""
        proc = self._procs.get(job)
        if space is None and proc is not None:
            space = proc.space
        if space is not None:
            return space / "storage.credential", space / "aws-config"
        folder = self.work_dir / "credentials"
        return folder / f"{job}.storage", folder / f"{job}.aws-config"

    def _write_storage(
        self, job: str, credential: JobCredential, space: Path | None
    ) -> dict[str, str]:
        """Write ``job``'s checkpoint credential (and AWS config file); the environment that
        names them."""
        path, config_path = self.storage_paths(job, space)
        _write_private(path, credential.data, job, space is not None)
        env = credential.job_env(path)
        config = credential.aws_config(path)
        if config is not None:
            _write_private(config_path, config.encode(), job, space is not None)
            env["AWS_CONFIG_FILE"] = str(config_path)
            env["AWS_SHARED_CREDENTIALS_FILE"] = str(config_path.with_name("no-credentials"))
        return env

    def run_dir(self, job: str) -> Path:
        """``<work_dir>/runs/<job>``: the launcher's run folder (given as ``--run-dir``), but
        an isolated job's, which is ``run/`` in its own folder (its user writes it)."""
        return self.work_dir / "runs" / job

    def _forget(self, job: str, space: Path | None = None) -> None:
        self.credential_path(job).unlink(missing_ok=True)
        for path in self.storage_paths(job):
            path.unlink(missing_ok=True)
        shutil.rmtree(self.run_dir(job), ignore_errors=True)
        if space is not None:
            shutil.rmtree(space, ignore_errors=True)  # links in it are removed, not followed

    def _isolation(self, a: JobAssignment) -> tuple[JobAssignment, Path, list[str], dict[str, str]]:
        """An isolated job's own folder (``<tmp>/coadapt-job-<job>-*``: root's, 0711, with
        ``home/`` of its user and ``checkpoints/``, where its checkpoint folder under
        ``checkpoint_root`` is mounted for it alone), the assignment as the job sees it, the
        command prefix that runs it as its user (:mod:`coadapt_common.jobexec`) and its
        environment."""
        uid = job_uid(a.job)
        space = Path(tempfile.mkdtemp(prefix=f"coadapt-job-{a.job}-"))
        os.chmod(space, 0o711)
        home = space / "home"
        home.mkdir(mode=0o700)
        os.chown(home, uid, uid)
        binds: list[tuple[str, str]] = []
        if a.checkpoint_uri is None and self.checkpoint_root is not None:
            own = Path(self.checkpoint_root) / a.job
            own.mkdir(mode=0o700, parents=True, exist_ok=True)
            _give(own, uid)
            target = space / "checkpoints"
            target.mkdir(mode=0o755)
            binds.append((str(own), str(target)))
            a = replace(a, checkpoint_uri=str(target))
        user = f"coadapt-job-{uid}"
        env = {"HOME": str(home), "USER": user, "LOGNAME": user}
        # torch's compile cache (default /tmp/torchinductor_$USER) goes with the job's folder
        env["TORCHINDUCTOR_CACHE_DIR"] = str(home / ".cache" / "torchinductor")
        prefix = jobexec_argv([], uid, binds=binds, exposed=_job_needs(a))  # ends with --
        return a, space, prefix, env

    def _disk_refusal(self, job: str) -> str | None:
        """Why ``job`` must not start now: the disk of its log (or of the checkpoint root)
        has less than ``min_free_bytes`` free. ``None``: it may."""
        if self.min_free_bytes <= 0:
            return None
        logs = Path(self.logs_dir) if self.logs_dir is not None else self.work_dir / "logs"
        for folder in (logs, self.checkpoint_root):  # (nothing is made: a full disk)
            if folder is None:
                continue
            free = free_bytes(Path(folder))
            if free is not None and free < self.min_free_bytes:
                return (
                    f"not starting {job}: the disk of {folder} has {free >> 20} MiB free, less "
                    f"than the {self.min_free_bytes >> 20} MiB kept free; it starts once there "
                    "is room"
                )
        return None

    def _record(self) -> None:
        """Write ``processes.json`` (:func:`_entry`); on a full disk it is said and left as it
        was (the jobs go on: an agent does not die for a file it could not write)."""
        try:
            write_json_atomic(
                self.work_dir / "processes.json",
                {job: _entry(p) for job, p in sorted(self._procs.items())},
            )
        except OSError as e:
            if not is_disk_full(e):
                raise
            log.warning("agent %s: processes.json not written: %s", self.agent_id, e)

    def adopt(self) -> Adoption | None:
        """Take over the launchers the previous life of this agent left running (see the
        module docstring); ``None`` when there was no previous life, or it ended cleanly
        (:meth:`stop_all` removes ``processes.json``).
        A recorded launcher is adopted only if its pid is alive with the recorded kernel
        start time and carries this agent's and the job's markers; the run folders of the
        others are removed (their processes are ended by the :meth:`sweep` that follows)."""
        path = self.work_dir / "processes.json"
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self._record()  # a later life knows this one existed
            return None
        except (OSError, ValueError):
            record = {}
        adopted, lost = [], []
        entries = record.items() if isinstance(record, dict) else ()
        for job, entry in sorted(entries)[:MAX_ADOPTED]:
            proc = _adoptable(self.agent_id, job, entry)
            if proc is None or job in self._procs:
                lost.append(str(job)[:128])
                continue
            if proc.run_dir is None:
                proc.run_dir = self.run_dir(job)
            self._procs[job] = proc
            adopted.append(job)
        runs = self.work_dir / "runs"
        if runs.is_dir():
            for folder in runs.iterdir():
                if folder.name not in self._procs:
                    shutil.rmtree(folder, ignore_errors=True)
        self._record()
        for job in adopted:
            self._note(job, f"agent restarted: adopted the running launcher of {job}")
        return Adoption(tuple(adopted), tuple(lost))

    # ---- actions ---------------------------------------------------------------------------

    def apply(self, actions: Sequence[AgentAction]) -> list[str]:
        """Carry ``actions`` out; returns the jobs whose launcher, asked to stop, had finished
        training instead (exit 0): a finished job is not started again."""
        finished = []
        for action in actions:
            if action.kind in (ActionKind.STOP, ActionKind.RESTART):
                code = self.stop(action.job, action.reason)
                if code == 0:
                    finished.append(action.job)
                    continue  # done: a restart would only resume at its last step and exit
            if action.kind in (ActionKind.START, ActionKind.RESTART):
                assert action.assignment is not None
                self.start(action.assignment)
        return finished

    def start(self, a: JobAssignment) -> int | None:
        """Start ``a``'s launcher; its pid (``None``: not started, the disk is full, said
        once in the agent's log). Its run folder is :meth:`run_dir` (an isolated job's:
        ``run/`` in its own folder), given as ``--run-dir`` before the ``--`` of a launcher
        command that has none.

        Its output goes through a pipe to its own log writer (:mod:`coadapt_common.logcap`,
        capped at ``log_max_bytes``), a process of its own that is not the agent and does
        not carry the agent's marker: it ends when every process of the job has closed the
        pipe, and an agent that dies or restarts does not cut the job's output. With
        ``isolate`` the launcher runs as the job's own user (:meth:`_isolation`)."""
        refusal = self._disk_refusal(a.job)
        if refusal is not None:
            self._refuse(a.job, refusal)
            return None
        credential = None
        if self.storage is not None:
            try:
                credential = self.storage.mint(a.job)
            except JobCredentialError as e:
                self._refuse(a.job, f"not starting {a.job}: no checkpoint credential: {e}")
                return None
        self._refused.pop(a.job, None)
        env = {**os.environ, **self.env, AGENT_ENV: self.agent_id, "COADAPT_JOB_ID": a.job}
        env.pop(REPORT_TOKEN_FILE, None)  # never another job's (or the agent's own)
        if credential is not None:  # the job's own credential, none of the agent's
            for name in CLOUD_CREDENTIAL_ENV:
                env.pop(name, None)
        space = None
        prefix: list[str] = []
        if self.isolate:
            a_seen, space, prefix, own_env = self._isolation(a)
            env.update(own_env)
        else:
            a_seen = a
        argv = (
            self.argv_for(a_seen)
            if self.argv_for
            else launch_argv(a_seen, controller_url=None, stop_grace_s=self.stop_grace_s)
        )
        run_dir = self.run_dir(a.job) if space is None else space / "run"
        shutil.rmtree(run_dir, ignore_errors=True)
        if "--" in argv and "--run-dir" not in argv[: argv.index("--")]:
            run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            if space is not None:
                _give(run_dir, job_uid(a.job))
            cut = argv.index("--")
            argv = [*argv[:cut], "--run-dir", str(run_dir), *argv[cut:]]
        env.update(self._write_credential(a, space))
        if credential is not None:
            env.update(self._write_storage(a.job, credential, space))
        writer_env = {
            k: v for k, v in os.environ.items() if k not in (AGENT_ENV, REPORT_TOKEN_FILE)
        }
        with open(self.log_path(a.job), "ab"):
            pass  # there from the start, as the writer will append to it
        read_end, write_end = os.pipe()
        try:
            grow_pipe(write_end)
            writer = subprocess.Popen(
                logcap_argv(self.log_path(a.job), self.log_max_bytes),
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                env=writer_env,
                start_new_session=True,
            )
            popen = subprocess.Popen(
                [*prefix, *argv],
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=write_end,
                env=env,
                start_new_session=True,
            )
        except BaseException:
            self._forget(a.job, space)
            raise
        finally:
            os.close(read_end)
            os.close(write_end)
        self._procs[a.job] = _Proc(
            a,
            popen,
            popen.pid,
            started=process_start_time(popen.pid),
            run_dir=run_dir,
            space=space,
            writer=writer,
            storage_renew_s=0.0 if credential is None else credential.renew_at_s(),
        )
        self._record()
        return popen.pid

    def _refuse(self, job: str, refusal: str) -> None:
        """Say once (in the agent's log and on stderr) why ``job`` does not start now."""
        if self._refused.get(job) != refusal:
            log.warning("agent %s: %s", self.agent_id, refusal)
            print(f"coadapt agent {self.agent_id}: {refusal}", file=sys.stderr, flush=True)
        self._refused[job] = refusal

    def stop(self, job: str, reason: str = "") -> int | None:
        """Stop ``job``'s launcher: one line in the job's log saying why, SIGTERM to the
        launcher (it has its workers checkpoint and stop within ``stop_grace_s``; torchrun
        then ends cleanly), up to ``stop_grace_s + KILL_MARGIN_S``, then SIGKILL to its group;
        its exit status (``None`` if it was not running)."""
        proc = self._procs.pop(job, None)
        if proc is None:
            return None
        proc.stopping = True
        self._note(
            job, f"stopping {job}: {reason or 'asked to'} (a checkpointed stop, not a failure)"
        )
        code = _end_group(proc, self.stop_grace_s + KILL_MARGIN_S)
        self.sweep(job)
        _drain(proc.writer)
        self._forget(job, proc.space)
        self._record()
        if code == 0:
            self._note(job, f"{job} had finished training: it is not started again")
        return code

    def _note(self, job: str, line: str) -> None:
        """One line of the agent's own in the job's log."""
        with contextlib.suppress(OSError), open(self.log_path(job), "a", encoding="utf-8") as log:
            log.write(f"coadapt agent {self.agent_id}: {line}\n")

    def refresh_credentials(self, assigned: Mapping[str, JobAssignment]) -> list[str]:
        """Write each running job's report credential again where ``assigned`` carries
        another one (a rotation of the agent key): the trainer reads the file before each
        report, so nothing is restarted. The jobs whose credential changed."""
        changed = []
        for job, proc in self._procs.items():
            want = assigned.get(job)
            if want is None or want.report_token is None:
                continue
            if want.report_token != proc.assignment.report_token:
                proc.assignment = replace(proc.assignment, report_token=want.report_token)
                self._write_credential(proc.assignment, proc.space)
                changed.append(job)
        return changed

    def renew_storage_credentials(self, now_s: float | None = None) -> list[str]:
        """With ``storage``: write a new checkpoint credential for each running job whose
        credential is :data:`~autoscaler.controller.job_storage.RENEW_AT` of the way to its
        expiry (an adopted job's at once: its age is not known). The jobs renewed; one that
        fails keeps its old credential and is tried again :data:`RENEW_RETRY_S` later, its
        failure said once in the agent's log (again only when it changes, and a renewal that
        works again is said too)."""
        if self.storage is None:
            return []
        now = time.time() if now_s is None else now_s
        renewed = []
        for job, proc in self._procs.items():
            if proc.storage_renew_s > now:
                continue
            try:
                credential = self.storage.mint(job)
                self._write_storage(job, credential, proc.space)
            except (JobCredentialError, OSError) as e:  # OSError: a full disk, say
                proc.storage_renew_s = now + RENEW_RETRY_S
                said = f"checkpoint credential of {job} not renewed: {e}"
                if self._renewal_said.get(job) != said:
                    log.warning("agent %s: %s (tried again every %.0f s)", self.agent_id, said,
                                RENEW_RETRY_S)  # fmt: skip
                self._renewal_said[job] = said
                continue
            if self._renewal_said.pop(job, None) is not None:
                log.warning("agent %s: checkpoint credential of %s renewed again", self.agent_id,
                            job)  # fmt: skip
            proc.storage_renew_s = credential.renew_at_s()
            renewed.append(job)
        return renewed

    def poll(self) -> list[tuple[str, Outcome, int]]:
        """Launchers that exited on their own since the last poll: (job, outcome, status)."""
        ended = []
        for job, proc in list(self._procs.items()):
            code = proc.poll()
            if code is None:
                continue
            del self._procs[job]
            self.sweep(job)
            _drain(proc.writer)  # the log holds the launcher's last words before they are read
            self._forget(job, proc.space)
            ended.append((job, exit_outcome(code), code))
        if ended:
            self._record()
        return ended

    def stop_all(self) -> None:
        """Stop every job (checkpointing), then end anything still carrying the marker. Every
        launcher is asked first, so the jobs checkpoint at once, within one grace, not one
        after the other (a repeated SIGTERM changes nothing for a launcher)."""
        for proc in self._procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        for job in sorted(self._procs):
            self.stop(job)
        self.sweep()
        # A clean end: the next life of this agent has nothing to adopt and no restart to
        # tell (a processes.json left behind means this life ended without stopping).
        (self.work_dir / "processes.json").unlink(missing_ok=True)

    def sweep(self, job: str | None = None) -> list[int]:
        """SIGKILL every process carrying this agent's marker (and ``job``'s, if given) that
        belongs to no job still supervised (its launcher, torchrun, its workers); the pids
        ended."""
        keep = {p.pid for p in self._procs.values()}
        spare = {f"COADAPT_JOB_ID={j}".encode() for j in self._procs}
        ended = []
        for pid in _marked(self.agent_id, job):
            if pid in keep or pid == os.getpid():
                continue
            # Read again, settled: a job's process that has just exec'd reads empty for an
            # instant, and one caught there would be killed as nobody's (a worker torchrun is
            # starting as the agent sweeps after a restart: its launch fails and it restarts).
            if spare and spare & set(read_proc_strings(pid, "environ")):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                ended.append(pid)
        deadline = time.monotonic() + 5.0  # a SIGKILL takes effect asynchronously
        while any(is_running(read_stat(p)) for p in ended) and time.monotonic() < deadline:
            time.sleep(0.01)
        return ended


WRITER_DRAIN_S: Final = 5.0
"""How long an agent waits for a job's log writer to write what the job's processes left in
its pipe once they are gone (it then goes on: the writer finishes on its own)."""


def _drain(writer: subprocess.Popen[bytes] | None) -> None:
    if writer is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            writer.wait(timeout=WRITER_DRAIN_S)


def _job_needs(a: JobAssignment) -> list[str]:
    """What an isolated job must see wherever it is (:mod:`coadapt_common.jobexec` shows it
    behind closed parents): the Python installation and the environment it runs, the
    trainer's code, the working folder and the job's script. Nothing else is shown: a file
    the job reads elsewhere must be open to other users."""
    cwd = Path.cwd()
    code = Path(trainer.__file__).resolve().parents[1]
    wanted = [Path(sys.base_prefix), Path(sys.prefix), code, cwd, cwd / a.command[0]]
    return [str(p) for p in wanted if p.exists()]


CLOUD_CREDENTIAL_ENV: Final = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "COADAPT_GCS_TOKEN",
    "GOOGLE_OAUTH_ACCESS_TOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS",
)
"""Variables of the agent's environment that would hand a job credentials other than its
own checkpoint credential: a job handed one (``Supervisor.storage``) starts without them."""


def _write_private(path: Path, data: bytes, job: str, as_job: bool) -> None:
    """Write ``data`` to ``path``, 0600: the agent's own file, or with ``as_job`` the job's
    user's (in its folder, which is root's: the job cannot plant a link there)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not as_job:
        write_bytes_atomic(path, data, mode=0o600)
        return
    uid = job_uid(job)
    tmp = path.with_name(f".{path.name}.new")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        os.fchown(handle.fileno(), uid, uid)
        handle.write(data)
    rotate_file(tmp, path)


def _give(folder: Path, uid: int) -> None:
    """Make ``folder`` (a job's checkpoint folder) and what it holds ``uid``'s, when it is
    not yet (written by an earlier, unisolated run); links are changed, never followed."""
    if folder.lstat().st_uid == uid:
        return
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in (*dirs, *files):
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)
    os.chown(folder, uid, uid, follow_symlinks=False)


def _marked(agent_id: str, job: str | None) -> list[int]:
    """Pids whose environment carries ``AGENT_ENV=agent_id`` (and ``COADAPT_JOB_ID=job``)."""
    want = f"{AGENT_ENV}={agent_id}".encode()
    want_job = None if job is None else f"COADAPT_JOB_ID={job}".encode()
    out = []
    for entry in PROC_ROOT.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        env = read_proc_strings(pid, "environ", settle=False)
        mine = want in env and (want_job is None or want_job in env)
        if mine and is_running(read_stat(pid)):
            out.append(pid)
    return sorted(out)


def _end_group(proc: _Proc, grace_s: float) -> int | None:
    """SIGTERM the launcher (the leader of its process group), wait up to ``grace_s``, then
    SIGKILL the whole group. Only the launcher is signalled first: it stops its workers at an
    agreed step, and torchrun, left alone, ends without the traceback a SIGTERM of its own
    would print."""
    pid = proc.pid
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    code = None
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            break
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)  # whatever of the group is left
    if proc.popen is not None and code is None:
        code = proc.popen.wait()
    elif code is None:  # adopted: not our child; it is gone once its pid is
        end = time.monotonic() + 5.0
        while (code := proc.poll()) is None and time.monotonic() < end:
            time.sleep(0.02)
    return code


def _entry(proc: _Proc) -> dict[str, object]:
    """A launcher as ``processes.json`` records it (its assignment without the credential)."""
    (assignment,) = json.loads(dump({"_": replace(proc.assignment, report_token=None)}))
    entry: dict[str, object] = {"pid": proc.pid, "started": proc.started, "assignment": assignment}
    if proc.space is not None:  # an isolated job's folder and run folder in it
        entry["space"] = str(proc.space)
    if proc.run_dir is not None:
        entry["run_dir"] = str(proc.run_dir)
    return entry


def _adoptable(agent_id: str, job: object, entry: object) -> _Proc | None:
    """The launcher a previous life recorded for ``job``, if it still runs as recorded."""
    if not isinstance(job, str) or not isinstance(entry, dict):
        return None
    pid, started = entry.get("pid"), entry.get("started")
    if (
        not isinstance(pid, int)
        or isinstance(pid, bool)
        or pid <= 1
        or not isinstance(started, str)
    ):
        return None
    if not is_running(read_stat(pid)) or process_start_time(pid) != started:
        return None
    env = read_proc_strings(pid, "environ")  # settled: one just exec'd reads empty an instant
    if f"{AGENT_ENV}={agent_id}".encode() not in env or f"COADAPT_JOB_ID={job}".encode() not in env:
        return None
    try:
        found = assignments_from_json([entry.get("assignment")])
    except (InvalidInputError, KeyError, TypeError, ValueError):
        return None
    if job not in found:
        return None
    space, run_dir = entry.get("space"), entry.get("run_dir")
    return _Proc(
        found[job],
        None,
        pid,
        False,
        started,
        run_dir=Path(run_dir) if isinstance(run_dir, str) else None,
        space=Path(space) if isinstance(space, str) else None,
    )


def assignments_from_json(data: object) -> dict[str, JobAssignment]:
    """The API's assignment list (``GET /v1/agents/{key}/assignments``) as assignments."""
    if not isinstance(data, list):
        raise InvalidInputError("assignments must be a JSON list", field="assignments")
    out = {}
    for item in data:
        if not isinstance(item, dict):
            raise InvalidInputError("an assignment must be an object", field="assignments")
        if item.get("rendezvous") is None:
            continue  # the first node's address is not known yet: next round
        batch = item.get("batch")
        a = JobAssignment(
            job=str(item["job"]),
            gpus=int(item["gpus"]),
            nodes=tuple((str(k), int(g)) for k, g in item["nodes"]),
            rendezvous=str(item["rendezvous"]),
            command=tuple(str(c) for c in item["command"]),
            checkpoint_uri=item.get("checkpoint_uri"),
            batch=None
            if batch is None
            else (int(batch["global_batch_size"]), int(batch["accum_steps"])),
            report_token=None if item.get("report_token") is None else str(item["report_token"]),
        )
        out[a.job] = a
    return out


def dump(assignments: Mapping[str, JobAssignment]) -> str:
    """Assignments as JSON (the inverse of :func:`assignments_from_json`)."""
    return json.dumps(
        [
            {
                "job": a.job,
                "gpus": a.gpus,
                "nodes": [list(n) for n in a.nodes],
                "rendezvous": a.rendezvous,
                "command": list(a.command),
                "checkpoint_uri": a.checkpoint_uri,
                "batch": None
                if a.batch is None
                else {"global_batch_size": a.batch[0], "accum_steps": a.batch[1]},
                "report_token": a.report_token,
            }
            for _, a in sorted(assignments.items())
        ]
    )


class AgentRunner:
    """One instance's agent loop over the controller API (``client``, with the instance's
    credential): :meth:`step` heartbeats, reads the assignments, starts / stops / restarts
    launchers (:func:`plan`), hands running jobs their new report credentials (and, with the
    supervisor's ``storage``, renews their checkpoint credentials when due), and reports
    launchers that ended on their own (done or failed; a stop with a checkpoint is never
    reported). A heartbeat answer that carries a new credential (the agent key was rotated)
    replaces the client's, and ``on_credential`` is told (to keep it where the agent reads it
    when it starts again). Once ``notice`` answers true (the instance is being
    reclaimed: see :func:`notice_source`), every job is stopped with a checkpoint and nothing
    new is started: the controller re-places them elsewhere. :meth:`close` stops everything
    and leaves no process behind."""

    def __init__(
        self,
        client: ApiClient,
        instance_key: str,
        supervisor: Supervisor,
        *,
        address: str,
        notice: Callable[[], bool] | None = None,
        on_credential: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.instance_key = instance_key
        self.supervisor = supervisor
        self.address = address
        self.notice = notice
        self.on_credential = on_credential
        self.noticed = False
        self.registered = False
        self._adoption: Adoption | None = None
        self._adopted = False
        self._beat_lock = threading.Lock()

    def step(self) -> list[AgentAction]:
        """One pass; the actions taken."""
        if not self.registered:
            if not self._adopted:  # once: what a previous life of this agent left running
                self._adoption = self.supervisor.adopt()
                self._adopted = True
            restart = None if self._adoption is None else self._adoption.to_json()
            self.client.register(self.instance_key, address=self.address, restart=restart)
            self.supervisor.sweep()  # the rest of what a previous life left running
            self.registered = True
        self.beat()
        for job, outcome, code in self.supervisor.poll():
            if outcome is Outcome.FAILED:
                cause = failure_cause(self.supervisor.log_path(job), code)
                final = deterministic_reason(code, cause) is not None
                self.client.job_exited(
                    self.instance_key, job, failed=True, cause=cause, deterministic=final
                )
            elif outcome is Outcome.DONE:
                self.client.job_exited(self.instance_key, job, failed=False)
        if not self.noticed and self.notice is not None:
            try:
                self.noticed = bool(self.notice())
            except ProviderError as e:  # the metadata service blipped: look again next step
                log.warning("agent %s: interruption source: %s", self.instance_key, e)
        running = self.supervisor.running
        assigned: dict[str, JobAssignment] = {}
        if not self.noticed:
            raw = self.client.assignments(self.instance_key)
            assigned = assignments_from_json(raw)
            # Still assigned here, its rendezvous not known yet (a restarted controller has
            # not heard from the job's first node since): what runs keeps running.
            for item in raw:
                job = str(item.get("job")) if isinstance(item, dict) else ""
                if job in running and job not in assigned and item.get("rendezvous") is None:
                    assigned[job] = running[job]
        actions = plan(assigned, running)
        for job in self.supervisor.apply(actions):
            try:  # it finished as it was being stopped: the controller learns it was done
                self.client.job_exited(self.instance_key, job, failed=False)
            except ApiError as e:  # no longer assigned here: the controller moved on
                log.info("agent %s: exit of %s not recorded: %s", self.instance_key, job, e)
        self.supervisor.refresh_credentials(assigned)
        self.supervisor.renew_storage_credentials()
        return actions

    def beat(self) -> None:
        """One heartbeat (and the credential its answer may renew). :meth:`step` sends one;
        the agent's process also beats from a thread of its own every poll, so that a step
        that waits for a job's checkpoint (up to the stop grace) never makes a live agent
        look dead. Thread-safe."""
        with self._beat_lock:
            beat = self.client.heartbeat(self.instance_key, address=self.address)
            if beat.credential is not None:
                self.client.use_token(beat.credential)
                if self.on_credential is not None:
                    self.on_credential(beat.credential)
                log.info("agent %s: credential renewed", self.instance_key)

    def close(self) -> None:
        self.supervisor.stop_all()


def notice_source(
    kind: str, *, clock: Clock, notice_file: Path | None = None, metadata_url: str | None = None
) -> Callable[[], bool] | None:
    """What tells an agent its instance is being reclaimed (``AgentRunner(notice=...)``):

    * ``local``: ``notice_file`` exists (the local provider's ``spot-notice.json``);
    * ``aws``: instance metadata (IMDSv2) shows a spot ``instance-action`` (the two-minute
      warning); a rebalance recommendation is not a reclaim, the controller weighs it;
    * ``gcp``: the metadata server's ``instance/preempted`` is ``TRUE``;
    * ``none``: nothing (``None``).

    ``metadata_url``: the metadata service's base URL (a test server)."""
    if kind == "none":
        return None
    if kind == "local":
        if notice_file is None:
            raise ValueError("the local notice source needs notice_file")
        return notice_file.exists
    if kind == "aws":
        from providers.aws.imds import DEFAULT_IMDS_URL, ImdsPoller
        from providers.base import InterruptionKind

        poller = ImdsPoller(base_url=metadata_url or DEFAULT_IMDS_URL, clock=clock)
        return lambda: any(n.kind is InterruptionKind.SPOT_INTERRUPTION for n in poller.current())
    if kind == "gcp":
        from providers.gcp.metadata import (
            DEFAULT_METADATA_BASE_URL,
            PreemptionWatcher,
            discover_instance_id,
        )

        base = metadata_url or DEFAULT_METADATA_BASE_URL
        watcher: list[PreemptionWatcher] = []

        def preempted() -> bool:
            if not watcher:  # the instance id is read once, when the server first answers
                watcher.append(
                    PreemptionWatcher(discover_instance_id(base), clock=clock, base_url=base)
                )
            return watcher[0].poll() is not None

        return preempted
    raise ValueError(f"unknown notice source {kind!r}: local, aws, gcp or none")
