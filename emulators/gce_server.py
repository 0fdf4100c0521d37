"""A fake GCE Compute Engine REST server, for tests and benchmarks (stdlib only, no google import).

It speaks the subset of the Compute v1 REST API that ``providers.gcp`` uses, over plain HTTP on
``127.0.0.1`` (port 0 = any free port), so the *real* ``google-cloud-compute`` client, with its
REST transport, talks to it unchanged (``client_options.api_endpoint = server.endpoint``). It
behaves like a cloud, not like a mock: state lives on the server and every client sees it.

Served paths (``/compute/v1/projects/{project}/...``)::

    POST   zones/{z}/instances                  instances.insert       (requestId)
    POST   zones/{z}/instances/bulkInsert       instances.bulkInsert   (requestId)
    GET    zones/{z}/instances                  instances.list         (filter, paging)
    GET    zones/{z}/instances/{name}           instances.get
    DELETE zones/{z}/instances/{name}           instances.delete       (requestId)
    GET    aggregated/instances                 instances.aggregatedList (filter, paging)
    GET    zones/{z}/operations                 zoneOperations.list    (filter, paging)
    GET    zones/{z}/operations/{op}            zoneOperations.get
    POST   zones/{z}/operations/{op}/wait       zoneOperations.wait
    GET    aggregated/acceleratorTypes          acceleratorTypes.aggregatedList

plus a per-instance metadata server: ``GET /_metadata/{zone}/{name}/computeMetadata/v1/instance/
{preempted,name,zone,id,machine-type}`` (header ``Metadata-Flavor: Google`` required;
``?wait_for_change=true[&last_etag=..][&timeout_sec=..]``); ``metadata_base_url(zone, name)``
gives the base URL a node-side poller uses.

Behaviour modelled on the real API:

* **Operations** go ``PENDING -> RUNNING -> DONE`` on the server's clock (``insert_pending_s``,
  ``insert_duration_s``, ``delete_duration_s``); ``wait`` blocks until DONE or 120 s (on a
  ``FakeClock`` it advances the clock instead of sleeping). A created instance is
  ``PROVISIONING``, ``STAGING`` once the operation runs, ``RUNNING`` when it is done; a deleted
  one is ``STOPPING`` until its delete operation is done, then gone.
* **requestId**: must be a UUID (else 400); the same requestId in the same zone within an hour
  returns the first call's operation and does nothing else, whatever the body.
  ``forget_request_ids()`` ends every window at once (as an hour passing would, without moving
  the clock), so tests can check that a client does not rely on it.
* **Names**: inserting an existing name is ``409 alreadyExists``; bulkInsert with an existing
  ``perInstanceProperties`` name is refused the same way (all or nothing).
* **bulkInsert**: ``count``/``minCount``/``perInstanceProperties``/``namePattern``; creates
  ``min(count, capacity, quota)`` instances when that is at least ``minCount``, else none (the
  operation ends with the capacity or quota error); ``instancesBulkInsertOperationMetadata``
  reports target/created/failed counts.
* **Capacity / quota**: ``exhaust``/``set_capacity`` per (zone, machine type, market) make
  inserts end with ``ZONE_RESOURCE_POOL_EXHAUSTED`` (httpErrorStatusCode 503);
  ``set_gpu_quota`` per region and GCE quota metric (``NVIDIA_T4_GPUS``,
  ``PREEMPTIBLE_NVIDIA_T4_GPUS``, ...) makes them end with ``QUOTA_EXCEEDED`` (403).
* **Validation** like GCE's: unknown zone/project/network/machine type/accelerator, malformed
  names and labels, GPUs without ``onHostMaintenance=TERMINATE``, Spot with automatic restart,
  missing boot disk -> 400/404 with GCE's error body
  (``{"error": {"code", "message", "errors": [{"reason", ...}], "status"}}``).
* **Filters**: ``field = value``, ``field != value``, ``AND``/``OR``/parentheses (implicit AND
  between parenthesised terms), dotted fields such as ``labels.coadapt-cluster-id``; anything
  else is a 400, as for an unsupported filter on GCE.
* **Paging**: ``maxResults`` (<= 500) and opaque ``nextPageToken``; aggregated lists return
  every zone as a scope, empty ones with a ``NO_RESULTS_ON_PAGE`` warning.
* **Preemption**: ``preempt(zone, name)`` records a DONE ``compute.instances.preempted`` system
  operation, flips the instance's metadata ``preempted`` to ``TRUE`` and deletes the instance
  (``instanceTerminationAction=DELETE``) or leaves it ``TERMINATED`` (``STOP``).

Not modelled: IAM/auth (every caller is allowed), regional operations, instance templates,
``setLabels``, ``start``/``stop``, disks as separate resources, the 2-minute server-side wait
with a real clock is capped at ``wait_cap_s``.

Test hooks: ``exhaust``, ``set_capacity``, ``restore``, ``set_gpu_quota``,
``set_zone_accelerators``, ``reset_faults``, ``inject_error``
(an HTTP error for the next matching call(s), optionally *after* the call took effect, to mimic
a lost response), ``inject_operation_error``, ``preempt``, ``add_foreign_instance``,
``settle``; counters ``request_counts``, ``api_calls``, ``launch_attempts``,
``call_kinds``; ``requests`` (the recorded request shapes).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from coadapt_common.clock import Clock, SystemClock

GOOGLE_BASE = "https://www.googleapis.com/compute/v1"
DEFAULT_ZONES = ("us-central1-a", "us-central1-b", "us-east1-c", "europe-west4-a")
WAIT_MAX_S = 120.0  # zoneOperations.wait returns after at most this long, DONE or not
REQUEST_ID_TTL_S = 3600.0
_PACIFIC = timezone(timedelta(hours=-8))  # GCE timestamps carry a Pacific offset

# The fake cloud's own machine and accelerator tables (kept independent of the adapter's
# catalogue on purpose, so a catalogue mistake shows up as a cloud error in tests).
# machine type -> (vCPUs, memory GiB, built-in accelerator, built-in GPU count)
MACHINE_TYPES: dict[str, tuple[int, float, str | None, int]] = {
    **{f"n1-standard-{n}": (n, 3.75 * n, None, 0) for n in (1, 2, 4, 8, 16, 32, 64, 96)},
    "g2-standard-4": (4, 16.0, "nvidia-l4", 1),
    "g2-standard-8": (8, 32.0, "nvidia-l4", 1),
    "g2-standard-12": (12, 48.0, "nvidia-l4", 1),
    "g2-standard-16": (16, 64.0, "nvidia-l4", 1),
    "g2-standard-24": (24, 96.0, "nvidia-l4", 2),
    "g2-standard-32": (32, 128.0, "nvidia-l4", 1),
    "g2-standard-48": (48, 192.0, "nvidia-l4", 4),
    "g2-standard-96": (96, 384.0, "nvidia-l4", 8),
    "a2-highgpu-1g": (12, 85.0, "nvidia-tesla-a100", 1),
    "a2-highgpu-2g": (24, 170.0, "nvidia-tesla-a100", 2),
    "a2-highgpu-4g": (48, 340.0, "nvidia-tesla-a100", 4),
    "a2-highgpu-8g": (96, 680.0, "nvidia-tesla-a100", 8),
    "a2-ultragpu-1g": (12, 170.0, "nvidia-a100-80gb", 1),
    "a3-highgpu-8g": (208, 1872.0, "nvidia-h100-80gb", 8),
}
# accelerator type -> (quota metric infix, max cards per instance)
ACCELERATOR_TYPES: dict[str, tuple[str, int]] = {
    "nvidia-tesla-t4": ("T4", 4),
    "nvidia-tesla-v100": ("V100", 8),
    "nvidia-tesla-p100": ("P100", 4),
    "nvidia-tesla-p4": ("P4", 4),
    "nvidia-l4": ("L4", 8),
    "nvidia-tesla-a100": ("A100", 16),
    "nvidia-a100-80gb": ("A100_80GB", 8),
    "nvidia-h100-80gb": ("H100", 8),
}

_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
_CANONICAL = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    412: "FAILED_PRECONDITION",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}

_ROUTE_KINDS = {
    "instances.insert": "launch",
    "instances.bulkInsert": "launch",
    "instances.delete": "terminate",
    "instances.get": "list",
    "instances.list": "list",
    "instances.aggregatedList": "list",
    "zoneOperations.get": "operations",
    "zoneOperations.wait": "operations",
    "zoneOperations.list": "operations",
    "acceleratorTypes.aggregatedList": "other",
}

_P = r"^/compute/v1/projects/(?P<project>[^/]+)"
_Z = _P + r"/zones/(?P<zone>[^/]+)"
_ROUTES: tuple[tuple[str, re.Pattern[str], str], ...] = tuple(
    (method, re.compile(pattern), route)
    for method, pattern, route in (
        ("POST", _Z + r"/instances/bulkInsert$", "instances.bulkInsert"),
        ("POST", _Z + r"/instances$", "instances.insert"),
        ("GET", _Z + r"/instances$", "instances.list"),
        ("GET", _Z + r"/instances/(?P<name>[^/]+)$", "instances.get"),
        ("DELETE", _Z + r"/instances/(?P<name>[^/]+)$", "instances.delete"),
        ("GET", _P + r"/aggregated/instances$", "instances.aggregatedList"),
        ("GET", _Z + r"/operations$", "zoneOperations.list"),
        ("GET", _Z + r"/operations/(?P<op>[^/]+)$", "zoneOperations.get"),
        ("POST", _Z + r"/operations/(?P<op>[^/]+)/wait$", "zoneOperations.wait"),
        ("GET", _P + r"/aggregated/acceleratorTypes$", "acceleratorTypes.aggregatedList"),
        (
            "GET",
            r"^/_metadata/(?P<zone>[^/]+)/(?P<name>[^/]+)/computeMetadata/v1/instance/(?P<key>.+)$",
            "metadata.get",
        ),
    )
)


# Every Compute Engine route any fake server answered (the metadata server aside): the tests
# hold the adapter to the methods its IAM role grants (``providers.gcp.permissions``).
ROUTES_SEEN: set[str] = set()


class HttpError(Exception):
    """An HTTP error the fake answers with, in GCE's error body shape."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.status,
                "message": self.message,
                "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
                "status": _CANONICAL.get(self.status, "UNKNOWN"),
            }
        }


