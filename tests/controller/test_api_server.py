"""The API server under slow and stalled clients: a real server on loopback, real sockets.

A thousand connections that send half a request and stall must not hold a thread each, nor
keep a normal request from answering within a second; stalled and trickling connections are
closed by the server's time-outs."""

from __future__ import annotations

import contextlib
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoscaler.controller.api import (
    ApiApp,
    ApiClient,
    ApiServer,
    ApiTokens,
    ServerLimits,
    ServiceControl,
    generate_tokens,
    make_app,
    serve,
)
from autoscaler.controller.store import JobStatus, Store
from coadapt_common.clock import FakeClock
from coadapt_common.procfs import native_thread_count

HALF_OPEN = 1_000


def _exit(name: str, *, failed: bool) -> JobStatus:
    return JobStatus.FAILED if failed else JobStatus.COMPLETED


@pytest.fixture
def tokens(tmp_path: Path) -> ApiTokens:
    return generate_tokens(tmp_path / "tokens.json")


@pytest.fixture
def app(tmp_path: Path, tokens: ApiTokens) -> Iterator[ApiApp]:
    clock = FakeClock()
    Store.create(tmp_path / "store.db", "c1", clock).close()
    app = make_app(tmp_path / "store.db", tokens, clock, logs_dir=tmp_path, on_job_exit=_exit)
    yield app
    app.close()


@contextlib.contextmanager
def running(app: ApiApp, limits: ServerLimits) -> Iterator[ApiServer]:
    server = serve(app, limits=limits)
    try:
        yield server
    finally:
        server.shutdown()


def _room_for_sockets(count: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < count:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(count, hard), hard))


