"""Launcher decisions, process bookkeeping, the preload server, profiling and reporting."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coadapt_common.clock import FakeClock
from coadapt_common.procfs import process_start_time
from tests.trainer.harness import ReportServer, serving
from trainer.control import ExitKind, ExitMarker, RunDir
from trainer.errors import TrainerConfigError
from trainer.launch import (
    LaunchConfig,
    Verdict,
    classify,
    end_processes,
    parse_args,
    torchrun_command,
    worker_environment,
)
from trainer.metrics import ProfileKey, StepProfiler
from trainer.preload import SOCKET_ENV, _recv, _send
from trainer.report import (
    BatchConfig,
    JobHints,
    ReportReply,
    TrainerReport,
)
from trainer.reporter import FileSink, HttpSink, Reporter, read_reports

from .harness import ROOT


def _marker(rank: int, kind: ExitKind, initiated: bool = False) -> ExitMarker:
    return ExitMarker(rank, kind, None, initiated, 10, None)


@pytest.mark.parametrize(
    ("markers", "rc", "signalled", "verdict"),
    [
        ([_marker(0, ExitKind.DONE), _marker(1, ExitKind.DONE)], 0, False, Verdict.DONE),
        ([], 0, False, Verdict.DONE),
        ([], 1, False, Verdict.FAILURE),
        ([], 1, True, Verdict.STOPPED),  # signalled before the workers were up
        (
            [_marker(0, ExitKind.STOPPED, True), _marker(1, ExitKind.STOPPED)],
            0,
            True,
            Verdict.STOPPED,
        ),
        ([_marker(0, ExitKind.STOPPED, True)], 0, False, Verdict.STOPPED),  # notice / controller
        ([_marker(0, ExitKind.STOPPED), _marker(1, ExitKind.STOPPED)], 0, False, Verdict.RESCALE),
        ([_marker(0, ExitKind.PEER_LOST)], 1, False, Verdict.RESCALE),
        ([_marker(0, ExitKind.PEER_LOST), _marker(1, ExitKind.FAILED)], 1, False, Verdict.FAILURE),
        ([_marker(0, ExitKind.FAILED)], 1, True, Verdict.FAILURE),
    ],
)
def test_classify(markers, rc: int, signalled: bool, verdict: Verdict) -> None:
    assert classify(markers, rc, signalled) is verdict


def test_torchrun_command_and_environment() -> None:
    config = parse_args(
        ["--job-id", "j", "--nproc-per-node", "3", "--nnodes", "1:4", "--batch-size", "96",
         "--accum-steps", "2", "--controller-url", "http://c:1", "train.py", "--lr", "0.1"]
    )  # fmt: skip
    assert config.elastic and config.preload
    command = torchrun_command(config, "h:29400", python="py")
    # torchrun is forked by the preload server too (torch already imported there)
    assert command[:6] == ["py", "-m", "trainer.preload", "run", "-m", "torch.distributed.run"]
    assert "--nnodes=1:4" in command and "--max-restarts=0" in command
    assert "--rdzv-endpoint=h:29400" in command and "--rdzv-id=j" in command
    assert any("last_call_timeout=1" in c for c in command)
    assert command[-6:] == ["--module", "trainer.preload", "run", "train.py", "--lr", "0.1"]
    env = worker_environment(config, "/run", 4, {"PATH": "/bin"})
    assert env["COADAPT_JOB_ID"] == "j" and env["COADAPT_ATTEMPT"] == "4"
    assert env["COADAPT_BATCH_SIZE"] == "96" and env["COADAPT_ACCUM_STEPS"] == "2"
    assert env["COADAPT_CONTROLLER_URL"] == "http://c:1" and env["COADAPT_RUN_DIR"] == "/run"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1" and "OMP_NUM_THREADS" in env
    assert str(ROOT) in env["PYTHONPATH"].split(os.pathsep)
    plain = LaunchConfig(script="t.py", preload=False)
    assert torchrun_command(plain, "h:1")[-1] == "t.py" and not plain.elastic
    assert torchrun_command(plain, "h:1", python="py")[:3] == ["py", "-m", "torch.distributed.run"]
    with pytest.raises(TrainerConfigError):
        LaunchConfig(script="t.py", nnodes="1:x")
    with pytest.raises(TrainerConfigError):
        LaunchConfig(script="t.py", accum_steps=2)


def test_end_processes_ends_exactly_the_recorded_processes(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
         "signal.SIG_IGN); print('up', flush=True); time.sleep(60)"],
        start_new_session=True, stdout=subprocess.PIPE,
    )  # fmt: skip
    polite = subprocess.Popen(["sleep", "60"], start_new_session=True)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"up\n"
        run.write_pid(0, stubborn.pid)
        run.write_pid(1, polite.pid)
        # a recycled pid: same number, different start time -> must not be touched
        (run.pid_dir / "rank-2.pid").write_text(f"{other.pid} 1\n")
        ended = end_processes(run.pids(), grace_s=0.5)
        assert sorted(ended) == sorted([stubborn.pid, polite.pid])
        assert stubborn.wait(5) == -signal.SIGKILL and polite.wait(5) == -signal.SIGTERM
        assert other.poll() is None
    finally:
        for p in (stubborn, polite, other):
            p.kill()
            p.wait()


def test_run_dir_markers_round_trip(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    marker = ExitMarker(3, ExitKind.STOPPED, "signal", True, 42, "ckpt-000000000042.ckpt")
    run.write_marker(marker)
    run.write_pid(3)
    assert run.markers() == [marker]
    assert run.pids() == [(os.getpid(), process_start_time(os.getpid()))]
    run.clear()
    assert run.markers() == [] and run.pids() == []


# ---------------------------------------------------------------------------- preload server


@pytest.fixture
def preload_server(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "p.sock")
    server = subprocess.Popen(
        [sys.executable, "-m", "trainer.preload", "serve", path, "json"],
        cwd=ROOT, stdin=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    yield path
    assert server.stdin is not None
    server.stdin.close()  # EOF: the server stops
    assert server.wait(10) == 0


SCRIPT = """
import json, os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "x": os.environ.get("X"),
                  "pid": os.getpid()}), flush=True)
