"""The trainers' endpoint: a job's report, answered with what the trainer does next.

A reply says ``stop`` when the job is not ``running`` (cancelled, ended, or not placed), and
carries the round's planned ``batch`` when it was planned for the GPUs the trainer runs on and
differs from the batch it reports (the trainer adopts it from its next agreed optimizer step,
without a relaunch, its learning rate scaled by its rule); ``null``: keep. A batch planned for
another GPU count comes with the assignment instead (the relaunch that count needs).
"""

from __future__ import annotations

import json
from typing import Final

from werkzeug.wrappers import Request, Response

from autoscaler.controller.api.state import ApiState, Route
from autoscaler.controller.api.wire import json_response
from autoscaler.controller.client import ApiError
from autoscaler.controller.credentials import Role
from autoscaler.controller.store import JobBatch, JobStatus
from trainer.report import REPORT_PATH_TEMPLATE, BatchConfig, ReportReply, TrainerReport

__all__ = ["ROUTES"]


def _add_report(state: ApiState, request: Request, job_id: str) -> Response:
    body = state.body(request)
    try:
        report = TrainerReport.from_dict(body)
    except (ValueError, TypeError, AttributeError, KeyError, ArithmeticError) as e:
        # ReportSchemaError is a ValueError; a value of the wrong JSON type inside the
        # report (a number where an object belongs, an integer too large for a float)
        # can raise the others
        raise ApiError(400, f"not a trainer report: {e}") from e
    if report.job_id != job_id:
        raise ApiError(
            400, f"the report is for job {report.job_id!r}, posted to {job_id!r}", "job_id"
        )
    store = state.store()
    store.add_report(job_id, report.to_json())
    job = store.get_job(job_id)
    running = job.status is JobStatus.RUNNING
    reply = ReportReply(
        batch=_new_batch(store.get_batch(job_id), report) if running else None,
        stop=not running,
    )
    return json_response(json.loads(reply.to_json()))


def _new_batch(planned: JobBatch | None, report: TrainerReport) -> BatchConfig | None:
    """The batch a report's reply carries: the planned one, when it was planned for the GPUs
    the trainer runs on (a plan for another count comes with the relaunch that count needs)
    and differs from the batch in force; the trainer has nothing left to do once done."""
    if planned is None or report.done or planned.gpus != report.world_size:
        return None
    want = BatchConfig(planned.global_batch_size, planned.accum_steps)
    return None if want == report.batch else want


ROUTES: Final[tuple[Route, ...]] = (
    ("POST", REPORT_PATH_TEMPLATE.replace("{job_id}", "<job_id>"), Role.REPORT, _add_report),
)
"""The trainers' route."""