def _half_open(port: int, count: int) -> list[socket.socket]:
    """``count`` connections, each having sent part of a request: some stop inside the
    headers, the others after the headers, inside a body they announced."""
    out = []
    for i in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if i % 2:
            s.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthori")
        else:
            s.sendall(
                b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 500\r\n\r\n{"name": '
            )
        out.append(s)
    return out


def _closed_by_server(s: socket.socket) -> bool:
    s.settimeout(0.0)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.mark.slow
def test_a_thousand_half_open_requests_hold_no_thread_and_block_no_one(
    app: ApiApp, tokens: ApiTokens
) -> None:
    _room_for_sockets(4 * HALF_OPEN)
    # A request stuck behind the stalled ones would wait for their idle time-out (6 s); an
    # answer well inside it (3 s, room for a loaded machine) shows that none blocks it.
    limits = ServerLimits(threads=4, idle_timeout_s=6, request_timeout_s=60.0)
    with running(app, limits) as server:
        client = ApiClient(server.url, tokens.user, timeout_s=10)
        client.submit_job(
            {"name": "first", "init_batch_size": 8, "max_batch_size": 8, "max_local_bsz": 8,
             "command": ["train.py"]}
        )  # fmt: skip
        threads_before = native_thread_count()
        assert threads_before is not None
        stalled = _half_open(server.port, HALF_OPEN)
        try:
            time.sleep(0.3)  # the server has accepted and read them
            t0 = time.monotonic()
            jobs = client.list_jobs()
            answered_s = time.monotonic() - t0
            assert [j.name for j in jobs] == ["first"]
            assert answered_s < 3.0, f"a normal request took {answered_s:.2f} s"
            threads = native_thread_count()
            assert threads is not None and threads <= threads_before + 2, (threads_before, threads)
            assert server.worker_threads == 4
            # Stalled for the idle time-out: the server closes them all.
            deadline = time.monotonic() + 15
            open_ = list(stalled)
            while open_ and time.monotonic() < deadline:
                time.sleep(0.2)
                open_ = [s for s in open_ if not _closed_by_server(s)]
            assert not open_, f"{len(open_)} stalled connections still open"
            assert [j.name for j in client.list_jobs()] == ["first"]
        finally:
            for s in stalled:
                s.close()


@pytest.mark.slow
def test_a_request_trickled_byte_by_byte_is_dropped_at_the_request_deadline(
    app: ApiApp, tokens: ApiTokens
) -> None:
    limits = ServerLimits(threads=2, idle_timeout_s=5, request_timeout_s=2.0)
    with running(app, limits) as server:
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        stop = threading.Event()
        request = b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 200

        def trickle() -> None:  # a byte every 0.5 s: never idle, never complete
            for byte in request:
                if stop.wait(0.5):
                    return
                try:
                    s.sendall(bytes([byte]))
                except OSError:
                    return

        sender = threading.Thread(target=trickle)
        sender.start()
        try:
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline and not _closed_by_server(s):
                time.sleep(0.1)
            assert _closed_by_server(s), "a request that never completes kept its connection"
        finally:
            stop.set()
            sender.join()
            s.close()


def test_keep_alive_serves_several_requests_then_idles_out(app: ApiApp, tokens: ApiTokens) -> None:
    import http.client

    limits = ServerLimits(threads=2, idle_timeout_s=1, request_timeout_s=5.0)
    with running(app, limits) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        for _ in range(3):  # one connection, three answers
            conn.request("GET", "/v1/jobs", headers={"Authorization": f"Bearer {tokens.user}"})
            answer = conn.getresponse()
            assert answer.status == 200
            answer.read()
        sock = conn.sock
        assert sock is not None
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and not _closed_by_server(sock):
            time.sleep(0.1)
        assert _closed_by_server(sock), "an idle keep-alive connection was never closed"
        conn.close()


def test_limits_are_checked() -> None:
    for bad in ({"threads": 0}, {"connection_limit": -1}, {"request_timeout_s": 0.0}):
        with pytest.raises(ValueError):
            ServerLimits(**bad)  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_event_loop_waits_while_workers_answer(
    app: ApiApp, tokens: ApiTokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under concurrent submissions and job lists the event loop wakes a few times per
    request, not hundreds: it no longer polls a connection for writing while a worker still
    fills its answer (Waitress's default did, and spun: 300 wake-ups a request here)."""
    import waitress.wasyncore as wasyncore

    wakeups = [0]
    poll2 = wasyncore.poll2

    def counted(timeout: float = 0.0, map: dict | None = None) -> None:
        wakeups[0] += 1
        poll2(timeout, map)

    monkeypatch.setattr(wasyncore, "poll2", counted)
    done = [0]
    with running(app, ServerLimits()) as server:
        stop = time.monotonic() + 2.0

        def client(i: int) -> None:
            c = ApiClient(server.url, tokens.user, timeout_s=30)
            k = 0
            while time.monotonic() < stop:
                k += 1
                body = {"name": f"j-{i}-{k}", "init_batch_size": 64, "max_batch_size": 512,
                        "max_local_bsz": 64, "command": ["t.py"]}  # fmt: skip
                c.submit_job(body)
                c.list_jobs_page()
                done[0] += 2

        threads = [threading.Thread(target=client, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert done[0] >= 40
    assert wakeups[0] / done[0] < 20, (wakeups[0], done[0])


def test_the_answer_to_down_goes_out_before_the_server_closes(
    tmp_path: Path, tokens: ApiTokens
) -> None:
    """``coadapt down`` asks the service to stop; the service's loop wakes and shuts the server
    down while the 202 is still on its way (seen on a loaded machine: the client got a closed
    connection and said nothing was stopped). The answer goes out first."""
    clock = FakeClock()
    Store.create(tmp_path / "store.db", "c1", clock).close()
    holder: list[ApiServer] = []
    stopper: list[threading.Thread] = []

    def request_down() -> None:
        stopper.append(threading.Thread(target=holder[0].shutdown))
        stopper[0].start()
        time.sleep(0.5)  # the shutdown runs while this request is still being answered

    service = ServiceControl({"pid": 1, "started": "1", "cmdline": ["x"]}, request_down)
    app = make_app(
        tmp_path / "store.db", tokens, clock, logs_dir=tmp_path, on_job_exit=_exit,
        service=service,
    )  # fmt: skip
    try:
        server = serve(app, limits=ServerLimits(threads=2))
        holder.append(server)
        answer = ApiClient(server.url, tokens.user, timeout_s=10).service_down()
        assert answer["pid"] == 1
        stopper[0].join(timeout=20)
        assert not stopper[0].is_alive()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    finally:
        server.shutdown()
        app.close()
