"""The long-running processes: the controller service (``coadapt up``) and the node agent
(``coadapt agent``).

:func:`run_up` runs one cluster on the embedded ``local`` provider (instances are local agent
processes with CPU-backed "GPU slots", valued as T4s by the decision core), or on a cloud,
until ``stop`` is set. Stopping it keeps the fleet: instances and their jobs go on (local
agents are their own sessions, so they outlive the process), and the next ``up`` on the same
state folder takes them back, at the same address. Only ``coadapt down`` (``POST
/v1/service/down``) or ``release_on_stop`` (the embedded demo) releases the fleet on the way
out (:meth:`~autoscaler.controller.loop.Controller.down`), and only a fleet the store owns:
one its store has planned, never one a round refused (:class:`~autoscaler.controller.errors.
UnknownFleetError`). A store that fails (deleted, its write-ahead log deleted, read-only,
damaged, a full disk) ends the service with :class:`ServiceError`: one line, the process
exits non-zero and its supervisor starts it again, which checks the store when it opens it.
Everything it keeps is under ``state_dir`` (0700; the files it writes there are private to
its user, whatever the umask)::

    store.db        the controller's store (created on the first ``up``; a later ``up``
                    refuses to create a new one beside an earlier cluster's files unless
                    told to with ``new_store``)
    tokens.json     the controller's secrets: the users' token and the agent key (0600;
                    created on the first ``up``; ``coadapt tokens rotate`` replaces them)
    api.json        the API's address, kept across restarts: the next ``up`` listens there
                    again, where the agents call
    up.json         the running service: its API URL, pid, start time and command line
                    (removed when it stops)
    cluster.json    where its instances come from (``provider``, ``provider_config``): what
                    :func:`down_without_up` reads to release the fleet with no ``up`` running;
                    and where its store is (``store``: a PostgreSQL URL without its
                    password, ``null`` for ``store.db``): what :func:`cluster_store_location`
                    reads for the commands that read the store with no ``up`` running
    up.log          the output of a ``coadapt up -d`` (it runs in the background)
    logs/<job>/     job logs, one file per instance (what ``GET /v1/jobs/{name}/logs`` reads),
                    each capped by its writer (``--job-log-max-mib``: the latest output is
                    kept, one rotated file beside it, and reads say how much was dropped)
    checkpoints/    job checkpoints (a job without its own location writes here; an isolated
                    job's folder is its own user's, mounted for it alone)
    agents/<key>/   each agent's working folder, with ``agent-token.json``: that agent's own
                    credential (0600), good for its instance only
    local/          the local provider's state (instances, agent processes)

Jobs cannot read these secrets: run as root, ``up`` has each job run as its own
unprivileged user (:func:`job_isolation`, :mod:`coadapt_common.jobexec`), and says in one line
how its jobs run. Below ``--min-free-mib`` free on the state folder's disk ``up`` refuses to
start, or ends in one line with a ``disk-full`` event, and agents start no job.

Each launched instance starts :func:`agent_main` with the API URL, its own token file, its
instance key and these folders (the launch's user data: a command line that carries paths,
never a secret). The controller reads ``tokens.json`` again when a rotation changed it (on a
shared store, the store's credentials instead, every controller of the store the same:
:class:`~autoscaler.controller.credentials.StoreCredentials`, ``tokens.json`` their copy), and on
a cloud publishes the users' token again (:mod:`autoscaler.controller.cloud_setup`). The API runs
in threads of this process; job exits reported through it are recorded on the API thread's own
store (:func:`~autoscaler.controller.loop.record_job_exit`), the rounds run on the main thread.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Final

from autoscaler.controller.agent import (
    KILL_MARGIN_S,
    STOP_GRACE_S,
    AgentRunner,
    JobAssignment,
    Supervisor,
    launch_argv,
    notice_source,
)
from autoscaler.controller.api import (
    ApiApp,
    ApiClient,
    ApiError,
    ApiServer,
    ServiceControl,
    make_app,
    serve,
)
from autoscaler.controller.cloud_setup import (
    AwsAgentCredentials,
    CredentialPublishError,
    ProviderConfig,
    gcp_startup_script,
    load_provider_config,
    make_cloud_provider,
    publish_user_token,
)
from autoscaler.controller.credentials import (
    CredentialSource,
    StoreCredentials,
    TokenFileError,
    load_token,
    open_tokens,
    write_token_file,
)
from autoscaler.controller.errors import (
    ControllerError,
    FencedError,
    RoundError,
    StoreCorruptError,
    StoreError,
    StoreMissingError,
    StoreUnwritableError,
    UnknownFleetError,
)
from autoscaler.controller.events import Event, EventKind, EventRecorder
from autoscaler.controller.job_storage import JobCredentialSource
from autoscaler.controller.leader import (
    DEFAULT_LEASE_INTERVALS,
    STANDBY_TRIES_PER_INTERVAL,
    Election,
    holder_id,
)
from autoscaler.controller.loop import (
    ACTIVE_JOBS,
    DEFAULT_RETENTION_S,
    Controller,
    ControllerConfig,
    instance_key_from_request_id,
    record_job_exit,
)
from autoscaler.controller.metrics import ControllerMetrics, Leadership
from autoscaler.controller.ratelimit import RequestLimits
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import InstanceRow, JobStatus, Store
from autoscaler.controller.store.postgres import (
    EMPTY_DATABASE,
    is_postgres_url,
    masked_url,
    url_without_password,
)
from autoscaler.decide.sizing import SizingConfig
from autoscaler.decide.strategies import FixedFleet
from autoscaler.decide.views import JobView
from autoscaler.errors import InvalidInputError
from coadapt_common.atomic import write_json_atomic
from coadapt_common.clock import Clock, SystemClock
from coadapt_common.diskspace import DEFAULT_MIN_FREE_BYTES, free_bytes, is_disk_full
from coadapt_common.jobexec import JOB_UID_BASE
from coadapt_common.jobexec import probe as probe_isolation
from coadapt_common.logcap import DEFAULT_LOG_MAX_BYTES, MIN_LOG_MAX_BYTES
from coadapt_common.procfs import process_start_time, read_proc_strings
from providers.base import Provider
from providers.errors import ProviderError

__all__ = [
    "BroughtDownError",
    "DownWithoutUp",
    "ServiceError",
    "UpConfig",
    "UpProcess",
    "UpRecord",
    "UpReport",
    "agent_main",
    "describe_store_error",
    "down_without_up",
    "run_up",
    "unfinished_after_down",
    "up_is_stale",
]

log = logging.getLogger(__name__)

LOCAL_RESTART_DELAY_S = 10.0
"""The restart delay the decisions assume on the local provider (a job there restarts in
about 6-10 s: ENVIRONMENT's measured floor plus the agent's poll)."""
LOCAL_TERM_GRACE_S = 2 * (STOP_GRACE_S + KILL_MARGIN_S)
"""The local provider's SIGTERM-to-SIGKILL grace for an instance: its local agent process waits
0.6 x this (84 s) for the node agent, which waits :data:`~autoscaler.controller.agent.
STOP_GRACE_S` + :data:`~autoscaler.controller.agent.KILL_MARGIN_S` (70 s) for its launchers,
which give their workers :data:`~autoscaler.controller.agent.STOP_GRACE_S` (60 s) to
checkpoint: each grace nests inside the next."""
ALIVE_TICK_S = 1.0
"""How often the service notes that its controller is running (``Controller.note_alive``)."""
STALL_GAP_S = 5.0
"""Default ``UpConfig.stall_gap_s``: five missed ticks of :data:`ALIVE_TICK_S` (a loaded
machine delays a tick by a second or two; a longer gap is the process not running)."""
LOCAL_PROVISIONING_DELAY_S = 10.0
"""The provisioning delay the sizing assumes on the local provider (an instance is a local
process whose agent registers within seconds)."""


@dataclass(frozen=True)
class UpConfig:
    """``coadapt up``'s settings. ``max_instances`` and ``max_gpus`` bound the fleet (on the
    local provider ``max_gpus`` defaults to its slot budget: a fleet beyond it could not
    launch, the budget being machine-wide; half the slots leaves room for a whole replacement
    fleet while the old one drains, what ``coadapt demo`` does); ``max_gpu_slots`` is the
    machine-wide slot budget of the local provider, ``local_spot_price_swing`` /
    ``_period_s`` its simulated spot prices; ``offerings_refresh_s`` how often prices are
    read again. ``provider`` ``aws`` / ``gcp`` reads the deployment's ``provider_config``
    (:mod:`autoscaler.controller.cloud_setup`); ``endpoint_url`` points the cloud's clients at a
    test server. ``port`` 0: the port recorded in ``api.json`` by an earlier ``up`` of this
    state folder, else any free one. ``new_store``: start with a new store although the
    folder holds an earlier cluster's tokens, logs or instances (an existing store file is
    moved aside, never deleted). ``release_on_stop``: release the fleet whenever the service
    stops (the embedded demo), not only on ``coadapt down``. ``fixed_fleet``: hold these
    instances per offering key (``Offering.key``) whatever the jobs, a static cluster,
    instead of sizing the fleet by goodput per dollar. ``request_limits``: how often one
    job's trainers and one instance's agent may call the API (``None``: derived from
    ``report_interval_s`` and ``agent_interval_s``, :meth:`RequestLimits.for_intervals`).
    ``job_isolation`` (local provider):
    ``user`` runs each job as its own user (:func:`job_isolation`; refused when this process
    cannot), ``none`` as this process's, ``auto`` the first when it can. ``job_log_max_bytes``:
    what each job's log keeps per instance (:mod:`coadapt_common.logcap`).
    ``min_free_bytes``: what is kept free on the state folder's disk (:mod:`coadapt_common.
    diskspace`): below it ``up`` refuses to start, a running service ends in one line and an
    event, and agents start no job. ``heartbeat_timeout_s``: how long an agent may be silent,
    counted only while this service runs, before its instance is presumed dead (``None``:
    ``max(60, 10 x agent_interval_s)``); ``stall_gap_s``: a pause of the service's own
    one-second ticker longer than this is a stall of the controller (SIGSTOP, a suspended
    machine), whose time is not held against the agents (:mod:`~autoscaler.controller.
    liveness`). ``retention_s``: how long the store keeps reports, prices and events
    (``ControllerConfig.retention_s``; ``None``: forever). ``resume``: on a store that
    ``coadapt down`` brought down, relaunch its unfinished jobs (without it such a store with
    unfinished jobs is refused: :class:`BroughtDownError`). ``store_url``: a
    ``postgresql://`` URL whose database keeps every table (a team's store: the store is built
    there on the first ``up``; see :mod:`autoscaler.controller.store.postgres`); ``None``: the
    SQLite file ``store.db`` in the state folder. ``lease_s``: how long the leader lease
    lasts from its last renewal (``None``: :data:`~autoscaler.controller.leader.
    DEFAULT_LEASE_INTERVALS` round intervals; :mod:`autoscaler.controller.leader`).
    ``api_urls``: the API addresses the local agents are given, tried in turn (the
    controllers of a shared store; empty: this process's own)."""

    state_dir: Path
    cluster_id: str = "coadapt-local"
    interval_s: float = 10.0
    host: str = "127.0.0.1"
    port: int = 0
    max_instances: int = 4
    max_gpu_slots: int | None = None
    max_gpus: int | None = None
    agent_interval_s: float = 2.0
    report_interval_s: float = 5.0
    offerings_refresh_s: float = 300.0
    local_spot_price_swing: float = 0.0
    local_spot_price_period_s: float = 600.0
    provider: str = "local"
    provider_config: Path | None = None
    endpoint_url: str | None = None
    new_store: bool = False
    release_on_stop: bool = False
    fixed_fleet: tuple[tuple[str, int], ...] = ()
    request_limits: RequestLimits | None = None
    job_isolation: str = "auto"
    job_log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES
    heartbeat_timeout_s: float | None = None
    stall_gap_s: float = STALL_GAP_S
    retention_s: float | None = DEFAULT_RETENTION_S
    resume: bool = False
    store_url: str | None = None
    lease_s: float | None = None
    api_urls: tuple[str, ...] = ()

    @property
    def effective_heartbeat_timeout_s(self) -> float:
        """The heartbeat timeout the controller applies (see the class docstring)."""
        if self.heartbeat_timeout_s is not None:
            return self.heartbeat_timeout_s
        return max(60.0, 10 * self.agent_interval_s)


def _agent_user_data(
    cfg: UpConfig, url: str, tokens: CredentialSource, *, isolate: bool = False
) -> Callable[[InstanceRow], str]:
    """A local instance's user data: its agent's command line, once that agent's own
    credential is in its own token file (``agents/<key>/agent-token.json``, 0600): the users'
    token and the agent key stay in ``tokens.json``, which no agent is given. A file that
    cannot be written is logged, not raised: the round goes on, and that agent refuses to
    start (its instance is then replaced like one whose agent died). ``isolate``: its jobs
    run as their own users (:func:`job_isolation`)."""
    state = cfg.state_dir.resolve()

    def user_data(row: InstanceRow) -> str:
        agent_dir = state / "agents" / row.instance_key
        token_file = agent_dir / "agent-token.json"
        credential = tokens.current().agent_credential(row.instance_key)
        try:
            write_token_file(token_file, "agent", credential)
        except TokenFileError as e:
            log.error("instance %s: %s", row.instance_key, e)
        argv = [
            sys.executable,
            "-m",
            "autoscaler.controller.service",
            "agent",
            "--api",
            url,
            "--token-file",
            str(token_file),
            "--instance-key",
            row.instance_key,
            "--work-dir",
            str(agent_dir),
            "--logs-dir",
            str(state / "logs"),
            "--checkpoint-root",
            str(state / "checkpoints"),
            "--notice-dir",
            str(state / "local" / "agents"),
            "--interval-s",
            str(cfg.agent_interval_s),
            "--report-interval-s",
            str(cfg.report_interval_s),
            "--job-log-max-bytes",
            str(cfg.job_log_max_bytes),
            "--min-free-bytes",
            str(cfg.min_free_bytes),
        ]
        if isolate:
            argv.append("--isolate-jobs")
        return f"cd {shlex.quote(os.getcwd())} && exec {shlex.join(argv)}"

    return user_data


def _cloud_user_data(
    cloud: ProviderConfig, tokens: CredentialSource
) -> Callable[[InstanceRow], str] | None:
    """AWS: none (the deployment's launch template starts the agent; its credential comes
    through SSM: :class:`AwsAgentCredentials`); GCP: each node's startup script, with its
    instance key and its own credential."""
    if cloud.kind == "aws":
        return None
    api_url = str(cloud.settings["controller_url"])
    return lambda row: gcp_startup_script(
        cloud,
        instance_key=row.instance_key,
        api_url=api_url,
        credential=tokens.current().agent_credential(row.instance_key),
    )


class _CloudSecrets:
    """What a cloud controller keeps published: the users' token (again after a rotation)
    and, on AWS, each node's own credential. :meth:`sync` never raises: a failure is logged
    and retried at the next call."""

    def __init__(
        self, cloud: ProviderConfig, tokens: CredentialSource, endpoint_url: str | None
    ) -> None:
        self._cloud = cloud
        self._tokens = tokens
        self._endpoint_url = endpoint_url
        self._user: str | None = None  # the users' token last published
        self._agents = (
            AwsAgentCredentials(cloud, endpoint_url=endpoint_url) if cloud.kind == "aws" else None
        )

    def sync(self, store: Store) -> None:
        credentials = self._tokens.current()
        try:
            if credentials.user != self._user:
                publish_user_token(self._cloud, credentials.user, endpoint_url=self._endpoint_url)
                self._user = credentials.user
            if self._agents is not None:
                self._agents.sync(store.list_instances(), credentials)
        except (CredentialPublishError, StoreError) as e:
            log.warning("publishing credentials: %s (retried next round)", e)


def _close(store: Store, shared: Store | None) -> None:
    """Close ``up``'s store and, on a shared store, the credentials' own connection."""
    store.close()
    if shared is not None:
        shared.close()


class UpProcess(StrEnum):
    """What the process an ``up.json`` names is now (:meth:`UpRecord.process`)."""

    OURS = "ours"
    """The ``coadapt up`` that wrote it: its pid runs, with the recorded start time and command
    line."""
    GONE = "gone"
    """It is gone (killed, a crash, a reboot): its pid runs no process, or another one (a
    recycled pid has another start time)."""
    OTHER = "other"
    """Its pid and start time, another command line: the process is no longer that ``coadapt
    up`` (it replaced itself with another program), yet it runs."""


@dataclass(frozen=True)
class UpRecord:
    """What ``up.json`` records of the running service (written by :func:`run_up`): its API
    ``url``, and the identity of its process (``pid``, kernel ``started`` time, ``cmdline``)."""

    url: str
    pid: int
    started: str
    cmdline: tuple[str, ...]

    @classmethod
    def read(cls, up_file: Path) -> UpRecord | None:
        """The record in ``up_file``; ``None`` when it cannot be read or is not a whole record
        (nothing is judged of it then)."""
        try:
            doc = json.loads(up_file.read_text())
            url, pid, started, cmdline = doc["url"], doc["pid"], doc["started"], doc["cmdline"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if (
            isinstance(pid, bool)
            or not isinstance(pid, int)
            or pid <= 1
            or not isinstance(started, str)
            or not isinstance(cmdline, list)
            or not all(isinstance(part, str) for part in cmdline)
            or not (isinstance(url, str) and url.startswith(("http://", "https://")))
        ):
            return None
        return cls(url, pid, started, tuple(cmdline))

    @classmethod
    def names_pid(cls, up_file: Path, pid: int) -> bool:
        """Whether ``up_file`` records the process ``pid`` (a stopping ``up`` removes only its
        own record: the controllers of a shared store write theirs in turn)."""
        record = cls.read(up_file)
        return record is not None and record.pid == pid

    def process(self) -> UpProcess:
        """The one check of "is this record's process still ours" (``coadapt up`` taking over
        a stale record, ``coadapt down`` before it asks and while it waits): the pid, its start
        time and its command line, all three."""
        if process_start_time(self.pid) != self.started:
            return UpProcess.GONE
        if tuple(_cmdline(self.pid)) != self.cmdline:
            return UpProcess.OTHER
        return UpProcess.OURS


def up_is_stale(up_file: Path) -> bool:
    """Whether ``up.json`` was left by a ``coadapt up`` that is gone (:attr:`UpProcess.GONE`):
    the next ``up`` may take over. An unreadable file, or one whose process runs, is not
    judged stale."""
    record = UpRecord.read(up_file)
    return record is not None and record.process() is UpProcess.GONE


class ServiceError(ControllerError):
    """``coadapt up`` cannot start or cannot go on; the message says what and how to fix it
    (one line). The fleet is left as it is."""


class BroughtDownError(ServiceError):
    """``coadapt up`` on a store that ``coadapt down`` brought down, which still holds
    unfinished jobs (``jobs``, their names), without ``UpConfig.resume``: starting would
    relaunch them (and launch instances for them), which the user must ask for."""

    def __init__(self, state: Path, jobs: tuple[str, ...]) -> None:
        self.jobs = jobs
        shown = ", ".join(jobs[:5]) + (f" and {len(jobs) - 5} more" if len(jobs) > 5 else "")
        super().__init__(
            f"{state} was brought down with {len(jobs)} unfinished job(s) ({shown}); "
            f"relaunch them with coadapt up --resume --state-dir {state}, or start empty with "
            "--new-store"
        )


JOB_ISOLATION_MODES: Final = ("auto", "user", "none")


@dataclass(frozen=True)
class JobIsolation:
    """Whether the local provider's jobs run as users of their own (``isolated``), and the
    line ``coadapt up`` says about it."""

    isolated: bool
    line: str


def job_isolation(
    mode: str, *, euid: int, probe: Callable[[], str | None] = probe_isolation
) -> JobIsolation:
    """How the local provider's jobs are kept from the control plane's secrets (the state
    folder: ``tokens.json``, the agents' credentials, the store):

    * as root (``euid`` 0), each job runs as its own unprivileged user (uid and gid
      :func:`coadapt_common.jobexec.job_uid`, no supplementary group, no new privileges), in
      a mount namespace of its own where its checkpoint folder is mounted for it, with its own
      home folder and report credential. The state folder (0700, root's) is out of its reach.
      The Python it runs, the trainer's code, the working folder and its script are shown to
      it even behind a closed parent (``/root``: covered, only those shown); any other file
      it reads must be open to other users.
      ``probe`` (:func:`coadapt_common.jobexec.probe`) first runs Python that way: where it
      cannot (a container without mount namespaces), it is as below, with its reason.
    * otherwise jobs run as this user, who owns the state folder: they could read it. ``auto``
      says so; ``user`` refuses to start (run ``coadapt up`` as root to isolate jobs).
    * ``none``: jobs run as this user, said in one line."""
    if mode not in JOB_ISOLATION_MODES:
        raise InvalidInputError(
            f"--job-isolation {mode!r}: choose {', '.join(JOB_ISOLATION_MODES)}",
            field="job_isolation",
        )
    exposed = (
        "jobs run as this service's user and can read its state folder (the users' token "
        "and the agents' credentials included)"
    )  # said at the start of a line: 'coadapt: jobs run as ...'
    if mode == "none":
        return JobIsolation(False, f"{exposed}: --job-isolation none")
    failed = probe() if euid == 0 else None
    if euid == 0 and failed is None:
        return JobIsolation(
            True,
            "each job runs as its own unprivileged user (uid "
            f"{JOB_UID_BASE}+), seeing only its own checkpoint folder, home and report "
            "credential: the state folder and its tokens are out of its reach",
        )
    why = "only root can run jobs as users of their own (coadapt up as root isolates them)"
    if failed is not None:
        why = f"running a job as a user of its own failed here: {failed}"
    if mode == "user":
        raise ServiceError(f"--job-isolation user: {why}")
    return JobIsolation(False, f"{exposed}: {why}")


def _disk_line(state: Path, free: int, keep: int) -> str:
    return (
        f"the disk of the state folder {state} is full ({free >> 20} MiB free, less than the "
        f"{keep >> 20} MiB coadapt up keeps free: --min-free-mib): nothing is launched or "
        "written; free some space (or name another folder with --state-dir), then start "
        "coadapt up again"
    )


def check_free_space(state: Path, keep_bytes: int) -> str | None:
    """The one line that says the state folder's disk is (nearly) full, or ``None``."""
    free = free_bytes(state)
    if free is None or free >= keep_bytes:
        return None
    return _disk_line(state, free, keep_bytes)


@dataclass(frozen=True)
class UpReport:
    """How :func:`run_up` ended: ``released`` the fleet (``coadapt down``, the demo) or kept
    it running; ``remaining``: cloud ids still listed after a release, or those kept;
    ``error``: the provider's last error while releasing, if any."""

    released: bool
    remaining: tuple[str, ...] = ()
    error: str | None = None

    @property
    def clean(self) -> bool:
        """Released, and nothing is left."""
        return self.released and not self.remaining


_PRIVATE_DIRS: Final = ("logs", "checkpoints", "agents", "local")
_EARLIER_CLUSTER: Final = ("tokens.json", "api.json", "logs", "checkpoints", "agents", "local")


def _private_folder(path: Path) -> None:
    """Make ``path`` a folder only its owner may read (0700), whatever the umask."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_uid == os.geteuid():
        os.chmod(path, 0o700)


def _prepare_state(state: Path) -> None:
    if state.exists() and not state.is_dir():
        raise ServiceError(
            f"--state-dir {state} is a file, not a folder; name a folder (it is created if missing)"
        )
    try:
        _private_folder(state)
        for name in _PRIVATE_DIRS:
            _private_folder(state / name)
        for name in ("store.db", "store.db-wal", "store.db-shm", "tokens.json"):
            path = state / name
            mode = path.stat().st_mode if path.is_file() else 0
            if mode & 0o077 and path.stat().st_uid == os.geteuid():
                os.chmod(path, stat.S_IMODE(mode) & 0o700)  # closed to others, not opened
    except OSError as e:
        raise ServiceError(f"cannot prepare the state folder {state}: {e}; fix its owner or "
                           "mode, or name another folder with --state-dir") from e  # fmt: skip


def _open_database_store(url: str, cluster_id: str, clock: Clock, *, new_store: bool) -> Store:
    """The PostgreSQL store at ``url``: opened, or built on a first ``up`` in its (existing,
    empty) database. A store there is never moved aside (``new_store`` refuses: drop and
    create the database to start over); one of another cluster is refused."""
    where = masked_url(url)
    try:
        try:
            store = Store.open(url, clock)
        except StoreMissingError as e:
            if EMPTY_DATABASE not in str(e):
                raise  # no such database: it is the operator's to create
            return Store.create(url, cluster_id, clock)
        try:
            if new_store:
                raise ServiceError(
                    f"--new-store: {where} already holds a store, and a PostgreSQL store is "
                    "never moved aside; drop and create that database to start over"
                )
            if store.cluster_id != cluster_id:
                raise ServiceError(
                    f"{where} holds the store of cluster {store.cluster_id!r}, not "
                    f"{cluster_id!r}: give --cluster-id {store.cluster_id}, or another database"
                )
            store.check_writable()
        except BaseException:
            store.close()
            raise
        return store
    except StoreError as e:
        raise ServiceError(describe_store_error(e)) from e


def _open_store(
    state: Path, cluster_id: str, clock: Clock, *, new_store: bool, store_url: str | None = None
) -> Store:
    """The store of ``state`` (or of ``store_url``, a PostgreSQL database): opened, or
    created on a first ``up``; refuses to create one silently beside an earlier cluster's
    files (see :class:`UpConfig`'s ``new_store``)."""
    if store_url is not None:
        return _open_database_store(store_url, cluster_id, clock, new_store=new_store)
    path = state / "store.db"
    try:
        if path.exists() and new_store:
            aside = path.with_name(f"store.db.{int(clock.now_s())}.aside")
            for suffix in ("", "-wal", "-shm"):
                old = path.with_name(path.name + suffix)
                if old.exists():
                    old.rename(aside.with_name(aside.name + suffix))
            log.warning("the earlier store was moved aside to %s", aside)
        if path.exists():
            store = Store.open(path, clock)
            try:
                store.check_writable()
            except BaseException:
                store.close()
                raise
            return store
        earlier = [n for n in _EARLIER_CLUSTER if _holds_something(state / n)]
        if earlier and not new_store:
            raise ServiceError(
                f"{path} is missing, but {state} holds an earlier cluster's "
                f"{', '.join(earlier)}: its jobs would be forgotten. Restore store.db from a "
                "backup, or start over with a new, empty store: coadapt up --new-store"
            )
        return Store.create(path, cluster_id, clock)
    except StoreError as e:
        raise ServiceError(describe_store_error(e)) from e


def _holds_something(path: Path) -> bool:
    if path.is_file():
        return True
    if path.is_dir():
        if path.name == "local":  # the provider's folders exist as soon as it ran once
            return any((path / "instances").glob("*.json"))
        return any(path.iterdir())
    return False


def describe_store_error(e: StoreError) -> str:
    """One line: what is wrong with the store and how to fix it."""
    where = e.path or "the store"
    text = " ".join(str(e).split())
    if is_disk_full(e):
        return (
            f"the disk of the store is full ({text}): nothing more is written; free some "
            "space, then start coadapt up again (the store is kept as it was)"
        )
    if isinstance(e, StoreCorruptError):
        return (
            f"the store is damaged ({text}); stop coadapt up and restore {where} from a backup, "
            "or start over with a new, empty store: coadapt up --new-store (the damaged file "
            "is kept beside it)"
        )
    if isinstance(e, StoreUnwritableError):
        return (
            f"the store cannot be written ({text}); make {where} and its folder writable by "
            "this user and free disk space, then start coadapt up again"
        )
    if isinstance(e, StoreMissingError):
        return (
            f"the store failed while in use ({text}); start coadapt up again: it checks the "
            "store when it opens it (restore it from a backup if it is gone)"
        )
    return f"the store failed ({text}); check its disk and start coadapt up again"


def _bind(app: ApiApp, cfg: UpConfig, state: Path) -> ApiServer:
    """Serve ``app`` on ``cfg``'s port, else on the one recorded in ``api.json`` (where the
    agents of a running fleet call), else on any free one; record it."""
    recorded = _recorded_port(state / "api.json")
    port = cfg.port or recorded or 0
    if cfg.port and recorded and cfg.port != recorded:
        log.warning(
            "listening on port %d, not %d where running agents call: they are lost (and "
            "replaced) unless they are started again",
            cfg.port,
            recorded,
        )
    try:
        server = serve(app, cfg.host, port)
    except OSError as e:
        where = "recorded in " + str(state / "api.json") if port == recorded else "given"
        raise ServiceError(
            f"cannot listen on {cfg.host}:{port} (the port {where}): {e.strerror or e}; stop "
            "what holds it, or start with --port N (agents already running then lose the "
            "controller)"
        ) from e
    write_json_atomic(state / "api.json", {"host": cfg.host, "port": server.port})
    return server


def _recorded_port(path: Path) -> int:
    try:
        port = json.loads(path.read_text())["port"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    return port if isinstance(port, int) and 0 < port < 65536 else 0


def _cmdline(pid: int) -> list[str]:
    return [part.decode(errors="replace") for part in read_proc_strings(pid, "cmdline")]


def run_up(
    cfg: UpConfig,
    stop: threading.Event,
    *,
    clock: Clock | None = None,
    on_ready: Callable[[str], None] | None = None,
    on_event: Callable[[Event], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> UpReport:
    """Run the controller service until ``stop`` is set or ``coadapt down`` asks it to stop
    (see the module docstring); returns whether it released the fleet and what is left.
    After each round and after a release, what happened is recorded in the store's events
    (:class:`~autoscaler.controller.events.EventRecorder`) and each event is passed to
    ``on_event``; ``on_note`` is told, once, how jobs are isolated (:func:`job_isolation`),
    and whether this process leads (on a shared PostgreSQL store: or stands by, and each
    change of it) (the leader lease: :mod:`autoscaler.controller.leader`; every process serves
    the API, only the leader runs rounds).
    Raises :class:`ServiceError` (one line) when it cannot start, when the store fails, when
    the state folder's disk is full (below ``min_free_bytes`` free: at the start, or at a
    round, after a ``disk-full`` event; an ``OSError`` that says the disk is full anywhere),
    and when a round refuses the fleet it finds: the fleet is left as it is."""
    try:
        return _run_up(cfg, stop, clock=clock, on_ready=on_ready, on_event=on_event,
                       on_note=on_note)  # fmt: skip
    except OSError as e:
        if not is_disk_full(e):
            raise
        free = free_bytes(cfg.state_dir) or 0
        raise ServiceError(_disk_line(cfg.state_dir, free, cfg.min_free_bytes)) from e


def _run_up(
    cfg: UpConfig,
    stop: threading.Event,
    *,
    clock: Clock | None,
    on_ready: Callable[[str], None] | None,
    on_event: Callable[[Event], None] | None,
    on_note: Callable[[str], None] | None,
) -> UpReport:
    from providers.local import LocalProvider

    clock = clock or SystemClock()
    cloud = None
    if cfg.provider != "local":
        if cfg.provider_config is None:
            raise InvalidInputError(
                f"--provider {cfg.provider} needs --provider-config (the deployment's "
                "provider.json)",
                field="provider_config",
            )
        cloud = load_provider_config(cfg.provider_config)
        if cloud.kind != cfg.provider:
            raise InvalidInputError(
                f"{cfg.provider_config} is a {cloud.kind} config, not {cfg.provider}",
                field="provider",
            )
    if cfg.job_log_max_bytes < MIN_LOG_MAX_BYTES or cfg.min_free_bytes < 0:
        raise InvalidInputError(
            f"job logs keep at least {MIN_LOG_MAX_BYTES} bytes and the space kept free is >= 0",
            field="job_log_max_bytes",
        )
    state = cfg.state_dir
    _prepare_state(state)
    full = check_free_space(state, cfg.min_free_bytes)
    if full is not None:
        raise ServiceError(full)
    isolation = None
    if cloud is None:
        isolation = job_isolation(cfg.job_isolation, euid=os.geteuid())
    store_path: Path | str = cfg.store_url or state / "store.db"
    store = _open_store(
        state, cfg.cluster_id, clock, new_store=cfg.new_store, store_url=cfg.store_url
    )
    log.info("the store: %s", store.location)
    shared: Store | None = None  # the credentials' own connection, on a shared store
    try:
        waiting = _unfinished_after_down(store)
        if waiting and not cfg.resume:
            raise BroughtDownError(state, waiting)
        write_json_atomic(
            state / "cluster.json",
            {
                "provider": cfg.provider,
                "provider_config": None
                if cfg.provider_config is None
                else str(cfg.provider_config.resolve()),
                "store": None if cfg.store_url is None else url_without_password(cfg.store_url),
            },
        )
        tokens: CredentialSource
        if cfg.store_url is None:
            tokens = open_tokens(state / "tokens.json")
        else:  # every controller of the store checks the store's credentials
            shared = Store.open(cfg.store_url, clock)
            tokens = StoreCredentials.open(shared, state / "tokens.json")
        max_gpus = cfg.max_gpus
        controller_cfg = ControllerConfig(
            store.cluster_id,
            interval_s=cfg.interval_s,
            reconcile=ReconcileConfig(heartbeat_timeout_s=cfg.effective_heartbeat_timeout_s),
            gpu_type_aliases={"cpu-slot": "T4"} if cloud is None else {},
            offerings_refresh_s=cfg.offerings_refresh_s,
            stall_gap_s=cfg.stall_gap_s,
            retention_s=cfg.retention_s,
        )
        # One unavailable-offerings memory, with the controller's TTLs: the provider's launch
        # walk marks capacity and quota errors in it and skips what it holds, the controller
        # fails queued launches into it, the sizing routes around it.
        unavailable = controller_cfg.unavailable_offerings(clock)
        if cloud is None:
            local = LocalProvider(
                state / "local",
                clock=clock,
                max_gpu_slots=cfg.max_gpu_slots,
                # The agent stops its jobs with a checkpoint before it goes: its instance
                # waits longer than the jobs' checkpoint grace and the agent's kill margin
                # (the local agent process waits 0.6 x this for its workload).
                term_grace_s=LOCAL_TERM_GRACE_S,
                spot_price_swing=cfg.local_spot_price_swing,
                spot_price_period_s=cfg.local_spot_price_period_s,
                unavailable=unavailable,
            )
            provider: Provider = local
            if max_gpus is None:
                max_gpus = local.max_gpu_slots
        else:
            provider = make_cloud_provider(
                cloud, clock, endpoint_url=cfg.endpoint_url, unavailable=unavailable
            )
        secrets = None if cloud is None else _CloudSecrets(cloud, tokens, cfg.endpoint_url)
        if secrets is not None:
            secrets.sync(store)  # the users' token, before the first round
        strategy = None
        if cfg.fixed_fleet:
            known = {o.key for o in provider.offerings()}
            unknown = sorted(k for k, _ in cfg.fixed_fleet if k not in known)
            if unknown:
                raise InvalidInputError(
                    f"fixed fleet: no offering {unknown[0]!r} (known: {', '.join(sorted(known))})",
                    field="fixed_fleet",
                )
            strategy = FixedFleet("fixed", dict(cfg.fixed_fleet))
    except BaseException:
        _close(store, shared)
        raise
    # What a restart and a new instance cost, as the decisions weigh them: a local instance
    # is a process, ready in seconds, and a local job restarts in about 6-10 s (imports, the
    # checkpoint, the rendezvous); a cloud instance takes minutes (the defaults).
    sizing = SizingConfig(max_instances=cfg.max_instances, max_gpus=max_gpus)
    if cloud is None:
        sizing = replace(sizing, provisioning_delay_s=LOCAL_PROVISIONING_DELAY_S)
    controller_cfg = replace(controller_cfg, sizing=sizing)
    if cloud is None:
        controller_cfg = replace(controller_cfg, restart_delay_s=LOCAL_RESTART_DELAY_S)

    def on_job_exit(name: str, *, failed: bool, deterministic: bool = False) -> JobStatus:
        with Store.open(store_path, clock) as own:  # this API thread's store
            return record_job_exit(
                own,
                name,
                failed=failed,
                max_retries=controller_cfg.max_job_retries,
                deterministic=deterministic,
            )

    release = threading.Event()
    if cfg.release_on_stop:
        release.set()

    def request_down() -> None:
        release.set()
        stop.set()

    metrics = ControllerMetrics()
    me = os.getpid()
    identity = {"pid": me, "started": process_start_time(me), "cmdline": _cmdline(me)}
    app = make_app(
        store_path,
        tokens,
        clock,
        logs_dir=state / "logs",
        checkpoints_dir=state / "checkpoints",
        on_job_exit=on_job_exit,
        service=ServiceControl(identity, request_down),
        limits=cfg.request_limits
        or RequestLimits.for_intervals(cfg.report_interval_s, cfg.agent_interval_s),
        metrics=metrics,
    )
    try:
        server = _bind(app, cfg, state)
    except BaseException:
        app.close()
        _close(store, shared)
        raise
    user_data: Callable[[InstanceRow], str] | None
    if cloud is None and isolation is not None:
        agent_url = ",".join(cfg.api_urls) if cfg.api_urls else server.url
        user_data = _agent_user_data(cfg, agent_url, tokens, isolate=isolation.isolated)
    else:
        user_data = None if cloud is None else _cloud_user_data(cloud, tokens)
    if isolation is not None:
        log.info("%s", isolation.line)
        if on_note is not None:
            on_note(isolation.line)

    def new_controller() -> Controller:
        """A controller for an epoch this process leads: built fresh at every takeover, as
        a restarted ``up`` would be (no memory of an earlier epoch's rounds)."""
        return Controller(
            store,
            provider,
            clock,
            controller_cfg,
            strategy=strategy,
            user_data=user_data,
            unavailable=unavailable,
        )

    # The leader lease (autoscaler.controller.leader): every process serves the API, only
    # the holder runs rounds. On the embedded SQLite store (one up per state folder) the one
    # process takes it at once and nothing is said; on a shared PostgreSQL store it says
    # whether it leads or stands by, and when it takes over.
    team = store.is_postgres
    identity["holder"] = holder_id(server.port, me)  # what /v1/fleet's leader.leading asks
    election = Election(
        store,
        str(identity["holder"]),
        cfg.lease_s or DEFAULT_LEASE_INTERVALS * cfg.interval_s,
        take=not team,
    )
    lead: list[Controller | None] = [None]  # the controller of the epoch led; None: standby
    recorder: EventRecorder | None = None
    said: list[str] = [""]

    def say(line: str) -> None:
        if line == said[0]:
            return
        said[0] = line
        log.info("%s", line)
        if on_note is not None:
            on_note(line)

    def tell() -> None:
        """The events since the last call, recorded and passed on; a failure to record them
        is said once and never stops the service (the store's own errors surface in the
        next round)."""
        if recorder is None:
            return
        try:
            events = recorder.observe()
        except FencedError:
            return  # deposed: the next try of the lease says so
        except (ControllerError, InvalidInputError) as e:
            log.warning("could not record the cluster's events: %s", e)
            return
        if on_event is not None:
            for event in events:
                on_event(event)

    try:
        if store.down_at_s() is not None:  # up again: its jobs may launch (resume or none left)
            store.set_down(False)
    except StoreError as e:
        server.shutdown()
        app.close()
        _close(store, shared)
        raise ServiceError(describe_store_error(e)) from e
    up_record = {"url": server.url, **identity}
    write_json_atomic(state / "up.json", up_record)
    if on_ready is not None:
        on_ready(server.url)
    last_error: str | None = None
    ticking = threading.Event()

    def tick() -> None:  # the controller's own evidence that it runs (see liveness)
        while not ticking.wait(ALIVE_TICK_S):
            current = lead[0]
            if current is not None:
                current.note_alive()

    ticker = threading.Thread(target=tick, name="coadapt-alive", daemon=True)
    ticker.start()
    seen_holder: str | None = None  # who held the lease at the last try, by this process
    result: UpReport | None = None
    try:
        while not stop.is_set():
            full = check_free_space(state, cfg.min_free_bytes)
            if full is not None:  # no round writes or launches into a full disk
                _tell_disk_full(store, clock, full, on_event)
                raise ServiceError(full)
            try:
                lease = election.try_lead()
            except StoreError as e:
                if not team:
                    raise ServiceError(describe_store_error(e)) from e
                # A shared store out of reach (a restart, a cut, a stuck writer): no round
                # without the lease; tried again, standing by meanwhile.
                log.warning("coadapt up: cannot reach the leader lease: %s; standing by", e)
                election.deposed()
                lead[0] = recorder = None
                stop.wait(cfg.interval_s / STANDBY_TRIES_PER_INTERVAL)
                continue
            leadership = Leadership(leader=election.leading, epoch=lease.epoch)
            metrics.set_leadership(leadership)
            if not election.leading:
                if lead[0] is not None:
                    say(f"deposed: {lease.holder} leads now (epoch {lease.epoch}); standing by")
                lead[0] = recorder = None
                seen_holder = lease.holder
                say(f"stands by: {lease.holder} leads (epoch {lease.epoch})")
                stop.wait(cfg.interval_s / STANDBY_TRIES_PER_INTERVAL)
                continue
            controller = lead[0]
            if controller is None:
                if team and store.down_at_s() is not None:
                    say("the cluster was brought down (coadapt down): stopping")
                    election.release()
                    stop.set()
                    break
                controller = lead[0] = new_controller()
                recorder = EventRecorder(store, clock, views=_views_of(controller, clock))
                if not team:  # the one process over its own store leads at once: said once
                    say(leadership_line(leadership))
                if team:
                    write_json_atomic(state / "up.json", up_record)  # the leader's API
                    took = (
                        f", took over from {seen_holder}"
                        if seen_holder not in (None, election.holder)
                        else ""
                    )
                    say(f"leads (epoch {lease.epoch}, as {election.holder}{took})")
            try:
                if store.released_at_s() is not None:  # coadapt destroy: hold nothing
                    released = controller.down(timeout_s=0.0)
                    store.record_release_listing(released.remaining, released.error)
                    if released.remaining:
                        log.info("released; still listed: %s", ", ".join(released.remaining))
                else:
                    try:
                        report = controller.run_round()
                    except RoundError as e:  # said once; the API keeps serving (cancel works)
                        if str(e) != last_error:
                            log.error("coadapt up: a round could not finish: %s", e)
                        last_error = str(e)
                    else:
                        last_error = None
                        metrics.observe_round(report)
                        if report.error:
                            log.warning("round %d: %s", report.round_index, report.error)
            except FencedError as e:  # deposed while it ran: nothing more of it is written
                log.warning("coadapt up: %s; the round stopped, standing by", e)
                election.deposed()
                continue
            except UnknownFleetError as e:  # leaves the fleet alone, releasing or not
                raise ServiceError(" ".join(str(e).split())) from e
            except (StoreMissingError, StoreCorruptError, StoreUnwritableError) as e:
                raise ServiceError(describe_store_error(e)) from e
            except StoreError as e:
                if not team:
                    raise ServiceError(describe_store_error(e)) from e
                # A shared store's transaction failed (a connection cut, a stuck session the
                # server ended): this epoch's controller is dropped; the lease is tried again
                # and a new one built if this process still leads.
                log.warning("coadapt up: the round failed on the store: %s", e)
                election.deposed()
                lead[0] = recorder = None
                continue
            tell()
            if secrets is not None:
                secrets.sync(store)
            _wait_renewing(election, stop, cfg.interval_s, renew=team)
        current = lead[0]
        if current is not None:
            result = _leave(current, store, release=release.is_set())
            tell()
            if secrets is not None and result.released:
                secrets.sync(store)  # withdraw the credentials of the nodes now gone
        else:
            if release.is_set():
                log.warning("standing by: only the leader releases the fleet (coadapt down "
                            "--state-dir names it in up.json)")  # fmt: skip
            result = UpReport(False)
    finally:
        ticking.set()
        if team:
            with contextlib.suppress(StoreError):
                election.release()  # a standby takes over at its next try
        server.shutdown()
        app.close()
        _close(store, shared)
        if not team or UpRecord.names_pid(state / "up.json", me):
            (state / "up.json").unlink(missing_ok=True)
    return result


def leadership_line(leadership: Leadership) -> str:
    """The line ``coadapt up`` says at its start about its leadership."""
    if leadership.leader:
        return (
            f"this controller leads (epoch {leadership.epoch}): it runs the rounds and calls "
            "the cloud"
        )
    return (
        f"this controller stands by (epoch {leadership.epoch}): it serves the API and "
        "takes over if the leader goes"
    )


def _views_of(controller: Controller, clock: Clock) -> Callable[[], Sequence[JobView]]:
    return lambda: controller.job_views(clock.now_s())


def _wait_renewing(election: Election, stop: threading.Event, interval_s: float, *,
                   renew: bool) -> None:  # fmt: skip
    """Wait a round interval (or until ``stop``), renewing the lease every half interval
    when ``renew`` (a shared store); returns early when the lease was lost."""
    if not renew:
        stop.wait(interval_s)
        return
    end = time.monotonic() + interval_s
    while not stop.wait(max(0.0, min(interval_s / 2, end - time.monotonic()))):
        if time.monotonic() >= end:
            return
        try:
            election.try_lead()
        except StoreError as e:
            log.warning("coadapt up: could not renew the leader lease: %s", e)
            continue
        if not election.leading:
            return


def _tell_disk_full(
    store: Store, clock: Clock, line: str, on_event: Callable[[Event], None] | None
) -> None:
    """Record the ``disk-full`` event (the space kept free holds it) and pass it on; a store
    that cannot take it any more is left as it is (the line is said anyway)."""
    event = Event(clock.now_s(), EventKind.DISK_FULL, "state", line)
    try:
        store.add_events([(event.at_s, event.kind.value, event.subject, event.message)])
    except (StoreError, OSError) as e:
        log.warning("could not record the disk-full event: %s", e)
    if on_event is not None:
        on_event(event)


def _leave(
    controller: Controller, store: Store, *, release: bool, timeout_s: float = 120.0
) -> UpReport:
    """What a stopping service does with its fleet: releases it when asked to and when its
    store owns it (the store has planned: a store that never did has launched nothing, and
    what the cloud lists under its cluster is a stranger's), and marks the cluster down (its
    unfinished jobs wait for an ``up --resume``); otherwise leaves every instance and job
    running."""
    if release:
        store.set_down(True)  # intent first: a release cut short is still a cluster down
    if release and store.planned_at_s() is not None:
        down = controller.down(timeout_s=timeout_s, poll_s=1.0)
        return UpReport(True, down.remaining, down.error)
    if release:
        log.warning(
            "not releasing the fleet: this store has never planned one, so nothing listed "
            "under cluster %s is known to be its own",
            controller.config.cluster_id,
        )
    try:
        kept = tuple(sorted(i.instance_id for i in controller.provider.list_instances(
            controller.config.cluster_id)))  # fmt: skip
    except ProviderError as e:
        return UpReport(False, (), str(e))
    return UpReport(False, kept)


def _unfinished_after_down(store: Store) -> tuple[str, ...]:
    """The unfinished (queued or running) jobs of a store that ``coadapt down`` brought down,
    by name: what an ``up`` would relaunch; empty when the store is not down."""
    if store.down_at_s() is None:
        return ()
    return tuple(job.name for job in store.list_jobs(statuses=ACTIVE_JOBS))


def cluster_store_location(state: Path, store_url: str | None = None) -> Path | str | None:
    """Where the cluster of ``state`` keeps its store, for the commands that read it with
    or without a running ``up`` (``events``, ``logs``, ``cost report``, ``status``,
    ``describe``, ``down``, ``up``'s question about a cluster brought down): ``store_url``
    when given (``--store`` / ``COADAPT_STORE_URL``), else the PostgreSQL database that
    ``cluster.json`` records (its URL without the password: libpq takes it from
    ``PGPASSWORD`` or ``~/.pgpass``), else ``state/store.db`` when that file exists; ``None``
    when there is none. Raises :class:`ServiceError` for a ``store_url`` that is not a
    ``postgresql://`` URL, or a ``cluster.json`` that records something else as the store."""
    if store_url is not None:
        if not is_postgres_url(store_url):
            raise ServiceError(
                f"--store {masked_url(store_url)[:200]!r} is not a PostgreSQL URL: give "
                "postgresql://user@host:port/db (the password in PGPASSWORD), or leave it out "
                "for the store.db of the state folder"
            )
        return store_url
    try:
        doc = json.loads((state / "cluster.json").read_text())
    except (OSError, ValueError):
        doc = None
    recorded = doc.get("store") if isinstance(doc, dict) else None
    if recorded is not None:
        if not is_postgres_url(recorded):
            raise ServiceError(
                f"{state / 'cluster.json'} records a store that is not a PostgreSQL URL "
                f"({str(recorded)[:200]!r}); give the cluster's store with --store URL, or "
                "run coadapt up --store URL again, which records it"
            )
        return str(recorded)
    path = state / "store.db"
    return path if path.is_file() else None


def open_cluster_store(
    state: Path, clock: Clock, *, store_url: str | None = None, read_only: bool = True
) -> Store:
    """The store of the cluster of ``state`` (:func:`cluster_store_location`), opened
    read-only (every write refused) unless ``read_only`` is false. Raises
    :class:`StoreMissingError` when the folder names no store, :class:`ServiceError` as
    :func:`cluster_store_location` does, and the store's own :class:`StoreError` s."""
    where = cluster_store_location(state, store_url)
    if where is None:
        raise StoreMissingError(
            f"no cluster store in {state} (no store.db, and no database in cluster.json): "
            f"coadapt up --state-dir {state} makes one, or give the cluster's --store URL",
            path=str(state / "store.db"),
        )
    return Store.open_read_only(where, clock) if read_only else Store.open(where, clock)


def unfinished_after_down(state: Path, store_url: str | None = None) -> tuple[str, ...]:
    """:func:`_unfinished_after_down` of the cluster's store (:func:`open_cluster_store`),
    read-only (``coadapt up`` asks before it relaunches them); empty when there is no store,
    or one it cannot read (``up`` itself then says what is wrong with it)."""
    try:
        with open_cluster_store(state, SystemClock(), store_url=store_url) as store:
            return _unfinished_after_down(store)
    except (StoreError, ServiceError):
        return ()


@dataclass(frozen=True)
class DownWithoutUp:
    """What :func:`down_without_up` did: ``found``, the cloud ids listed under the cluster's
    tag before it released them; ``report``, how the release ended (``remaining``: still
    listed); ``was_down_at_s``: when the cluster had already been brought down (``None``: it
    was not)."""

    cluster_id: str
    found: tuple[str, ...]
    report: UpReport
    was_down_at_s: float | None


def _recorded_provider(state: Path, clock: Clock) -> Provider:
    """The provider of the cluster in ``state``, from its ``cluster.json`` (a state folder
    written before it: the local provider, the only one ``up`` ran here without a deployment)."""
    from providers.local import LocalProvider

    try:
        doc = json.loads((state / "cluster.json").read_text())
    except FileNotFoundError:
        doc = {"provider": "local", "provider_config": None}
    except (OSError, ValueError) as e:
        raise ServiceError(
            f"{state / 'cluster.json'} is unreadable ({e}); it names the cluster's provider: "
            "restore it or run coadapt up again"
        ) from e
    if not isinstance(doc, dict):
        doc = {}
    kind, config = doc.get("provider"), doc.get("provider_config")
    if kind == "local":
        return LocalProvider(state / "local", clock=clock, term_grace_s=LOCAL_TERM_GRACE_S)
    if kind not in ("aws", "gcp") or not isinstance(config, str):
        raise ServiceError(f"{state / 'cluster.json'} names no provider coadapt knows "
                           f"({kind!r}); restore it or run coadapt up again")  # fmt: skip
    try:
        return make_cloud_provider(load_provider_config(config), clock)
    except InvalidInputError as e:
        raise ServiceError(f"cannot reach the cluster's {kind} provider: {e}") from e


def down_without_up(
    state: Path,
    *,
    timeout_s: float = 300.0,
    clock: Clock | None = None,
    on_event: Callable[[Event], None] | None = None,
    store_url: str | None = None,
) -> DownWithoutUp:
    """Bring down the cluster of ``state`` with no ``coadapt up`` running for it (killed,
    crashed, stopped): list the cloud under the cluster's tag, release what it lists
    (:func:`_leave`, the rule a stopping ``up`` follows: only a fleet its store has planned;
    on the local provider terminating an instance stops its agent and every job process it
    started), wait up to ``timeout_s`` for the listing to be empty, record the events (each
    passed to ``on_event``) and mark the cluster down; the store is the cluster's
    (:func:`open_cluster_store`: ``store_url``, else where ``cluster.json`` says). The caller
    checks first that no ``up`` runs (``up.json``, :class:`UpRecord`). Raises
    :class:`ServiceError` (one line) when the folder holds no store, or its store or provider
    cannot be used; a provider that fails while releasing is in the report
    (``report.error``)."""
    clock = clock or SystemClock()
    if cluster_store_location(state, store_url) is None:
        raise ServiceError(
            f"no cluster in {state} (no store.db there, and no database in cluster.json): "
            "nothing was stopped or released"
        )
    try:
        store = open_cluster_store(state, clock, store_url=store_url, read_only=False)
    except StoreError as e:
        raise ServiceError(describe_store_error(e)) from e
    try:
        was_down = store.down_at_s()
        provider = _recorded_provider(state, clock)
        controller = Controller(store, provider, clock, ControllerConfig(store.cluster_id))
        try:
            found = tuple(sorted(i.instance_id for i in provider.list_instances(store.cluster_id)))
        except ProviderError as e:
            found = ()
            log.warning("listing the cluster's instances: %s", e)
        recorder = EventRecorder(store, clock)
        report = _leave(controller, store, release=True, timeout_s=timeout_s)
        events = recorder.observe()
    except StoreError as e:
        raise ServiceError(describe_store_error(e)) from e
    finally:
        store.close()
    if on_event is not None:
        for event in events:
            on_event(event)
    return DownWithoutUp(store.cluster_id, found, report, was_down)


def _checkpoint_root(value: str | None) -> str | None:
    """An absolute folder, or a ``s3://`` / ``gs://`` / ``file://`` prefix, without a trailing
    slash."""
    if not value:
        return None
    if "://" in value:
        return value.rstrip("/")
    return str(Path(value).resolve())


EXIT_NO_FIREWALL: Final = 3
"""``coadapt agent``'s exit status when it cannot keep jobs off the metadata service."""


def _firewall_jobs(cloud: str, *, allow_metadata: bool) -> str | None:
    """Install the jobs' metadata firewall (:mod:`autoscaler.controller.job_firewall`) on a
    cloud node; ``None`` when done (or skipped, said on stderr, with ``allow_metadata``),
    else the one line the agent exits with."""
    from autoscaler.controller.job_firewall import FirewallError, install_metadata_firewall

    try:
        install_metadata_firewall(cloud)
    except FirewallError as e:
        if allow_metadata:
            print(
                f"coadapt agent: UNSAFE: jobs can reach the instance metadata ({e}); "
                "--allow-job-metadata given",
                file=sys.stderr,
                flush=True,
            )
            return None
        return (
            f"coadapt agent: not starting jobs: cannot firewall them off the instance metadata "
            f"({e}); install iptables, or give --allow-job-metadata (unsafe)"
        )
    return None


def _job_storage(
    cloud: str | None,
    root: str | None,
    role_arn: str | None,
    metadata_url: str | None,
    *,
    allow_metadata: bool = False,
) -> JobCredentialSource | None:
    """What mints each job's checkpoint credential on this node (``None``: jobs get none):
    with ``role_arn`` and an ``s3://`` root, :class:`AwsJobCredentials`; on a GCP node with a
    ``gs://`` root, :class:`GcpJobCredentials`. :class:`ValueError`: a role without an
    ``s3://`` root, or an AWS node with an ``s3://`` root and no role (its jobs, kept off the
    metadata service, would have no credential), unless ``allow_metadata``."""
    from autoscaler.controller.job_storage import AwsJobCredentials, GcpJobCredentials

    if role_arn:
        if root is None or not root.startswith("s3://"):
            raise ValueError("--job-storage-role-arn needs an s3:// --checkpoint-root")
        return AwsJobCredentials(role_arn, root)
    if cloud == "aws" and root is not None and root.startswith("s3://") and not allow_metadata:
        raise ValueError(
            "an s3:// --checkpoint-root on an AWS node needs --job-storage-role-arn (jobs "
            "cannot reach the node's role)"
        )
    if cloud == "gcp" and root is not None and root.startswith("gs://"):
        return GcpJobCredentials(root, metadata_url=metadata_url)
    return None


def agent_main(argv: list[str] | None = None) -> int:
    """``coadapt agent``: one instance's agent (see :class:`~autoscaler.controller.agent.
    AgentRunner`) until SIGTERM/SIGINT, then every job stops with a checkpoint and nothing is
    left running. Users meet it as ``coadapt agent --help`` (:func:`autoscaler.cli.cluster.
    agent`, which explains every option); this parser is the launcher's own entry."""
    p = argparse.ArgumentParser(
        prog="coadapt agent",
        description="One instance's node agent (see coadapt agent --help).",
    )
    p.add_argument("--api", required=True, help="the controller API URL")
    p.add_argument(
        "--token-file",
        required=True,
        type=Path,
        help='this agent\'s own credential (a 0600 JSON file {"agent": ...}); renewed in place',
    )
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--instance-key", help="this instance's id in the store")
    who.add_argument(
        "--request-id",
        help="this instance's coadapt-request-id tag (a cloud node); needs --cluster-id",
    )
    p.add_argument("--cluster-id", help="the cluster (with --request-id)")
    p.add_argument("--work-dir", required=True, type=Path)
    p.add_argument("--logs-dir", type=Path, default=None)
    p.add_argument(
        "--checkpoint-root",
        default=None,
        help="where jobs without their own location checkpoint: a folder, s3:// or gs://",
    )
    p.add_argument("--notice-dir", type=Path, default=None, help="local provider notices")
    p.add_argument(
        "--notice-source",
        choices=("local", "aws", "gcp", "none"),
        default=None,
        help="what says this instance is being reclaimed: the local provider's notice file, "
        "AWS instance metadata (IMDSv2 spot instance-action), GCP metadata (preempted); "
        "default: local with --notice-dir, else none",
    )
    p.add_argument("--metadata-url", default=None, help="the metadata service (tests)")
    p.add_argument("--interval-s", type=float, default=2.0)
    p.add_argument("--report-interval-s", type=float, default=30.0)
    p.add_argument("--address", default="127.0.0.1", help="address peers reach this node at")
    p.add_argument(
        "--isolate-jobs",
        action="store_true",
        help="run each job as its own unprivileged user (needs root; see coadapt up)",
    )
    p.add_argument(
        "--allow-job-metadata",
        action="store_true",
        help="UNSAFE: on a cloud node, run jobs even where they cannot be firewalled off the "
        "instance metadata service (they could then take the node's credentials)",
    )
    p.add_argument(
        "--job-storage-role-arn",
        default=None,
        help="AWS: the role this node assumes to hand each job a credential for its own "
        "checkpoints under an s3:// --checkpoint-root",
    )
    p.add_argument(
        "--job-log-max-bytes",
        type=int,
        default=DEFAULT_LOG_MAX_BYTES,
        help="what each job's log keeps here (its latest output)",
    )
    p.add_argument(
        "--min-free-bytes",
        type=int,
        default=0,
        help="start no job while the disk of its log or checkpoints has less free",
    )
    p.add_argument(
        "--stop-grace-s",
        type=float,
        default=STOP_GRACE_S,
        help="seconds a job asked to stop has to checkpoint before it is killed (1-3600)",
    )
    args = p.parse_args(argv)
    if args.job_log_max_bytes < MIN_LOG_MAX_BYTES or args.min_free_bytes < 0:
        p.error(f"--job-log-max-bytes must be >= {MIN_LOG_MAX_BYTES}, --min-free-bytes >= 0")
    if not 1.0 <= args.stop_grace_s <= 3600.0:  # NaN fails too
        p.error(f"--stop-grace-s must be within [1, 3600], got {args.stop_grace_s}")
    os.umask(0o077)  # job logs and checkpoints are private to this user
    if args.request_id is not None:
        if not args.cluster_id:
            p.error("--request-id needs --cluster-id")
        try:
            args.instance_key = instance_key_from_request_id(args.cluster_id, args.request_id)
        except ValueError as e:
            p.error(str(e))
    try:
        token = load_token(args.token_file, "agent")
    except TokenFileError as e:
        print(f"coadapt: {e}", file=sys.stderr)
        return 2
    if args.isolate_jobs and os.geteuid() != 0:
        print("coadapt: --isolate-jobs needs root (jobs get users of their own)", file=sys.stderr)
        return 2
    root = _checkpoint_root(args.checkpoint_root)
    cloud = args.notice_source if args.notice_source in ("aws", "gcp") else None
    try:
        storage = _job_storage(
            cloud,
            root,
            args.job_storage_role_arn,
            args.metadata_url,
            allow_metadata=args.allow_job_metadata,
        )
    except (ValueError, ImportError) as e:
        print(f"coadapt agent: {e}", file=sys.stderr)
        return 2
    if cloud is not None:  # before any job runs
        refusal = _firewall_jobs(cloud, allow_metadata=args.allow_job_metadata)
        if refusal is not None:
            print(refusal, file=sys.stderr, flush=True)
            return EXIT_NO_FIREWALL

    def keep_credential(credential: str) -> None:  # renewed: read at the next start too
        try:
            write_token_file(args.token_file, "agent", credential)
        except TokenFileError as e:
            print(f"coadapt agent: {e} (the renewed credential is kept in memory)", file=sys.stderr)

    def argv_for(a: JobAssignment) -> list[str]:
        if a.checkpoint_uri is None and root is not None:
            a = replace(a, checkpoint_uri=f"{root}/{a.job}")
        return launch_argv(
            a,
            controller_url=args.api,
            extra=["--report-interval-s", str(args.report_interval_s)],
            stop_grace_s=args.stop_grace_s,
        )

    supervisor = Supervisor(
        args.instance_key,
        args.work_dir,
        stop_grace_s=args.stop_grace_s,
        argv_for=argv_for,
        logs_dir=args.logs_dir,
        log_max_bytes=args.job_log_max_bytes,
        isolate=args.isolate_jobs,
        checkpoint_root=Path(root) if root is not None and "://" not in root else None,
        min_free_bytes=args.min_free_bytes,
        storage=storage,
    )
    source = args.notice_source
    notice_file = None
    if source is None:  # the local provider's agents: its notice file, when it has one
        source = "none"
        if args.notice_dir is not None and os.environ.get("COADAPT_INSTANCE_ID"):
            source = "local"
            notice_file = args.notice_dir / os.environ["COADAPT_INSTANCE_ID"] / "spot-notice.json"
    runner = AgentRunner(
        ApiClient(args.api, token, timeout_s=10.0),
        args.instance_key,
        supervisor,
        address=args.address,
        notice=notice_source(
            source, clock=SystemClock(), notice_file=notice_file, metadata_url=args.metadata_url
        ),
        on_credential=keep_credential,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def beating() -> None:  # alive while a step waits for a checkpoint (AgentRunner.beat)
        while not stop.wait(args.interval_s):
            if runner.registered:
                with contextlib.suppress(ApiError):  # the step says it, once per poll
                    runner.beat()

    threading.Thread(target=beating, name="coadapt-agent-beat", daemon=True).start()
    try:
        while not stop.is_set():
            try:
                runner.step()
            except ApiError as e:  # the controller is away for a moment: keep what runs
                print(f"coadapt agent: {e}", file=sys.stderr, flush=True)
            stop.wait(args.interval_s)
    finally:
        runner.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["agent"]:
        return agent_main(args[1:])
    print("usage: python -m autoscaler.controller.service agent ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
