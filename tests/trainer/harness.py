"""Helpers for tests that run real ``coadapt-launch``/``torchrun`` processes.

Every launch gets its own rendezvous port (the launcher picks a free one), its own run folder
(pid files, exit markers), ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, ``OMP_NUM_THREADS=1`` and
``GLOO_SOCKET_IFNAME=lo``. The launcher runs in its own session; :meth:`Cluster.close` ends the
launcher's process group *and* every worker that registered a pid (workers run in their own
sessions, so killing the launcher's group does not reach them).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from coadapt_common.procfs import process_start_time
from trainer.control import RunDir
from trainer.report import ReportReply, TrainerReport

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "elastic_mlp.py"


def base_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    for name in list(env):
        if name.startswith("COADAPT_"):
            del env[name]
    env.update(extra)
    return env


class Launch:
    """One ``python -m trainer.launch`` process and its files."""

    def __init__(self, args: list[str], *, workdir: Path, name: str, env: dict[str, str]) -> None:
        self.run_dir = workdir / f"run-{name}"
        self.output = workdir / f"{name}.out"
        command = [sys.executable, "-m", "trainer.launch", "--run-dir", str(self.run_dir), *args]
        self._out = open(self.output, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.worker_pids: list[tuple[int, str | None]] = []

    def remember_workers(self) -> None:
        for entry in RunDir(self.run_dir).pids():
            if entry not in self.worker_pids:
                self.worker_pids.append(entry)

    def terminate(self) -> None:
        self.remember_workers()
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.remember_workers()
            rc = self.proc.poll()
            if rc is not None:
                return rc
            time.sleep(0.05)
        raise TimeoutError(f"launcher still running after {timeout_s} s; see {self.output}")

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def close(self) -> None:
        self.remember_workers()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        for pid, start in self.worker_pids:
            if process_start_time(pid) is not None and process_start_time(pid) == start:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._out.close()


class Cluster:
    """Starts launches and guarantees they (and their workers) are gone at teardown."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = env
        self.launches: list[Launch] = []

    def launch(self, name: str, args: list[str], **extra_env: str) -> Launch:
        env = dict(self.env)
        env.update(extra_env)
        launch = Launch(args, workdir=self.workdir, name=name, env=env)
        self.launches.append(launch)
        return launch

    def close(self) -> None:
        for launch in self.launches:
            launch.close()


def read_jsonl(folder: Path) -> list[dict[str, Any]]:
    """Every record of every ``*.jsonl`` file in ``folder`` (files in name order)."""
    out = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                out.append(json.loads(line))
    return out


def wait_until(
    predicate: Callable[[], bool], timeout_s: float, what: str, launch: Launch | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if launch is not None and launch.proc.poll() is not None:
            raise AssertionError(
                f"launcher exited ({launch.proc.returncode}) before {what}:\n"
                + launch.text()[-4000:]
            )
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def max_step(log_dir: Path) -> int:
    steps = [r["step"] for r in read_jsonl(log_dir) if "event" not in r]
    return max(steps, default=-1)


def iter_micro_records(log_dir: Path) -> Iterator[dict[str, Any]]:
    for record in read_jsonl(log_dir):
        if "event" not in record:
            yield record


def load_example(path: Path) -> Any:
    """The example script at ``path`` imported as a module (``<stem>_example``), for its argument
    parser and model builders."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{path.stem}_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ReportServer(http.server.ThreadingHTTPServer):
    """A local controller stand-in over real HTTP: records each report the trainer posts (and
    its path) and answers it with ``reply(report, index)`` (``index``: its place in
    ``reports``). Use it with :func:`serving`."""

    def __init__(self, reply: Callable[[TrainerReport, int], ReportReply]) -> None:
        self.reports: list[TrainerReport] = []
        self.paths: list[str] = []
        self.reply = reply
        super().__init__(("127.0.0.1", 0), _ReportHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ReportHandler(http.server.BaseHTTPRequestHandler):
    server: ReportServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.paths.append(self.path)
        report = TrainerReport.from_json(body)  # raises on schema errors
        self.server.reports.append(report)
        payload = self.server.reply(report, len(self.server.reports) - 1).to_json().encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def serving(server: ReportServer) -> Iterator[ReportServer]:
    """``server`` answering on a thread until the block ends."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
