"""The API's client: what the CLI and the node agent use to talk to a controller.

One method per endpoint of :mod:`autoscaler.controller.api`, answers as typed values, errors
as :class:`ApiError`. It imports neither the server nor the store nor the decision core (a GPU
node's agent runs it: ``tests/controller/test_client_imports.py``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.client import HTTPException as HttpClientError
from typing import TYPE_CHECKING, Any, Final, TypeVar

from autoscaler.controller.errors import ControllerError
from autoscaler.controller.records import (
    InstanceRow,
    InstanceStatus,
    JobBatch,
    JobStatus,
    ReportRow,
)
from coadapt_common.http import credential_opener
from providers.base import Market
from trainer.report import ReportReply, TrainerReport, remaining_progress, report_path

if TYPE_CHECKING:
    from autoscaler.controller.jobbook import JobSubmission

__all__ = [
    "DEFAULT_JOBS_PAGE",
    "MAX_JOBS_PAGE",
    "ApiClient",
    "ApiError",
    "ApiUnreachableError",
    "HeartbeatReply",
    "JobExitReply",
    "JobInfo",
    "LogChunk",
    "PlannedBatch",
    "ProgressInfo",
    "instance_from_dict",
    "instance_to_dict",
]

DEFAULT_JOBS_PAGE: Final = 100
"""Jobs in one answer of ``GET /v1/jobs`` without ``limit``."""
MAX_JOBS_PAGE: Final = 500
"""The largest ``limit`` of ``GET /v1/jobs``."""

_T = TypeVar("_T")


# ---- errors --------------------------------------------------------------------------------


class ApiError(ControllerError):
    """An API request refused or failed: ``status`` is the HTTP status (0: no answer came,
    see :class:`ApiUnreachableError`), ``field`` the input field at fault, when one is.
    The server raises it to answer an error; :class:`ApiClient` raises it for one."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message
        self.field = field