if sys.argv[1] == "wait":
    time.sleep(30)
sys.exit(int(sys.argv[2]))
"""


def _client(script: Path, args: list[str], sock: str | None, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "X": "forwarded"}
    env.pop(SOCKET_ENV, None)
    if sock:
        env[SOCKET_ENV] = sock
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.preload", "run", str(script), *args],
        cwd=cwd, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_preload_forks_workers_that_behave_like_the_script(
    preload_server: str, tmp_path: Path
) -> None:
    script = tmp_path / "w.py"
    script.write_text(SCRIPT)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    client = _client(script, ["exit", "3"], preload_server, workdir)
    out, _ = client.communicate(timeout=30)
    assert client.returncode == 3
    seen = json.loads(out)
    assert seen["argv"] == [str(script), "exit", "3"] and seen["x"] == "forwarded"
    assert seen["cwd"] == str(workdir) and seen["pid"] != client.pid  # a forked worker

    waiting = _client(script, ["wait", "0"], preload_server, workdir)
    assert waiting.stdout is not None
    worker = json.loads(waiting.stdout.readline())["pid"]
    waiting.send_signal(signal.SIGTERM)  # what torchrun does: forwarded to the worker
    assert waiting.wait(30) == 7
    assert process_start_time(worker) is None


def test_a_worker_killed_by_sigkill_ends_its_client_the_same_way_without_a_traceback(
    preload_server: str, tmp_path: Path
) -> None:
    """A stop that has to kill (a second signal, a down) SIGKILLs the forked worker: its
    client dies by SIGKILL too, as torchrun expects, and prints no traceback into the job's
    log (it raised EINVAL setting a handler for SIGKILL)."""
    script = tmp_path / "k.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), SOCKET_ENV: preload_server}
    client = subprocess.run(
        [sys.executable, "-m", "trainer.preload", "run", str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert client.returncode == -signal.SIGKILL, client.stderr
    assert "Traceback" not in client.stderr and "Invalid argument" not in client.stderr


def test_preload_client_falls_back_without_a_server(tmp_path: Path) -> None:
    script = tmp_path / "w.py"
    script.write_text(SCRIPT)
    client = _client(script, ["exit", "4"], None, tmp_path)
    out, _ = client.communicate(timeout=30)
    assert client.returncode == 4 and json.loads(out)["pid"] == client.pid  # exec'd in place


def test_a_signal_sent_before_the_client_knows_its_worker_is_forwarded(tmp_path: Path) -> None:
    """torchrun may signal a worker the instant it starts: the client holds the signal until
    the server has named the worker, then forwards it (the server here speaks the protocol
    by hand, so the signal lands deterministically before the pid reply)."""
    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.settimeout(30)
    target = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys, time\n"
         "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
         "print('ready', flush=True)\ntime.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert target.stdout is not None and target.stdout.readline() == "ready\n"
    client = _client(tmp_path / "unused.py", [], path, tmp_path)
    try:
        conn, _ = listener.accept()
        conn.settimeout(30)
        request, fds = _recv(conn, with_fds=3)
        for fd in fds:
            os.close(fd)
        assert request["argv"] == [str(tmp_path / "unused.py")]
        client.send_signal(signal.SIGTERM)  # before the client knows the worker
        time.sleep(0.3)
        assert client.poll() is None  # held, not fatal
        _send(conn, {"pid": target.pid})
        assert target.wait(30) == 7  # forwarded once the pid arrived
        _send(conn, {"exit": 7})
        assert client.wait(30) == 7
    finally:
        for proc in (client, target):
            if proc.poll() is None:
                proc.kill()
        listener.close()


# ---------------------------------------------------------------------------- profiling


def test_profiler_splits_compute_and_sync_and_skips_warmup() -> None:
    clock = FakeClock()
    profiler = StepProfiler(clock, warmup_steps=1)
    key = ProfileKey(1, 2, 32, 1)
    for _ in range(4):
        profiler.begin_step()
        clock.advance(0.08)
        profiler.mark_last_bucket()
        clock.advance(0.02)
        profiler.end_step(key)
        clock.advance(0.01)  # data loading before the next step counts to the next step
    (entry,) = profiler.snapshot()
    assert entry.steps == 3 and entry.local_batch_size == 32
    assert entry.step_s == pytest.approx(0.11) and entry.sync_s == pytest.approx(0.02)
    assert entry.compute_s == pytest.approx(0.09)
    profiler.break_chain()
    other = ProfileKey(1, 2, 64, 2)
    for _ in range(3):
        profiler.begin_step()
        clock.advance(0.2)
        profiler.end_step(other)
    assert [e.local_batch_size for e in profiler.snapshot()] == [32, 64]
    assert profiler.snapshot()[1].steps == 2 and profiler.snapshot()[1].sync_s == 0.0


# ---------------------------------------------------------------------------- reporting


def _report() -> TrainerReport:
    return TrainerReport(
        job_id="j", attempt=0, started_at_s=1.0, sent_at_s=2.0, world_size=1, num_nodes=1,
        batch=BatchConfig(32), step=3, skipped_steps=0, epoch=0, epoch_position=96,
        progress=3.0, gradient=None, profiles=(), hints=JobHints(32),
    )  # fmt: skip


def _sink_server() -> ReportServer:
    """A controller stand-in that answers every report with batch 64 in 2 steps."""
    reply = ReportReply(batch=BatchConfig(64, 2))
    return ReportServer(lambda _report, _index: reply)


def test_reporter_posts_periodically_and_hands_replies_over() -> None:
    replies: list[ReportReply] = []
    with serving(_sink_server()) as server:
        sink = HttpSink(server.url, "j")
        reporter = Reporter(sink, _report, interval_s=0.05, on_reply=replies.append)
        reporter.start()
        deadline = time.monotonic() + 10
        while len(server.reports) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        reporter.stop(final=True)
    assert len(server.reports) >= 3 and reporter.failed == 0
    assert replies and replies[0].batch == BatchConfig(64, 2)


def test_reporter_sends_each_scheduled_report_and_handles_its_reply_inside_the_window() -> None:
    """The step loop's reply window (trainer.stepping, "Batch changes") must cover the whole
    exchange: entered before the report is built and sent, left after ``on_reply`` ran; the
    final report at exit waits for no window."""
    events: list[str] = []

    @contextlib.contextmanager
    def window() -> Iterator[bool]:
        events.append("open")
        yield True
        events.append("close")

    def build() -> TrainerReport:
        events.append("build")
        return _report()

    with serving(_sink_server()) as server:
        sink = HttpSink(server.url, "j")
        reporter = Reporter(
            sink, build, interval_s=0.05, on_reply=lambda _r: events.append("reply"),
            reply_window=window,
        )  # fmt: skip
        reporter.start()
        deadline = time.monotonic() + 10
        while events.count("close") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        reporter.stop(final=True)
    scheduled = events.count("open")
    assert scheduled >= 2
    assert events == ["open", "build", "reply", "close"] * scheduled + ["build", "reply"]


def test_http_sink_tries_a_controller_pairs_addresses_in_turn() -> None:
    """The agents of a controller pair give the trainer both addresses (coadapt up
    --api-urls): a report reaches the one that serves, whichever is first; the failover
    benchmark found every report of a pair's jobs lost to 'Name or service not known'."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # closed again: nothing listens there
    with serving(_sink_server()) as server:
        live = server.url
        sink = HttpSink(f"http://127.0.0.1:{dead},{live}", "j", timeout_s=2)
        assert sink.send(_report()) == ReportReply(batch=BatchConfig(64, 2))
        assert sink.url == f"{live}/v1/jobs/j/reports"  # the one that answered, first now
        assert sink.send(_report()) is not None
    assert len(server.reports) == 2
    with pytest.raises(TrainerConfigError):
        HttpSink(f"{live},ftp://x", "j")
    with pytest.raises(OSError):  # none answers: the Reporter logs it and retries
        HttpSink(f"http://127.0.0.1:{dead},http://127.0.0.1:{dead}", "j", timeout_s=1).send(
            _report()
        )


