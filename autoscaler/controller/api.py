"""The controller's HTTP API: JSON in and out, versioned paths under ``/v1``, bearer credentials.

Three roles, each with its own credential (:mod:`autoscaler.controller.credentials`): users
(the CLI, the dashboard) hold the users' token; each instance's agent holds a credential good
for that instance only; the trainers of a job hold one good for that job's reports only. A
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
``GET  /v1/jobs/{name}/logs?offset=N``        user    :class:`LogChunk` (``&instance=KEY``: one
                                                      file)
``GET  /v1/instances``                        user    ``{"instances": [row, ...]}``, by key
``GET  /v1/service``                          user    ``{"pid", "started", "cmdline"}``: the
                                                      process serving (``coadapt up``)
``POST /v1/service/down``                     user    202, the same: it releases every instance
                                                      and stops (``coadapt down``)
``GET  /v1/fleet``                            user    ``{"released_at_s", "release_listing"}``
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
============================================  ======  =============================================

A job, as answered (:class:`JobInfo`): ``name``, ``status`` (``queued``, ``running``,
``completed``, ``failed``, ``cancelled`` or ``refused``), ``reason`` (why it was refused or
last failed, one line; ``null`` otherwise), ``retries`` (failures), ``restarts`` (placements
after its first start), ``submitted_at_s``, ``updated_at_s``, ``version``, ``spec`` (the
submission), ``assignment`` (``{instance_key: gpus}``), ``gpus``, the planned
``batch_size`` / ``local_batch_size`` / ``accumulation_steps`` (``null`` while it holds no
GPUs), ``progress`` / ``target_progress`` / ``remaining_progress`` (initial-batch-size
iterations; ``target_progress`` is the length its script declared, ``null`` when it declared
none), ``report`` (its latest trainer report in short: ``at_s``, ``progress``, ``step``,
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
  (:func:`~autoscaler.controller.jobbook.submission_deadline`): one in the past, or sooner than
  any job could be done (an instance's provisioning and a start, estimated), is refused
  with that estimate; one that later becomes certain to be missed is said in the job's
  ``reason`` (and a ``deadline`` event). A name is a DNS label (a URL path segment, a
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
  trainer runs on and differs from the batch it reports (the trainer adopts it at its next
  epoch boundary, without a relaunch, its learning rate scaled by its rule); ``null``: keep.
  A batch planned for another GPU count comes with the assignment instead (``batch``:
  ``--batch-size`` and ``--accum-steps`` of the relaunch that count needs).
* **Logs** are ``<logs_dir>/<job>/<instance_key>.log``, read as one byte stream in instance-key
  order, at most :data:`MAX_LOG_CHUNK_BYTES` per answer (``more`` says there is more). An
  incomplete UTF-8 character at the end is left for the next read. Offsets into the
  concatenation are stable while only the last file grows; to follow a job on several
  instances, read each with ``instance=KEY`` (``instances`` lists them with their sizes).
  A log is capped by its writer (:mod:`coadapt_common.logcap`): what it rotated out and
  dropped still counts in the offsets and reads as one line that says how much is gone.

The app opens its own :class:`~autoscaler.controller.store.Store` per thread on the store
file (a store is bound to the thread that made it); the file is checked once, when the app is
made (:meth:`Store.open`), and each thread's store comes from :meth:`Store.for_thread`.
:func:`serve` runs it on Waitress: one event loop reads every connection, and only complete
requests reach a bounded pool of worker threads, each with its own store (closed when the
server shuts down); idle and slow connections time out (:class:`ServerLimits`).
Credentials are compared in constant time and never logged; the request log (the request line
and the status) goes to this module's logger at DEBUG. The credentials are read through a
:class:`~autoscaler.controller.credentials.CredentialSource`: a running controller's is its
tokens file, read again when a rotation changed it.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import re
import resource
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, NoReturn, Protocol, TypeVar

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask, ThreadedTaskDispatcher
from waitress.wasyncore import close_all
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from autoscaler.accounting.dashboard import PAGE
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
    CredentialSource,
    InsecureTokenFileError,
    Principal,
    Role,
    TokenFileError,
    generate_tokens,
    load_token,
    load_tokens,
)
from autoscaler.controller.errors import (
    DuplicateRowError,
    StaleVersionError,
    StoreError,
    UnknownRowError,
)
from autoscaler.controller.events import EventKind
from autoscaler.controller.jobbook import JOB_NAME_PATTERN, JobSubmission, submission_deadline
from autoscaler.controller.lifecycle import AGENT_REVOKED, InstanceStatus
from autoscaler.controller.ratelimit import (
    DEFAULT_REQUEST_LIMITS,
    RateLimiter,
    RequestLimits,
    retry_after_s,
)
from autoscaler.controller.store import (
    JobBatch,
    JobRow,
    JobStatus,
    ReportRow,
    Store,
)
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import Clock
from coadapt_common.logcap import LogSegments, dropped_note
from coadapt_common.logcap import segments as log_segments
from trainer.report import (
    REPORT_PATH_TEMPLATE,
    BatchConfig,
    ReportReply,
    TrainerReport,
)

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
    "jobs_in_store",
    "load_token",
    "load_tokens",
    "make_app",
    "printable",
    "read_job_logs",
    "rendezvous_endpoint",
    "serve",
]

DEFAULT_MAX_BODY_BYTES: Final = 1 << 20
"""Bodies larger than this (1 MiB) are refused with 413."""
MAX_LOG_CHUNK_BYTES: Final = 1 << 20
"""The most log bytes one answer carries."""
MAX_QUERY_INT: Final = (1 << 63) - 1
"""The largest count a query argument may carry (a log offset: no file is larger)."""
RENDEZVOUS_PORT_BASE: Final = 29500
RENDEZVOUS_PORT_SPAN: Final = 1000

MAX_RESTART_JOBS: Final = 256
"""The most jobs a restarted agent may name as adopted or lost (its own bound,
``agent.MAX_ADOPTED``, is the same)."""
_log = logging.getLogger(__name__)
_BODY_SLACK_BYTES: Final = 64 * 1024
_ENDED: Final = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})
_NOUNS: Final = {"jobs": "job", "instances": "instance"}
_CANCEL_TRIES: Final = 5
_PRINCIPAL: Final = "coadapt.principal"  # the WSGI environ key of the authenticated caller
_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}")
_T = TypeVar("_T")


ApiTokens = ApiCredentials  # the name before per-instance and per-job credentials


# ---- the answers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceControl:
    """The service an API runs in, for ``coadapt down``: ``identity`` (``pid``, ``started``:
    the kernel's start time of that pid, ``cmdline``) and ``request_down``, called when a
    user asks it to release its fleet and stop."""

    identity: Mapping[str, Any]
    request_down: Callable[[], None]


class JobExitHandler(Protocol):
    """What the app calls when an agent reports that a running job's processes ended on
    their own (``Controller.job_exited``): returns the job's new status."""

    def __call__(self, name: str, *, failed: bool) -> JobStatus: ...


def rendezvous_endpoint(job: str, host: str, node: str = "") -> str:
    """``HOST:PORT`` of ``job``'s c10d rendezvous on ``host``, the address of its first node
    ``node`` (an instance key): the port is stable per job and node (``RENDEZVOUS_PORT_BASE``
    plus a hash of both modulo ``RENDEZVOUS_PORT_SPAN``), so jobs whose first node is the
    same instance get different ports unless their names collide, and two clusters on one
    machine (the local provider's instances share its address) do not meet on a job name
    they both use: their instance keys differ."""
    digest = hashlib.sha256(f"{job}\0{node}".encode()).digest()
    port = RENDEZVOUS_PORT_BASE + int.from_bytes(digest[:4], "big") % RENDEZVOUS_PORT_SPAN
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---- the app -------------------------------------------------------------------------------

_Handler = Callable[..., Response]


class ApiApp:
    """The WSGI app (see the module docstring); build it with :func:`make_app`. Thread-safe:
    each thread uses its own store. :meth:`close` when done."""

    def __init__(
        self,
        store: Store,
        credentials: CredentialSource,
        clock: Clock,
        *,
        logs_dir: Path,
        on_job_exit: JobExitHandler,
        max_body_bytes: int,
        service: ServiceControl | None = None,
        limits: RequestLimits = DEFAULT_REQUEST_LIMITS,
    ) -> None:
        """Use :func:`make_app`."""
        self.limits = limits
        self._limiters = {
            Role.REPORT: RateLimiter(limits.report, clock),
            Role.AGENT: RateLimiter(limits.agent, clock),
        }
        self._throttle_warned: dict[tuple[Role, str], float] = {}  # monotonic s of the last
        self._throttle_lock = threading.Lock()
        self._service_control = service
        # Checked when opened, kept open (and unused but by for_thread) until close(): while
        # it is open, its write-ahead log is the one every thread's store must find.
        self._template = store
        self._credentials = credentials
        self._clock = clock
        self._logs_dir = logs_dir
        self._on_job_exit = on_job_exit
        self.max_body_bytes = max_body_bytes
        self._local = threading.local()
        self._exit_lock = threading.Lock()
        self._addresses: dict[str, str] = {}
        self._addresses_lock = threading.Lock()
        self._routes: tuple[tuple[str, str, Role, _Handler], ...] = (
            ("POST", "/v1/jobs", Role.USER, self._submit_job),
            ("GET", "/v1/jobs", Role.USER, self._list_jobs),
            ("GET", "/v1/jobs/<name>", Role.USER, self._get_job),
            ("POST", "/v1/jobs/<name>/cancel", Role.USER, self._cancel_job),
            ("POST", "/v1/jobs/<name>/retry", Role.USER, self._retry_job),
            ("GET", "/v1/jobs/<name>/logs", Role.USER, self._job_logs),
            ("GET", "/v1/instances", Role.USER, self._list_instances),
            ("GET", "/v1/fleet", Role.USER, self._fleet),
            ("POST", "/v1/fleet/release", Role.USER, self._release_fleet),
            ("POST", "/v1/fleet/resume", Role.USER, self._resume_fleet),
            ("GET", "/v1/costs", Role.USER, self._costs),
            ("GET", "/v1/service", Role.USER, self._service),
            ("POST", "/v1/service/down", Role.USER, self._service_down),
            ("POST", "/v1/agents/register", Role.AGENT, self._register),
            ("POST", "/v1/agents/<instance_key>/heartbeat", Role.AGENT, self._heartbeat),
            ("GET", "/v1/agents/<instance_key>/assignments", Role.AGENT, self._assignments),
            ("POST", "/v1/agents/<instance_key>/jobs/<name>/exit", Role.AGENT, self._job_exit),
            (
                "POST",
                REPORT_PATH_TEMPLATE.replace("{job_id}", "<job_id>"),
                Role.REPORT,
                self._add_report,
            ),
        )
        self._map = Map(
            [
                Rule(path, methods=[method], endpoint=i)
                for i, (method, path, _, _) in enumerate(self._routes)
            ],
            strict_slashes=False,
        )

    # ---- plumbing --------------------------------------------------------------------------

    def __call__(self, environ: Any, start_response: Any) -> Any:
        request = Request(environ)
        request.max_content_length = self.max_body_bytes
        if request.method == "GET" and request.path.rstrip("/") == "/dashboard":
            # The page holds no data: its script calls the API with the user token from the
            # URL fragment (autoscaler/accounting/dashboard.py).
            page = Response(PAGE, content_type="text/html; charset=utf-8")
            page.headers["Cache-Control"] = "no-store"
            page.headers["Content-Security-Policy"] = (
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                "connect-src 'self'; img-src 'self'; frame-ancestors 'none'; "
                "base-uri 'none'; form-action 'none'"
            )
            # No other page may frame it (clickjacking), in browsers old and new.
            page.headers["X-Frame-Options"] = "DENY"
            page.headers["Referrer-Policy"] = "no-referrer"
            return page(environ, start_response)
        return self._dispatch(request)(environ, start_response)

    def close_thread_store(self) -> None:
        """Close the calling thread's store, if it has one (a worker thread that ends)."""
        store = getattr(self._local, "store", None)
        if store is not None:
            self._local.store = None
            store.close()

    def close(self) -> None:
        """Close the calling thread's store and the store the app was made with (call it
        from the thread that made the app; the workers' stores close when they end)."""
        self.close_thread_store()
        self._template.close()

    def _store(self) -> Store:
        store: Store | None = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = self._template.for_thread()
        else:
            store.ensure_present()
        return store

    def _dispatch(self, request: Request) -> Response:
        response = self._answer(request)
        _log.debug("%s %s %s", request.method, request.path, response.status_code)
        return response

    def _answer(self, request: Request) -> Response:
        try:
            endpoint, args = self._map.bind_to_environ(request.environ).match()
            _, _, role, handler = self._routes[endpoint]
            self._authorize(request, role, args)  # before the body is read
            throttled = self._throttle(request.environ[_PRINCIPAL])
            if throttled is not None:
                return throttled
            return handler(request, **args)
        except ApiError as e:
            return _error(e.status, e.message, e.field)
        except InvalidInputError as e:
            return _error(400, str(e), e.field)
        except UnknownRowError as e:
            return _error(404, f"no {_NOUNS.get(e.table, e.table)} {e.key!r}")
        except DuplicateRowError as e:
            noun = _NOUNS.get(e.table, e.table)
            return _error(409, f"{noun} {e.key!r} already exists", "name")
        except StaleVersionError as e:
            return _error(409, f"{e} (try again)")
        except StoreError as e:
            _log.warning("store unavailable for %s %s: %s", request.method, request.path, e)
            return _error(503, f"the store is unavailable: {e}")
        except MethodNotAllowed as e:
            allowed = ", ".join(sorted(e.valid_methods or ()))
            response = _error(405, f"{request.method} is not allowed here (allowed: {allowed})")
            response.headers["Allow"] = allowed
            return response
        except NotFound:
            return _error(404, f"no such endpoint: {request.method} {request.path}")
        except HTTPException as e:
            return _error(e.code or 500, e.description or e.name)
        except Exception:
            _log.exception("unexpected error answering %s %s", request.method, request.path)
            return _error(500, "internal error (see the controller's log)")

    def _authorize(self, request: Request, role: Role, args: Mapping[str, str]) -> None:
        """Let the request through if its credential is valid (401 otherwise), of ``role``
        (403 otherwise) and, for an agent or a report credential, for the instance or job the
        path names (403 otherwise); the caller's :class:`Principal` goes in the request's
        environ for the handler."""
        header = request.headers.get("Authorization")
        if not header:
            _unauthorized("a bearer token is required (Authorization: Bearer <token>)")
        scheme, _, presented = header.partition(" ")
        presented = presented.strip()
        if scheme.lower() != "bearer" or not presented:
            _unauthorized("the Authorization header must be 'Bearer <token>'")
        principal = self._credentials.current().authenticate(presented, self._clock.now_s())
        if principal is None:
            _unauthorized("the token is not valid")
        if principal.role is not role:
            raise ApiError(
                403, f"this endpoint needs the {role.value} role, not {principal.role.value}"
            )
        named = args.get("instance_key" if role is Role.AGENT else "job_id")
        if role is not Role.USER and named is not None and named != principal.subject:
            what = "instance" if role is Role.AGENT else "job"
            raise ApiError(
                403, f"this credential is for {what} {principal.subject!r}, not {named!r}"
            )
        if role is Role.AGENT and principal.subject is not None:
            self._check_not_revoked(principal.subject)
        request.environ[_PRINCIPAL] = principal

    def _check_not_revoked(self, instance_key: str) -> None:
        """401 when ``instance_key``'s agent credential is revoked: its instance ended or
        failed to start (:data:`~autoscaler.controller.lifecycle.AGENT_REVOKED`). An
        instance the store does not know is left to the endpoint (404)."""
        try:
            row = self._store().get_instance(instance_key)
        except UnknownRowError:
            return
        if row.status in AGENT_REVOKED:
            _unauthorized(
                f"the credential of instance {instance_key!r} was revoked: the instance is "
                f"{row.status.value}"
            )

    def _throttle(self, principal: Principal) -> Response | None:
        """429 with ``Retry-After`` when ``principal`` (an agent's or a job's credential) has
        used up its rate (:mod:`autoscaler.controller.ratelimit`); ``None``: go on."""
        limiter = self._limiters.get(principal.role)
        if limiter is None or principal.subject is None:
            return None
        wait_s = limiter.take(principal.subject)
        if wait_s <= 0:
            return None
        after = retry_after_s(wait_s)
        what = "job" if principal.role is Role.REPORT else "instance"
        limit = limiter.limit
        message = (
            f"too many requests for {what} {principal.subject!r} (at most "
            f"{limit.per_s:g}/s, {limit.burst} at once): retry after {after} s"
        )
        self._warn_throttled((principal.role, principal.subject), message)
        response = _error(429, message)
        response.headers["Retry-After"] = str(after)
        return response

    def _warn_throttled(self, holder: tuple[Role, str], message: str) -> None:
        """Log a refusal for its rate at WARNING, at most once a minute per holder (a flood
        is seen by the operator, not logged request by request)."""
        now = self._clock.monotonic_s()
        with self._throttle_lock:
            if now - self._throttle_warned.get(holder, -math.inf) < 60.0:
                return
            if len(self._throttle_warned) >= 10_000:
                self._throttle_warned.clear()
            self._throttle_warned[holder] = now
        _log.warning("refused (429): %s", message)

    def _body(self, request: Request, *, optional: bool = False) -> dict[str, Any]:
        """The body as a JSON object ({} for an empty ``optional`` one): 413 over the limit
        (from ``Content-Length`` before reading), 400 if malformed."""
        length = request.content_length
        if length is not None and length > self.max_body_bytes:
            raise _too_large(self.max_body_bytes)
        if length is None:
            # A streamed (chunked) body: Werkzeug's stream stops quietly at the limit, so it
            # is read with a limit one byte higher, and a body that reaches it is too large.
            request.max_content_length = self.max_body_bytes + 1
        try:
            raw = request.get_data(cache=False)
        except RequestEntityTooLarge as e:
            raise _too_large(self.max_body_bytes) from e
        if len(raw) > self.max_body_bytes:
            raise _too_large(self.max_body_bytes)
        if not raw.strip():
            if optional:
                return {}
            raise ApiError(400, "the body is empty: expected a JSON object")
        try:
            data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
        except UnicodeDecodeError as e:
            raise ApiError(400, f"the body is not UTF-8: {e.reason} at byte {e.start}") from e
        except ValueError as e:
            raise ApiError(400, f"the body is not valid JSON: {e}") from e
        except RecursionError as e:
            raise ApiError(400, "the body is not valid JSON: nested too deeply") from e
        if not isinstance(data, dict):
            raise ApiError(400, f"the body must be a JSON object, not {_json_type(data)}")
        return data

    def _one_job(self, store: Store, row: JobRow) -> dict[str, Any]:
        assignment = {k: g for (_, k), g in store.list_assignments(job=row.name).items()}
        restarts = store.restart_counts([row.name]).get(row.name, 0)
        return _job_info(
            row, assignment, store.latest_report(row.name), store.get_batch(row.name), restarts
        ).to_dict()

    # ---- users -----------------------------------------------------------------------------

    def _submit_job(self, request: Request) -> Response:
        spec = _submission(self._body(request))
        after, at = submission_deadline(spec, self._clock.now_s())
        store = self._store()
        row = store.add_job(spec.name, spec.to_json(), deadline_after_s=after, deadline_at_s=at)
        _log.info("job %s submitted", spec.name)
        # A job just added holds nothing yet: no assignment, report, batch or restart to read.
        return _json(
            _job_info(row, {}, None, None, 0).to_dict(),
            201,
            {"Location": f"/v1/jobs/{urllib.parse.quote(row.name)}"},
        )

    def _list_jobs(self, request: Request) -> Response:
        limit = _int_arg(request, "limit", DEFAULT_JOBS_PAGE, maximum=MAX_JOBS_PAGE)
        if limit < 1:
            raise ApiError(400, f"limit must be 1 to {MAX_JOBS_PAGE}", "limit")
        after = _cursor_arg(request)
        rows = self._store().list_jobs_page(after, limit)
        jobs = ", ".join(_job_json(*parts) for parts in _job_parts(self._store(), rows))
        last = rows[-1] if len(rows) == limit else None
        cursor = None if last is None else _cursor(last.submitted_at_s, last.name)
        # What _json writes for {"jobs": [...], "next_cursor": ...}, the jobs' JSON reused.
        body = f'{{"jobs": [{jobs}], "next_cursor": {json.dumps(cursor)}}}\n'
        response = Response(body, 200, mimetype="application/json")
        response.headers["Cache-Control"] = "no-store"
        return response

    def _get_job(self, request: Request, name: str) -> Response:
        store = self._store()
        return _json(self._one_job(store, store.get_job(name)))

    def _cancel_job(self, request: Request, name: str) -> Response:
        store = self._store()
        for _ in range(_CANCEL_TRIES):
            row = store.get_job(name)
            if row.status in _ENDED:
                raise ApiError(409, f"job {name!r} already ended ({row.status.value})")
            try:
                row = store.update_job(name, row.version, status=JobStatus.CANCELLED)
            except StaleVersionError:
                continue  # changed since read: read again and decide again
            _log.info("job %s cancelled", name)
            return _json(self._one_job(store, row))
        raise ApiError(409, f"job {name!r} kept changing while being cancelled: try again")

    def _retry_job(self, request: Request, name: str) -> Response:
        """A refused or failed job is queued again (its failure count starts over): what a
        user does once the cause is fixed (a larger fleet, a repaired script)."""
        store = self._store()
        for _ in range(_CANCEL_TRIES):
            row = store.get_job(name)
            if row.status not in (JobStatus.REFUSED, JobStatus.FAILED):
                raise ApiError(
                    409,
                    f"job {name!r} is {row.status.value}: only a refused or failed job "
                    "can be retried",
                )
            try:
                row = store.update_job(
                    name, row.version, status=JobStatus.QUEUED, retries=0, reason=None
                )
            except StaleVersionError:
                continue
            _log.info("job %s queued again", name)
            return _json(self._one_job(store, row))
        raise ApiError(409, f"job {name!r} kept changing while being retried: try again")

    def _job_logs(self, request: Request, name: str) -> Response:
        store = self._store()
        store.get_job(name)
        offset = _int_arg(request, "offset", 0)
        instance = request.args.get("instance")
        if not JOB_NAME_PATTERN.fullmatch(name):
            raise ApiError(400, f"job {name!r} has no log folder (not a safe folder name)")
        return _json(read_job_logs(self._logs_dir, name, offset, instance=instance).to_dict())

    def _list_instances(self, request: Request) -> Response:
        rows = self._store().list_instances()
        return _json({"instances": [instance_to_dict(r) for r in rows]})

    def _fleet(self, request: Request) -> Response:
        store = self._store()
        return _json(
            {"released_at_s": store.released_at_s(), "release_listing": store.release_listing()}
        )

    def _release_fleet(self, request: Request) -> Response:
        store = self._store()
        store.set_released(True)
        return _json({"released_at_s": store.released_at_s()}, 202)

    def _resume_fleet(self, request: Request) -> Response:
        store = self._store()
        store.set_released(False)
        return _json({"released_at_s": None})

    def _costs(self, request: Request) -> Response:
        """Cost so far: the closed cost records, plus what running instances have accrued at
        their price since they started; ``points`` the cumulative cost over time."""
        store = self._store()
        now = self._clock.now_s()
        records = sorted(store.cost_records(), key=lambda c: (c.end_s, c.record_id))
        points: list[list[float]] = []
        total = 0.0
        for c in records:
            total += c.usd
            points.append([c.end_s, total])
        usd_per_hour = 0.0
        for row in store.list_instances():
            if row.status in (
                InstanceStatus.RUNNING,
                InstanceStatus.DRAINING,
                InstanceStatus.TERMINATING,
            ):
                _, started = store.status_times(row.instance_key)
                if started is not None:
                    total += row.price_usd_per_hour * max(0.0, now - started) / 3600.0
                    usd_per_hour += row.price_usd_per_hour
        if records or usd_per_hour:
            first = records[0].start_s if records else now
            points = [[first, 0.0], *points, [now, total]]
        return _json({"total_usd": total, "usd_per_hour": usd_per_hour, "points": points})

    def _service(self, request: Request) -> Response:
        """The process serving this API (what ``coadapt down`` checks against ``up.json``)."""
        control = self._service_control
        if control is None:
            raise ApiError(404, "this API runs in no service that can be stopped")
        return _json(dict(control.identity))

    def _service_down(self, request: Request) -> Response:
        """``coadapt down``: the service releases the fleet and stops."""
        control = self._service_control
        if control is None:
            raise ApiError(404, "this API runs in no service that can be stopped")
        control.request_down()
        _log.info("down requested: releasing the fleet and stopping")
        return _json(dict(control.identity), 202)

    # ---- agents ----------------------------------------------------------------------------

    def _register(self, request: Request) -> Response:
        body = self._body(request)
        key = body.get("instance_key")
        if not isinstance(key, str) or not key:
            raise ApiError(400, "instance_key must be a non-empty string", "instance_key")
        subject = request.environ[_PRINCIPAL].subject
        if key != subject:
            raise ApiError(403, f"this credential is for instance {subject!r}, not {key!r}")
        address = _address(body)
        row = self._store().get_instance(key)
        if row.status is not InstanceStatus.RUNNING:
            raise ApiError(409, f"instance {key!r} is {row.status.value}, not running")
        restart = body.get("restart")
        if restart is not None:
            adopted, lost = _restart_lists(restart)
            self._agent_restarted(key, adopted, lost)
        self._remember(key, address)
        _log.info("agent of instance %s registered", key)
        return _json(instance_to_dict(row))

    def _agent_restarted(self, key: str, adopted: list[str], lost: list[str]) -> None:
        """An agent restarted (its previous life ended without stopping its jobs): one event,
        and each job whose launcher it found gone, still assigned to this instance, starts
        again from its checkpoint: a restart of that job (:meth:`Store.record_relaunch`)."""
        store = self._store()
        assigned = {job for job, k in store.list_assignments() if k == key}
        relaunched = [job for job in lost if job in assigned]
        for job in relaunched:
            store.record_relaunch(job, key)
        parts = ["its agent restarted (the previous one ended without stopping its jobs)"]
        if adopted:
            parts.append(f"it adopted the running launcher of {', '.join(adopted)}")
        if relaunched:
            parts.append(
                f"the launcher of {', '.join(relaunched)} was gone: it starts again from its "
                "checkpoint"
            )
        if not adopted and not relaunched:
            parts.append("no job of it was running")
        said = "; ".join(parts)
        store.add_events([(self._clock.now_s(), EventKind.AGENT_RESTART.value, key, said)])
        _log.warning("agent of instance %s: %s", key, said)

    def _heartbeat(self, request: Request, instance_key: str) -> Response:
        address = _address(self._body(request, optional=True))
        store = self._store()
        now = self._clock.now_s()
        store.record_heartbeat(instance_key, now)
        self._remember(instance_key, address)
        row = store.get_instance(instance_key)
        answer = {"instance_key": instance_key, "at_s": now, "status": row.status.value}
        if request.environ[_PRINCIPAL].renew:  # made with the previous agent key: the new one
            answer["credential"] = self._credentials.current().agent_credential(instance_key)
            _log.info("agent of instance %s renewed its credential", instance_key)
        return _json(answer)

    def _assignments(self, request: Request, instance_key: str) -> Response:
        store = self._store()
        row = store.get_instance(instance_key)
        with self._addresses_lock:
            addresses = dict(self._addresses)
        credentials = self._credentials.current()
        out = []
        for mine in store.assignment_rows(instance=instance_key):
            job = store.get_job(mine.job_name)
            if job.status is not JobStatus.RUNNING:
                continue
            nodes = [(a.instance_key, a.gpus) for a in store.assignment_rows(job=job.name)]
            if not any(key == instance_key for key, _ in nodes):
                continue  # released since the first read
            spec = JobSubmission.from_json(job.spec_json)
            first = addresses.get(nodes[0][0])
            out.append(
                {
                    "job": job.name,
                    "status": job.status.value,
                    "gpus": dict(nodes)[instance_key],
                    "nodes": [[key, gpus] for key, gpus in nodes],
                    "node_rank": [key for key, _ in nodes].index(instance_key),
                    "addresses": {key: addresses.get(key) for key, _ in nodes},
                    "rendezvous": None
                    if first is None
                    else rendezvous_endpoint(job.name, first, nodes[0][0]),
                    "command": list(spec.command),
                    "checkpoint_uri": spec.checkpoint_uri,
                    "batch": _launch_batch(store.get_batch(job.name), nodes),
                    "spec": dataclasses.asdict(spec),
                    "report_token": credentials.report_credential(job.name),
                }
            )
        return _json(
            {"instance_key": instance_key, "instance_status": row.status.value, "assignments": out}
        )

    def _job_exit(self, request: Request, instance_key: str, name: str) -> Response:
        body = self._body(request)
        failed = body.get("failed")
        if not isinstance(failed, bool):
            raise ApiError(400, "failed must be true or false", "failed")
        cause = body.get("cause")
        if cause is not None and not (isinstance(cause, str) and cause.strip()):
            raise ApiError(400, "cause must be a non-empty string", "cause")
        store = self._store()
        store.get_instance(instance_key)
        with self._exit_lock:  # the nodes of one run report at once: one of them counts
            job = store.get_job(name)
            if job.status is not JobStatus.RUNNING:
                return _json({"job": name, "status": job.status.value, "counted": False})
            if not store.list_assignments(job=name, instance=instance_key):
                raise ApiError(
                    409,
                    f"job {name!r} is not assigned to instance {instance_key!r}: processes "
                    "the controller stopped are not reported",
                )
            status = JobStatus(self._on_job_exit(name, failed=failed))
            if failed and cause is not None:  # why it failed last: coadapt status shows it
                with contextlib.suppress(StaleVersionError):  # changed meanwhile: it moved on
                    after = store.get_job(name)
                    store.update_job(name, after.version, reason=printable(cause))
        _log.info("job %s exited on %s (failed=%s): now %s", name, instance_key, failed, status)
        return _json({"job": name, "status": status.value, "counted": True})

    def _add_report(self, request: Request, job_id: str) -> Response:
        body = self._body(request)
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
        store = self._store()
        store.add_report(job_id, report.to_json())
        job = store.get_job(job_id)
        running = job.status is JobStatus.RUNNING
        reply = ReportReply(
            batch=_new_batch(store.get_batch(job_id), report) if running else None,
            stop=not running,
        )
        return _json(json.loads(reply.to_json()))

    def _remember(self, instance_key: str, address: str | None) -> None:
        if address is not None:
            with self._addresses_lock:
                self._addresses[instance_key] = address


def make_app(
    store_path: str | Path,
    credentials: CredentialSource,
    clock: Clock,
    *,
    logs_dir: str | Path,
    on_job_exit: JobExitHandler,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    service: ServiceControl | None = None,
    limits: RequestLimits = DEFAULT_REQUEST_LIMITS,
) -> ApiApp:
    """The API over the store at ``store_path`` (opened, checked and migrated now, in the
    calling thread: :meth:`Store.open`'s errors), authenticating with ``credentials`` (fixed
    :class:`ApiCredentials`, or the controller's :class:`~autoscaler.controller.credentials.
    TokenFile`, which follows a rotation); stored times come from ``clock``; job logs are read
    under ``logs_dir``; ``on_job_exit`` is told of jobs that exited (see the module
    docstring). ``max_body_bytes`` is the largest body accepted. ``service``: the process
    serving the API (``coadapt up``), which ``/v1/service`` names and ``/v1/service/down``
    stops (without it both answer 404). ``limits``: how often one job's trainers and one
    instance's agent may call (429 with ``Retry-After`` beyond it: see
    :mod:`autoscaler.controller.ratelimit`)."""
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int):
        raise InvalidInputError("max_body_bytes must be an integer", field="max_body_bytes")
    if max_body_bytes < 1:
        raise InvalidInputError("max_body_bytes must be >= 1", field="max_body_bytes")
    current = getattr(credentials, "current", None)
    if not callable(current) or not isinstance(current(), ApiCredentials):
        raise InvalidInputError(
            "credentials must be ApiCredentials or a TokenFile", field="credentials"
        )
    store = Store.open(store_path, clock)  # checked (and migrated); each thread opens its
    return ApiApp(  # own from it (Store.for_thread)
        store,
        credentials,
        clock,
        logs_dir=Path(logs_dir),
        on_job_exit=on_job_exit,
        max_body_bytes=max_body_bytes,
        service=service,
        limits=limits,
    )