class ApiUnreachableError(ApiError):
    """No HTTP answer: the controller could not be reached, or the connection broke."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


@dataclass(frozen=True)
class ProgressInfo:
    """A job's latest trainer report, in short: received at ``at_s``; ``progress`` in
    initial-batch-size iterations, ``target_progress`` the length its script declared in the
    same unit (``None``: undeclared), ``done`` whether its trainer finished, ``step`` optimizer
    steps, ``epoch``, ``attempt`` (launches of the job by its launcher), ``started_at_s``
    (when this set of worker processes started: a relaunch changes it), ``world_size``
    (replicas), the batch the trainer runs (``global_batch_size`` over ``accum_steps``
    micro-steps) and ``lr_scale``, the factor its scaling rule last applied to the learning
    rate."""

    at_s: float
    progress: float
    step: int
    epoch: int
    attempt: int
    world_size: int
    target_progress: float | None = None
    done: bool = False
    started_at_s: float = 0.0
    global_batch_size: int = 0
    accum_steps: int = 1
    lr_scale: float | None = None

    @classmethod
    def from_report(cls, row: ReportRow) -> ProgressInfo:
        report = TrainerReport.from_json(row.payload_json)
        return cls(
            row.at_s,
            report.progress,
            report.step,
            report.epoch,
            report.attempt,
            report.world_size,
            report.target_progress,
            report.done,
            report.started_at_s,
            report.batch.global_batch_size,
            report.batch.accum_steps,
            report.lr_scale,
        )


@dataclass(frozen=True)
class PlannedBatch:
    """The batch the controller planned for a job running on ``gpus`` GPUs (what the API
    answers its trainer): ``global_batch_size`` samples per optimizer step,
    ``local_batch_size`` per GPU and micro-step, ``accum_steps`` micro-steps."""

    global_batch_size: int
    local_batch_size: int
    accum_steps: int
    gpus: int

    @classmethod
    def of(cls, row: JobBatch) -> PlannedBatch:
        return cls(row.global_batch_size, row.local_batch_size, row.accum_steps, row.gpus)


@dataclass(frozen=True)
class JobInfo:
    """A job as the API answers it (see the module docstring). ``spec`` is the submission as
    stored (:attr:`submission` parses it); ``report`` the latest trainer report in short;
    ``batch`` the planned batch; ``restarts`` how many times the job was placed again after
    its first start (rescales, moves and resumes after a preemption or a failure);
    ``reason`` why it was refused or last failed; ``started_at_s`` when it was first placed
    (``None``: never), ``deadline_s`` its deadline as the absolute time fixed at submission
    (``None``: none); ``eta_s`` when a running job will be done by its fitted model at the
    GPUs it holds, as the controller's last round estimated it at ``eta_at_s`` (``None``:
    unknown: not running, no declared length or model yet, an estimate beyond
    :data:`~autoscaler.decide.deadlines.MAX_REMAINING_S`, or a cluster that is not up)."""

    name: str
    status: JobStatus
    retries: int
    submitted_at_s: float
    updated_at_s: float
    version: int
    spec: Mapping[str, Any]
    assignment: Mapping[str, int]
    report: ProgressInfo | None
    batch: PlannedBatch | None = None
    restarts: int = 0
    reason: str | None = None
    started_at_s: float | None = None
    deadline_s: float | None = None
    eta_s: float | None = None
    eta_at_s: float | None = None

    @property
    def submission(self) -> JobSubmission:
        """The stored spec, checked (:class:`InvalidInputError` if it no longer passes)."""
        from autoscaler.controller.jobbook import JobSubmission  # the decision core: lazily

        return JobSubmission.from_mapping(self.spec)

    @property
    def gpus(self) -> int:
        return sum(self.assignment.values())

    def samples(self, progress: float | None) -> int | None:
        """``progress`` (initial-batch-size iterations, the trainer's unit) in samples: times
        the spec's ``init_batch_size`` (``None`` when either is missing). The samples are
        those of the initial batch: a larger batch's step counts as its gain (AdaScale's)."""
        init = self.spec.get("init_batch_size")
        if progress is None or isinstance(init, bool) or not isinstance(init, int) or init < 1:
            return None
        return round(progress * init)

    def to_dict(self) -> dict[str, Any]:
        """The answer: every attribute, and flat at the top, what a user reads first:
        ``gpus``, the planned ``batch_size`` / ``local_batch_size`` / ``accumulation_steps``
        (``null`` while it holds no GPUs), ``progress`` / ``target_progress`` /
        ``remaining_progress`` (``null`` before the first report, or when the script
        declared no length), ``restarts`` and ``reason``; progress in its unit, samples
        (``progress_samples`` / ``target_samples``: :meth:`samples`), and ``progress_share``,
        the share of the declared length done (0..1, ``null`` without one); ``started_at_s``
        and ``deadline_s`` (Unix seconds, ``null``: none), the deadline also as
        ``deadline_utc`` (ISO-8601 UTC, e.g. ``2025-01-02T03:04:05Z``); ``eta_s`` and
        ``eta_at_s`` (Unix seconds, ``null``: unknown), the ETA also as ``eta_utc``."""
        report = self.report
        remaining = (
            None if report is None else remaining_progress(report.progress, report.target_progress)
        )
        share = None
        if report is not None and report.target_progress:
            share = min(1.0, max(0.0, report.progress / report.target_progress))
        return {
            "name": self.name,
            "status": self.status.value,
            "reason": self.reason,
            "retries": self.retries,
            "restarts": self.restarts,
            "submitted_at_s": self.submitted_at_s,
            "started_at_s": self.started_at_s,
            "deadline_s": self.deadline_s,
            "deadline_utc": None if self.deadline_s is None else utc_text(self.deadline_s),
            "eta_s": self.eta_s,
            "eta_at_s": self.eta_at_s,
            "eta_utc": None if self.eta_s is None else utc_text(self.eta_s),
            "updated_at_s": self.updated_at_s,
            "version": self.version,
            "spec": dict(self.spec),
            "assignment": dict(sorted(self.assignment.items())),
            "gpus": self.gpus,
            "batch_size": None if self.batch is None else self.batch.global_batch_size,
            "local_batch_size": None if self.batch is None else self.batch.local_batch_size,
            "accumulation_steps": None if self.batch is None else self.batch.accum_steps,
            "progress": None if report is None else report.progress,
            "target_progress": None if report is None else report.target_progress,
            "remaining_progress": remaining,
            "progress_samples": (  # up to the declared length: the last step may overshoot
                None
                if report is None
                else self.samples(min(report.progress, report.target_progress or math.inf))
            ),
            "target_samples": None if report is None else self.samples(report.target_progress),
            "progress_share": share,
            "report": None if report is None else dataclasses.asdict(report),
            "batch": None if self.batch is None else dataclasses.asdict(self.batch),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobInfo:
        report = data["report"]
        batch = data.get("batch")
        reason = data.get("reason")
        return cls(
            name=str(data["name"]),
            status=JobStatus(data["status"]),
            retries=int(data["retries"]),
            submitted_at_s=float(data["submitted_at_s"]),
            updated_at_s=float(data["updated_at_s"]),
            version=int(data["version"]),
            spec=dict(data["spec"]),
            assignment={str(k): int(v) for k, v in dict(data["assignment"]).items()},
            report=None if report is None else ProgressInfo(**report),
            batch=None if batch is None else PlannedBatch(**batch),
            restarts=int(data.get("restarts", 0)),
            reason=None if reason is None else str(reason),
            started_at_s=_optional_float(data.get("started_at_s")),
            deadline_s=_optional_float(data.get("deadline_s")),
            eta_s=_optional_float(data.get("eta_s")),
            eta_at_s=_optional_float(data.get("eta_at_s")),
        )


@dataclass(frozen=True)
class LogChunk:
    """Job logs from byte ``offset`` to ``next_offset`` (pass it as the next ``offset``),
    decoded as UTF-8; ``more``: bytes are left to read now. ``instances``: the log files,
    ``(instance_key, size_bytes)`` in reading order."""

    job: str
    offset: int
    next_offset: int
    text: str
    more: bool
    instances: tuple[tuple[str, int], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "offset": self.offset,
            "next_offset": self.next_offset,
            "text": self.text,
            "more": self.more,
            "instances": [{"instance_key": k, "size_bytes": n} for k, n in self.instances],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LogChunk:
        return cls(
            job=str(data["job"]),
            offset=int(data["offset"]),
            next_offset=int(data["next_offset"]),
            text=str(data["text"]),
            more=bool(data["more"]),
            instances=tuple(
                (str(i["instance_key"]), int(i["size_bytes"])) for i in data["instances"]
            ),
        )


@dataclass(frozen=True)
class HeartbeatReply:
    """A heartbeat recorded at ``at_s``; ``status`` is the instance's status now (an agent
    whose instance is leaving sees it here)."""

    instance_key: str
    at_s: float
    status: InstanceStatus
    credential: str | None = field(default=None, repr=False)
    """The agent's new credential, when it presented one of the previous agent key."""


