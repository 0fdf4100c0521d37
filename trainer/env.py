"""What the launcher and agent tell a worker: one frozen value read in one call.

``TrainerEnv.from_environ()`` reads ``torchrun``'s variables (rank, world size, restart count,
rendezvous address) and coadapt's own ``COADAPT_*`` variables (set by ``trainer.launch`` or the
controller's agent). Nothing is required: a plain ``python script.py`` is a standalone job of one
process with a local checkpoint folder and a local report file. Torch-free.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import ReportSchemaError, TrainerConfigError
from trainer.report import BatchConfig

# coadapt's variables (the launcher sets them; see trainer/launch.py).
JOB_ID = "COADAPT_JOB_ID"
CHECKPOINT_URI = "COADAPT_CHECKPOINT_URI"
CONTROLLER_URL = "COADAPT_CONTROLLER_URL"
# The file holding this job's report credential (set by the agent; the credential is good for
# this job's reports only, and the agent rewrites the file when it changes).
REPORT_TOKEN_FILE = "COADAPT_REPORT_TOKEN_FILE"
# The file holding this job's own GCS token on a GCP node (its agent writes and renews it;
# read by trainer.storage.GcsStore).
GCS_TOKEN_FILE = "COADAPT_GCS_TOKEN_FILE"
REPORT_FILE = "COADAPT_REPORT_FILE"
REPORT_INTERVAL_S = "COADAPT_REPORT_INTERVAL_S"
BATCH_SIZE = "COADAPT_BATCH_SIZE"
ACCUM_STEPS = "COADAPT_ACCUM_STEPS"
RUN_DIR = "COADAPT_RUN_DIR"
STOP_FILE = "COADAPT_STOP_FILE"
BACKEND = "COADAPT_BACKEND"
COLLECTIVE_TIMEOUT_S = "COADAPT_COLLECTIVE_TIMEOUT_S"
ATTEMPT = "COADAPT_ATTEMPT"

DEFAULT_JOB_ID = "standalone"
DEFAULT_REPORT_INTERVAL_S = 30.0
DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0
_JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _int(environ: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as e:
        raise TrainerConfigError(f"not an integer: {raw!r}", field=name) from e
    if value < minimum:
        raise TrainerConfigError(f"{value} < {minimum}", field=name)
    return value


def _float(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as e:
        raise TrainerConfigError(f"not a number: {raw!r}", field=name) from e
    if not value > 0:
        raise TrainerConfigError(f"must be > 0, got {value}", field=name)
    return value


def _optional(environ: Mapping[str, str], name: str) -> str | None:
    raw = environ.get(name)
    return raw if raw else None


@dataclass(frozen=True)
class TrainerEnv:
    """Everything a worker learns from its environment.

    ``distributed`` is true when a launcher (torchrun) provided a rendezvous (``MASTER_ADDR``);
    otherwise the job is a single local process. ``controller_url is None`` means standalone:
    reports go to ``report_file``. ``batch`` is the configuration decided for this allocation
    (``None``: keep the checkpointed one, or start at the initial batch size).
    ``restart_count`` is torchrun's count of restarts within this launch; ``attempt`` the
    launcher's count of launches of this job (failure restarts and rescales alike).
    ``report_token_file`` names the file holding the job's report credential (``None``: reports
    carry none).
    """

    job_id: str
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    restart_count: int
    attempt: int
    distributed: bool
    checkpoint_uri: str
    controller_url: str | None
    report_token_file: str | None
    report_file: str
    report_interval_s: float
    batch: BatchConfig | None
    run_dir: str | None
    stop_file: str | None
    backend: str | None
    collective_timeout_s: float

    @property
    def standalone(self) -> bool:
        """No controller: reports are written to ``report_file``."""
        return self.controller_url is None

    @property
    def num_nodes(self) -> int:
        """Number of nodes (assumes the same number of processes on every node)."""
        return max(1, self.world_size // max(1, self.local_world_size))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> TrainerEnv:
        """Read the environment (``os.environ`` by default). Raises ``TrainerConfigError``."""
        env = os.environ if environ is None else environ
        job_id = env.get(JOB_ID) or DEFAULT_JOB_ID
        if not _JOB_ID_RE.match(job_id):
            raise TrainerConfigError(f"invalid job id {job_id!r}", field=JOB_ID)
        world_size = _int(env, "WORLD_SIZE", 1, minimum=1)
        rank = _int(env, "RANK", 0)
        if rank >= world_size:
            raise TrainerConfigError(f"rank {rank} >= world size {world_size}", field="RANK")
        local_world_size = _int(env, "LOCAL_WORLD_SIZE", world_size, minimum=1)
        local_rank = _int(env, "LOCAL_RANK", rank % local_world_size)
        distributed = bool(env.get("MASTER_ADDR")) and bool(env.get("MASTER_PORT"))
        if world_size > 1 and not distributed:
            raise TrainerConfigError("WORLD_SIZE > 1 without MASTER_ADDR/MASTER_PORT", field="")

        batch: BatchConfig | None = None
        batch_size = _int(env, BATCH_SIZE, 0, minimum=1) if env.get(BATCH_SIZE) else 0
        accum = _int(env, ACCUM_STEPS, 1, minimum=1)
        if batch_size:
            try:
                batch = BatchConfig(batch_size, accum)
            except ReportSchemaError as e:
                raise TrainerConfigError(str(e), field=BATCH_SIZE) from e
        elif env.get(ACCUM_STEPS):
            raise TrainerConfigError(f"{ACCUM_STEPS} set without {BATCH_SIZE}", field=ACCUM_STEPS)

        checkpoint_uri = env.get(CHECKPOINT_URI) or str(Path("checkpoints") / job_id)
        controller_url = _optional(env, CONTROLLER_URL)
        if controller_url is not None and not controller_url.startswith(("http://", "https://")):
            raise TrainerConfigError(
                f"not an http(s) URL: {controller_url!r}", field=CONTROLLER_URL
            )
        report_file = env.get(REPORT_FILE) or str(Path("coadapt-reports") / f"{job_id}.jsonl")
        backend = _optional(env, BACKEND)
        if backend is not None and backend not in ("gloo", "nccl"):
            raise TrainerConfigError(f"unknown backend {backend!r}", field=BACKEND)
        return cls(
            job_id=job_id,
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            local_world_size=local_world_size,
            node_rank=_int(env, "GROUP_RANK", 0),
            restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
            attempt=_int(env, ATTEMPT, 0),
            distributed=distributed,
            checkpoint_uri=checkpoint_uri,
            controller_url=controller_url.rstrip("/") if controller_url else None,
            report_token_file=_optional(env, REPORT_TOKEN_FILE),
            report_file=report_file,
            report_interval_s=_float(env, REPORT_INTERVAL_S, DEFAULT_REPORT_INTERVAL_S),
            batch=batch,
            run_dir=_optional(env, RUN_DIR),
            stop_file=_optional(env, STOP_FILE),
            backend=backend,
            collective_timeout_s=_float(env, COLLECTIVE_TIMEOUT_S, DEFAULT_COLLECTIVE_TIMEOUT_S),
        )