# ---- request helpers -----------------------------------------------------------------------


def _new_batch(planned: JobBatch | None, report: TrainerReport) -> BatchConfig | None:
    """The batch a report's reply carries: the planned one, when it was planned for the GPUs
    the trainer runs on (a plan for another count comes with the relaunch that count needs)
    and differs from the batch in force; the trainer has nothing left to do once done."""
    if planned is None or report.done or planned.gpus != report.world_size:
        return None
    want = BatchConfig(planned.global_batch_size, planned.accum_steps)
    return None if want == report.batch else want


def _launch_batch(planned: JobBatch | None, nodes: list[tuple[str, int]]) -> dict[str, int] | None:
    """The batch an assignment starts the job with (``--batch-size``, ``--accum-steps``):
    the planned one when it was planned for the job's GPUs now."""
    if planned is None or planned.gpus != sum(g for _, g in nodes):
        return None
    return {
        "global_batch_size": planned.global_batch_size,
        "local_batch_size": planned.local_batch_size,
        "accum_steps": planned.accum_steps,
    }


def _json(payload: object, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    body = json.dumps(payload, sort_keys=True, allow_nan=False) + "\n"
    response = Response(body, status, mimetype="application/json")
    response.headers["Cache-Control"] = "no-store"
    for key, value in (headers or {}).items():
        response.headers[key] = value
    return response


def _error(status: int, message: str, field: str | None = None) -> Response:
    response = _json({"error": message, "field": field}, status)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="coadapt"'
    return response


def _unauthorized(message: str) -> NoReturn:
    raise ApiError(401, message)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the body is larger than {limit} bytes")


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def _json_type(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return "a boolean" if isinstance(value, bool) else "a number"


def _int_arg(request: Request, name: str, default: int, *, maximum: int = MAX_QUERY_INT) -> int:
    """A query argument that is a count (``0..maximum``): 400 for anything else, without
    converting more digits than ``maximum`` has (a 5,000-digit number is refused as what it
    is, not parsed)."""
    text = request.args.get(name)
    if text is None:
        return default
    if not text.isdigit() or not text.isascii():
        raise ApiError(400, f"{name} must be an integer >= 0, got {text[:40]!r}", name)
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(maximum)) or int(digits) > maximum:
        raise ApiError(400, f"{name} must be at most {maximum} ({len(digits)} digits given)", name)
    return int(digits)


_JobParts = tuple[JobRow, tuple[tuple[str, int], ...], ReportRow | None, JobBatch | None, int]


def _job_parts(store: Store, rows: tuple[JobRow, ...]) -> list[_JobParts]:
    """What a job's answer is made of, for each of ``rows``: the row, its assignment
    (``(instance_key, gpus)`` by key), latest report, planned batch and restarts."""
    names = [row.name for row in rows]
    assigned: dict[str, dict[str, int]] = {}
    for (job, key), gpus in store.assignments_of(names).items():
        assigned.setdefault(job, {})[key] = gpus
    reports = store.latest_reports(names)
    batches = store.list_batches(names)
    restarts = store.restart_counts(names)
    return [
        (
            row,
            tuple(sorted(assigned[row.name].items())) if row.name in assigned else (),
            reports.get(row.name),
            batches.get(row.name),
            restarts.get(row.name, 0),
        )
        for row in rows
    ]


def jobs_in_store(store: Store) -> tuple[JobInfo, ...]:
    """Every job, in submission order, as ``GET /v1/jobs`` answers it, read from ``store``
    (what ``coadapt status`` shows of a cluster that is not up)."""
    return tuple(
        _job_info(row, dict(assignment), report, batch, restarts)
        for row, assignment, report, batch, restarts in _job_parts(store, store.list_jobs())
    )


@functools.lru_cache(maxsize=4096)
def _job_json(
    row: JobRow,
    assignment: tuple[tuple[str, int], ...],
    report: ReportRow | None,
    batch: JobBatch | None,
    restarts: int,
) -> str:
    """A job's answer as JSON text (what :func:`_json` writes for :meth:`JobInfo.to_dict`),
    remembered for the same rows: a job list re-reads mostly jobs that did not change since
    its last page, and encoding them was most of its cost (``benchmarks/api_load.py``)."""
    info = _job_info(row, dict(assignment), report, batch, restarts)
    return json.dumps(info.to_dict(), sort_keys=True, allow_nan=False)


def _job_info(
    row: JobRow,
    assignment: Mapping[str, int],
    report: ReportRow | None,
    batch: JobBatch | None,
    restarts: int,
) -> JobInfo:
    """A job as the API answers it, from its rows."""
    return JobInfo(
        name=row.name,
        status=row.status,
        retries=row.retries,
        submitted_at_s=row.submitted_at_s,
        updated_at_s=row.updated_at_s,
        version=row.version,
        spec=_stored_spec(row.spec_json),
        assignment=assignment,
        report=None if report is None else ProgressInfo.from_report(report),
        batch=None if batch is None or not assignment else PlannedBatch.of(batch),
        restarts=restarts,
        reason=row.reason,
    )


@functools.lru_cache(maxsize=4096)
def _stored_spec(spec_json: str) -> Mapping[str, Any]:
    """A stored spec as the JSON object it is (read-only; a job list parses each spec once,
    not on every page it is read in), even one that no longer passes the checks."""
    try:
        spec = json.loads(spec_json)
    except ValueError:
        spec = {}
    return MappingProxyType(spec if isinstance(spec, dict) else {})


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
        at_s, name = json.loads(raw, parse_constant=_no_constant)
        if isinstance(at_s, bool) or not isinstance(at_s, int | float) or not isinstance(name, str):
            raise ValueError("not a job key")
        return float(at_s), name
    except (ValueError, TypeError, binascii.Error) as e:
        raise ApiError(400, "cursor is not one this server gave (use next_cursor)", "cursor") from e


def _restart_lists(value: object) -> tuple[list[str], list[str]]:
    """A register body's ``restart``: ``{"adopted": [jobs], "lost": [jobs]}`` (job names,
    at most :data:`MAX_RESTART_JOBS` each); 400 otherwise."""
    if not isinstance(value, dict) or set(value) - {"adopted", "lost"}:
        raise ApiError(400, 'restart must be {"adopted": [...], "lost": [...]}', "restart")
    out: list[list[str]] = []
    for name in ("adopted", "lost"):
        jobs = value.get(name, [])
        if not isinstance(jobs, list) or len(jobs) > MAX_RESTART_JOBS:
            raise ApiError(
                400, f"restart.{name} must be a list of at most {MAX_RESTART_JOBS} jobs", "restart"
            )
        if not all(isinstance(j, str) and JOB_NAME_PATTERN.fullmatch(j) for j in jobs):
            raise ApiError(400, f"restart.{name} must hold job names", "restart")
        out.append(sorted(set(jobs)))
    return out[0], out[1]


def _address(body: Mapping[str, Any]) -> str | None:
    address = body.get("address")
    if address is None:
        return None
    if not isinstance(address, str) or not _ADDRESS.fullmatch(address):
        raise ApiError(400, "address must be a host name or an IP address", "address")
    return address


def _submission(data: Mapping[str, Any]) -> JobSubmission:
    """A submission from a JSON object: :meth:`JobSubmission.from_mapping`, the one check of
    a job's fields that ``coadapt submit`` runs too (ranges in
    :data:`~autoscaler.controller.jobbook.BOUNDS_DOC`)."""
    return JobSubmission.from_mapping(data)


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` as it may reach a user's terminal: every non-printable character (a control
    character, an escape sequence's ESC or CSI, a bidirectional override) shown as ``?``, so
    nothing it holds can change a terminal's title, clear its screen or colour a line. On one
    line (runs of white space, line breaks included, become one space: what an agent reports
    as a job's failure), or with ``lines`` its line breaks and tabs kept (``\r\n`` read as
    ``\n``: a job's log, ``coadapt logs``)."""
    if not lines:
        return "".join(c if c.isprintable() else "?" for c in " ".join(text.split()))
    text = text.replace("\r\n", "\n")
    return "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text)


def read_job_logs(
    logs_dir: Path, job: str, offset: int = 0, *, instance: str | None = None
) -> LogChunk:
    """Job ``job``'s logs under ``logs_dir`` (``<logs_dir>/<job>/<instance>.log``, what the
    agents write) from byte ``offset``, as ``GET /v1/jobs/{job}/logs`` answers them (only
    ``instance``'s file when given): the API and ``coadapt logs`` on the cluster's machine,
    whether or not the cluster is up. ``job`` must be a job name (:data:`JOB_NAME_PATTERN`:
    a safe folder name); ``ValueError`` otherwise."""
    if not JOB_NAME_PATTERN.fullmatch(job):
        raise ValueError(f"{job!r} is not a job name")
    files = _log_files(Path(logs_dir) / job)
    if instance is not None:
        files = [f for f in files if f[0] == instance]
    return _read_logs(job, files, offset)


def _log_files(folder: Path) -> list[tuple[str, LogSegments]]:
    """``(instance_key, segments)`` of the regular ``*.log`` files in ``folder``, by key
    (links and hidden files are skipped; each is read with what its capped writer rotated
    out and dropped: :func:`coadapt_common.logcap.segments`)."""
    out = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.startswith(".") or not entry.name.endswith(".log"):
                continue
            if not entry.is_file(follow_symlinks=False):
                continue
            out.append((entry.name[: -len(".log")], log_segments(Path(entry.path))))
    return sorted(out, key=lambda item: item[0])


def _read_logs(job: str, files: list[tuple[str, LogSegments]], offset: int) -> LogChunk:
    """Bytes ``offset``.. of the logs read in order as one stream (each up to the size it
    had when listed), at most :data:`MAX_LOG_CHUNK_BYTES`. A range a capped log dropped
    reads as one line that says how much is gone (:func:`coadapt_common.logcap.dropped_note`)
    and costs no bytes of the answer; offsets count every byte the job wrote."""
    chunks: list[bytes] = []
    want = MAX_LOG_CHUNK_BYTES
    start = 0  # where the current piece begins in the stream
    cursor = offset
    total = sum(seg.total_bytes for _, seg in files)
    for _, seg in files:
        pieces: list[tuple[Path | None, int]] = [(None, seg.dropped_bytes), *seg.files]
        for path, size in pieces:
            if want and start <= cursor < start + size:
                if path is None:
                    dropped = start + size - cursor
                    chunks.append(dropped_note(dropped, seg.max_bytes).encode())
                    cursor += dropped
                else:
                    count = min(start + size - cursor, want)
                    data = b""
                    with contextlib.suppress(FileNotFoundError), open(path, "rb") as handle:
                        handle.seek(cursor - start)
                        data = handle.read(count)
                    chunks.append(data)
                    want -= len(data)
                    cursor += len(data)
                    if len(data) < count:  # rotated or cut since listed: the next read
                        want = 0
            start += size
    raw = b"".join(chunks)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = decoder.decode(raw, final=False)
    held_back = len(decoder.getstate()[0])  # an incomplete character at the end
    next_offset = cursor - held_back
    return LogChunk(
        job=job,
        offset=offset,
        next_offset=next_offset,
        text=text,
        more=next_offset < total and want <= 0,
        instances=tuple((key, seg.total_bytes) for key, seg in files),
    )


# ---- the server ----------------------------------------------------------------------------


class _ErrorTask(ErrorTask):  # type: ignore[misc]
    """The answer to a request the server refused before the app saw it (malformed, headers
    or a body too large): JSON like every other answer."""

    def execute(self) -> None:
        e = self.request.error
        code = int(e.code)
        if code == 413:
            limit = getattr(self.channel.server.application, "max_body_bytes", None)
            message = f"the body is larger than {limit} bytes"
        else:
            message = f"{e.reason}: {e.body}"
        body = (json.dumps({"error": message, "field": None}, sort_keys=True) + "\n").encode()
        self.status = f"{code} {e.reason}"
        self.response_headers.extend(
            [("Content-Type", "application/json"), ("Cache-Control", "no-store")]
        )
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


_SEND_BYTES: Final = 4 << 20
"""Buffered answer bytes below which a worker leaves the sending to the event loop."""


class _Channel(HTTPChannel):
    """Waitress's connection, remembering when the request it is reading began (the server
    closes one whose request is not complete after ``request_timeout_s``)."""

    error_task_class = _ErrorTask
    request_started_s: float | None = None

    def writable(self) -> bool:
        """Waitress's rule, less one case: while a request of this connection runs and what
        it has written is below ``send_bytes``, Waitress's own write handler sends nothing,
        yet the connection would be polled for writing: the socket is writable, so the event
        loop woke at once, did nothing, and spun (measured: the loop thread took 26 s of CPU
        in 30 s under ``benchmarks/api_load.py``, starving the workers). A task that ends
        pulls the loop's trigger, and the connection is polled for writing again then."""
        if (
            self.requests
            and not self.will_close
            and not self.close_when_flushed
            and self.total_outbufs_len < self.adj.send_bytes
        ):
            return False
        return bool(super().writable())

    def received(self, data: bytes) -> bool:
        if data and self.request is None:
            self.request_started_s = time.monotonic()
        done: bool = super().received(data)
        if self.request is None:
            self.request_started_s = None
        return done


class _Server(TcpWSGIServer):  # type: ignore[misc]
    """Waitress's TCP server with a deadline on reading a whole request (headers and body),
    besides its idle time-out: a client that trickles a byte now and then holds a connection
    only that long."""

    channel_class = _Channel
    request_timeout_s: float = 30.0

    def maintenance(self, now: float) -> None:
        super().maintenance(now)
        cutoff = time.monotonic() - self.request_timeout_s
        for channel in list(self.active_channels.values()):
            started = getattr(channel, "request_started_s", None)
            if started is not None and started < cutoff and not channel.requests:
                channel.will_close = True


class _Dispatcher(ThreadedTaskDispatcher):  # type: ignore[misc]
    """Waitress's worker pool; a worker that ends closes its store."""

    def __init__(self, on_worker_exit: Callable[[], None]) -> None:
        super().__init__()
        self._on_worker_exit = on_worker_exit

    def handler_thread(self, thread_no: int) -> None:
        try:
            super().handler_thread(thread_no)
        finally:
            self._on_worker_exit()


@dataclass(frozen=True)
class ServerLimits:
    """How the API server holds connections (see :func:`serve`). ``threads``: the worker pool
    that runs requests (a connection holds no thread until its request is complete);
    ``connection_limit``: open connections at most (beyond it new ones wait in the listen
    backlog); ``idle_timeout_s``: a connection that sends nothing for this long is closed
    (an idle keep-alive connection, or a request that stalled); ``request_timeout_s``: a
    request not completely received this long after its first byte is dropped;
    ``check_interval_s``: how often those two are checked (whole seconds)."""

    threads: int = 8
    connection_limit: int = 2048
    idle_timeout_s: int = 10
    request_timeout_s: float = 30.0
    check_interval_s: int = 1

    def __post_init__(self) -> None:
        for name in ("threads", "connection_limit", "idle_timeout_s", "check_interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"{name} must be an integer >= 1", field=name)
        if not self.request_timeout_s > 0:
            raise InvalidInputError("request_timeout_s must be > 0", field="request_timeout_s")


class ApiServer:
    """A running API server (see :func:`serve`); ``url`` is its base URL. :meth:`shutdown`
    stops it (also on leaving a ``with`` block)."""

    def __init__(self, server: _Server, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def host(self) -> str:
        return str(self._server.effective_host)

    @property
    def port(self) -> int:
        return int(self._server.effective_port)

    @property
    def url(self) -> str:
        host = self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    @property
    def worker_threads(self) -> int:
        """The worker threads running now (bounded by :attr:`ServerLimits.threads`)."""
        return len(self._server.task_dispatcher.threads)

    def shutdown(self, grace_s: float = 3.0) -> None:
        """Stop accepting requests, close every connection and the socket, and wait for the
        serving thread and the workers. A request in progress, or an answer not yet sent (the
        202 of the ``/v1/service/down`` that stops the service), gets up to ``grace_s``
        seconds to go out first; idle and half-open connections do not delay it. Calling it
        twice is fine."""
        if self._thread.is_alive():
            server = self._server
            deadline = time.monotonic() + max(0.0, grace_s)
            while self._answering() and time.monotonic() < deadline:
                time.sleep(0.02)
            server.trigger.pull_trigger(lambda: close_all(server._map))
            self._thread.join(timeout=10.0)
        self._server.task_dispatcher.shutdown(timeout=5)
        sock = self._server.socket
        if sock is not None:  # closed by the loop already, unless it never ran
            with contextlib.suppress(OSError):
                sock.close()

    def _answering(self) -> bool:
        """Whether a connection has a request in progress or bytes still to send."""
        server = self._server
        for _ in range(3):  # the serving thread may change the map while we read it
            try:
                channels = [ch for ch in list(server._map.values()) if ch is not server]
                break
            except RuntimeError:
                continue
        else:
            return True
        return any(
            getattr(ch, "requests", None) or getattr(ch, "total_outbufs_len", 0) for ch in channels
        )

    def __enter__(self) -> ApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _adjustments(
    app: ApiApp, host: str, port: int, limits: ServerLimits, poll_interval_s: float
) -> Adjustments:
    """Waitress's settings for :func:`serve` (see its docstring)."""
    return Adjustments(
        host=host,
        port=port,
        threads=limits.threads,
        connection_limit=limits.connection_limit,
        channel_timeout=limits.idle_timeout_s,
        cleanup_interval=limits.check_interval_s,
        asyncore_use_poll=True,  # select() cannot watch more than 1,024 sockets
        # The loop's poll time-out: 1 s, Waitress's own (a shorter one slowed the workers
        # under concurrent submissions here); shutdown wakes the loop through its trigger.
        asyncore_loop_timeout=max(1.0, poll_interval_s),
        # The app checks the exact limit; the server refuses, unread, what is clearly over it
        # (a chunked body's size counts its framing here).
        max_request_body_size=app.max_body_bytes + _BODY_SLACK_BYTES,
        ident="coadapt",
        expose_tracebacks=False,
        # No proxy is trusted and the app reads no X-Forwarded-* header: nothing to clear
        # (Waitress would otherwise wrap every request in a middleware that looks).
        clear_untrusted_proxy_headers=False,
        # An answer is sent by the loop once its request is done (or a worker's write passes
        # this size), never piecemeal while a worker still holds the connection's buffer:
        # with Waitress's default of 1 byte, the loop woke for every connection with a byte
        # buffered, found the buffer locked and spun (see _Channel.writable).
        send_bytes=_SEND_BYTES,
    )


def serve(
    app: ApiApp,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    poll_interval_s: float = 0.1,
    limits: ServerLimits | None = None,
) -> ApiServer:
    """Serve ``app`` on ``host:port`` (0: any free port, see :attr:`ApiServer.url`) in a
    background thread; returns once it listens.

    The server (Waitress) reads each connection's requests in one event loop and hands only
    complete requests (headers and body) to a fixed pool of ``limits.threads`` workers: a
    connection that is open, idle or half-sent holds a socket, never a thread, so slow or
    stalled clients cannot starve the others (``tests/controller/test_api_server.py``:
    1,000 half-open requests, and a normal request still answers in under 1 s). Idle
    connections close after ``limits.idle_timeout_s``, requests that take longer than
    ``limits.request_timeout_s`` to arrive are dropped, and at most
    ``limits.connection_limit`` connections are open. HTTP/1.1 keep-alive is supported
    within those limits. ``poll_interval_s`` is the event loop's longest sleep (at least
    1 s)."""
    limits = limits or ServerLimits()
    # Waitress warns on every request that waits for a worker: under load, a line per request.
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    with contextlib.suppress(ValueError, OSError):  # a socket per connection: room for them
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = limits.connection_limit + 256
        if soft != resource.RLIM_INFINITY and soft < want:
            ceiling = want if hard == resource.RLIM_INFINITY else min(want, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
    with warnings.catch_warnings():  # send_bytes is deprecated upstream: pinned below 4
        warnings.simplefilter("ignore", DeprecationWarning)
        adj = _adjustments(app, host, port, limits, poll_interval_s)
    dispatcher = _Dispatcher(app.close_thread_store)
    dispatcher.set_thread_count(adj.threads)
    server = _Server(app, map={}, dispatcher=dispatcher, adj=adj, sockinfo=adj.listen[0])
    server.request_timeout_s = limits.request_timeout_s
    thread = threading.Thread(
        target=server.run, name=f"coadapt-api-{server.effective_port}", daemon=True
    )
    thread.start()
    return ApiServer(server, thread)