@dataclass(frozen=True)
class JobExitReply:
    """The job's status after an exit report; ``counted``: the report was passed to the
    controller (``False``: the job was not running, so the exit was already known)."""

    job: str
    status: JobStatus
    counted: bool


def utc_text(at_s: float) -> str:
    """Unix time ``at_s`` as ISO-8601 UTC to the second (``2025-01-02T03:04:05Z``)."""
    moment = datetime.datetime.fromtimestamp(at_s, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def instance_to_dict(row: InstanceRow) -> dict[str, Any]:
    """An instance row as the API answers it (every column)."""
    out = dataclasses.asdict(row)
    out["market"] = row.market.value
    out["status"] = row.status.value
    return out


def instance_from_dict(data: Mapping[str, Any]) -> InstanceRow:
    """The inverse of :func:`instance_to_dict` (unknown keys are ignored)."""
    values = {f.name: data[f.name] for f in dataclasses.fields(InstanceRow)}
    values["market"] = Market(values["market"])
    values["status"] = InstanceStatus(values["status"])
    return InstanceRow(**values)


# ---- the client ----------------------------------------------------------------------------


class ApiClient:
    """A client of the API for the CLI and the agent: one method per endpoint, answers as
    typed values, :class:`ApiError` for an error answer (its ``status``, ``message`` and
    ``field``) and :class:`ApiUnreachableError` when no answer came. It never follows a
    redirect and ignores proxy settings (the token goes only to ``base_url``:
    :func:`~coadapt_common.http.credential_opener`). Thread-safe."""

    def __init__(self, base_url: str, token: str, *, timeout_s: float = 30.0) -> None:
        """``base_url`` may list several addresses, comma-separated (the controllers of a
        shared store, which all serve the API): a request that gets no answer from one is
        sent to the next, in turn, starting from the last that answered."""
        self._urls = [u.strip().rstrip("/") for u in base_url.split(",") if u.strip()]
        if not self._urls:
            raise ValueError("an API client needs at least one address")
        self._current = 0
        self.base_url = self._urls[0]
        self._token = token
        self.timeout_s = timeout_s
        self._opener = credential_opener()

    def __repr__(self) -> str:
        return f"ApiClient({self.base_url!r})"

    def use_token(self, token: str) -> None:
        """Send ``token`` from the next request on (an agent's renewed credential)."""
        self._token = token

    # ---- users -----------------------------------------------------------------------------

    def submit_job(self, spec: JobSubmission | Mapping[str, Any]) -> JobInfo:
        """Submit a job: a submission is sent in the spec's names and shape
        (:func:`~autoscaler.controller.jobspec.submission_body`), a mapping as it is."""
        from autoscaler.controller.jobspec import submission_body

        is_spec = dataclasses.is_dataclass(spec) and not isinstance(spec, type)
        body = submission_body(spec) if is_spec else dict(spec)  # type: ignore[arg-type]
        return self._parse(JobInfo.from_dict, self._call("POST", "/v1/jobs", body))

    def list_jobs(self, *, page_size: int = MAX_JOBS_PAGE) -> tuple[JobInfo, ...]:
        """Every job, in submission order, read page by page (:meth:`list_jobs_page`)."""
        out: list[JobInfo] = []
        cursor: str | None = None
        while True:
            jobs, cursor = self.list_jobs_page(cursor, limit=page_size)
            out.extend(jobs)
            if cursor is None:
                return tuple(out)

    def list_jobs_page(
        self, cursor: str | None = None, *, limit: int = DEFAULT_JOBS_PAGE
    ) -> tuple[tuple[JobInfo, ...], str | None]:
        """One page of jobs in submission order, from ``cursor`` (``None``: the first page),
        and the cursor of the next page (``None``: this was the last)."""
        query = {"limit": str(limit)}
        if cursor is not None:
            query["cursor"] = cursor
        data = self._call("GET", "/v1/jobs", query=query)
        return self._parse(
            lambda d: (
                tuple(JobInfo.from_dict(j) for j in d["jobs"]),
                None if d.get("next_cursor") is None else str(d["next_cursor"]),
            ),
            data,
        )

    def get_job(self, name: str) -> JobInfo:
        return self._parse(JobInfo.from_dict, self._call("GET", f"/v1/jobs/{_seg(name)}"))

    def job_history(self, name: str) -> dict[str, Any]:
        """What ``coadapt describe`` shows of job ``name`` beyond :meth:`get_job`: its
        placements, batch, events and GPU-time (``GET /v1/jobs/<name>/history``)."""
        data = self._call("GET", f"/v1/jobs/{_seg(name)}/history")
        return self._parse(dict, data)

    def delete_job(self, name: str) -> dict[str, Any]:
        """Delete ended job ``name`` (its name can be used again); the answer says where its
        history went (``DELETE /v1/jobs/<name>``)."""
        return self._parse(dict, self._call("DELETE", f"/v1/jobs/{_seg(name)}"))

    def cancel_job(self, name: str) -> JobInfo:
        data = self._call("POST", f"/v1/jobs/{_seg(name)}/cancel")
        return self._parse(JobInfo.from_dict, data)

    def retry_job(self, name: str) -> JobInfo:
        """Queue a refused or failed job again."""
        data = self._call("POST", f"/v1/jobs/{_seg(name)}/retry")
        return self._parse(JobInfo.from_dict, data)

    def job_logs(self, name: str, offset: int = 0, *, instance: str | None = None) -> LogChunk:
        query: dict[str, str] = {"offset": str(offset)}
        if instance is not None:
            query["instance"] = instance
        data = self._call("GET", f"/v1/jobs/{_seg(name)}/logs", query=query)
        return self._parse(LogChunk.from_dict, data)

    def follow_logs(self, name: str, offset: int = 0) -> Iterator[LogChunk]:
        """Chunks from ``offset`` until none is left now (each answer's ``next_offset`` is
        the next request's ``offset``)."""
        while True:
            chunk = self.job_logs(name, offset)
            yield chunk
            if not chunk.more or chunk.next_offset == offset:
                return
            offset = chunk.next_offset

    def release_fleet(self) -> float:
        """Ask the service to terminate every instance and launch none (``coadapt destroy``);
        returns when the release was recorded (poll :meth:`list_instances` for the end)."""
        return float(self._call("POST", "/v1/fleet/release")["released_at_s"])

    def fleet(self) -> dict[str, Any]:
        """``{"released_at_s", "release_listing", "leader"}``: which controller leads
        (:class:`~autoscaler.controller.leader.LeaderState` as a dict), whether the fleet is
        released and what the cloud listed after the service's last release pass
        (``{"at_s", "instances", "error"}``, ``None`` before the first)."""
        return dict(self._call("GET", "/v1/fleet"))

    def service(self) -> dict[str, Any]:
        """The process serving the API: ``pid``, ``started`` (its kernel start time),
        ``cmdline``."""
        return dict(self._call("GET", "/v1/service"))

    def service_down(self) -> dict[str, Any]:
        """Ask the service to release its fleet and stop (``coadapt down``); its identity."""
        return dict(self._call("POST", "/v1/service/down"))

    def resume_fleet(self) -> None:
        """Undo :meth:`release_fleet`: the service launches again."""
        self._call("POST", "/v1/fleet/resume")

    def list_instances(self) -> tuple[InstanceRow, ...]:
        data = self._call("GET", "/v1/instances")
        return self._parse(lambda d: tuple(instance_from_dict(i) for i in d["instances"]), data)

    # ---- agents ----------------------------------------------------------------------------

    def costs(self) -> dict[str, Any]:
        """Cost so far (``GET /v1/costs``): ``total_usd``, ``usd_per_hour``, ``points``."""
        return dict(self._call("GET", "/v1/costs"))

    def events(self, limit: int = 100) -> list[dict[str, Any]]:
        """The cluster's last ``limit`` events, oldest first (``GET /v1/events``): each
        ``seq``, ``at_s``, ``kind``, ``subject``, ``message``."""
        return list(self._call("GET", f"/v1/events?limit={int(limit)}")["events"])

    def register(
        self,
        instance_key: str,
        *,
        address: str | None = None,
        restart: Mapping[str, Sequence[str]] | None = None,
    ) -> InstanceRow:
        """Register this instance's agent; ``restart``: what a restarted agent found of its
        previous life (``{"adopted": [jobs], "lost": [jobs]}``)."""
        body: dict[str, Any] = {"instance_key": instance_key}
        if address is not None:
            body["address"] = address
        if restart is not None:
            body["restart"] = {k: list(v) for k, v in restart.items()}
        return self._parse(instance_from_dict, self._call("POST", "/v1/agents/register", body))

    def heartbeat(self, instance_key: str, *, address: str | None = None) -> HeartbeatReply:
        body = {} if address is None else {"address": address}
        data = self._call("POST", f"/v1/agents/{_seg(instance_key)}/heartbeat", body)
        return self._parse(
            lambda d: HeartbeatReply(
                str(d["instance_key"]),
                float(d["at_s"]),
                InstanceStatus(d["status"]),
                None if d.get("credential") is None else str(d["credential"]),
            ),
            data,
        )

    def assignments(self, instance_key: str) -> list[dict[str, Any]]:
        """The running jobs assigned to the instance, as JSON objects (``job``, ``gpus``,
        ``nodes``, ``node_rank``, ``addresses``, ``rendezvous``, ``command``,
        ``checkpoint_uri``, ``spec``, ``status``, ``report_token``): what
        ``agent.assignments_from_json`` reads."""
        data = self._call("GET", f"/v1/agents/{_seg(instance_key)}/assignments")
        return self._parse(lambda d: [dict(a) for a in d["assignments"]], data)

    def job_exited(
        self,
        instance_key: str,
        name: str,
        *,
        failed: bool,
        cause: str | None = None,
        deterministic: bool = False,
    ) -> JobExitReply:
        """Tell the controller ``name``'s processes ended on their own on this instance
        (``cause``: why they failed, one line, kept as the job's reason; ``deterministic``: the
        failure cannot succeed when run again, so the job is failed, not retried)."""
        path = f"/v1/agents/{_seg(instance_key)}/jobs/{_seg(name)}/exit"
        body: dict[str, Any] = {"failed": failed}
        if cause is not None:
            body["cause"] = cause
        if deterministic:
            body["deterministic"] = True
        data = self._call("POST", path, body)
        return self._parse(
            lambda d: JobExitReply(str(d["job"]), JobStatus(d["status"]), bool(d["counted"])),
            data,
        )

    # ---- trainers --------------------------------------------------------------------------

    def post_report(self, report: TrainerReport) -> ReportReply:
        status, raw = self._request("POST", report_path(_seg(report.job_id)), report.to_dict())
        try:
            return ReportReply.from_json(raw)
        except ValueError as e:
            raise ApiError(status, f"the controller's reply is not a report reply: {e}") from e

    # ---- plumbing --------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        body: object | None = None,
        *,
        query: Mapping[str, str] | None = None,
    ) -> Any:
        status, raw = self._request(method, path, body, query=query)
        try:
            return json.loads(raw)
        except ValueError as e:
            raise ApiError(status, f"{method} {path}: the answer is not JSON") from e

    def _request(
        self,
        method: str,
        path: str,
        body: object | None = None,
        *,
        query: Mapping[str, str] | None = None,
    ) -> tuple[int, bytes]:
        first = self._current
        unreachable: ApiUnreachableError | None = None
        for i in range(len(self._urls)):
            at = (first + i) % len(self._urls)
            try:
                answer = self._request_one(self._urls[at], method, path, body, query)
            except ApiUnreachableError as e:
                unreachable = e
                continue
            self._current = at
            self.base_url = self._urls[at]
            return answer
        assert unreachable is not None
        raise unreachable

    def _request_one(
        self,
        base_url: str,
        method: str,
        path: str,
        body: object | None,
        query: Mapping[str, str] | None,
    ) -> tuple[int, bytes]:
        url = base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body, allow_nan=False).encode()
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with self._opener.open(request, timeout=self.timeout_s) as answer:
                return int(answer.status), answer.read()
        except urllib.error.HTTPError as e:
            with e:
                raw = e.read()
            raise _answer_error(e.code, raw) from e
        except (urllib.error.URLError, OSError, HttpClientError) as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            raise ApiUnreachableError(f"{method} {url}: no answer ({reason})") from e

    @staticmethod
    def _parse(read: Callable[[Any], _T], data: Any) -> _T:
        try:
            return read(data)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ApiError(200, f"the answer is not what was expected: {e!r}") from e


def _seg(value: str) -> str:
    """``value`` quoted as one URL path segment."""
    return urllib.parse.quote(value, safe="")


def _answer_error(status: int, raw: bytes) -> ApiError:
    try:
        data = json.loads(raw)
        message, field_ = str(data["error"]), data.get("field")
        return ApiError(status, message, None if field_ is None else str(field_))
    except (ValueError, KeyError, TypeError):
        text = raw.decode("utf-8", "replace").strip()[:200]
        return ApiError(status, text or f"HTTP {status}")
