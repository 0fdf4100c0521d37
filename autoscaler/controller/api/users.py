"""The users' endpoints (the CLI, the dashboard): jobs, instances, the fleet, costs, the service.

What each answers is in :mod:`autoscaler.controller.api`'s table. A job's fields are checked by
the one function ``coadapt submit`` runs on a YAML spec (:meth:`JobSubmission.from_mapping`),
and a body has the spec's names and shape
(:func:`~autoscaler.controller.jobspec.submission_from_body`; the old flat names are answered
with a ``Deprecation`` header);
a cancel or a retry is written against the version read, read again if it changed meanwhile
(five tries, then 409).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from werkzeug.wrappers import Request, Response

from autoscaler.controller.api.answers import job_history, job_info, job_json, job_parts, one_job
from autoscaler.controller.api.logs import read_job_logs
from autoscaler.controller.api.state import ApiState, Route
from autoscaler.controller.api.wire import int_arg, json_response, no_constant
from autoscaler.controller.client import (
    DEFAULT_JOBS_PAGE,
    MAX_JOBS_PAGE,
    ApiError,
    instance_to_dict,
)
from autoscaler.controller.credentials import Role
from autoscaler.controller.errors import StaleVersionError
from autoscaler.controller.jobbook import (
    JOB_NAME_PATTERN,
    JobSubmission,
    admit,
)
from autoscaler.controller.jobspec import REFERENCE_PATH, submission_from_body
from autoscaler.controller.leader import leader_state
from autoscaler.controller.spend import fleet_cost
from autoscaler.controller.store import JobStatus
from autoscaler.errors import InvalidInputError

__all__ = ["ROUTES"]

_log = logging.getLogger(__name__)
_ENDED: Final = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})
_CHANGE_TRIES: Final = 5


def _submit_job(state: ApiState, request: Request) -> Response:
    spec, deprecated = _submission(state.body(request))
    store = state.store()
    after, at, estimate = admit(spec, state.clock.now_s(), store)
    row = store.add_job(spec.name, spec.to_json(), deadline_after_s=after, deadline_at_s=at)
    _log.info("job %s submitted%s", spec.name, "" if estimate is None else f": {estimate.text()}")
    headers = {"Location": f"/v1/jobs/{urllib.parse.quote(row.name)}"}
    if deprecated:
        # RFC 9745's header; the link says what replaces the flat names.
        headers["Deprecation"] = "true"
        headers["Link"] = f'<{REFERENCE_PATH}>; rel="deprecation"'
        _log.warning(
            "job %s was submitted with deprecated flat field names (%s): see %s",
            spec.name,
            ", ".join(deprecated),
            REFERENCE_PATH,
        )
    # A job just added holds nothing yet: no assignment, report, batch or restart to read.
    return json_response(job_info(row, {}, None, None, 0).to_dict(), 201, headers)


def _list_jobs(state: ApiState, request: Request) -> Response:
    limit = int_arg(request, "limit", DEFAULT_JOBS_PAGE, maximum=MAX_JOBS_PAGE)
    if limit < 1:
        raise ApiError(400, f"limit must be 1 to {MAX_JOBS_PAGE}", "limit")
    after = _cursor_arg(request)
    rows = state.store().list_jobs_page(after, limit, deleted=False)
    jobs = ", ".join(job_json(*parts) for parts in job_parts(state.store(), rows))
    last = rows[-1] if len(rows) == limit else None
    cursor = None if last is None else _cursor(last.submitted_at_s, last.name)
    # What json_response writes for {"jobs": [...], "next_cursor": ...}, the jobs' JSON reused.
    body = f'{{"jobs": [{jobs}], "next_cursor": {json.dumps(cursor)}}}\n'
    response = Response(body, 200, mimetype="application/json")
    response.headers["Cache-Control"] = "no-store"
    return response


def _get_job(state: ApiState, request: Request, name: str) -> Response:
    store = state.store()
    return json_response(one_job(store, store.get_job(name)))


def _cancel_job(state: ApiState, request: Request, name: str) -> Response:
    store = state.store()
    for _ in range(_CHANGE_TRIES):
        row = store.get_job(name)
        if row.status in _ENDED:
            raise ApiError(409, f"job {name!r} already ended ({row.status.value})")
        try:
            row = store.update_job(name, row.version, status=JobStatus.CANCELLED)
        except StaleVersionError:
            continue  # changed since read: read again and decide again
        _log.info("job %s cancelled", name)
        return json_response(one_job(store, row))
    raise ApiError(409, f"job {name!r} kept changing while being cancelled: try again")


def _job_history(state: ApiState, request: Request, name: str) -> Response:
    return json_response(job_history(state.store(), name, state.clock.now_s()))


def _delete_job(state: ApiState, request: Request, name: str) -> Response:
    """An ended job is deleted (:meth:`~autoscaler.controller.store.Store.delete_job`): its
    name can be submitted again; its history (assignments, reports, events, its share of the
    bill) is kept under ``<name>~<n>``, and so are its logs (``<logs_dir>/<name>~<n>``) and,
    on a cluster whose checkpoints are on this machine (``checkpoints_dir``), its checkpoints
    (``<checkpoints_dir>/<name>~<n>``): a job submitted again under the name starts afresh. A
    job with its own ``checkpoint_uri``, or a cluster checkpointing to a bucket, keeps its
    checkpoints where they are (the answer's ``checkpoints`` is ``null``: a job submitted
    again there resumes from them). 409 for a job that has not ended."""
    store = state.store()
    try:
        kept = store.delete_job(name)
    except InvalidInputError as e:
        raise ApiError(409, str(e)) from e
    logs_kept = _move_aside(state.logs_dir, name, kept, "logs")
    checkpoints_kept = _move_aside(state.checkpoints_dir, name, kept, "checkpoints")
    _log.info("job %s deleted (its history kept as %s)", name, kept)
    return json_response(
        {"name": name, "kept_as": kept, "logs": logs_kept, "checkpoints": checkpoints_kept}
    )


def _move_aside(root: Path | None, name: str, kept: str, what: str) -> str | None:
    """``root/name`` renamed ``root/kept`` (a deleted job's folder); where it is now, or
    ``None`` when there is none."""
    if root is None or not JOB_NAME_PATTERN.fullmatch(name):
        return None
    folder = root / name
    if not folder.is_dir():
        return None
    try:
        folder.rename(root / kept)
    except OSError as e:  # the row moved: say where the folder stayed
        _log.warning("job %s deleted, its %s left in %s: %s", name, what, folder, e)
        return str(folder)
    return str(root / kept)


def _retry_job(state: ApiState, request: Request, name: str) -> Response:
    """A refused or failed job is queued again (its failure count starts over): what a
    user does once the cause is fixed (a larger fleet, a repaired script)."""
    store = state.store()
    for _ in range(_CHANGE_TRIES):
        row = store.get_job(name)
        if row.status not in (JobStatus.REFUSED, JobStatus.FAILED):
            raise ApiError(
                409,
                f"job {name!r} is {row.status.value}: only a refused or failed job can be retried",
            )
        try:
            row = store.update_job(
                name, row.version, status=JobStatus.QUEUED, retries=0, reason=None
            )
        except StaleVersionError:
            continue
        _log.info("job %s queued again", name)
        return json_response(one_job(store, row))
    raise ApiError(409, f"job {name!r} kept changing while being retried: try again")


def _job_logs(state: ApiState, request: Request, name: str) -> Response:
    store = state.store()
    store.get_job(name)
    offset = int_arg(request, "offset", 0)
    instance = request.args.get("instance")
    if not JOB_NAME_PATTERN.fullmatch(name):
        raise ApiError(400, f"job {name!r} has no log folder (not a safe folder name)")
    return json_response(read_job_logs(state.logs_dir, name, offset, instance=instance).to_dict())


def _list_instances(state: ApiState, request: Request) -> Response:
    rows = state.store().list_instances()
    return json_response({"instances": [instance_to_dict(r) for r in rows]})


def _fleet(state: ApiState, request: Request) -> Response:
    """The fleet's release, and which controller leads (``leader``: :func:`~autoscaler.
    controller.leader.leader_state`, ``leading`` whether the one answering does)."""
    store = state.store()
    me = None if state.service is None else state.service.identity.get("holder")
    return json_response(
        {
            "released_at_s": store.released_at_s(),
            "release_listing": store.release_listing(),
            "leader": leader_state(store, me).to_dict(),
        }
    )


def _release_fleet(state: ApiState, request: Request) -> Response:
    store = state.store()
    store.set_released(True)
    return json_response({"released_at_s": store.released_at_s()}, 202)


def _resume_fleet(state: ApiState, request: Request) -> Response:
    store = state.store()
    store.set_released(False)
    return json_response({"released_at_s": None})


def _costs(state: ApiState, request: Request) -> Response:
    """Cost so far (:func:`~autoscaler.controller.spend.fleet_cost`: the closed cost records,
    plus what running instances have accrued at their price since they started); ``points``
    the cumulative cost over time (from the first instance's start, growing with the
    instances running), its last point ``total_usd`` at now."""
    cost = fleet_cost(state.store(), state.clock.now_s())
    points = [[t, usd] for t, usd in cost.points]
    return json_response(
        {"total_usd": cost.total_usd, "usd_per_hour": cost.usd_per_hour, "points": points}
    )


MAX_EVENTS_ANSWERED: Final = 500
"""The most events one ``GET /v1/events`` answers (``?limit=``, default 100)."""


def _events(state: ApiState, request: Request) -> Response:
    """The end of the cluster's story: its last ``limit`` events (default 100, at most
    :data:`MAX_EVENTS_ANSWERED`), oldest first, each ``{seq, at_s, kind, subject, message}``
    (what ``coadapt events`` prints)."""
    limit = int_arg(request, "limit", 100, maximum=MAX_EVENTS_ANSWERED)
    if limit < 1:
        raise ApiError(400, "limit must be at least 1", "limit")
    rows = state.store().latest_events(limit)
    events = [
        {"seq": e.seq, "at_s": e.at_s, "kind": e.kind, "subject": e.subject, "message": e.message}
        for e in rows
    ]
    return json_response({"events": events})


def _service(state: ApiState, request: Request) -> Response:
    """The process serving this API (what ``coadapt down`` checks against ``up.json``)."""
    control = state.service
    if control is None:
        raise ApiError(404, "this API runs in no service that can be stopped")
    return json_response(dict(control.identity))


def _service_down(state: ApiState, request: Request) -> Response:
    """``coadapt down``: the service releases the fleet and stops."""
    control = state.service
    if control is None:
        raise ApiError(404, "this API runs in no service that can be stopped")
    control.request_down()
    _log.info("down requested: releasing the fleet and stopping")
    return json_response(dict(control.identity), 202)


def _submission(data: Mapping[str, Any]) -> tuple[JobSubmission, tuple[str, ...]]:
    """A submission from a JSON object in the spec's names and shape, or the old flat form
    (whose names come back, deprecated): :func:`~autoscaler.controller.jobspec.
    submission_from_body`, which ends in the one check of a job's fields that ``coadapt
    submit`` runs too (ranges in ``docs/jobspec.md``)."""
    return submission_from_body(data)


def _cursor(at_s: float, name: str) -> str:
    """The opaque cursor after the job keyed ``(at_s, name)`` (URL-safe base64 of JSON)."""
    raw = json.dumps([at_s, name], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _cursor_arg(request: Request) -> tuple[float, str] | None:
    """The ``cursor`` query argument (a ``next_cursor`` of an earlier page) decoded; 400 for
    anything that is not one."""
    text = request.args.get("cursor")
    if text is None or text == "":
        return None
    try:
        if len(text) > 512:
            raise ValueError("too long")
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        at_s, name = json.loads(raw, parse_constant=no_constant)
        if isinstance(at_s, bool) or not isinstance(at_s, int | float) or not isinstance(name, str):
            raise ValueError("not a job key")
        return float(at_s), name
    except (ValueError, TypeError, binascii.Error) as e:
        raise ApiError(400, "cursor is not one this server gave (use next_cursor)", "cursor") from e


ROUTES: Final[tuple[Route, ...]] = (
    ("POST", "/v1/jobs", Role.USER, _submit_job),
    ("GET", "/v1/jobs", Role.USER, _list_jobs),
    ("GET", "/v1/jobs/<name>", Role.USER, _get_job),
    ("POST", "/v1/jobs/<name>/cancel", Role.USER, _cancel_job),
    ("POST", "/v1/jobs/<name>/retry", Role.USER, _retry_job),
    ("GET", "/v1/jobs/<name>/history", Role.USER, _job_history),
    ("DELETE", "/v1/jobs/<name>", Role.USER, _delete_job),
    ("GET", "/v1/jobs/<name>/logs", Role.USER, _job_logs),
    ("GET", "/v1/instances", Role.USER, _list_instances),
    ("GET", "/v1/fleet", Role.USER, _fleet),
    ("POST", "/v1/fleet/release", Role.USER, _release_fleet),
    ("POST", "/v1/fleet/resume", Role.USER, _resume_fleet),
    ("GET", "/v1/costs", Role.USER, _costs),
    ("GET", "/v1/events", Role.USER, _events),
    ("GET", "/v1/service", Role.USER, _service),
    ("POST", "/v1/service/down", Role.USER, _service_down),
)
"""The users' routes, in the order they are matched."""
