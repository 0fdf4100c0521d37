"""The node agent's core: plan() over literal assignments, and the Supervisor over real
processes (a stand-in launcher that checkpoints on SIGTERM and exits 75, and leaves a worker
in its own session, as torchrun's workers are)."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from autoscaler.controller.agent import (
    ActionKind,
    JobAssignment,
    Outcome,
    Supervisor,
    _marked,
    assignments_from_json,
    dump,
    exit_outcome,
    launch_argv,
    notice_source,
    plan,
)
from coadapt_common.clock import FakeClock

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc")

LAUNCHER = r"""
import os, signal, subprocess, sys, time
mode = sys.argv[1]
# a worker in its own session (as torchrun starts them), carrying the inherited marker
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
def stop(*_):
    if mode == "finished":  # training ended as the stop came: the launcher says DONE
        sys.exit(0)
    open(os.environ["CKPT"], "w").write("checkpointed")
    sys.exit(75)
signal.signal(signal.SIGTERM, stop)
print("started", flush=True)
if mode == "done":
    time.sleep(0.3); sys.exit(0)
if mode == "fail":
    time.sleep(0.3); sys.exit(1)
time.sleep(600)
"""


def job(name: str, gpus: int = 1, nodes=(("i-a", 1),), rdzv: str = "127.0.0.1:29500"):
    return JobAssignment(name, gpus, nodes, rdzv, ("train.py", "--epochs", "1"))


def test_plan_starts_stops_and_restarts_on_a_changed_allocation() -> None:
    running = {"a": job("a"), "b": job("b"), "c": job("c")}
    assigned = {"a": job("a"), "b": job("b", gpus=2), "d": job("d")}
    actions = plan(assigned, running)
    assert [(x.kind, x.job) for x in actions] == [
        (ActionKind.STOP, "c"),
        (ActionKind.RESTART, "b"),
        (ActionKind.START, "d"),
    ]
    moved = {"a": job("a", nodes=(("i-a", 1), ("i-b", 1)))}
    assert [x.kind for x in plan(moved, {"a": job("a")})] == [ActionKind.RESTART]
    assert plan(running, running) == []


def test_exit_statuses_read_as_outcomes() -> None:
    assert exit_outcome(0) is Outcome.DONE
    assert exit_outcome(75) is Outcome.STOPPED
    assert exit_outcome(1) is Outcome.FAILED and exit_outcome(-9) is Outcome.FAILED


def test_launch_argv_and_wire_format() -> None:
    a = job("a", gpus=2, nodes=(("i-a", 2), ("i-b", 2)), rdzv="10.0.0.1:29600")
    argv = launch_argv(a, controller_url="http://ctl:8080", python="py")
    assert argv[:3] == ["py", "-m", "trainer.launch"]
    assert argv[argv.index("--nproc-per-node") + 1] == "2"
    assert argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:29600"
    assert argv[-3:] == ["train.py", "--epochs", "1"]
    assert assignments_from_json(__import__("json").loads(dump({"a": a}))) == {"a": a}


def test_the_stop_graces_nest() -> None:
    """Issue 37, item 2: each grace between a stop request and a kill lies inside the next, so
    nothing kills a job that is still within its checkpoint grace: the launcher's workers get
    STOP_GRACE_S (the launcher's --shutdown-timeout-s, whose own default is the same), the
    agent waits that plus KILL_MARGIN_S, the local agent process 0.6 x the local provider's
    grace (providers/local.py), and the local provider that grace."""
    from autoscaler.controller.agent import KILL_MARGIN_S, STOP_GRACE_S
    from autoscaler.controller.service import LOCAL_TERM_GRACE_S
    from trainer.launch import parse_args

    assert parse_args(["x.py"]).shutdown_timeout_s == STOP_GRACE_S == 60.0
    assert STOP_GRACE_S < STOP_GRACE_S + KILL_MARGIN_S == 70.0 < 0.6 * LOCAL_TERM_GRACE_S == 84.0
    assert LOCAL_TERM_GRACE_S == 140.0
    argv = launch_argv(job("a"), controller_url=None, stop_grace_s=STOP_GRACE_S)
    assert argv[argv.index("--shutdown-timeout-s") + 1] == "60"
    assert argv.index("--shutdown-timeout-s") < argv.index("--")
    # coadapt agent --stop-grace-s: the same default, bounded.
    import inspect

    from autoscaler.cli import cluster as cli_cluster
    from autoscaler.controller.service import agent_main

    assert inspect.signature(cli_cluster.agent).parameters["stop_grace_s"].default == STOP_GRACE_S
    base = ["--api", "http://x", "--token-file", "t", "--instance-key", "k", "--work-dir", "w"]
    for bad in ("0", "nan", "4000"):
        with pytest.raises(SystemExit) as refused:
            agent_main([*base, "--stop-grace-s", bad])
        assert refused.value.code == 2


def _supervisor(tmp_path: Path, mode: str, agent_id: str | None = None) -> Supervisor:
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    return Supervisor(
        agent_id or f"test-{uuid.uuid4().hex[:8]}",
        tmp_path / "agent",
        stop_grace_s=5.0,
        argv_for=lambda a: [sys.executable, str(script), mode],
        env={"CKPT": str(tmp_path / f"ckpt-{mode}")},
    )


def _wait_started(sup: Supervisor, name: str) -> None:
    deadline = time.monotonic() + 10
    while "started" not in sup.log_path(name).read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)  # the worker is spawned before "started" is printed


def test_stop_checkpoints_and_leaves_no_process(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path, "run")
    sup.apply(plan({"a": job("a")}, sup.running))
    _wait_started(sup, "a")
    assert len(_marked(sup.agent_id, None)) == 2  # the launcher and its worker
    code = sup.stop("a")
    assert code == 75 and (tmp_path / "ckpt-run").read_text() == "checkpointed"
    assert _marked(sup.agent_id, None) == [] and sup.running == {}


def test_finished_and_failed_launchers_are_reported_once(tmp_path: Path) -> None:
    for mode, outcome in (("done", Outcome.DONE), ("fail", Outcome.FAILED)):
        sup = _supervisor(tmp_path, mode)
        sup.start(job(mode))
        deadline = time.monotonic() + 10
        ended: list = []
        while not ended and time.monotonic() < deadline:
            ended = sup.poll()
            time.sleep(0.05)
        assert [(j, o) for j, o, _ in ended] == [(mode, outcome)]
        assert sup.poll() == [] and _marked(sup.agent_id, None) == []


def test_a_restarted_agent_ends_what_its_previous_life_left(tmp_path: Path) -> None:
    agent_id = f"test-{uuid.uuid4().hex[:8]}"
    first = _supervisor(tmp_path, "run", agent_id)
    first.start(job("a"))
    _wait_started(first, "a")
    # the agent dies without stopping anything; a new one with the same id starts
    second = _supervisor(tmp_path, "run", agent_id)
    assert len(second.sweep()) == 2
    assert _marked(agent_id, None) == []
    first._procs["a"].popen.wait(timeout=5)  # reap the killed launcher


def test_a_job_that_finished_as_it_was_stopped_is_not_started_again(tmp_path: Path) -> None:
    """A rescale that lands just after training ended: the stop finds the launcher done
    (exit 0); the restart's start is skipped, the job's log says why in one line, and the
    job is handed back as finished (the runner reports it done)."""
    sup = _supervisor(tmp_path, "finished")
    sup.apply(plan({"a": job("a")}, sup.running))
    _wait_started(sup, "a")
    finished = sup.apply(plan({"a": job("a", gpus=2)}, sup.running))
    assert finished == ["a"] and sup.running == {}
    log = sup.log_path("a").read_text()
    assert "stopping a: allocation changed (a checkpointed stop, not a failure)" in log
    assert "a had finished training: it is not started again" in log
    assert log.splitlines().count("started") == 1 and "Traceback" not in log


def test_a_planned_batch_starts_the_launch_with_it() -> None:
    a = JobAssignment("a", 2, (("i-a", 2),), "h:1", ("t.py",), batch=(512, 2))
    argv = launch_argv(a, controller_url=None, python="py")
    assert argv[argv.index("--batch-size") + 1] == "512"
    assert argv[argv.index("--accum-steps") + 1] == "2"
    assert a.allocation == JobAssignment("a", 2, (("i-a", 2),), "h:1", ("t.py",)).allocation
    assert assignments_from_json(json.loads(dump({"a": a}))) == {"a": a}


def test_stop_all_then_nothing_is_left(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path, "run")
    sup.apply(plan({"a": job("a"), "b": job("b")}, {}))
    _wait_started(sup, "a")
    _wait_started(sup, "b")
    assert os.path.exists(sup.work_dir / "processes.json")
    sup.stop_all()
    assert _marked(sup.agent_id, None) == [] and sup.running == {}
    # A clean end: the next life has nothing to adopt (processes.json is what it adopts from).
    assert not os.path.exists(sup.work_dir / "processes.json")


def test_the_runner_follows_the_api_and_reports_exits(tmp_path: Path) -> None:
    """A real API server over a real store: the runner registers, starts what is assigned,
    stops what is released (checkpoint, nothing reported), reports a launcher that finished,
    and stops everything when its instance gets a preemption notice."""
    from autoscaler.controller.agent import AgentRunner
    from autoscaler.controller.api import ApiClient, generate_tokens, make_app, serve
    from autoscaler.controller.jobbook import JobSubmission
    from autoscaler.controller.lifecycle import InstanceStatus
    from autoscaler.controller.store import JobStatus, Store

    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", "c1", clock)
    row = store.add_instance(
        instance_key="i-1",
        request_id="c1-i-1",
        offering_key="local/slot/local-a/on-demand",
        provider="local",
        instance_type="slot",
        zone="local-a",
        market="on-demand",
        gpu_type="T4",
        gpus=2,
        price_usd_per_hour=0.1,
    )
    row = store.transition("i-1", row.version, InstanceStatus.REQUESTED, reason="launch")
    store.transition(
        "i-1", row.version, InstanceStatus.RUNNING, reason="up", provider_instance_id="p1"
    )
    for name in ("a", "b"):
        store.add_job(name, JobSubmission(name, 64, 512, 64, command=("x.py",)).to_json())
        store.set_assignments(name, {"i-1": 1})
        store.update_job(name, store.get_job(name).version, status=JobStatus.RUNNING)
    exits: list[tuple[str, bool]] = []

    def on_exit(name: str, *, failed: bool) -> JobStatus:  # as Controller.job_exited does
        exits.append((name, failed))
        status = JobStatus.FAILED if failed else JobStatus.COMPLETED
        with Store.open(tmp_path / "store.db", clock) as own:  # the server's thread
            own.update_job(name, own.get_job(name).version, status=status)
            own.set_assignments(name, {})
        return status

    tokens = generate_tokens(tmp_path / "tokens.json")
    app = make_app(
        tmp_path / "store.db", tokens, clock, logs_dir=tmp_path / "logs", on_job_exit=on_exit
    )
    server = serve(app)
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    modes = {"a": "run", "b": "done"}
    sup = Supervisor(
        f"test-{uuid.uuid4().hex[:8]}",
        tmp_path / "agent",
        stop_grace_s=5.0,
        argv_for=lambda a: [sys.executable, str(script), modes[a.job]],
        env={"CKPT": str(tmp_path / "ckpt")},
    )
    notice = tmp_path / "spot-notice.json"
    runner = AgentRunner(
        ApiClient(server.url, tokens.agent_credential("i-1"), timeout_s=10),
        "i-1",
        sup,
        address="127.0.0.1",
        notice=notice_source("local", clock=clock, notice_file=notice),
    )
    try:
        first = runner.step()
        assert sorted((x.kind.value, x.job) for x in first) == [("start", "a"), ("start", "b")]
        assert store.get_instance("i-1").last_heartbeat_s == clock.now_s()
        _wait_started(sup, "a")
        deadline = time.monotonic() + 10
        while not exits and time.monotonic() < deadline:  # b finishes on its own
            runner.step()
            time.sleep(0.05)
        assert exits == [("b", False)] and store.get_job("b").status is JobStatus.COMPLETED
        notice.write_text("{}")
        stopped = runner.step()
        assert [(x.kind.value, x.job) for x in stopped] == [("stop", "a")]
        assert (tmp_path / "ckpt").read_text() == "checkpointed" and exits == [("b", False)]
        assert _marked(sup.agent_id, None) == []
    finally:
        runner.close()
        server.shutdown()
        app.close()


def test_a_running_job_is_kept_while_a_restarted_controller_learns_its_rendezvous(
    tmp_path: Path,
) -> None:
    """A two-node job: after the controller restarts, the agent of the second node calls
    before the first node's agent has; the rendezvous is unknown for a moment, and the job
    that runs here keeps running (no stop, no relaunch)."""
    from autoscaler.controller.agent import AgentRunner
    from autoscaler.controller.api import ApiClient, generate_tokens, make_app, serve
    from autoscaler.controller.jobbook import JobSubmission
    from autoscaler.controller.lifecycle import InstanceStatus
    from autoscaler.controller.store import JobStatus, Store

    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", "c1", clock)
    for key in ("i-1", "i-2"):
        row = store.add_instance(
            instance_key=key, request_id=f"c1-{key}", offering_key="local/slot/local-a/spot",
            provider="local", instance_type="slot", zone="local-a", market="spot",
            gpu_type="T4", gpus=1, price_usd_per_hour=0.1,
        )  # fmt: skip
        row = store.transition(key, row.version, InstanceStatus.REQUESTED, reason="launch")
        store.transition(
            key, row.version, InstanceStatus.RUNNING, reason="up", provider_instance_id=f"p{key}"
        )
    store.add_job("a", JobSubmission("a", 64, 512, 64, command=("x.py",)).to_json())
    store.set_assignments("a", {"i-1": 1, "i-2": 1})
    store.update_job("a", store.get_job("a").version, status=JobStatus.RUNNING)
    tokens = generate_tokens(tmp_path / "tokens.json")

    def started() -> tuple[Any, Any]:
        app = make_app(
            tmp_path / "store.db", tokens, clock, logs_dir=tmp_path / "logs",
            on_job_exit=lambda name, *, failed: JobStatus.FAILED,
        )  # fmt: skip
        return app, serve(app)

    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    sup = Supervisor(
        f"test-{uuid.uuid4().hex[:8]}",
        tmp_path / "agent",
        stop_grace_s=5.0,
        argv_for=lambda a: [sys.executable, str(script), "run"],
        env={"CKPT": str(tmp_path / "ckpt")},
    )
    app, server = started()
    two, one = tokens.agent_credential("i-2"), tokens.agent_credential("i-1")
    runner = AgentRunner(ApiClient(server.url, two), "i-2", sup, address="127.0.0.2")
    try:
        ApiClient(server.url, one).heartbeat("i-1", address="127.0.0.1")
        assert [(x.kind.value, x.job) for x in runner.step()] == [("start", "a")]
        pid = sup._procs["a"].pid
        server.shutdown()  # the controller restarts: it remembers no agent's address
        app.close()
        app, server = started()
        runner.client = ApiClient(server.url, two)
        assert runner.step() == [] and sup._procs["a"].pid == pid  # kept as it runs
        ApiClient(server.url, one).heartbeat("i-1", address="127.0.0.1")
        assert runner.step() == [] and sup._procs["a"].pid == pid  # the same rendezvous
    finally:
        runner.close()
        server.shutdown()
        app.close()


# -------------------------------------------------------------- what says "being reclaimed"


def test_the_aws_notice_source_reads_imdsv2_and_ignores_rebalance() -> None:
    from emulators.aws_imds import FakeImds

    imds = FakeImds()
    try:
        noticed = notice_source("aws", clock=FakeClock(), metadata_url=imds.url)
        assert noticed is not None and not noticed()
        imds.rebalance = json.dumps({"noticeTime": "2026-12-04T10:00:00Z"})
        assert not noticed()  # elevated risk, no reclaim: the controller weighs it
        imds.instance_action = json.dumps({"action": "terminate", "time": "2026-12-04T10:02:00Z"})
        assert noticed()
        assert all(r[0] != "GET" or r[1] != "/latest/api/token" for r in imds.requests)
        assert any(r == ("PUT", "/latest/api/token") for r in imds.requests)  # IMDSv2 only
    finally:
        imds.close()


def test_the_gcp_notice_source_reads_the_preempted_flag() -> None:
    from emulators.gcp_env import TEST_ZONES, FakeGcpEnv

    with FakeGcpEnv() as env:
        zone = TEST_ZONES[0]
        name = env.server.add_foreign_instance(zone)
        noticed = notice_source(
            "gcp", clock=env.clock, metadata_url=env.server.metadata_base_url(zone, name)
        )
        assert noticed is not None and not noticed()
        env.server.preempt(zone, name)
        assert noticed()


def test_the_local_notice_source_is_the_notice_file(tmp_path: Path) -> None:
    noticed = notice_source("local", clock=FakeClock(), notice_file=tmp_path / "n.json")
    assert noticed is not None and not noticed()
    (tmp_path / "n.json").write_text("{}")
    assert noticed()
    assert notice_source("none", clock=FakeClock()) is None
    with pytest.raises(ValueError, match="unknown notice source"):
        notice_source("azure", clock=FakeClock())


TORCHRUN_TAIL = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/work/load_data.py", line 3, in <module>
[rank0]:     raise RuntimeError("the dataset at /nowhere/data is missing")
[rank0]: RuntimeError: the dataset at /nowhere/data is missing
E1205 13:01:02 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1)
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
load_data.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
  exitcode  : 1 (pid: 4242)
============================================================
"""


def test_failure_cause_is_the_worker_exception_not_the_launcher_summary(tmp_path: Path) -> None:
    from autoscaler.controller.agent import MAX_CAUSE_CHARS, failure_cause

    log = tmp_path / "job.log"
    log.write_text("x" * 40_000 + "\n" + TORCHRUN_TAIL)
    assert failure_cause(log, 1) == (
        "exit status 1: RuntimeError: the dataset at /nowhere/data is missing"
    )
    log.write_text("step 1\nout of memory, giving up\n")
    assert failure_cause(log, -9) == "ended by SIGKILL: out of memory, giving up"
    assert failure_cause(tmp_path / "none.log", 3) == "exit status 3"
    log.write_text("ValueError: " + "v" * 1000 + "\n")
    assert len(failure_cause(log, 1)) == MAX_CAUSE_CHARS


ADOPTABLE = r"""
import json, os, signal, subprocess, sys, time
run_dir = sys.argv[sys.argv.index("--run-dir") + 1]  # the agent's runs/<job>
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
def stop(*_):
    open(os.environ["CKPT"] + "-" + os.environ["COADAPT_JOB_ID"], "w").write("checkpointed")
    json.dump({"status": 75}, open(os.path.join(run_dir, "launcher-exit.json"), "w"))
    sys.exit(75)
signal.signal(signal.SIGTERM, stop)
print("started", flush=True)
time.sleep(600)
"""


def test_a_restarted_agent_adopts_its_running_launchers_and_says_so(tmp_path: Path) -> None:
    """Issue 37, item 5: an agent killed with kill -9 leaves its launchers running. The next
    agent of the instance adopts the one still running (same pid, same start time, same
    markers: its job goes on untouched, and its stop still checkpoints), ends what is left of
    the one that died with it and starts that job again (counted as a restart of that job),
    records an agent-restart event, and leaves no run folder behind. A recorded pid that is
    now another process is never adopted."""
    from autoscaler.controller.agent import AgentRunner
    from autoscaler.controller.api import ApiClient, generate_tokens, make_app, serve
    from autoscaler.controller.jobbook import JobSubmission
    from autoscaler.controller.lifecycle import InstanceStatus
    from autoscaler.controller.store import JobStatus, Store
    from coadapt_common.procfs import process_start_time

    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", "c1", clock)
    row = store.add_instance(
        instance_key="i-1", request_id="c1-i-1", offering_key="local/slot/local-a/on-demand",
        provider="local", instance_type="slot", zone="local-a", market="on-demand",
        gpu_type="T4", gpus=2, price_usd_per_hour=0.1,
    )  # fmt: skip
    row = store.transition("i-1", row.version, InstanceStatus.REQUESTED, reason="launch")
    store.transition(
        "i-1", row.version, InstanceStatus.RUNNING, reason="up", provider_instance_id="p"
    )
    for name in ("a", "b"):
        store.add_job(name, JobSubmission(name, 64, 512, 64, command=("x.py",)).to_json())
        store.set_assignments(name, {"i-1": 1})
        store.update_job(name, store.get_job(name).version, status=JobStatus.RUNNING)
    tokens = generate_tokens(tmp_path / "tokens.json")
    app = make_app(
        tmp_path / "store.db",
        tokens,
        clock,
        logs_dir=tmp_path / "logs",
        on_job_exit=lambda name, *, failed: JobStatus.FAILED,  # no launcher exits on its own
    )
    server = serve(app)
    script = tmp_path / "launcher.py"
    script.write_text(ADOPTABLE)
    agent_id = f"test-{uuid.uuid4().hex[:8]}"

    def life() -> AgentRunner:
        sup = Supervisor(
            agent_id,
            tmp_path / "agent",
            stop_grace_s=5.0,
            argv_for=lambda a: [sys.executable, str(script), "--", a.job],
            env={"CKPT": str(tmp_path / "ckpt")},
        )
        client = ApiClient(server.url, tokens.agent_credential("i-1"), timeout_s=10)
        return AgentRunner(client, "i-1", sup, address="127.0.0.1")

    first = life()
    second = None
    try:
        first.step()
        for job in ("a", "b"):
            _wait_started(first.supervisor, job)
        a_pid = first.supervisor._procs["a"].pid
        assert (tmp_path / "agent" / "runs" / "a").is_dir()
        # kill -9 of the agent: nothing is stopped; b's launcher dies with it, a's goes on
        b = first.supervisor._procs["b"].popen
        b.kill()
        b.wait(timeout=5)
        record = json.loads((tmp_path / "agent" / "processes.json").read_text())
        record["c"] = {**record["a"], "pid": os.getpid(), "started": "1"}  # a recycled pid
        (tmp_path / "agent" / "processes.json").write_text(json.dumps(record))
        before = store.usage(["a", "b"], clock.now_s())
        clock.advance(2.0)  # the instance's init restarts the agent a moment later

        second = life()
        actions = second.step()
        assert [(x.kind.value, x.job) for x in actions] == [("start", "b")]
        assert second.supervisor._procs["a"].pid == a_pid  # the same launcher, adopted
        assert process_start_time(a_pid) is not None
        after = store.usage(["a", "b"], clock.now_s())
        assert after["a"][1] == before["a"][1] and after["b"][1] == before["b"][1] + 1
        (event,) = [e for e in store.events_after(0) if e.kind == "agent-restart"]
        assert event.subject == "i-1"
        assert "adopted the running launcher of a" in event.message
        assert "the launcher of b was gone: it starts again from its checkpoint" in event.message
        assert "c" not in second.supervisor.running
        assert sorted(p.name for p in (tmp_path / "agent" / "runs").iterdir()) == ["a", "b"]
        _wait_started(second.supervisor, "b")
        # The adopted launcher still stops with a checkpoint, and its status is read back.
        assert second.supervisor.stop("a") == 75
        assert (tmp_path / "ckpt-a").read_text() == "checkpointed"
        second.close()
        assert _marked(agent_id, None) == []
        assert list((tmp_path / "agent" / "runs").iterdir()) == []
        # A clean end leaves nothing to adopt and no restart to tell.
        assert life().supervisor.adopt() is None
    finally:
        (second or first).close()
        first.supervisor.sweep()
        server.shutdown()
        app.close()
