"""``coadapt up``'s service (:func:`run_up`) as it runs: a real store file, the real API server
on loopback, the local provider's real agent processes.

Stopping keeps the fleet and the next start takes it back at the same address; only a down
request (with the users' token) releases it, and never a fleet the store does not own; a
state folder that lost its store refuses to start; a store that fails while in use ends the
service with one line; what it writes is private to its user."""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from autoscaler.controller.api import ApiClient, ApiError, generate_tokens, load_tokens
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.service import ServiceError, UpConfig, UpReport, run_up
from autoscaler.controller.store import JobStatus
from coadapt_common.procfs import PROC_ROOT, is_running, read_stat

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "coadapt-local"

pytestmark = pytest.mark.skipif(not PROC_ROOT.is_dir(), reason="needs Linux /proc")


class Service:
    """:func:`run_up` in a thread: its URL once ready, its outcome once stopped."""

    def __init__(self, cfg: UpConfig) -> None:
        self.stop = threading.Event()
        self.ready: list[str] = []
        self.outcome: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, args=(cfg,))
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.ready and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)

    def _run(self, cfg: UpConfig) -> None:
        try:
            self.outcome["report"] = run_up(cfg, self.stop, on_ready=self.ready.append)
        except Exception as e:
            self.outcome["error"] = e

    @property
    def url(self) -> str:
        assert self.ready, self.outcome
        return self.ready[0]

    def end(self, timeout_s: float = 150.0) -> Any:
        self.stop.set()
        self.thread.join(timeout_s)
        assert not self.thread.is_alive()
        return self.outcome.get("report", self.outcome.get("error"))


@contextmanager
def service(cfg: UpConfig) -> Iterator[Service]:
    svc = Service(cfg)
    try:
        yield svc
    finally:
        svc.end()


def _local(state: Path) -> Any:
    from providers.local import LocalProvider

    return LocalProvider(state / "local")


def _listed(state: Path) -> list[str]:
    return sorted(i.instance_id for i in _local(state).list_instances(CLUSTER))


def _agent_pids(state: Path) -> dict[str, int]:
    out = {}
    for path in (state / "local" / "instances").glob("*.json"):
        rec = json.loads(path.read_text())
        if rec["state"] == "running" and rec["pid"]:
            out[rec["instance_id"]] = rec["pid"]
    return out


def _job(name: str) -> JobSubmission:
    # A real job, long enough to hold its instance while the test stops and starts the
    # service; what matters here is the fleet.
    return JobSubmission(name, 64, 512, 64, command=("examples/elastic_mlp.py", "--epochs", "50"))


@pytest.mark.slow
def test_stopping_keeps_the_fleet_a_restart_takes_it_back_and_down_releases_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    state = tmp_path / "state"
    cfg = UpConfig(state, interval_s=0.5, max_instances=1, max_gpu_slots=2)
    umask = os.umask(0o022)
    try:
        with service(cfg) as first:
            user = ApiClient(first.url, load_tokens(state / "tokens.json").user, timeout_s=10)
            user.submit_job(_job("holder"))
            deadline = time.monotonic() + 60
            while not _agent_pids(state) and time.monotonic() < deadline:
                time.sleep(0.2)
            agents = _agent_pids(state)
            assert agents, "no instance was launched"
            # The job is placed once its instance is ready (its agent heard), a round later.
            while (
                user.get_job("holder").status is not JobStatus.RUNNING
                and time.monotonic() < deadline
            ):
                time.sleep(0.2)
            assert user.get_job("holder").status is JobStatus.RUNNING
            while not any((state / "logs").rglob("*")) and time.monotonic() < deadline:
                time.sleep(0.2)
        report = first.end()
        assert isinstance(report, UpReport) and not report.released
        assert report.remaining == tuple(sorted(agents))
        # The service is gone; its instances (agent processes) are not.
        assert _listed(state) == sorted(agents)
        assert all(is_running(read_stat(pid)) for pid in agents.values())
        with service(cfg) as second:
            assert second.url == first.url  # where the agents call
            deadline = time.monotonic() + 10
            rows: tuple[Any, ...] = ()
            while time.monotonic() < deadline:
                rows = ApiClient(
                    second.url, load_tokens(state / "tokens.json").user
                ).list_instances()
                if any(r.last_heartbeat_s and r.last_heartbeat_s > time.time() - 3 for r in rows):
                    break
                time.sleep(0.2)
            assert {r.provider_instance_id for r in rows if r.status == "running"} == set(agents)
            # A down request needs the users' token: the agents' is refused, nothing stops.
            agent = ApiClient(
                second.url, load_tokens(state / "tokens.json").agent_credential("i-x")
            )
            with pytest.raises(ApiError) as refused:
                agent.service_down()
            assert refused.value.status == 403
            time.sleep(1.0)
            assert second.thread.is_alive() and _listed(state) == sorted(agents)
            ApiClient(second.url, load_tokens(state / "tokens.json").user).service_down()
            second.thread.join(150)
            assert not second.thread.is_alive()
        report = second.end()
        assert report.released and report.clean, report
        assert _listed(state) == []
        assert not any(is_running(read_stat(pid)) for pid in agents.values())
        # What the agents and the job wrote (logs, the checkpoint of its stop) is private,
        # although this process's umask (which the agents inherit) is 022.
        written = [p for d in ("logs", "checkpoints") for p in (state / d).rglob("*")]
        assert any(p.is_file() for p in (state / "logs").rglob("*")), written
        for path in written:
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    finally:
        os.umask(umask)
        left = _listed(state) if (state / "local").exists() else []
        if left:
            _local(state).terminate(CLUSTER, left, "test-cleanup")


