"""The controller's HTTP API: JSON in and out, versioned paths under ``/v1``, bearer credentials.

Four roles, each with its own credential (:mod:`autoscaler.controller.credentials`): users
(the CLI, the dashboard) hold the users' token; each instance's agent holds a credential good
for that instance only; the trainers of a job hold one good for that job's reports only; a
metrics scraper holds the scrape token, good for ``GET /metrics`` only. A
request must carry ``Authorization: Bearer <credential>``; a request without one, or with one
that is not valid, gets 401; a valid one of another role, or of the right role for another
instance or job, gets 403. Either way nothing is read beyond the headers and nothing changes.
An agent credential is revoked (401) once its instance ended or failed to start
(``terminated``, ``allocation_failed``): an instance key is never reused, so it stays so.

============================================  ======  =============================================
endpoint                                      role    answer
============================================  ======  =============================================
``POST /v1/jobs``                             user    201, the job (body: a ``JobSubmission``);
                                                      409 if the name is taken
``GET  /v1/jobs?limit=N&cursor=C``            user    ``{"jobs": [job, ...], "next_cursor"}``: a
                                                      page (N <= 500, default 100) in submission
                                                      order; ``next_cursor`` (``null`` at the
                                                      end) is the next page's ``cursor``
``GET  /v1/jobs/{name}``                      user    the job
``POST /v1/jobs/{name}/cancel``               user    the job, ``cancelled``; 409 if it had ended
``POST /v1/jobs/{name}/retry``                user    the job, ``queued`` again (a refused or
                                                      failed one; its failures start over); 409
                                                      for any other
``GET  /v1/jobs/{name}/history``              user    its placements, events and GPU-seconds
                                                      (:func:`job_history`: coadapt describe)
``DELETE /v1/jobs/{name}``                    user    ``{"name", "kept_as", "logs"}``: an ended
                                                      job deleted, its name free again, its
                                                      history kept as ``<name>~<n>``; 409 for a
                                                      job that has not ended
``GET  /v1/jobs/{name}/logs?offset=N``        user    :class:`LogChunk` (``&instance=KEY``: one
                                                      file)
``GET  /v1/instances``                        user    ``{"instances": [row, ...]}``, by key
``GET  /v1/service``                          user    ``{"pid", "started", "cmdline"}``: the
                                                      process serving (``coadapt up``)
``POST /v1/service/down``                     user    202, the same: it releases every instance
                                                      and stops (``coadapt down``)
``GET  /v1/fleet``                            user    ``{"released_at_s", "release_listing",
                                                      "leader"}``: ``leader`` says which
                                                      controller leads (``holder``, ``epoch``,
                                                      ``since_s``, ``leading``: the one answering)
``POST /v1/fleet/release``                    user    202 ``{"released_at_s"}``: the service
                                                      terminates every instance, launches none
``POST /v1/fleet/resume``                     user    ``{"released_at_s": null}``: launches again
``GET  /v1/costs``                            user    ``{"total_usd", "usd_per_hour", "points"}``
``POST /v1/agents/register``                  agent   the instance row (body ``{"instance_key"}``,
                                                      the credential's own, and from an agent
                                                      that restarted ``"restart": {"adopted":
                                                      [jobs], "lost": [jobs]}``: an
                                                      ``agent-restart`` event, and each lost
                                                      job assigned there counts a restart);
                                                      409 unless it is ``running``
``POST /v1/agents/{key}/heartbeat``           agent   ``{"instance_key", "at_s", "status"}``, and
                                              of key  ``"credential"`` when the one presented was
                                                      made with the previous agent key (renew)
``GET  /v1/agents/{key}/assignments``         agent   ``{"instance_key", "instance_status",
                                              of key  "assignments": [...]}``; each assignment
                                                      carries its job's ``report_token`` and the
                                                      planned ``batch`` to launch with
``POST /v1/agents/{key}/jobs/{name}/exit``    agent   ``{"job", "status", "counted"}`` (body
                                              of key  ``{"failed": bool, "cause": str}``; the
                                                      cause of a failure becomes the job's
                                                      ``reason``)
``POST /v1/jobs/{job_id}/reports``            report  a :class:`~trainer.report.ReportReply`
                                              of job
``GET  /metrics``                             user,   the Prometheus text format
                                              scrape  (:mod:`autoscaler.controller.metrics`)
============================================  ======  =============================================

A job, as answered (:class:`JobInfo`): ``name``, ``status`` (``queued``, ``running``,
``completed``, ``failed``, ``cancelled`` or ``refused``), ``reason`` (why it was refused or
last failed, one line; ``null`` otherwise), ``retries`` (failures), ``restarts`` (placements
after its first start), ``submitted_at_s``, ``updated_at_s``, ``version``, ``spec`` (the
submission), ``assignment`` (``{instance_key: gpus}``), ``gpus``, the planned
``batch_size`` / ``local_batch_size`` / ``accumulation_steps`` (``null`` while it holds no
GPUs), ``progress`` / ``target_progress`` / ``remaining_progress`` (initial-batch-size
iterations; ``target_progress`` is the length its script declared, ``null`` when it declared
none), ``eta_s`` / ``eta_at_s`` / ``eta_utc`` (a running job's ETA by its fitted model, as
the controller's last round recorded it and when; ``null`` when unknown), ``report`` (its
latest trainer report in short: ``at_s``, ``progress``, ``step``,
``epoch``, ``attempt``, ``started_at_s``, ``world_size``, the batch the trainer runs,
``lr_scale``, ``done``; ``null`` before the first) and ``batch`` (the planned batch with the
GPUs it was planned for).

Errors are JSON too: ``{"error": "<message>", "field": "<name>" | null}`` with 400 (bad input:
``field`` names it; malformed JSON), 401/403 (authentication), 404 (unknown job, instance or
path), 405, 409 (a conflict: a duplicate name, a job that already ended, a row that changed),
413 (a body over ``max_body_bytes``, refused from its ``Content-Length`` before it is read, or
once the limit is passed for a body without one), 429 with ``Retry-After`` (one job's
trainers or one instance's agent called more often than its limit allows, checked after
authentication and before the body is read: :mod:`autoscaler.controller.ratelimit`), 503
(the store is unusable) or 500.

Decisions made here, and why:

* **A job's fields** are checked by one function, the one ``coadapt submit`` runs on a YAML
  spec (:func:`~autoscaler.controller.jobbook.submission_problems`; ranges in
  :data:`~autoscaler.controller.jobbook.BOUNDS_DOC`): the API and the CLI refuse the same jobs,
  and a refusal names the field. A ``deadline`` is fixed as a time at submission
  (:func:`~autoscaler.controller.jobbook.submission_deadline`, through
  :func:`~autoscaler.controller.jobbook.admit`): one in the past, or sooner than any job
  could be done (an instance's provisioning and a start, estimated), or sooner than the
  spec's declared ``length`` takes at the application's measured speed, is refused with that
  estimate (said unknown where the cluster has not measured the application); one that
  later becomes certain to be missed is said in the job's ``reason`` (and a ``deadline``
  event). A name is a DNS label (a URL path segment, a
  folder under the logs directory and a rendezvous id: ``..`` can never name a folder); a
  submission must name a ``command`` whose first word is the training script (never an
  option the launcher would read); every number is bounded.
* **Assignments** list only ``running`` jobs: a cancelled or ended job disappears at once (its
  agent stops it), and a job queued for a retry is started again only when the next round
  places it. ``nodes`` is every instance of the job with its GPUs, in rank order (by instance
  key), this one included; ``rendezvous`` is ``HOST:PORT`` on the first node, ``HOST`` being
  the address its agent gave with ``register`` or ``heartbeat`` (kept in memory, so each
  heartbeat restates it; the store has no column for it yet), ``null`` until it is known.
* **A job exit is counted once per run**: the exit of a job that is not ``running`` (another
  node of the same run already reported it, or it ended) is answered with its status and
  ``"counted": false``, without calling ``on_job_exit``; an exit from an instance the running
  job is not assigned to is a 409 (processes the controller stopped are never reported).
  ``on_job_exit`` is called from the server's request threads, one call at a time, and
  must have changed the job's status when it returns (the next report of the same run is
  told apart by that status).
* **Report replies** say ``stop`` when the job is not ``running`` (cancelled, ended, or not
  placed), and carry the round's planned ``batch`` when it was planned for the GPUs the
  trainer runs on and differs from the batch it reports (the trainer adopts it from its
  next agreed optimizer step, mid-epoch, without a relaunch, its learning rate scaled by its rule);
  ``null``: keep. A batch planned for another GPU count comes with the assignment instead
  (``batch``: ``--batch-size`` and ``--accum-steps`` of the relaunch that count needs).
* **Logs** are ``<logs_dir>/<job>/<instance_key>.log``, read as one byte stream in instance-key
  order, at most :data:`MAX_LOG_CHUNK_BYTES` per answer (``more`` says there is more). An
  incomplete UTF-8 character at the end is left for the next read. Offsets into the
  concatenation are stable while only the last file grows; to follow a job on several
  instances, read each with ``instance=KEY`` (``instances`` lists them with their sizes).
  A log is capped by its writer (:mod:`coadapt_common.logcap`): what it rotated out and
  dropped still counts in the offsets and reads as one line that says how much is gone.

The package, by concern: :mod:`~autoscaler.controller.api.users`,
:mod:`~autoscaler.controller.api.agents` and :mod:`~autoscaler.controller.api.reports` hold the
endpoints of each role; :mod:`~autoscaler.controller.api.auth` who may call and how often
(credentials are compared in constant time and never logged; they are read through a
:class:`~autoscaler.controller.credentials.CredentialSource`: a running controller's is its
tokens file, read again when a rotation changed it); :mod:`~autoscaler.controller.api.metrics`
the scraper's endpoint; :mod:`~autoscaler.controller.api.wire`
JSON in and out; :mod:`~autoscaler.controller.api.answers` a job as answered;
:mod:`~autoscaler.controller.api.logs` the job logs; :mod:`~autoscaler.controller.api.state`
what the handlers share (a store per thread); :mod:`~autoscaler.controller.api.app` the WSGI
app, whose logger (under ``autoscaler.controller.api``) gets the request log (the request
line and the status) at DEBUG; :mod:`~autoscaler.controller.api.server` the Waitress server.
Import from this package face; the client (:mod:`autoscaler.controller.client`) stays apart,
so that an agent imports neither the server nor the store.
"""

