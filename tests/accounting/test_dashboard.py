"""The dashboard `coadapt up` serves, loaded in headless Chromium against a real API server:
with the user token (in the URL fragment) it shows the jobs, the fleet and the cost; without
it, the API's refusal and no data. Skipped only where no Chromium binary exists."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import select
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from autoscaler.controller.api import MAX_JOBS_PAGE, ApiClient, generate_tokens, make_app, serve
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.store import JobStatus, Store
from coadapt_common.clock import FakeClock
from tests.accounting.report.test_html_chromium import FLAGS, _chromium


def _dom(url: str) -> str:
    out = subprocess.run(
        [_chromium(), *FLAGS, "--virtual-time-budget=8000", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.slow
def test_the_dashboard_shows_jobs_fleet_and_cost_only_with_the_token(tmp_path: Path) -> None:
    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", "c1", clock)
    row = store.add_instance(
        instance_key="i-dash1",
        request_id="c1-i-dash1",
        offering_key="local/local-2gpu/local-a/spot",
        provider="local",
        instance_type="local-2gpu",
        zone="local-a",
        market="spot",
        gpu_type="cpu-slot",
        gpus=2,
        price_usd_per_hour=0.2,
    )
    row = store.transition("i-dash1", row.version, InstanceStatus.REQUESTED, reason="launch")
    store.transition(
        "i-dash1", row.version, InstanceStatus.RUNNING, reason="up", provider_instance_id="p1"
    )
    store.add_job(
        "job-on-dashboard",
        JobSubmission("job-on-dashboard", 64, 512, 64, command=("train.py",)).to_json(),
    )
    store.set_assignments("job-on-dashboard", {"i-dash1": 2})
    job = store.get_job("job-on-dashboard")
    store.update_job(job.name, job.version, status=JobStatus.RUNNING)
    for i in range(MAX_JOBS_PAGE):  # the dashboard reads every page, not only the first
        store.add_job(
            f"queued-{i:03d}",
            JobSubmission(f"queued-{i:03d}", 64, 512, 64, command=("t.py",)).to_json(),
        )
    clock.advance(3600.0)  # an hour of the running instance: $0.20 accrued
    tokens = generate_tokens(tmp_path / "tokens.json")
    app = make_app(
        tmp_path / "store.db",
        tokens,
        clock,
        logs_dir=tmp_path / "logs",
        on_job_exit=lambda name, *, failed: JobStatus.COMPLETED,
    )
    server = serve(app)
    try:
        costs = ApiClient(server.url, tokens.user).costs()
        assert costs["total_usd"] == pytest.approx(0.2) and costs["usd_per_hour"] == 0.2
        dom = _dom(f"{server.url}/dashboard#token={tokens.user}")
        assert "job-on-dashboard" in dom and "i-dash1" in dom and "2 x cpu-slot" in dom
        assert f"queued-{MAX_JOBS_PAGE - 1:03d}" in dom  # on the second page
        assert "total $0.2000, now $0.2000/h" in dom
        assert "<polyline" in dom  # the cost-over-time line was drawn
        refused = _dom(f"{server.url}/dashboard#token=not-a-token")
        assert "401" in refused and "job-on-dashboard" not in refused
        agent_token = _dom(f"{server.url}/dashboard#token={tokens.agent_credential('i-1')}")
        assert "403" in agent_token and "job-on-dashboard" not in agent_token
    finally:
        server.shutdown()
        app.close()
        store.close()


# ---- the token leaves no trace, and no other page may frame the dashboard ---------------------


class _Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-
    pipe``: JSON messages ended by a NUL byte, commands on fd 3, answers on fd 4), to read
    what a dumped DOM cannot show: the address bar and the session history."""

    def __init__(self, profile: Path) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # The child's ends, moved above fd 9 so that making them its fds 3 and 4 (in a small
        # Python before exec: no preexec_fn in a process with threads) overwrites neither.
        self._to_chrome_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
        self._from_chrome_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        exec_with_pipe = (
            "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
            "os.execv(sys.argv[3], sys.argv[3:])"
        )
        argv = [_chromium(), *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe"]
        fds = [str(self._to_chrome_r), str(self._from_chrome_w)]
        self._proc = subprocess.Popen(
            [sys.executable, "-c", exec_with_pipe, *fds, *argv, "about:blank"],
            pass_fds=(self._to_chrome_r, self._from_chrome_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(self._to_chrome_r)
        os.close(self._from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        attached = self.call("Target.attachToTarget", targetId=target, flatten=True)
        self.session = attached["sessionId"]

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                answer = json.loads(raw)
                if answer.get("id") == self._next_id:
                    assert "error" not in answer, answer
                    return dict(answer["result"])
            ready, _, _ = select.select([self._from_chrome], [], [], 0.5)
            if ready:
                self._buffer += os.read(self._from_chrome, 1 << 20)
        raise TimeoutError(method)

    def page(self, method: str, **params: Any) -> dict[str, Any]:
        return self.call(method, self.session, **params)

    def evaluate(self, expression: str) -> Any:
        return self.page("Runtime.evaluate", expression=expression)["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.evaluate(expression):
            assert time.monotonic() < deadline, f"never true: {expression}"
            time.sleep(0.2)

    def close(self) -> None:
        with contextlib.suppress(OSError, TimeoutError):
            self.call("Browser.close")
        try:
            self._proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


@pytest.mark.slow
def test_the_token_leaves_the_address_and_history_and_no_page_may_frame_the_dashboard(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The audit: the dashboard kept ``#token=`` in the browser's address and history and
    allowed framing (no ``frame-ancestors``). In Chromium: once the page has read its token
    (it shows the jobs), the address has no fragment and no history entry holds the token;
    a page of another origin that frames the dashboard gets nothing: its script never runs
    (the API sees no call) and the server said so in its headers."""
    _chromium()  # skip here, before anything starts, where there is no Chromium
    clock = FakeClock()
    with Store.create(tmp_path / "store.db", "c1", clock) as store:
        store.add_job(
            "job-on-dashboard",
            JobSubmission("job-on-dashboard", 64, 512, 64, command=("train.py",)).to_json(),
        )
    tokens = generate_tokens(tmp_path / "tokens.json")
    app = make_app(
        tmp_path / "store.db",
        tokens,
        clock,
        logs_dir=tmp_path / "logs",
        on_job_exit=lambda name, *, failed: JobStatus.COMPLETED,
    )
    server = serve(app)
    browser = _Browser(tmp_path / "profile")
    try:
        page = urllib.request.urlopen(f"{server.url}/dashboard", timeout=10)
        assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
        assert page.headers["X-Frame-Options"] == "DENY"

        browser.page("Page.enable")
        browser.page("Page.navigate", url=f"{server.url}/dashboard#token={tokens.user}")
        browser.wait_for("document.querySelector('#jobs tbody').textContent.includes('job-on')")
        assert browser.evaluate("location.href") == f"{server.url}/dashboard"
        history = browser.page("Page.getNavigationHistory")["entries"]
        # (Chromium keeps the address as typed in the entry's userTypedURL, its own record
        # of what was typed; the entry's URL, what the history shows and goes back to, has
        # no token: the page cannot reach further, see the dashboard's docstring.)
        assert history and all(tokens.user not in entry["url"] for entry in history)

        caplog.set_level(logging.DEBUG, logger="autoscaler.controller.api")
        framing = tmp_path / "framing.html"
        framing.write_text(
            f'<iframe id="f" src="{server.url}/dashboard#token={tokens.user}"></iframe>'
        )
        browser.page("Page.navigate", url=framing.as_uri())
        browser.wait_for("document.readyState === 'complete'")
        time.sleep(3.0)  # the framed page's first refresh would have called by now
        calls = [r.getMessage() for r in caplog.records if "/v1/" in r.getMessage()]
        assert calls == [], calls
    finally:
        browser.close()
        server.shutdown()
        app.close()
