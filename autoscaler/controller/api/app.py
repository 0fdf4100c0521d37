"""The WSGI app: routes a request to its handler after :func:`~autoscaler.controller.api.auth.
authorize` and the :class:`~autoscaler.controller.api.auth.Throttle`, and turns every error
into its JSON answer; the dashboard's page (:mod:`autoscaler.accounting.dashboard`) is the one
answer that is not JSON.

The request log (the request line and the status) goes to this module's logger at DEBUG.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Final

from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from autoscaler.accounting.dashboard import PAGE
from autoscaler.controller.api.agents import ROUTES as AGENT_ROUTES
from autoscaler.controller.api.auth import PRINCIPAL, Throttle, authorize
from autoscaler.controller.api.metrics import ROUTES as METRICS_ROUTES
from autoscaler.controller.api.reports import ROUTES as REPORT_ROUTES
from autoscaler.controller.api.state import ApiState, JobExitHandler, Route, ServiceControl
from autoscaler.controller.api.users import ROUTES as USER_ROUTES
from autoscaler.controller.api.wire import DEFAULT_MAX_BODY_BYTES, error_response
from autoscaler.controller.client import ApiError
from autoscaler.controller.credentials import ApiCredentials, CredentialSource
from autoscaler.controller.errors import (
    DuplicateRowError,
    StaleVersionError,
    StoreError,
    UnknownRowError,
)
from autoscaler.controller.metrics import UNMATCHED_ROUTE, ControllerMetrics
from autoscaler.controller.ratelimit import DEFAULT_REQUEST_LIMITS, RequestLimits
from autoscaler.controller.store import Store
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import Clock

__all__ = ["ROUTES", "ApiApp", "make_app"]

ROUTES: Final[tuple[Route, ...]] = (
    *USER_ROUTES,
    *AGENT_ROUTES,
    *REPORT_ROUTES,
    *METRICS_ROUTES,
)
"""Every route of the API, by role: users, agents, trainers, the metrics scraper."""
ROUTE: Final = "coadapt.route"
"""The WSGI environ key of the matched route's template (the request metrics' label)."""
DASHBOARD: Final = "/dashboard"
_log = logging.getLogger(__name__)
_NOUNS: Final = {"jobs": "job", "instances": "instance"}


class ApiApp:
    """The WSGI app (see :mod:`autoscaler.controller.api`); build it with :func:`make_app`.
    Thread-safe: each thread uses its own store. :meth:`close` when done."""

    def __init__(self, state: ApiState, limits: RequestLimits = DEFAULT_REQUEST_LIMITS) -> None:
        """Use :func:`make_app`."""
        self.state = state
        self.limits = limits
        self.max_body_bytes = state.max_body_bytes
        self._throttle = Throttle(limits, state.clock)
        self._map = Map(
            [
                Rule(path, methods=[method], endpoint=i)
                for i, (method, path, _, _) in enumerate(ROUTES)
            ],
            strict_slashes=False,
        )

    def __call__(self, environ: Any, start_response: Any) -> Any:
        started = time.perf_counter()
        request = Request(environ)
        request.max_content_length = self.max_body_bytes
        response = self._response(request)
        self.state.metrics.observe_request(
            request.method, environ.get(ROUTE, UNMATCHED_ROUTE), time.perf_counter() - started
        )
        return response(environ, start_response)

    def _response(self, request: Request) -> Response:
        if request.method == "GET" and request.path.rstrip("/") == DASHBOARD:
            request.environ[ROUTE] = DASHBOARD
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
            return page
        return self._dispatch(request)

    def close_thread_store(self) -> None:
        """Close the calling thread's store, if it has one (a worker thread that ends)."""
        self.state.close_thread_store()

    def close(self) -> None:
        """Close the calling thread's store and the store the app was made with (call it
        from the thread that made the app; the workers' stores close when they end)."""
        self.state.close()

    def _dispatch(self, request: Request) -> Response:
        response = self._answer(request)
        _log.debug("%s %s %s", request.method, request.path, response.status_code)
        return response

    def _answer(self, request: Request) -> Response:
        state = self.state
        try:
            endpoint, args = self._map.bind_to_environ(request.environ).match()
            _, path, role, handler = ROUTES[endpoint]
            request.environ[ROUTE] = path
            # Before the body is read.
            authorize(request, role, args, state.credentials, state.clock.now_s(), state.store)
            throttled = self._throttle.check(request.environ[PRINCIPAL])
            if throttled is not None:
                return throttled
            return handler(state, request, **args)
        except ApiError as e:
            return error_response(e.status, e.message, e.field)
        except InvalidInputError as e:
            return error_response(400, str(e), e.field)
        except UnknownRowError as e:
            return error_response(404, f"no {_NOUNS.get(e.table, e.table)} {e.key!r}")
        except DuplicateRowError as e:
            noun = _NOUNS.get(e.table, e.table)
            return error_response(409, f"{noun} {e.key!r} already exists", "name")
        except StaleVersionError as e:
            return error_response(409, f"{e} (try again)")
        except StoreError as e:
            _log.warning("store unavailable for %s %s: %s", request.method, request.path, e)
            return error_response(503, f"the store is unavailable: {e}")
        except MethodNotAllowed as e:
            allowed = ", ".join(sorted(e.valid_methods or ()))
            response = error_response(
                405, f"{request.method} is not allowed here (allowed: {allowed})"
            )
            response.headers["Allow"] = allowed
            return response
        except NotFound:
            return error_response(404, f"no such endpoint: {request.method} {request.path}")
        except HTTPException as e:
            return error_response(e.code or 500, e.description or e.name)
        except Exception:
            _log.exception("unexpected error answering %s %s", request.method, request.path)
            return error_response(500, "internal error (see the controller's log)")


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
    checkpoints_dir: str | Path | None = None,
    metrics: ControllerMetrics | None = None,
) -> ApiApp:
    """The API over the store at ``store_path`` (opened, checked and migrated now, in the
    calling thread: :meth:`Store.open`'s errors), authenticating with ``credentials`` (fixed
    :class:`ApiCredentials`, or the controller's :class:`~autoscaler.controller.credentials.
    TokenFile`, which follows a rotation); stored times come from ``clock``; job logs are read
    under ``logs_dir``; ``on_job_exit`` is told of jobs that exited (see
    :mod:`autoscaler.controller.api`). ``max_body_bytes`` is the largest body accepted.
    ``service``: the process serving the API (``coadapt up``), which ``/v1/service`` names and
    ``/v1/service/down`` stops (without it both answer 404). ``limits``: how often one job's
    trainers and one instance's agent may call (429 with ``Retry-After`` beyond it: see
    :mod:`autoscaler.controller.ratelimit`). ``checkpoints_dir``: the folder where this
    cluster's jobs without their own ``checkpoint_uri`` checkpoint (``<dir>/<job>``; a local
    cluster's), moved aside with a deleted job (``None``: not on this machine).
    ``metrics``: the process's metrics, which ``GET /metrics`` answers, the app's requests
    counted in it and its store watched for the fleet's families (``None``: a new one; the
    service passes its own, which its rounds feed)."""
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
    state = ApiState(  # own from it (Store.for_thread)
        store,
        credentials,
        clock,
        logs_dir=Path(logs_dir),
        on_job_exit=on_job_exit,
        max_body_bytes=max_body_bytes,
        service=service,
        checkpoints_dir=None if checkpoints_dir is None else Path(checkpoints_dir),
        metrics=metrics or ControllerMetrics(),
    )
    state.metrics.watch_store(state.store, clock)
    return ApiApp(state, limits)