def test_reporter_failures_never_raise(tmp_path: Path) -> None:
    reporter = Reporter(HttpSink("http://127.0.0.1:9", "j", timeout_s=0.5), _report, interval_s=1)
    assert reporter.send_now() is None and reporter.failed == 1
    file_reporter = Reporter(FileSink(tmp_path / "r" / "reports.jsonl"), _report, interval_s=1)
    file_reporter.send_now()
    file_reporter.send_now()
    assert read_reports(tmp_path / "r" / "reports.jsonl") == [_report(), _report()]


# ---------------------------------------------------------------------------- supervisor loop

SUPERVISED = """
import os, sys
from trainer.control import ExitKind, ExitMarker, RunDir
attempt = int(os.environ["COADAPT_ATTEMPT"])
run = RunDir(os.environ["COADAPT_RUN_DIR"])
rank = int(os.environ["RANK"])
run.write_pid(rank)
with open(os.environ["LOG"], "a") as f:
    f.write(f"{attempt} {os.environ['WORLD_SIZE']}\\n")
if attempt == 0:
    sys.exit(3)  # a crash: no marker
kind = ExitKind.STOPPED if attempt == 1 else ExitKind.DONE
run.write_marker(ExitMarker(rank, kind, "peer" if attempt == 1 else None, False, attempt, None))
"""


@pytest.mark.slow
def test_launcher_counts_failures_but_not_rescales(tmp_path: Path) -> None:
    """Attempt 0 crashes (one failure of the budget), attempt 1 stops because a peer asked (a
    rescale: relaunched, not counted), attempt 2 finishes."""
    from trainer.launch import ExitCode, Launcher

    script = tmp_path / "job.py"
    script.write_text(SUPERVISED)
    log = tmp_path / "attempts.log"
    config = LaunchConfig(
        script=str(script),
        job_id="sup",
        nproc_per_node=1,
        max_restarts=1,
        run_dir=str(tmp_path / "run"),
        preload=False,
    )
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "LOG": str(log), "OMP_NUM_THREADS": "1"}
    launcher = Launcher(config, clock=FakeClock(), environ=environ)
    assert launcher.run() == ExitCode.DONE
    assert launcher.verdicts == [Verdict.FAILURE, Verdict.RESCALE, Verdict.DONE]
    assert (launcher.failures, launcher.rescales, launcher.attempts) == (1, 1, 3)
    assert log.read_text().split("\n")[:3] == ["0 1", "1 1", "2 1"]
