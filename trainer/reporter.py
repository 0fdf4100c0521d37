"""Sends :class:`~trainer.report.TrainerReport` payloads: HTTP to the controller, or a file.

A :class:`Reporter` runs on rank 0 only, in a daemon thread that wakes every ``interval_s``
(measured on the injected clock), asks a ``build`` callable for the current report (which must
only read host-side values: no tensor access, so no device synchronisation), and delivers it.
Delivery never raises into training: failures are logged (at most once a minute) and the next
report is attempted on schedule. The controller's :class:`~trainer.report.ReportReply` is handed
to ``on_reply``. Torch-free.

A scheduled report may be sent inside a ``reply_window`` (a context manager the reporter enters
around sending it and handling its reply; the final report at exit is not): the job's step loop
uses it so that the ranks agree on a reply's batch within a step of its arrival
(:meth:`trainer.stepping.StepLoop.reply_window`). It may hold a report back, for a bounded time.

A controller that refuses a report with 429 (too many reports from this job: see
``autoscaler.controller.ratelimit``) says in ``Retry-After`` how many seconds to wait; the
reporter sends nothing until then (also no final report at exit; at most
:data:`MAX_RETRY_AFTER_S` whatever the header says, one report interval when it cannot be
read), then goes on on schedule.

:class:`HttpSink` carries the job's report credential (good for this job's reports only) and
never follows a redirect: a controller, or anything posing as one, that answers with a 3xx gets
the credential no further (urllib's default opener would re-send it to the ``Location``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from coadapt_common.clock import Clock, SystemClock
from coadapt_common.http import credential_opener
from trainer.errors import ReportSchemaError, ReportThrottledError, TrainerConfigError
from trainer.report import ReportReply, TrainerReport, report_path

logger = logging.getLogger("trainer.reporter")

MAX_RETRY_AFTER_S = 600.0
"""The longest back-off a ``Retry-After`` may ask for (a longer one is cut to this)."""


def parse_retry_after(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` header given in seconds (``None``: absent, or not a
    number of seconds), within ``[0, MAX_RETRY_AFTER_S]``."""
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 12:
        return None
    return min(float(int(text)), MAX_RETRY_AFTER_S)


class ReportSink(Protocol):
    def send(self, report: TrainerReport) -> ReportReply | None: ...


MAX_CONTROLLER_URLS = 16
"""The most addresses an :class:`HttpSink` takes (what ``coadapt up --api-urls`` allows)."""


class HttpSink:
    """POSTs JSON to ``{controller_url}/v1/jobs/{job_id}/reports``; parses the reply. It
    authenticates as a bearer with ``token``, or with the credential in ``token_file`` (what
    the agent names in ``COADAPT_REPORT_TOKEN_FILE``), read again before every report so that
    a credential the agent renewed is used without a restart. No proxy, no redirect (see the
    module docstring); the token is never part of the sink's repr or of an error it raises.

    ``controller_url`` may list several addresses, comma-separated (a controller pair's, as
    ``coadapt up --api-urls`` gives its agents): a report goes to the first that answers,
    tried in turn when one cannot be reached (a refused or timed-out connection, an unknown
    host); the one that answered is tried first next time. An HTTP error answer is the
    controller's and is raised at once."""

    def __init__(
        self,
        controller_url: str,
        job_id: str,
        *,
        timeout_s: float = 5.0,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
    ) -> None:
        urls = [u.strip() for u in controller_url.split(",") if u.strip()]
        if not urls or len(urls) > MAX_CONTROLLER_URLS:
            raise TrainerConfigError(
                f"give 1-{MAX_CONTROLLER_URLS} http(s) URLs, comma-separated: "
                f"{controller_url[:200]!r}",
                field="url",
            )
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise TrainerConfigError(f"not an http(s) URL: {url!r}", field="url")
        if token and token_file:
            raise TrainerConfigError("give a token or a token file, not both", field="token")
        self.urls = [u.rstrip("/") + report_path(job_id) for u in urls]
        self.timeout_s = timeout_s
        self._token = token or None
        self._token_file = Path(token_file) if token_file else None
        self._opener = credential_opener()

    @property
    def url(self) -> str:
        """The report URL tried first (the last that answered)."""
        return self.urls[0]

    def __repr__(self) -> str:
        return f"HttpSink({','.join(self.urls)!r})"

    def _bearer(self) -> str | None:
        if self._token_file is None:
            return self._token
        try:
            token = self._token_file.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as e:  # an OSError: the Reporter logs and retries
            raise OSError(f"cannot read the report credential {self._token_file}: {e}") from e
        return token or None

    def send(self, report: TrainerReport) -> ReportReply | None:
        headers = {"Content-Type": "application/json"}
        token = self._bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        body = report.to_json().encode()
        for i, url in enumerate(self.urls):
            request = urllib.request.Request(url, data=body, method="POST", headers=headers)
            try:
                with self._opener.open(request, timeout=self.timeout_s) as response:
                    reply = ReportReply.from_json(response.read())
            except urllib.error.HTTPError as e:
                if e.code != 429:
                    raise
                wait_s = parse_retry_after(e.headers.get("Retry-After") if e.headers else None)
                raise ReportThrottledError(-1.0 if wait_s is None else wait_s) from None
            except OSError:  # unreachable (URLError, a timeout): the next address
                if i == len(self.urls) - 1:
                    raise
                continue
            if i:
                self.urls.insert(0, self.urls.pop(i))
            return reply
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover


