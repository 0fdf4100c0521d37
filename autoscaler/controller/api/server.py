"""The API's HTTP server: the app on Waitress, with bounded threads and connection limits.

:func:`serve` runs an :class:`~autoscaler.controller.api.app.ApiApp` on Waitress: one event loop
reads every connection, and only complete requests reach a bounded pool of worker threads, each
with its own store (closed when the worker ends); idle and slow connections time out
(:class:`ServerLimits`). A request the server refuses before the app sees it (malformed, headers
or a body too large) is answered in JSON like every other.
"""

from __future__ import annotations

import contextlib
import json
import logging
import resource
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask, ThreadedTaskDispatcher
from waitress.wasyncore import close_all

from autoscaler.controller.api.app import ApiApp
from autoscaler.errors import InvalidInputError

__all__ = ["ApiServer", "ServerLimits", "serve"]

_BODY_SLACK_BYTES: Final = 64 * 1024


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

    def close_connections(self) -> None:
        """Close every connection and the listening socket (run it on the serving thread)."""
        close_all(self._map)

    def answering(self) -> bool:
        """Whether a connection has a request in progress or bytes still to send."""
        for _ in range(3):  # the serving thread may change the map while we read it
            try:
                channels = [ch for ch in list(self._map.values()) if ch is not self]
                break
            except RuntimeError:
                continue
        else:
            return True
        return any(
            getattr(ch, "requests", None) or getattr(ch, "total_outbufs_len", 0) for ch in channels
        )


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
            while server.answering() and time.monotonic() < deadline:
                time.sleep(0.02)
            server.trigger.pull_trigger(server.close_connections)
            self._thread.join(timeout=10.0)
        self._server.task_dispatcher.shutdown(timeout=5)
        sock = self._server.socket
        if sock is not None:  # closed by the loop already, unless it never ran
            with contextlib.suppress(OSError):
                sock.close()

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