from __future__ import annotations

from autoscaler.controller.api.agents import rendezvous_endpoint
from autoscaler.controller.api.answers import job_history, jobs_in_store
from autoscaler.controller.api.app import ApiApp, make_app
from autoscaler.controller.api.logs import MAX_LOG_CHUNK_BYTES, printable, read_job_logs
from autoscaler.controller.api.server import ApiServer, ServerLimits, serve
from autoscaler.controller.api.state import JobExitHandler, ServiceControl
from autoscaler.controller.api.wire import DEFAULT_MAX_BODY_BYTES, MAX_QUERY_INT
from autoscaler.controller.client import (
    DEFAULT_JOBS_PAGE,
    MAX_JOBS_PAGE,
    ApiClient,
    ApiError,
    ApiUnreachableError,
    HeartbeatReply,
    JobExitReply,
    JobInfo,
    LogChunk,
    PlannedBatch,
    ProgressInfo,
    instance_from_dict,
    instance_to_dict,
)
from autoscaler.controller.credentials import (
    ApiCredentials,
    InsecureTokenFileError,
    Role,
    TokenFileError,
    generate_tokens,
    load_token,
    load_tokens,
)
from autoscaler.controller.jobbook import JOB_NAME_PATTERN

__all__ = [
    "DEFAULT_JOBS_PAGE",
    "DEFAULT_MAX_BODY_BYTES",
    "JOB_NAME_PATTERN",
    "MAX_JOBS_PAGE",
    "MAX_LOG_CHUNK_BYTES",
    "MAX_QUERY_INT",
    "ApiApp",
    "ApiClient",
    "ApiCredentials",
    "ApiError",
    "ApiServer",
    "ApiTokens",
    "ApiUnreachableError",
    "HeartbeatReply",
    "InsecureTokenFileError",
    "JobExitHandler",
    "JobExitReply",
    "JobInfo",
    "LogChunk",
    "PlannedBatch",
    "ProgressInfo",
    "Role",
    "ServerLimits",
    "ServiceControl",
    "TokenFileError",
    "generate_tokens",
    "instance_from_dict",
    "instance_to_dict",
    "job_history",
    "jobs_in_store",
    "load_token",
    "load_tokens",
    "make_app",
    "printable",
    "read_job_logs",
    "rendezvous_endpoint",
    "serve",
]

ApiTokens = ApiCredentials  # the name before per-instance and per-job credentials