class FileSink:
    """Appends one JSON line per report to a local file (standalone mode)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def send(self, report: TrainerReport) -> ReportReply | None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = report.to_json() + "\n"
        # One write() of a line in append mode: concurrent appenders never interleave lines.
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
        return None


class Reporter:
    """Periodic delivery in a background thread (see module docstring)."""

    def __init__(
        self,
        sink: ReportSink,
        build: Callable[[], TrainerReport],
        *,
        interval_s: float,
        clock: Clock | None = None,
        on_reply: Callable[[ReportReply], None] | None = None,
        reply_window: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        if not interval_s > 0:
            raise TrainerConfigError("must be > 0", field="report_interval_s")
        self.sink = sink
        self._build = build
        self._interval_s = interval_s
        self._clock = clock or SystemClock()
        self._on_reply = on_reply
        self._reply_window = reply_window
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._send_lock = threading.Lock()
        self._last_error_s = -1e18
        self._quiet_until_s = -1e18  # monotonic: no report before (a 429's Retry-After)
        self.sent = 0
        self.failed = 0
        self.throttled = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="coadapt-reporter", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        next_s = self._clock.monotonic_s() + self._interval_s
        while not self._stopped:
            wait_s = max(next_s, self._quiet_until_s) - self._clock.monotonic_s()
            if wait_s > 0:
                self._wake.wait(wait_s)
                continue
            if self._reply_window is None:
                self.send_now()
            else:
                with self._reply_window():
                    self.send_now()
            next_s = self._clock.monotonic_s() + self._interval_s

    def send_now(self) -> ReportReply | None:
        """Build and deliver one report now (also used for the final report at exit); none
        while the controller asked to wait (a 429's ``Retry-After``)."""
        with self._send_lock:
            if self._clock.monotonic_s() < self._quiet_until_s:
                self.throttled += 1
                return None
            try:
                report = self._build()
                reply = self.sink.send(report)
            except ReportThrottledError as e:
                self.throttled += 1
                wait_s = self._interval_s if e.retry_after_s < 0 else e.retry_after_s
                now = self._clock.monotonic_s()
                self._quiet_until_s = now + wait_s
                if now - self._last_error_s >= 60.0:
                    self._last_error_s = now
                    logger.warning("the controller throttles reports: none for %g s", wait_s)
                return None
            except (OSError, urllib.error.URLError, ReportSchemaError, ValueError) as e:
                self.failed += 1
                now = self._clock.monotonic_s()
                if now - self._last_error_s >= 60.0:
                    self._last_error_s = now
                    logger.warning("report delivery failed (%s); will retry", e)
                return None
            self.sent += 1
        if reply is not None and self._on_reply is not None:
            self._on_reply(reply)
        return reply

    def stop(self, *, final: bool = True) -> None:
        """Stop the thread; optionally deliver one last report first."""
        self._stopped = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if final:
            self.send_now()


def read_reports(path: str | os.PathLike[str]) -> list[TrainerReport]:
    """Parse a standalone report file (one JSON report per line)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            out.append(TrainerReport.from_dict(json.loads(line)))
    return out