def _timestamp(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=_PACIFIC).isoformat(timespec="milliseconds")


def _last(url_or_name: str) -> str:
    return url_or_name.rstrip("/").rsplit("/", 1)[-1]


def _region(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


# ---------------------------------------------------------------------------------- filters

_TOKEN_RE = re.compile(r'\s*(\(|\)|"(?:[^"\\]|\\.)*"|!=|=|:|[^\s()=!:"]+)')


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise ValueError(f"cannot parse filter near {text[pos:]!r}")
        tokens.append(m.group(1))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return tokens


Predicate = Callable[[Mapping[str, Any]], bool]


def _resolve(resource: Mapping[str, Any], path: str) -> Any:
    value: Any = resource
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _as_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class _FilterParser:
    """Recursive descent over GCE list-filter syntax (the subset described above)."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ValueError("unexpected end of filter")
        self.pos += 1
        return token

    def parse(self) -> Predicate:
        pred = self.expr()
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()!r} in filter")
        return pred

    def expr(self) -> Predicate:
        terms = [self.and_expr()]
        while self.peek() == "OR":
            self.take()
            terms.append(self.and_expr())
        return terms[0] if len(terms) == 1 else (lambda r: any(t(r) for t in terms))

    def and_expr(self) -> Predicate:
        terms = [self.unary()]
        while self.peek() not in (None, ")", "OR"):
            if self.peek() == "AND":
                self.take()
            terms.append(self.unary())
        return terms[0] if len(terms) == 1 else (lambda r: all(t(r) for t in terms))

    def unary(self) -> Predicate:
        if self.peek() == "(":
            self.take()
            pred = self.expr()
            if self.take() != ")":
                raise ValueError("missing ')' in filter")
            return pred
        return self.comparison()

    def comparison(self) -> Predicate:
        field_name = self.take()
        if not re.match(r"^[A-Za-z_][\w.-]*$", field_name):
            raise ValueError(f"bad field {field_name!r} in filter")
        op = self.take()
        if op not in ("=", "!="):
            raise ValueError(f"unsupported operator {op!r} in filter")
        raw = self.take()
        if raw in ("(", ")", "AND", "OR"):
            raise ValueError("missing value in filter")
        value = json.loads(raw) if raw.startswith('"') else raw
        if op == "=":
            return lambda r: _as_text(_resolve(r, field_name)) == value
        return lambda r: _as_text(_resolve(r, field_name)) != value


def parse_filter(text: str | None) -> Predicate:
    """A predicate for a GCE list ``filter`` (``ValueError`` when unsupported/malformed)."""
    if not text or not text.strip():
        return lambda r: True
    return _FilterParser(_tokenize(text)).parse()


# ----------------------------------------------------------------------------- state records


@dataclass
class _Operation:
    id: str
    name: str
    zone: str
    operation_type: str
    target_link: str
    target_id: str
    insert_s: float
    start_s: float
    done_s: float
    request_id: str | None = None
    errors: list[dict[str, str]] | None = None
    http_status: int | None = None
    http_message: str | None = None
    user: str = "coadapt-test@example.iam.gserviceaccount.com"
    status_message: str | None = None
    bulk_target: int | None = None
    bulk_created: int = 0
    on_start: Callable[[], None] | None = None
    on_done: Callable[[], None] | None = None
    started: bool = False
    finished: bool = False


@dataclass
class _Injected:
    route: str
    status: int
    reason: str
    message: str
    times: int
    zone: str | None
    after_effect: bool


@dataclass
class _InjectedOpError:
    code: str
    message: str
    http_status: int
    times: int


@dataclass(frozen=True)
class RecordedRequest:
    """One request the fake served: route name, path, query parameters and JSON body."""

    method: str
    route: str
    path: str
    query: dict[str, str]
    body: Any


@dataclass
class _Spec:
    machine_type: str
    accelerator: str | None
    accelerator_count: int
    provisioning_model: str
    termination_action: str | None
    labels: dict[str, str]
    resource: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------ server


class FakeGceServer:
    """The fake Compute Engine API (see the module docstring). Thread-safe; start before use."""

    def __init__(
        self,
        project: str = "coadapt-test",
        zones: Iterable[str] = DEFAULT_ZONES,
        *,
        clock: Clock | None = None,
        insert_pending_s: float = 0.5,
        insert_duration_s: float = 3.0,
        delete_duration_s: float = 2.0,
        networks: Iterable[str] = ("default",),
        wait_cap_s: float = 5.0,
        max_recorded_requests: int = 20_000,
        response_latency_s: float = 0.0,
    ) -> None:
        self.project = project
        self.zones = tuple(zones)
        self.clock: Clock = clock or SystemClock()
        self.insert_pending_s = insert_pending_s
        self.insert_duration_s = insert_duration_s
        self.delete_duration_s = delete_duration_s
        self.networks = set(networks)
        self.wait_cap_s = wait_cap_s
        # Real (wall-clock) delay before each response, as a network round trip would add;
        # with ``max_in_flight`` it shows whether a client overlaps its requests.
        self.response_latency_s = response_latency_s
        self.max_in_flight = 0
        self._in_flight = 0
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._instances: dict[str, dict[str, dict[str, Any]]] = {z: {} for z in self.zones}
        self._ops: dict[str, dict[str, _Operation]] = {z: {} for z in self.zones}
        self._active: list[_Operation] = []
        self._request_ids: dict[tuple[str, str], tuple[_Operation, float]] = {}
        self._capacity: dict[tuple[str, str, str], int] = {}
        self._capacity_code: dict[tuple[str, str, str], str] = {}
        self._quota: dict[tuple[str, str], float] = {}
        self._zone_accelerators: dict[str, set[str]] = {
            z: set(ACCELERATOR_TYPES) for z in self.zones
        }
        self._metadata: dict[tuple[str, str], dict[str, str]] = {}
        self._injected: list[_Injected] = []
        self._injected_op: dict[tuple[str, str, str], list[_InjectedOpError]] = {}
        self._ids = itertools.count(5_000_000_000_000_000_000)
        self._ips = itertools.count(2)
        self._counts: Counter[tuple[str, str]] = Counter()
        self._launch_attempts: Counter[tuple[str, str, str, str]] = Counter()
        self.requests: deque[RecordedRequest] = deque(maxlen=max_recorded_requests)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeGceServer:
        """Bind 127.0.0.1 on a free port and serve in a daemon thread."""
        if self._httpd is not None:
            return self
        server = self

        class Handler(_Handler):
            fake = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="fake-gce", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeGceServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>`` (pass as ``client_options.api_endpoint``)."""
        if self._httpd is None:
            raise RuntimeError("the fake GCE server is not started")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def metadata_base_url(self, zone: str, name: str) -> str:
        """Base URL of the metadata server *as seen from* instance ``zone/name``."""
        return f"{self.endpoint}/_metadata/{zone}/{name}"

    # ------------------------------------------------------------------ test hooks

    def _markets(self, market: str | None) -> tuple[str, ...]:
        if market is None:
            return ("SPOT", "STANDARD")
        return ("SPOT",) if market in ("spot", "SPOT") else ("STANDARD",)

    def set_capacity(
        self,
        zone: str,
        machine_type: str,
        count: int,
        *,
        market: str | None = None,
        code: str = "ZONE_RESOURCE_POOL_EXHAUSTED",
    ) -> None:
        """At most ``count`` more instances of that machine type fit in the zone (per market).

        ``market``: ``"spot"``, ``"on-demand"`` or ``None`` for both. ``code`` is the operation
        error code inserts end with once the pool is dry.
        """
        with self._lock:
            for model in self._markets(market):
                self._capacity[(zone, machine_type, model)] = count
                self._capacity_code[(zone, machine_type, model)] = code

    def exhaust(
        self,
        zone: str,
        machine_type: str,
        *,
        market: str | None = None,
        code: str = "ZONE_RESOURCE_POOL_EXHAUSTED",
    ) -> None:
        """No capacity left for that machine type in the zone (per market, or both)."""
        self.set_capacity(zone, machine_type, 0, market=market, code=code)

    def restore(self, zone: str, machine_type: str, *, market: str | None = None) -> None:
        """Unlimited capacity again."""
        with self._lock:
            for model in self._markets(market):
                self._capacity.pop((zone, machine_type, model), None)

    def set_gpu_quota(self, region: str, metric: str, limit: float) -> None:
        """Quota ``metric`` (e.g. ``PREEMPTIBLE_NVIDIA_T4_GPUS``) is ``limit`` GPUs in region."""
        with self._lock:
            self._quota[(region, metric)] = limit

    def reset_faults(self) -> None:
        """Undo every fault hook: capacity limits, quotas, zone accelerator restrictions and
        pending injected errors. Instances and operations stay."""
        with self._lock:
            self._capacity.clear()
            self._capacity_code.clear()
            self._quota.clear()
            self._injected.clear()
            self._injected_op.clear()
            self._zone_accelerators = {z: set(ACCELERATOR_TYPES) for z in self.zones}

    def forget_request_ids(self) -> int:
        """End the de-duplication window of every ``requestId`` seen so far (instances and
        operations stay); returns how many were forgotten."""
        with self._lock:
            n = len(self._request_ids)
            self._request_ids.clear()
            return n

    def set_zone_accelerators(self, zone: str, accelerators: Iterable[str]) -> None:
        """Only these accelerator types exist in ``zone`` (machine types built on others too)."""
        with self._lock:
            self._zone_accelerators[zone] = set(accelerators)

    def inject_error(
        self,
        route: str,
        status: int,
        reason: str,
        message: str | None = None,
        *,
        times: int = 1,
        zone: str | None = None,
        after_effect: bool = False,
    ) -> None:
        """Answer the next ``times`` calls of ``route`` (e.g. ``instances.bulkInsert``) with an
        HTTP error. With ``after_effect`` the call is carried out first and only its response
        is replaced (a lost response, as after a proxy timeout)."""
        with self._lock:
            self._injected.append(
                _Injected(
                    route,
                    status,
                    reason,
                    message or f"injected {reason}",
                    times,
                    zone,
                    after_effect,
                )
            )

    def inject_operation_error(
        self,
        zone: str,
        machine_type: str,
        code: str,
        message: str,
        *,
        http_status: int = 400,
        market: str | None = None,
        times: int = 1,
    ) -> None:
        """The next ``times`` inserts into that pool end with this operation error."""
        with self._lock:
            for model in self._markets(market):
                self._injected_op.setdefault((zone, machine_type, model), []).append(
                    _InjectedOpError(code, message, http_status, times)
                )

    def add_foreign_instance(
        self,
        zone: str | None = None,
        name: str | None = None,
        *,
        machine_type: str = "g2-standard-4",
        labels: Mapping[str, str] | None = None,
        spot: bool = True,
    ) -> str:
        """Create a RUNNING instance directly (not through the API, no counters); its name."""
        with self._lock:
            zone = zone or self.zones[0]
            name = name or f"foreign-{uuid.uuid4().hex[:10]}"
            spec = _Spec(
                machine_type=machine_type,
                accelerator=MACHINE_TYPES[machine_type][2],
                accelerator_count=MACHINE_TYPES[machine_type][3],
                provisioning_model="SPOT" if spot else "STANDARD",
                termination_action="DELETE" if spot else None,
                labels=dict(labels or {}),
            )
            resource = self._new_instance(zone, name, spec, status="RUNNING")
            self._instances[zone][name] = resource
            return name

    def preempt(self, zone: str, name: str) -> str:
        """Preempt instance ``zone/name`` now; returns the system operation's name.

        Records a DONE ``compute.instances.preempted`` operation, sets the instance's metadata
        ``preempted`` to TRUE, then deletes the instance (termination action DELETE) or leaves
        it TERMINATED (STOP). ``KeyError`` if there is no such instance.
        """
        with self._changed:
            self._tick()
            resource = self._instances[zone][name]
            now = self.clock.now_s()
            op = _Operation(
                id=str(next(self._ids)),
                name=f"systemevent-{int(now * 1000)}-{uuid.uuid4().hex[:13]}",
                zone=zone,
                operation_type="compute.instances.preempted",
                target_link=resource["selfLink"],
                target_id=resource["id"],
                insert_s=now,
                start_s=now,
                done_s=now,
                user="system",
                status_message="Instance was preempted.",
                started=True,
                finished=True,
            )
            self._ops[zone][op.name] = op
            meta = self._metadata.setdefault((zone, name), {})
            meta["preempted"] = "TRUE"
            action = (resource.get("scheduling") or {}).get("instanceTerminationAction")
            if action == "DELETE":
                self._remove_instance(zone, name)
            else:
                resource["status"] = "TERMINATED"
            self._changed.notify_all()
            return op.name

    def settle(self) -> None:
        """Finish every operation in flight now (the cloud becomes consistent)."""
        with self._lock:
            now = self.clock.now_s()
            for op in self._active:
                op.start_s = min(op.start_s, now)
                op.done_s = min(op.done_s, now)
            self._tick()

    # ------------------------------------------------------------------ inspection

    def instance(self, zone: str, name: str) -> dict[str, Any] | None:
        """A copy of instance ``zone/name`` as the API would return it, or ``None``."""
        with self._lock:
            self._tick()
            resource = self._instances.get(zone, {}).get(name)
            return json.loads(json.dumps(resource)) if resource else None

    def instances(self) -> list[dict[str, Any]]:
        """Copies of every instance, all zones."""
        with self._lock:
            self._tick()
            return [
                json.loads(json.dumps(r)) for z in self.zones for r in self._instances[z].values()
            ]

    def has_live_instance(self, zone: str, name: str) -> bool:
        """True while ``zone/name`` exists and is not STOPPING/TERMINATED/STOPPED."""
        resource = self.instance(zone, name)
        return resource is not None and resource["status"] in (
            "PROVISIONING",
            "STAGING",
            "RUNNING",
        )

    def request_counts(self) -> dict[tuple[str, str], int]:
        """``{(HTTP method, route name): count}`` of every request served."""
        with self._lock:
            return dict(self._counts)

    def api_calls(self) -> int:
        """Every Compute API call served (metadata-server reads excluded)."""
        with self._lock:
            return sum(n for (_, route), n in self._counts.items() if route != "metadata.get")

    def call_kinds(self) -> dict[str, int]:
        """Compute API calls by kind: ``launch`` (insert, bulkInsert), ``terminate`` (delete),
        ``list`` (instance get/list/aggregatedList), ``operations`` (zone operation
        get/wait/list) and ``other`` (acceleratorTypes). Metadata-server reads excluded."""
        with self._lock:
            out = {k: 0 for k in ("launch", "terminate", "list", "operations", "other")}
            for (_, route), n in self._counts.items():
                kind = _ROUTE_KINDS.get(route)
                if kind is not None:
                    out[kind] += n
            return out

    def launch_attempts(
        self, zone: str, machine_type: str, provisioning_model: str, accelerator: str = ""
    ) -> int:
        """Insert/bulkInsert calls that asked for that pool (``provisioning_model``: SPOT or
        STANDARD; ``accelerator``: the attached GPU of an N1 pool, else empty)."""
        with self._lock:
            return self._launch_attempts[(zone, machine_type, accelerator, provisioning_model)]

    # ------------------------------------------------------------------ time

    def _tick(self) -> None:
        now = self.clock.now_s()
        still: list[_Operation] = []
        for op in self._active:
            if not op.started and now >= op.start_s:
                op.started = True
                if op.on_start is not None:
                    op.on_start()
            if now >= op.done_s:
                op.finished = True
                if op.on_done is not None:
                    op.on_done()
            else:
                still.append(op)
        self._active = still
        expired = [k for k, (_, t) in self._request_ids.items() if now - t > REQUEST_ID_TTL_S]
        for key in expired:
            del self._request_ids[key]

    # ------------------------------------------------------------------ dispatch

    def handle(
        self, method: str, raw_path: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        """Serve one request: ``(status, JSON-able body or text, extra headers)``."""
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            if self.response_latency_s > 0:
                time.sleep(self.response_latency_s)
            return self._handle(method, raw_path, headers, body)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _handle(
        self, method: str, raw_path: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        split = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        for m, pattern, route in _ROUTES:
            match = pattern.match(split.path)
            if match is None or m != method:
                continue
            params = match.groupdict()
            try:
                payload = json.loads(body) if body else None
            except ValueError:
                payload = None
            with self._lock:
                self._counts[(method, route)] += 1
                self.requests.append(RecordedRequest(method, route, split.path, query, payload))
                if route != "metadata.get" and "x-goog-api-client" in {
                    k.lower() for k in headers
                }:  # the adapter's client library (not a test's own request, not a node)
                    ROUTES_SEEN.add(route)
                injected = self._take_injection(route, params.get("zone"))
            if route == "metadata.get":
                return self._metadata_get(params, query, headers)
            try:
                if injected is not None and not injected.after_effect:
                    raise HttpError(injected.status, injected.reason, injected.message)
                result = self._dispatch(route, params, query, payload)
                if injected is not None:
                    raise HttpError(injected.status, injected.reason, injected.message)
                return 200, result, {}
            except HttpError as err:
                return err.status, err.body(), {}
        return (
            404,
            HttpError(404, "notFound", f"The requested URL {split.path} was not found").body(),
            {},
        )

    def _take_injection(self, route: str, zone: str | None) -> _Injected | None:
        for inj in self._injected:
            if inj.route == route and (inj.zone is None or inj.zone == zone):
                inj.times -= 1
                if inj.times <= 0:
                    self._injected.remove(inj)
                return inj
        return None

    def _dispatch(
        self, route: str, params: dict[str, str], query: dict[str, str], payload: Any
    ) -> Any:
        if params.get("project") != self.project:
            raise HttpError(
                404, "notFound", f"The resource 'projects/{params.get('project')}' was not found"
            )
        zone = params.get("zone")
        if zone is not None and zone not in self._instances:
            raise HttpError(
                404,
                "notFound",
                f"The resource 'projects/{self.project}/zones/{zone}' was not found",
            )
        if route == "zoneOperations.wait":
            return self._wait_operation(zone or "", params["op"])
        with self._lock:
            self._tick()
            if route == "instances.insert":
                return self._insert(zone or "", payload or {}, query.get("requestId"))
            if route == "instances.bulkInsert":
                return self._bulk_insert(zone or "", payload or {}, query.get("requestId"))
            if route == "instances.delete":
                return self._delete(zone or "", params["name"], query.get("requestId"))
            if route == "instances.get":
                resource = self._instances[zone or ""].get(params["name"])
                if resource is None:
                    raise self._not_found(zone or "", params["name"])
                return resource
            if route == "instances.list":
                return self._list_instances(query, zones=(zone or "",), aggregated=False)
            if route == "instances.aggregatedList":
                return self._list_instances(query, zones=self.zones, aggregated=True)
            if route == "zoneOperations.get":
                op = self._get_op(zone or "", params["op"])
                return self._op_json(op)
            if route == "zoneOperations.list":
                return self._list_operations(zone or "", query)
            if route == "acceleratorTypes.aggregatedList":
                return self._accelerator_types()
        raise HttpError(400, "badRequest", f"unsupported route {route}")

    # ------------------------------------------------------------------ instances

    def _not_found(self, zone: str, name: str) -> HttpError:
        return HttpError(
            404,
            "notFound",
            f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' was not found",
        )

    def _check_request_id(self, zone: str, request_id: str | None) -> _Operation | None:
        if request_id is None:
            return None
        try:
            parsed = uuid.UUID(request_id)
        except ValueError:
            parsed = None
        if parsed is None or parsed.int == 0 or str(parsed) != request_id.lower():
            raise HttpError(
                400,
                "invalid",
                f"Invalid value for field 'requestId': '{request_id}'. The request ID must be a "
                "valid UUID with the exception that zero UUID is not supported "
                "(00000000-0000-0000-0000-000000000000).",
            )
        seen = self._request_ids.get((zone, request_id))
        return seen[0] if seen else None

    def _validate_spec(self, zone: str, props: Mapping[str, Any], *, bulk: bool) -> _Spec:
        where = "resource.instanceProperties" if bulk else "resource"
        machine_raw = str(props.get("machineType") or "")
        if bulk and "/" in machine_raw:
            raise HttpError(
                400,
                "invalid",
                f"Invalid value for field '{where}.machineType': '{machine_raw}'. "
                "Instance properties take a machine type name, not a URL.",
            )
        machine = _last(machine_raw)
        known = MACHINE_TYPES.get(machine)
        available = self._zone_accelerators.get(zone, set())
        if known is None or (known[2] is not None and known[2] not in available):
            raise HttpError(
                400,
                "invalid",
                f"Invalid value for field '{where}.machineType': '{machine_raw}'. Machine type "
                f"with name '{machine}' does not exist in zone '{zone}'.",
            )
        builtin, builtin_count = known[2], known[3]
        accelerators = props.get("guestAccelerators") or []
        accelerator: str | None = None
        count = 0
        if len(accelerators) > 1:
            raise HttpError(400, "invalid", "At most one accelerator type per instance.")
        if accelerators:
            raw = str(accelerators[0].get("acceleratorType") or "")
            accelerator = _last(raw)
            count = int(accelerators[0].get("acceleratorCount") or 0)
            if accelerator not in ACCELERATOR_TYPES or accelerator not in available:
                raise HttpError(
                    400,
                    "invalid",
                    f"Invalid value for field '{where}.guestAccelerators[0].acceleratorType': "
                    f"'{raw}'. Accelerator type '{accelerator}' does not exist in zone '{zone}'.",
                )
            if not 1 <= count <= ACCELERATOR_TYPES[accelerator][1]:
                raise HttpError(
                    400,
                    "invalid",
                    f"Invalid value for field '{where}.guestAccelerators[0].acceleratorCount': "
                    f"'{count}'.",
                )
            if builtin is not None and (accelerator, count) != (builtin, builtin_count):
                raise HttpError(
                    400,
                    "invalid",
                    f"Machine type '{machine}' comes with {builtin_count} x {builtin}; "
                    "accelerators cannot be changed.",
                )
        if builtin is not None:
            accelerator, count = builtin, builtin_count
        scheduling = props.get("scheduling") or {}
        model = scheduling.get("provisioningModel") or "STANDARD"
        if model not in ("STANDARD", "SPOT"):
            raise HttpError(
                400,
                "invalid",
                f"Invalid value for field '{where}.scheduling.provisioningModel': '{model}'.",
            )
        if accelerator is not None and scheduling.get("onHostMaintenance") != "TERMINATE":
            raise HttpError(
                400,
                "invalid",
                "Instances with guest accelerators do not support live migration.",
            )
        if model == "SPOT" and scheduling.get("automaticRestart", True) is not False:
            raise HttpError(
                400,
                "invalid",
                f"Invalid value for field '{where}.scheduling.automaticRestart': 'true'. Spot "
                "VMs cannot be restarted automatically.",
            )
        action = scheduling.get("instanceTerminationAction")
        if action not in (None, "STOP", "DELETE"):
            raise HttpError(
                400,
                "invalid",
                f"Invalid value for field '{where}.scheduling.instanceTerminationAction': "
                f"'{action}'.",
            )
        labels = dict(props.get("labels") or {})
        if len(labels) > 64:
            raise HttpError(400, "invalid", "Too many labels (at most 64).")
        for key, value in labels.items():
            if not _LABEL_KEY_RE.match(key) or not _LABEL_VALUE_RE.match(str(value)):
                raise HttpError(
                    400,
                    "invalid",
                    f"Invalid value for field '{where}.labels': '{key}={value}'. Label keys and "
                    "values can only contain lowercase letters, numeric characters, underscores "
                    "and dashes.",
                )
        disks = props.get("disks") or []
        boot = [d for d in disks if d.get("boot")]
        if len(boot) != 1 or not (boot[0].get("initializeParams") or {}).get("sourceImage"):
            raise HttpError(
                400,
                "invalid",
                f"Invalid value for field '{where}.disks': exactly one boot disk with "
                "initializeParams.sourceImage is required.",
            )
        nics = props.get("networkInterfaces") or []
        if not nics:
            raise HttpError(
                400, "invalid", f"Invalid value for field '{where}.networkInterfaces': ''."
            )
        for nic in nics:
            network = _last(str(nic.get("network") or "default"))
            if network not in self.networks:
                raise HttpError(
                    404,
                    "notFound",
                    f"The resource 'projects/{self.project}/global/networks/{network}' was "
                    "not found",
                )
        return _Spec(
            machine_type=machine,
            accelerator=accelerator,
            accelerator_count=count,
            provisioning_model=model,
            termination_action=action,
            labels={k: str(v) for k, v in labels.items()},
            resource=dict(props),
        )

    def _new_instance(
        self, zone: str, name: str, spec: _Spec, *, status: str = "PROVISIONING"
    ) -> dict[str, Any]:
        zone_url = f"{GOOGLE_BASE}/projects/{self.project}/zones/{zone}"
        ip = next(self._ips)
        instance_id = str(next(self._ids))
        scheduling = dict(spec.resource.get("scheduling") or {})
        scheduling.setdefault("provisioningModel", spec.provisioning_model)
        scheduling.setdefault("onHostMaintenance", "TERMINATE" if spec.accelerator else "MIGRATE")
        scheduling.setdefault("automaticRestart", spec.provisioning_model != "SPOT")
        scheduling["preemptible"] = False
        if spec.termination_action:
            scheduling["instanceTerminationAction"] = spec.termination_action
        labels = dict(spec.labels)
        metadata_items = list((spec.resource.get("metadata") or {}).get("items") or [])
        boot = next(
            (d for d in spec.resource.get("disks") or [] if d.get("boot")),
            {"initializeParams": {"diskSizeGb": "10"}},
        )
        resource: dict[str, Any] = {
            "kind": "compute#instance",
            "id": instance_id,
            "creationTimestamp": _timestamp(self.clock.now_s()),
            "name": name,
            "zone": zone_url,
            "machineType": f"{zone_url}/machineTypes/{spec.machine_type}",
            "status": status,
            "labels": labels,
            "labelFingerprint": hashlib.sha256(
                json.dumps(labels, sort_keys=True).encode()
            ).hexdigest()[:16],
            "scheduling": scheduling,
            "networkInterfaces": [
                {
                    "kind": "compute#networkInterface",
                    "name": "nic0",
                    "network": f"{GOOGLE_BASE}/projects/{self.project}/global/networks/default",
                    "networkIP": f"10.128.{(ip >> 8) & 255}.{ip & 255}",
                }
            ],
            "disks": [
                {
                    "kind": "compute#attachedDisk",
                    "boot": True,
                    "autoDelete": bool(boot.get("autoDelete", True)),
                    "deviceName": "persistent-disk-0",
                    "index": 0,
                    "mode": "READ_WRITE",
                    "type": "PERSISTENT",
                    "diskSizeGb": str(
                        (boot.get("initializeParams") or {}).get("diskSizeGb") or "10"
                    ),
                    "source": f"{zone_url}/disks/{name}",
                }
            ],
            "metadata": {
                "kind": "compute#metadata",
                "fingerprint": uuid.uuid4().hex[:16],
                "items": metadata_items,
            },
            "selfLink": f"{zone_url}/instances/{name}",
            "cpuPlatform": "Intel Cascade Lake",
            "deletionProtection": False,
            "startRestricted": False,
        }
        if spec.accelerator:
            resource["guestAccelerators"] = [
                {
                    "acceleratorType": f"{zone_url}/acceleratorTypes/{spec.accelerator}",
                    "acceleratorCount": spec.accelerator_count,
                }
            ]
        self._metadata[(zone, name)] = {
            "preempted": "FALSE",
            "name": name,
            "zone": f"projects/123456789012/zones/{zone}",
            "id": instance_id,
            "machine-type": f"projects/123456789012/machineTypes/{spec.machine_type}",
        }
        return resource

    def _remove_instance(self, zone: str, name: str) -> None:
        resource = self._instances[zone].pop(name, None)
        if resource is None:
            return
        model = (resource.get("scheduling") or {}).get("provisioningModel", "STANDARD")
        key = (zone, _last(resource["machineType"]), model)
        if key in self._capacity:
            self._capacity[key] += 1

    def _quota_room(self, zone: str, spec: _Spec) -> tuple[str, int | None]:
        """(quota metric, how many more instances of ``spec`` fit; None = unlimited)."""
        if spec.accelerator is None:
            return "", None
        infix = ACCELERATOR_TYPES[spec.accelerator][0]
        metric = f"{'PREEMPTIBLE_' if spec.provisioning_model == 'SPOT' else ''}NVIDIA_{infix}_GPUS"
        region = _region(zone)
        limit = self._quota.get((region, metric))
        if limit is None:
            return metric, None
        used = 0
        for z, instances in self._instances.items():
            if _region(z) != region:
                continue
            for r in instances.values():
                if r["status"] in ("TERMINATED", "STOPPED"):
                    continue
                accs = r.get("guestAccelerators") or []
                model = (r.get("scheduling") or {}).get("provisioningModel", "STANDARD")
                if (
                    accs
                    and _last(accs[0]["acceleratorType"]) == spec.accelerator
                    and (model == spec.provisioning_model)
                ):
                    used += int(accs[0]["acceleratorCount"])
        return metric, max(0, int((limit - used) // spec.accelerator_count))

    def _new_op(
        self,
        zone: str,
        operation_type: str,
        target_link: str,
        target_id: str,
        request_id: str | None,
        duration_s: float,
        pending_s: float,
    ) -> _Operation:
        now = self.clock.now_s()
        op = _Operation(
            id=str(next(self._ids)),
            name=f"operation-{int(now * 1000)}-{uuid.uuid4().hex[:13]}-{uuid.uuid4().hex[:8]}",
            zone=zone,
            operation_type=operation_type,
            target_link=target_link,
            target_id=target_id,
            insert_s=now,
            start_s=now + pending_s,
            done_s=now + max(duration_s, pending_s),
            request_id=request_id,
        )
        self._ops[zone][op.name] = op
        self._active.append(op)
        if request_id is not None:
            self._request_ids[(zone, request_id)] = (op, now)
        return op

    def _create_outcome(
        self, zone: str, spec: _Spec, wanted: int, minimum: int
    ) -> tuple[int, tuple[str, str, int] | None]:
        """How many instances to create, or the operation error that stops the call."""
        key = (zone, spec.machine_type, spec.provisioning_model)
        injected = self._injected_op.get(key)
        if injected:
            inj = injected[0]
            inj.times -= 1
            if inj.times <= 0:
                injected.pop(0)
            return 0, (inj.code, inj.message, inj.http_status)
        capacity = self._capacity.get(key)
        metric, quota_room = self._quota_room(zone, spec)
        n = wanted
        if capacity is not None:
            n = min(n, capacity)
        if n < minimum or n == 0:
            code = self._capacity_code.get(key, "ZONE_RESOURCE_POOL_EXHAUSTED")
            return 0, (
                code,
                f"The zone 'projects/{self.project}/zones/{zone}' does not have enough "
                "resources available to fulfill the request.  Try a different zone, or try "
                "again later.",
                503,
            )
        if quota_room is not None and quota_room < minimum:
            limit = self._quota[(_region(zone), metric)]
            return 0, (
                "QUOTA_EXCEEDED",
                f"Quota '{metric}' exceeded.  Limit: {float(limit)} in region {_region(zone)}.",
                403,
            )
        if quota_room is not None:
            n = min(n, quota_room)
        if capacity is not None:
            self._capacity[key] = capacity - n
        return n, None

    def _record_launch(self, zone: str, spec: _Spec) -> None:
        attached = spec.accelerator if MACHINE_TYPES[spec.machine_type][2] is None else None
        self._launch_attempts[
            (zone, spec.machine_type, attached or "", spec.provisioning_model)
        ] += 1

    def _creation_callbacks(self, zone: str, names: list[str], op: _Operation) -> None:
        def started() -> None:
            for name in names:
                r = self._instances[zone].get(name)
                if r is not None and r["status"] == "PROVISIONING":
                    r["status"] = "STAGING"

        def done() -> None:
            for name in names:
                r = self._instances[zone].get(name)
                if r is not None and r["status"] in ("PROVISIONING", "STAGING"):
                    r["status"] = "RUNNING"
                    r["lastStartTimestamp"] = _timestamp(self.clock.now_s())

        op.on_start, op.on_done = started, done

    def _insert(self, zone: str, body: Mapping[str, Any], request_id: str | None) -> Any:
        replay = self._check_request_id(zone, request_id)
        if replay is not None:
            return self._op_json(replay)
        name = str(body.get("name") or "")
        if not _NAME_RE.match(name):
            raise HttpError(
                400,
                "invalid",
                f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19})'",
            )
        spec = self._validate_spec(zone, body, bulk=False)
        if name in self._instances[zone]:
            raise HttpError(
                409,
                "alreadyExists",
                f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' already "
                "exists",
            )
        self._record_launch(zone, spec)
        n, error = self._create_outcome(zone, spec, 1, 1)
        target = f"{GOOGLE_BASE}/projects/{self.project}/zones/{zone}/instances/{name}"
        if error is not None or n == 0:
            op = self._new_op(
                zone,
                "insert",
                target,
                "",
                request_id,
                self.insert_duration_s,
                self.insert_pending_s,
            )
            code, message, status = error or ("ZONE_RESOURCE_POOL_EXHAUSTED", "", 503)
            op.errors = [{"code": code, "message": message}]
            op.http_status, op.http_message = status, _http_message(status)
            return self._op_json(op)
        resource = self._new_instance(zone, name, spec)
        self._instances[zone][name] = resource
        op = self._new_op(
            zone,
            "insert",
            target,
            resource["id"],
            request_id,
            self.insert_duration_s,
            self.insert_pending_s,
        )
        self._creation_callbacks(zone, [name], op)
        return self._op_json(op)

    def _bulk_insert(self, zone: str, body: Mapping[str, Any], request_id: str | None) -> Any:
        replay = self._check_request_id(zone, request_id)
        if replay is not None:
            return self._op_json(replay)
        if body.get("sourceInstanceTemplate") and not body.get("instanceProperties"):
            raise HttpError(400, "invalid", "sourceInstanceTemplate is not supported by this fake")
        props = body.get("instanceProperties")
        if not isinstance(props, Mapping):
            raise HttpError(
                400, "invalid", "Invalid value for field 'resource.instanceProperties': ''."
            )
        try:
            count = int(body.get("count") or 0)
            minimum = int(body.get("minCount") or count)
        except (TypeError, ValueError) as exc:
            raise HttpError(400, "invalid", "count and minCount must be integers") from exc
        per_instance = dict(body.get("perInstanceProperties") or {})
        pattern = body.get("namePattern")
        if count < 1 or count > 5000 or not 1 <= minimum <= count:
            raise HttpError(
                400,
                "invalid",
                f"Invalid value for field 'resource.count': '{count}' (minCount {minimum}).",
            )
        if not per_instance and not pattern:
            raise HttpError(
                400, "invalid", "Either namePattern or perInstanceProperties must be set."
            )
        if len(per_instance) > count or (not pattern and len(per_instance) != count):
            raise HttpError(
                400,
                "invalid",
                "The number of perInstanceProperties must equal count when namePattern is "
                "not set, and may not exceed it.",
            )
        names = sorted(per_instance)
        for name in names:
            if not _NAME_RE.match(name):
                raise HttpError(
                    400,
                    "invalid",
                    f"Invalid value for field 'resource.perInstanceProperties': '{name}'.",
                )
            if name in self._instances[zone]:
                raise HttpError(
                    409,
                    "alreadyExists",
                    f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' "
                    "already exists",
                )
        if pattern:
            names += self._names_from_pattern(zone, str(pattern), count - len(names), names)
        spec = self._validate_spec(zone, props, bulk=True)
        self._record_launch(zone, spec)
        n, error = self._create_outcome(zone, spec, count, minimum)
        target = f"{GOOGLE_BASE}/projects/{self.project}/zones/{zone}/instances"
        op = self._new_op(
            zone,
            "bulkInsert",
            target,
            "",
            request_id,
            self.insert_duration_s,
            self.insert_pending_s,
        )
        op.bulk_target = count
        if error is not None:
            code, message, status = error
            op.errors = [{"code": code, "message": message}]
            op.http_status, op.http_message = status, _http_message(status)
            return self._op_json(op)
        created = names[:n]
        for name in created:
            self._instances[zone][name] = self._new_instance(zone, name, spec)
        op.bulk_created = n
        self._creation_callbacks(zone, created, op)
        return self._op_json(op)

    def _names_from_pattern(
        self, zone: str, pattern: str, count: int, taken: list[str]
    ) -> list[str]:
        m = re.fullmatch(r"([a-z0-9-]*?)(#{1,18})([a-z0-9-]*)", pattern)
        if m is None or pattern.count("#") != len(m.group(2)):
            raise HttpError(
                400, "invalid", f"Invalid value for field 'resource.namePattern': '{pattern}'."
            )
        head, hashes, tail = m.groups()
        rx = re.compile(re.escape(head) + rf"(\d{{{len(hashes)}}})" + re.escape(tail) + "$")
        existing = [int(x.group(1)) for n in self._instances[zone] if (x := rx.match(n))]
        start = max(existing, default=0) + 1
        out = [f"{head}{i:0{len(hashes)}d}{tail}" for i in range(start, start + count)]
        return [n for n in out if n not in taken]

    def _delete(self, zone: str, name: str, request_id: str | None) -> Any:
        replay = self._check_request_id(zone, request_id)
        if replay is not None:
            return self._op_json(replay)
        resource = self._instances[zone].get(name)
        if resource is None:
            raise self._not_found(zone, name)
        resource["status"] = "STOPPING"
        op = self._new_op(
            zone,
            "delete",
            resource["selfLink"],
            resource["id"],
            request_id,
            self.delete_duration_s,
            0.0,
        )
        op.on_done = lambda: self._remove_instance(zone, name)
        return self._op_json(op)

    def _page(
        self, items: list[Any], query: Mapping[str, str], filter_text: str
    ) -> tuple[list[Any], str | None]:
        try:
            max_results = int(query.get("maxResults") or 500)
        except ValueError as exc:
            raise HttpError(400, "invalid", "Invalid value for field 'maxResults'") from exc
        if not 0 <= max_results <= 500:
            raise HttpError(
                400,
                "invalid",
                f"Invalid value for field 'maxResults': '{max_results}'. Must be less than or "
                "equal to 500",
            )
        max_results = max_results or 500
        fingerprint = hashlib.sha256(filter_text.encode()).hexdigest()[:8]
        offset = 0
        token = query.get("pageToken")
        if token:
            try:
                fp, _, raw = base64.urlsafe_b64decode(token.encode()).decode().partition(":")
                offset = int(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise HttpError(400, "invalid", "Invalid value for field 'pageToken'") from exc
            if fp != fingerprint or offset < 0:
                raise HttpError(400, "invalid", "Invalid value for field 'pageToken'")
        page = items[offset : offset + max_results]
        nxt = offset + max_results
        next_token = (
            base64.urlsafe_b64encode(f"{fingerprint}:{nxt}".encode()).decode()
            if nxt < len(items)
            else None
        )
        return page, next_token

    def _predicate(self, query: Mapping[str, str]) -> Predicate:
        try:
            return parse_filter(query.get("filter"))
        except ValueError as exc:
            raise HttpError(
                400, "invalid", f"Invalid list filter expression '{query.get('filter')}': {exc}"
            ) from exc

    def _list_instances(
        self, query: Mapping[str, str], *, zones: tuple[str, ...], aggregated: bool
    ) -> Any:
        pred = self._predicate(query)
        matches = [(z, r) for z in zones for _, r in sorted(self._instances[z].items()) if pred(r)]
        page, token = self._page(matches, query, query.get("filter", ""))
        base = f"{GOOGLE_BASE}/projects/{self.project}"
        if not aggregated:
            out: dict[str, Any] = {
                "kind": "compute#instanceList",
                "id": f"projects/{self.project}/zones/{zones[0]}/instances",
                "items": [r for _, r in page],
                "selfLink": f"{base}/zones/{zones[0]}/instances",
            }
        else:
            items: dict[str, Any] = {}
            for z in zones:
                on_page = [r for zz, r in page if zz == z]
                if on_page:
                    items[f"zones/{z}"] = {"instances": on_page}
                else:
                    items[f"zones/{z}"] = {
                        "warning": {
                            "code": "NO_RESULTS_ON_PAGE",
                            "message": f"There are no results for scope 'zones/{z}' on this page.",
                            "data": [{"key": "scope", "value": f"zones/{z}"}],
                        }
                    }
            out = {
                "kind": "compute#instanceAggregatedList",
                "id": f"projects/{self.project}/aggregated/instances",
                "items": items,
                "selfLink": f"{base}/aggregated/instances",
            }
        if token:
            out["nextPageToken"] = token
        return out

    # ------------------------------------------------------------------ operations

    def _get_op(self, zone: str, name: str) -> _Operation:
        op = self._ops[zone].get(name)
        if op is None:
            raise HttpError(
                404,
                "notFound",
                f"The resource 'projects/{self.project}/zones/{zone}/operations/{name}' was "
                "not found",
            )
        return op

    def _op_json(self, op: _Operation) -> dict[str, Any]:
        now = self.clock.now_s()
        if op.finished or now >= op.done_s:
            status, progress = "DONE", 100
        elif now >= op.start_s:
            status, progress = "RUNNING", 50
        else:
            status, progress = "PENDING", 0
        zone_url = f"{GOOGLE_BASE}/projects/{self.project}/zones/{op.zone}"
        out: dict[str, Any] = {
            "kind": "compute#operation",
            "id": op.id,
            "name": op.name,
            "zone": zone_url,
            "operationType": op.operation_type,
            "targetLink": op.target_link,
            "status": status,
            "user": op.user,
            "progress": progress,
            "insertTime": _timestamp(op.insert_s),
            "selfLink": f"{zone_url}/operations/{op.name}",
        }
        if op.target_id:
            out["targetId"] = op.target_id
        if op.request_id:
            out["clientOperationId"] = op.request_id
        if op.status_message:
            out["statusMessage"] = op.status_message
        if status != "PENDING":
            out["startTime"] = _timestamp(op.start_s)
        if status == "DONE":
            out["endTime"] = _timestamp(op.done_s)
            if op.errors:
                out["error"] = {"errors": op.errors}
                out["httpErrorStatusCode"] = op.http_status
                out["httpErrorMessage"] = op.http_message
        if op.bulk_target is not None:
            done = status == "DONE"
            out["instancesBulkInsertOperationMetadata"] = {
                "perLocationStatus": {
                    f"zones/{op.zone}": {
                        "status": "DONE" if done else "CREATING",
                        "targetVmCount": op.bulk_target,
                        "createdVmCount": op.bulk_created if done else 0,
                        "failedToCreateVmCount": (op.bulk_target - op.bulk_created) if done else 0,
                        "deletedVmCount": 0,
                    }
                }
            }
        return out

    def _wait_operation(self, zone: str, name: str) -> Any:
        with self._lock:
            self._tick()
            op = self._get_op(zone, name)
            remaining = max(0.0, op.done_s - self.clock.now_s())
        if remaining > 0:
            advance = getattr(self.clock, "advance", None)
            if callable(advance):
                advance(min(remaining, WAIT_MAX_S))  # a FakeClock: the call "blocked" that long
            else:
                time.sleep(min(remaining, WAIT_MAX_S, self.wait_cap_s))
        with self._lock:
            self._tick()
            return self._op_json(op)

    def _list_operations(self, zone: str, query: Mapping[str, str]) -> Any:
        pred = self._predicate(query)
        ops = sorted(self._ops[zone].values(), key=lambda o: (o.insert_s, o.name))
        rendered = [j for j in (self._op_json(o) for o in ops) if pred(j)]
        page, token = self._page(rendered, query, query.get("filter", ""))
        out: dict[str, Any] = {
            "kind": "compute#operationList",
            "id": f"projects/{self.project}/zones/{zone}/operations",
            "items": page,
            "selfLink": f"{GOOGLE_BASE}/projects/{self.project}/zones/{zone}/operations",
        }
        if token:
            out["nextPageToken"] = token
        return out

    def _accelerator_types(self) -> Any:
        items: dict[str, Any] = {}
        for zone in self.zones:
            zone_url = f"{GOOGLE_BASE}/projects/{self.project}/zones/{zone}"
            items[f"zones/{zone}"] = {
                "acceleratorTypes": [
                    {
                        "kind": "compute#acceleratorType",
                        "name": name,
                        "zone": zone_url,
                        "maximumCardsPerInstance": ACCELERATOR_TYPES[name][1],
                        "selfLink": f"{zone_url}/acceleratorTypes/{name}",
                    }
                    for name in sorted(self._zone_accelerators[zone])
                ]
            }
        return {"kind": "compute#acceleratorTypeAggregatedList", "items": items}

    # ------------------------------------------------------------------ metadata server

    def _metadata_get(
        self, params: Mapping[str, str], query: Mapping[str, str], headers: Mapping[str, str]
    ) -> tuple[int, Any, dict[str, str]]:
        if headers.get("metadata-flavor", "").lower() != "google":
            return 403, "Missing Metadata-Flavor:Google header.\n", {}
        key = (params["zone"], params["name"])
        attr = params["key"]
        deadline = time.monotonic() + min(
            float(query.get("timeout_sec") or self.wait_cap_s), self.wait_cap_s
        )
        with self._changed:
            meta = self._metadata.get(key)
            if meta is None or attr not in meta:
                return 404, "Not Found\n", {}
            value = meta[attr]
            etag = hashlib.sha256(value.encode()).hexdigest()[:16]
            if query.get("wait_for_change", "").lower() == "true":
                last = query.get("last_etag") or etag
                while etag == last and not self._stopping:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
                    value = self._metadata[key][attr]
                    etag = hashlib.sha256(value.encode()).hexdigest()[:16]
        return 200, value, {"ETag": etag, "Metadata-Flavor": "Google"}


def _http_message(status: int) -> str:
    return {403: "FORBIDDEN", 503: "SERVICE UNAVAILABLE", 400: "BAD REQUEST"}.get(status, "ERROR")


class _Handler(BaseHTTPRequestHandler):
    """Adapts http.server to ``FakeGceServer.handle`` (HTTP/1.1 keep-alive, JSON bodies)."""

    fake: FakeGceServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms stalls

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, payload, extra = self.fake.handle(self.command, self.path, headers, body)
        if isinstance(payload, str):
            data = payload.encode()
            content_type = "application/text"
        else:
            data = json.dumps(payload).encode()
            content_type = "application/json; charset=UTF-8"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in extra.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    do_GET = _serve
    do_POST = _serve
    do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet: tests read counters, not logs


__all__ = [
    "ACCELERATOR_TYPES",
    "DEFAULT_ZONES",
    "MACHINE_TYPES",
    "FakeGceServer",
    "HttpError",
    "RecordedRequest",
    "parse_filter",
]