def test_a_refused_fleet_is_left_alone_on_exit_even_when_releasing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store was lost; a new one (explicitly asked for) meets the old fleet: the round
    refuses it, and the service that was to release its fleet on exit touches none of it."""
    monkeypatch.chdir(ROOT)
    state = tmp_path / "state"
    cfg = UpConfig(state, interval_s=0.5, max_instances=1, max_gpu_slots=2)
    try:
        with service(cfg) as first:
            user = ApiClient(first.url, load_tokens(state / "tokens.json").user, timeout_s=10)
            user.submit_job(_job("holder"))
            deadline = time.monotonic() + 60
            while not _agent_pids(state) and time.monotonic() < deadline:
                time.sleep(0.2)
        agents = _agent_pids(state)
        assert agents and _listed(state) == sorted(agents)
        for name in ("store.db", "store.db-wal", "store.db-shm"):
            (state / name).unlink(missing_ok=True)
        again = Service(
            UpConfig(
                state,
                interval_s=0.5,
                max_instances=1,
                max_gpu_slots=2,
                new_store=True,
                release_on_stop=True,
            )
        )
        again.thread.join(60)
        assert not again.thread.is_alive()
        error = again.outcome.get("error")
        assert isinstance(error, ServiceError) and "never seen" in str(error), again.outcome
        assert "\n" not in str(error)
        assert _listed(state) == sorted(agents)  # nothing terminated
        assert all(is_running(read_stat(pid)) for pid in agents.values())
    finally:
        left = _listed(state) if (state / "local").exists() else []
        if left:
            _local(state).terminate(CLUSTER, left, "test-cleanup")


def test_a_state_folder_that_lost_its_store_refuses_to_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "logs" / "old-job").mkdir(parents=True)
    (state / "logs" / "old-job" / "i-1.log").write_text("step 10\n")
    generate_tokens(state / "tokens.json")
    with pytest.raises(ServiceError) as refused:
        run_up(UpConfig(state), threading.Event())
    message = str(refused.value)
    assert "store.db is missing" in message and "--new-store" in message and "\n" not in message
    assert "tokens.json" in message and "logs" in message
    assert not (state / "store.db").exists()
    assert not (state / "up.json").exists()
    # Asked for explicitly: a new store, and an existing one is moved aside, never deleted.
    with service(UpConfig(state, interval_s=0.2, new_store=True)) as svc:
        assert svc.url
    assert (state / "store.db").exists()
    with service(UpConfig(state, interval_s=0.2, new_store=True)) as svc:
        assert svc.url
    assert list(state.glob("store.db.*.aside"))


def test_a_state_folder_that_is_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(ServiceError, match="is a file, not a folder"):
        run_up(UpConfig(target), threading.Event())


def test_what_up_writes_is_private_whatever_the_umask(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)  # an earlier, open folder is closed too
    old = os.umask(0o022)
    try:
        with service(UpConfig(state, interval_s=0.2)) as svc:
            assert svc.url
    finally:
        os.umask(old)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for name in ("logs", "checkpoints", "agents", "local"):
        assert stat.S_IMODE((state / name).stat().st_mode) == 0o700, name
    for name in ("store.db", "tokens.json"):
        assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name


def test_a_deleted_write_ahead_log_ends_the_service_in_one_line_and_the_api_says_why(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    svc = Service(UpConfig(state, interval_s=0.5))
    try:
        user = ApiClient(svc.url, load_tokens(state / "tokens.json").user, timeout_s=10)
        user.submit_job(_job("kept"))
        (state / "store.db-wal").unlink()
        with pytest.raises(ApiError) as answer:
            user.submit_job(_job("lost"))
        assert answer.value.status == 503 and "write-ahead log" in answer.value.message
        svc.thread.join(30)
        assert not svc.thread.is_alive(), "the round loop went on with a broken store"
    finally:
        svc.end()
    error = svc.outcome.get("error")
    assert isinstance(error, ServiceError), svc.outcome
    assert "write-ahead log" in str(error) and "start coadapt up again" in str(error)
    assert "\n" not in str(error)


def test_the_demo_kind_of_service_releases_on_stop(tmp_path: Path) -> None:
    """``release_on_stop`` (the embedded demo) releases what its store planned, as down does;
    with nothing launched there is nothing to release, and it says so (clean)."""
    state = tmp_path / "state"
    with service(UpConfig(state, interval_s=0.2, release_on_stop=True)) as svc:
        deadline = time.monotonic() + 10
        while not (state / "store.db").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a round or two: the store has planned
    report = svc.end()
    assert isinstance(report, UpReport) and report.released and report.clean
    shutil.rmtree(state)
