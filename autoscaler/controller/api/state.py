"""What the API's handlers share: the store (one per thread), the clock, the credentials, the
logs folder, the service it runs in and the agents' addresses; and the shape of a route.

The app opens its own :class:`~autoscaler.controller.store.Store` per thread on the store file
(a store is bound to the thread that made it): the file is checked once, when the app is made
(:meth:`Store.open`), and each thread's store comes from :meth:`Store.for_thread`. The agents'
addresses (given with ``register`` or ``heartbeat``) are kept in memory, so each heartbeat
restates them (the store has no column for them yet).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from werkzeug.wrappers import Request, Response

from autoscaler.controller.api.wire import read_body
from autoscaler.controller.credentials import CredentialSource, Role
from autoscaler.controller.metrics import ControllerMetrics
from autoscaler.controller.store import JobStatus, Store
from coadapt_common.clock import Clock

__all__ = ["ApiState", "Handler", "JobExitHandler", "Route", "ServiceControl"]


@dataclass(frozen=True)
class ServiceControl:
    """The service an API runs in, for ``coadapt down``: ``identity`` (``pid``, ``started``:
    the kernel's start time of that pid, ``cmdline``) and ``request_down``, called when a
    user asks it to release its fleet and stop."""

    identity: Mapping[str, Any]
    request_down: Callable[[], None]


class JobExitHandler(Protocol):
    """What the app calls when an agent reports that a running job's processes ended on
    their own (``Controller.job_exited``): returns the job's new status. ``deterministic``
    (a failure that cannot succeed when run again: the job is failed, not retried) is passed
    only when true."""

    def __call__(self, name: str, *, failed: bool, deterministic: bool = False) -> JobStatus: ...


class ApiState:
    """The state of one app, for its handlers (see the module docstring). Thread-safe:
    each thread uses its own store; :attr:`exit_lock` serialises job exits."""

    def __init__(
        self,
        store: Store,
        credentials: CredentialSource,
        clock: Clock,
        *,
        logs_dir: Path,
        on_job_exit: JobExitHandler,
        max_body_bytes: int,
        service: ServiceControl | None,
        checkpoints_dir: Path | None = None,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        # Checked when opened, kept open (and unused but by for_thread) until close(): while
        # it is open, its write-ahead log is the one every thread's store must find.
        self._template = store
        self.credentials = credentials
        self.clock = clock
        self.logs_dir = logs_dir
        self.checkpoints_dir = checkpoints_dir
        self.on_job_exit = on_job_exit
        self.max_body_bytes = max_body_bytes
        self.service = service
        self.metrics = metrics or ControllerMetrics()
        self.exit_lock = threading.Lock()
        self._local = threading.local()
        self._addresses: dict[str, str] = {}
        self._addresses_lock = threading.Lock()

    def store(self) -> Store:
        """The calling thread's store (opened on its first call)."""
        store: Store | None = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = self._template.for_thread()
        else:
            store.ensure_present()
        return store

    def close_thread_store(self) -> None:
        """Close the calling thread's store, if it has one (a worker thread that ends)."""
        store = getattr(self._local, "store", None)
        if store is not None:
            self._local.store = None
            store.close()

    def close(self) -> None:
        """Close the calling thread's store and the store the app was made with."""
        self.close_thread_store()
        self._template.close()

    def body(self, request: Request, *, optional: bool = False) -> dict[str, Any]:
        """The request's body as a JSON object, within the app's ``max_body_bytes``
        (:func:`~autoscaler.controller.api.wire.read_body`)."""
        return read_body(request, self.max_body_bytes, optional=optional)

    def remember(self, instance_key: str, address: str | None) -> None:
        """Keep ``instance_key``'s agent's address (``None``: keep the one known)."""
        if address is not None:
            with self._addresses_lock:
                self._addresses[instance_key] = address

    def addresses(self) -> dict[str, str]:
        """The agents' addresses by instance key (a copy)."""
        with self._addresses_lock:
            return dict(self._addresses)


Handler = Callable[..., Response]
"""A route's handler: ``handler(state, request, **path_arguments)``."""
Route = tuple[str, str, Role | frozenset[Role], Handler]
"""``(method, path, role, handler)``: a path's ``<name>`` parts are the handler's arguments;
``role`` is the one role the route takes, or the set of them (``GET /metrics``)."""
