"""``LocalProvider`` with real agent processes: lifecycle, restarts, crash recovery, cleanup.

Everything here runs real ``providers.local_agent`` processes; waits on them are real but
bounded (a few seconds at most) and polled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coadapt_common.atomic import write_json_atomic
from coadapt_common.clock import FakeClock
from providers.base import InstanceState, InterruptionKind, LaunchRequest, Market, Offering
from providers.errors import (
    InstanceNotFoundError,
    InsufficientCapacityError,
    InvalidRequestError,
)
from providers.local import (
    AGENT_SCRIPT,
    EndReason,
    LocalProvider,
    LocalRecord,
    RecordState,
    local_offerings,
)
from providers.local_agent import INSTANCE_ENV
from providers.tags import all_tags
from tests.providers.test_local_contract import instance_running, kill_leftovers

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "c1"


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def offering(itype: str = "local-1gpu", market: Market = Market.SPOT) -> Offering:
    return next(o for o in local_offerings() if (o.instance_type, o.market) == (itype, market))


def req(rid: str, count: int = 1, itype: str = "local-1gpu", **kw: object) -> LaunchRequest:
    return LaunchRequest(rid, kw.pop("cluster", CLUSTER), (offering(itype),), count, **kw)  # type: ignore[arg-type]


def agent_state(state_dir: Path, iid: str) -> dict[str, object]:
    try:
        return json.loads((state_dir / "agents" / iid / "agent.json").read_text())
    except (OSError, ValueError):
        return {}


def pid_running(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2 :].split()[0] not in ("Z", "X")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "local"
    yield d
    # Whatever a test did, leave nothing running.
    left = kill_leftovers(d)
    if left:
        pytest.fail(f"instances left running: {left}")


@pytest.fixture
def local(state_dir: Path, clock: FakeClock) -> LocalProvider:
    return LocalProvider(state_dir, clock=clock, max_gpu_slots=8, term_grace_s=2.0, heartbeat_s=0.2)


def test_catalogue() -> None:
    offerings = local_offerings()
    assert {o.instance_type for o in offerings} == {"local-1gpu", "local-2gpu", "local-4gpu"}
    assert {o.zone for o in offerings} == {"local-a"}
    assert {o.market for o in offerings} == {Market.SPOT, Market.ON_DEMAND}


def test_simulated_spot_prices_move_around_the_nominal_ones(tmp_path: Path) -> None:
    clock = FakeClock(start_s=0.0)
    nominal = {o.key: o.price_usd_per_hour for o in local_offerings()}
    moving = LocalProvider(tmp_path, clock=clock, spot_price_swing=0.5, spot_price_period_s=100)
    seen: dict[str, list[float]] = {}
    for _ in range(100):
        for o in moving.offerings():
            seen.setdefault(o.key, []).append(o.price_usd_per_hour or 0.0)
        clock.advance(1.0)
    for key, prices in seen.items():
        base = nominal[key] or 0.0
        if key.endswith("/on-demand"):
            assert set(prices) == {base}
            continue
        assert min(prices) >= 0.5 * base - 1e-9 and max(prices) <= 1.5 * base + 1e-9
        assert max(prices) - min(prices) > 0.9 * base  # it really moves
        assert abs(sum(prices) / len(prices) - base) < 0.02 * base  # around the nominal price
    spot = {p.instance_type: p.price_usd_per_hour for p in moving.spot_prices()}
    assert spot == {
        o.instance_type: o.price_usd_per_hour
        for o in moving.offerings() if o.market is Market.SPOT
    }  # fmt: skip
    steady = LocalProvider(tmp_path / "s", clock=clock)
    assert {o.key: o.price_usd_per_hour for o in steady.offerings()} == nominal
    with pytest.raises(InvalidRequestError):
        LocalProvider(tmp_path / "x", clock=clock, spot_price_swing=1.0)


def test_agent_comes_up_heartbeats_and_stops_cleanly(local: LocalProvider, state_dir: Path) -> None:
    (inst,) = local.launch(req("r1", itype="local-2gpu")).instances
    rec = local.record(inst.instance_id)
    assert rec is not None and rec.pid is not None and rec.pgid == rec.pid
    wait_until(lambda: local.list_instances(CLUSTER)[0].state is InstanceState.RUNNING)
    first = agent_state(state_dir, inst.instance_id)
    assert first["pid"] == rec.pid and first["pgid"] == rec.pid and first["gpu_slots"] == 2
    wait_until(
        lambda: (
            agent_state(state_dir, inst.instance_id)["heartbeat_at_s"] != first["heartbeat_at_s"]
        )
    )
    result = local.terminate(CLUSTER, [inst.instance_id], "t1")
    assert result.terminated == (inst.instance_id,)
    final = agent_state(state_dir, inst.instance_id)
    assert final["state"] == "stopped" and final["stop_signal"] == signal.SIGTERM
    assert not pid_running(rec.pid)
    assert local.op_counts["signal"] == 1, "a clean stop needs no SIGKILL"
    done = local.record(inst.instance_id)
    assert done is not None and done.state is RecordState.TERMINATED
    assert done.end_reason is EndReason.TERMINATED


def test_terminate_stops_the_workload_in_the_group(local: LocalProvider, state_dir: Path) -> None:
    (inst,) = local.launch(
        req("r1", user_data="echo $COADAPT_GPU_SLOTS > slots; exec sleep 300")
    ).instances
    wait_until(lambda: agent_state(state_dir, inst.instance_id).get("workload_pid") is not None)
    wait_until(lambda: (state_dir / "agents" / inst.instance_id / "slots").exists())
    workload = agent_state(state_dir, inst.instance_id)["workload_pid"]
    assert isinstance(workload, int) and pid_running(workload)
    assert (state_dir / "agents" / inst.instance_id / "slots").read_text().strip() == "1"
    local.terminate(CLUSTER, [inst.instance_id], "t1")
    assert not pid_running(workload)


@pytest.mark.parametrize("preset", [None, "3"])
def test_workers_get_their_share_of_the_cores_unless_the_user_chose(
    state_dir: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, preset: str | None
) -> None:
    if preset is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", preset)
    cores = os.cpu_count() or 1
    local = LocalProvider(state_dir, clock=clock, max_gpu_slots=cores * 4, heartbeat_s=0.2)
    assert local.threads_per_slot == 1
    assert LocalProvider(state_dir, clock=clock, max_gpu_slots=1).threads_per_slot == cores
    (inst,) = local.launch(
        req("r1", user_data="echo $OMP_NUM_THREADS > threads; exec sleep 300")
    ).instances
    told = state_dir / "agents" / inst.instance_id / "threads"
    try:
        wait_until(lambda: told.exists() and told.read_text().strip() != "")
        assert told.read_text().strip() == (preset or "1")
    finally:
        local.terminate(CLUSTER, [inst.instance_id], "t1")


def test_the_agent_alone_stops_its_workload_on_sigterm(
    local: LocalProvider, state_dir: Path
) -> None:
    (inst,) = local.launch(req("r1", user_data="exec sleep 300")).instances
    wait_until(lambda: agent_state(state_dir, inst.instance_id).get("workload_pid") is not None)
    state = agent_state(state_dir, inst.instance_id)
    agent_pid, workload = state["pid"], state["workload_pid"]
    assert isinstance(agent_pid, int) and isinstance(workload, int)
    os.kill(agent_pid, signal.SIGTERM)  # the agent only, not its group
    wait_until(lambda: agent_state(state_dir, inst.instance_id).get("state") == "stopped")
    assert agent_state(state_dir, inst.instance_id)["workload_exit"] == -signal.SIGTERM
    wait_until(lambda: not pid_running(workload), timeout_s=2.0)
    wait_until(lambda: local.list_instances(CLUSTER) == [])


@pytest.mark.slow
def test_a_workload_that_crashes_is_started_again_one_that_finishes_is_not(
    local: LocalProvider, state_dir: Path
) -> None:
    """As a machine's init restarts a crashed service (the node agent)."""
    (inst,) = local.launch(req("r1", user_data="exec sleep 300")).instances
    wait_until(lambda: agent_state(state_dir, inst.instance_id).get("workload_pid") is not None)
    first = agent_state(state_dir, inst.instance_id)["workload_pid"]
    assert isinstance(first, int)
    os.kill(first, signal.SIGKILL)
    wait_until(
        lambda: (
            agent_state(state_dir, inst.instance_id).get("workload_restarts") == 1
            and agent_state(state_dir, inst.instance_id).get("workload_pid") != first
        ),
        timeout_s=10.0,
    )
    second = agent_state(state_dir, inst.instance_id)["workload_pid"]
    assert isinstance(second, int) and pid_running(second)
    assert [i.instance_id for i in local.list_instances(CLUSTER)] == [inst.instance_id]
    (done,) = local.launch(req("r2", user_data="exit 0")).instances
    wait_until(lambda: agent_state(state_dir, done.instance_id).get("workload_exit") == 0)
    time.sleep(2.0)
    assert agent_state(state_dir, done.instance_id).get("workload_restarts") == 0
    local.terminate(CLUSTER, [inst.instance_id, done.instance_id], "t1")
    assert not pid_running(second)


def test_the_intent_is_on_disk_before_the_agent_starts(
    state_dir: Path, clock: FakeClock, tmp_path: Path
) -> None:
    """A wrapper interpreter looks for the record the moment it is executed."""
    seen = tmp_path / "seen"
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            ls "{state_dir}/instances" > "{seen}"
            exec "{sys.executable}" "$@"
            """
        )
    )
    wrapper.chmod(0o755)
    local = LocalProvider(state_dir, clock=clock, python=str(wrapper), heartbeat_s=0.2)
    (inst,) = local.launch(req("r1")).instances
    wait_until(lambda: agent_state(state_dir, inst.instance_id).get("state") == "running")
    local.down(CLUSTER)
    assert f"{inst.instance_id}.json" in seen.read_text().split()


def test_terminate_also_stops_what_the_instance_started_in_its_own_session(
    local: LocalProvider, state_dir: Path
) -> None:
    """A node agent's launchers start their own sessions (out of the instance's group); they
    are the instance's all the same, and end with it."""
    script = (
        'python3 -c \'import os, time; os.setsid(); open("escaped", "w").write('
        "str(os.getpid())); time.sleep(300)' & exec sleep 300"
    )
    (inst,) = local.launch(req("r1", user_data=script)).instances
    escaped_file = state_dir / "agents" / inst.instance_id / "escaped"
    wait_until(lambda: escaped_file.exists() and escaped_file.read_text().strip() != "")
    escaped = int(escaped_file.read_text())
    assert pid_running(escaped)
    local.terminate(CLUSTER, [inst.instance_id], "t1")
    assert not pid_running(escaped)


def test_sigterm_ignoring_leftovers_are_sigkilled(state_dir: Path, clock: FakeClock) -> None:
    local = LocalProvider(state_dir, clock=clock, term_grace_s=0.5, heartbeat_s=0.2)
    # The shell ignores SIGTERM and so does its background sleep (ignored dispositions survive
    # exec); the agent SIGKILLs the shell, the orphaned sleep stays in the group.
    script = "trap '' TERM; sleep 300 & echo $! > sleeper; wait"
    (inst,) = local.launch(req("r1", user_data=script)).instances
    sleeper_file = state_dir / "agents" / inst.instance_id / "sleeper"
    wait_until(lambda: sleeper_file.exists() and sleeper_file.read_text().strip() != "")
    sleeper = int(sleeper_file.read_text())
    wait_until(lambda: agent_state(state_dir, inst.instance_id).get("state") == "running")
    local.terminate(CLUSTER, [inst.instance_id], "t1")
    assert not pid_running(sleeper)
    assert local.op_counts["signal"] == 2, "SIGTERM, then SIGKILL for the leftover"


def test_a_restarted_controller_rediscovers_and_cleans_up(state_dir: Path) -> None:
    """Launch from a separate controller process that exits; a new provider takes over."""
    script = textwrap.dedent(
        f"""
        import json
        from providers.base import LaunchRequest
        from providers.local import LocalProvider, local_offerings
        p = LocalProvider({str(state_dir)!r}, heartbeat_s=0.2)
        o = [x for x in local_offerings() if x.instance_type == "local-1gpu"][0]
        r = p.launch(LaunchRequest("r1", "c1", (o,), 2))
        print(json.dumps([i.instance_id for i in r.instances]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    launched = set(json.loads(out.stdout))
    restarted = LocalProvider(state_dir, term_grace_s=2.0)
    listed = {i.instance_id for i in restarted.list_instances(CLUSTER)}
    assert listed == launched, "detached agents outlive the controller and are rediscovered"
    again = restarted.launch(req("r1", count=2))
    assert {i.instance_id for i in again.instances} == launched, "idempotent across restarts"
    result = restarted.down(CLUSTER)
    assert set(result.terminated) == launched
    assert not any(instance_running(state_dir, i) for i in launched)


def test_a_recycled_pid_is_never_adopted_nor_signalled(
    local: LocalProvider, state_dir: Path, clock: FakeClock
) -> None:
    innocent = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        iid = "local-recycled0001"
        stale = LocalRecord(
            instance_id=iid,
            tags=all_tags(CLUSTER, "r-old", {}),
            offering=offering(),
            state=RecordState.RUNNING,
            created_at_s=clock.now_s(),
            pid=innocent.pid,
            pgid=innocent.pid,
            started_at_s=clock.now_s(),
        )
        write_json_atomic(state_dir / "instances" / f"{iid}.json", stale.to_json())
        assert local.list_instances(CLUSTER) == []
        assert pid_running(innocent.pid)
        rec = local.record(iid)
        assert rec is not None and rec.end_reason is EndReason.DIED
        assert local.terminate(CLUSTER, [iid], "t1").already_gone == (iid,)
        assert pid_running(innocent.pid)
        assert innocent.poll() is None
    finally:
        innocent.kill()
        innocent.wait()


def _intent(state_dir: Path, clock: FakeClock, iid: str, request_id: str) -> None:
    rec = LocalRecord(
        instance_id=iid,
        tags=all_tags(CLUSTER, request_id, {}),
        offering=offering(),
        state=RecordState.PENDING,
        created_at_s=clock.now_s(),
    )
    (state_dir / "agents" / iid).mkdir(parents=True)
    write_json_atomic(state_dir / "instances" / f"{iid}.json", rec.to_json())


def test_an_intent_without_a_process_is_closed_and_can_be_relaunched(
    local: LocalProvider, state_dir: Path, clock: FakeClock
) -> None:
    _intent(state_dir, clock, "local-crashed00001", "r1")
    assert local.list_instances(CLUSTER) == []
    rec = local.record("local-crashed00001")
    assert rec is not None and rec.end_reason is EndReason.NEVER_STARTED
    result = local.launch(req("r1"))
    assert len(result.instances) == 1
    assert result.instances[0].instance_id != "local-crashed00001"
    local.down(CLUSTER)


def test_an_intent_whose_agent_did_start_is_adopted(
    local: LocalProvider, state_dir: Path, clock: FakeClock
) -> None:
    """The controller crashed after spawning but before recording the pid."""
    iid = "local-crashed00002"
    _intent(state_dir, clock, iid, "r1")
    agent_dir = state_dir / "agents" / iid
    env = {**os.environ, INSTANCE_ENV: iid}
    argv = [sys.executable, AGENT_SCRIPT, "--instance-id", iid]
    argv += ["--agent-dir", str(agent_dir), "--gpus", "1", "--heartbeat-s", "0.2"]
    orphan = subprocess.Popen(argv, env=env, start_new_session=True, cwd=agent_dir)
    try:
        wait_until(lambda: agent_state(state_dir, iid).get("state") == "running")
        listed = local.list_instances(CLUSTER)
        assert [i.instance_id for i in listed] == [iid]
        rec = local.record(iid)
        assert rec is not None and rec.pid == orphan.pid and rec.pgid == orphan.pid
        assert local.terminate(CLUSTER, [iid], "t1").terminated == (iid,)
        assert orphan.wait(timeout=5) == 0, "the adopted agent stopped cleanly"
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


def test_an_agent_that_dies_is_reported_once(local: LocalProvider, state_dir: Path) -> None:
    (inst,) = local.launch(req("r1")).instances
    rec = local.record(inst.instance_id)
    assert rec is not None and rec.pgid is not None
    os.killpg(rec.pgid, signal.SIGKILL)
    wait_until(lambda: local.list_instances(CLUSTER) == [])
    notices = local.interruptions(CLUSTER)
    assert [(n.instance_id, n.kind) for n in notices] == [
        (inst.instance_id, InterruptionKind.TERMINATED)
    ]
    assert local.interruptions(CLUSTER) == []
    assert local.record(inst.instance_id).end_reason is EndReason.DIED  # type: ignore[union-attr]


def test_preemption_kills_at_the_deadline(
    local: LocalProvider, state_dir: Path, clock: FakeClock
) -> None:
    (inst,) = local.launch(req("r1")).instances
    notice = local.preempt(inst.instance_id, notice_s=30.0)
    assert notice.deadline_s == clock.now_s() + 30.0
    spot_notice = json.loads(
        (state_dir / "agents" / inst.instance_id / "spot-notice.json").read_text()
    )
    assert spot_notice["deadline_s"] == notice.deadline_s
    clock.advance(29.0)
    assert [i.instance_id for i in local.list_instances(CLUSTER)] == [inst.instance_id]
    clock.advance(1.0)
    assert local.list_instances(CLUSTER) == []
    rec = local.record(inst.instance_id)
    assert rec is not None and rec.end_reason is EndReason.PREEMPTED
    assert not instance_running(state_dir, inst.instance_id)
    kinds = [n.kind for n in local.interruptions(CLUSTER)]
    assert kinds == [InterruptionKind.SPOT_INTERRUPTION], "no extra TERMINATED notice"
    with pytest.raises(InstanceNotFoundError):
        local.preempt(inst.instance_id)


def test_slot_budget_limits_launches(state_dir: Path, clock: FakeClock) -> None:
    local = LocalProvider(state_dir, clock=clock, max_gpu_slots=5, heartbeat_s=0.2)
    four = local.launch(req("r1", itype="local-4gpu"))
    assert len(four.instances) == 1
    two = local.launch(req("r2", count=1, itype="local-2gpu"))
    assert two.instances == ()
    assert isinstance(two.errors[0].error, InsufficientCapacityError)
    assert local.unavailable.is_unavailable(offering("local-2gpu").key)
    one = local.launch(req("r3", count=3))
    assert len(one.instances) == 1, "the last free slot fills, then the pool runs dry"
    assert isinstance(one.errors[0].error, InsufficientCapacityError)
    local.down(CLUSTER)
    clock.advance(180.0)
    assert len(local.launch(req("r4", itype="local-2gpu")).instances) == 1
    local.down(CLUSTER)


def test_down_spares_other_clusters(local: LocalProvider) -> None:
    mine = local.launch(req("r1", count=2)).instances
    (theirs,) = local.launch(req("r2", cluster="c2")).instances
    result = local.down(CLUSTER)
    assert set(result.terminated) == {i.instance_id for i in mine}
    assert result.refused == () and result.already_gone == ()
    assert [i.instance_id for i in local.list_instances("c2")] == [theirs.instance_id]
    local.down("c2")
    assert local.list_instances("c2") == []


def test_unknown_ids_are_already_gone(local: LocalProvider) -> None:
    result = local.terminate(CLUSTER, ["local-nosuchthing0"], "t1")
    assert result.already_gone == ("local-nosuchthing0",)


def test_old_terminated_records_are_forgotten(state_dir: Path, clock: FakeClock) -> None:
    local = LocalProvider(state_dir, clock=clock, terminated_retention_s=60.0, heartbeat_s=0.2)
    (inst,) = local.launch(req("r1")).instances
    local.down(CLUSTER)
    assert local.record(inst.instance_id) is not None
    clock.advance(61.0)
    local.list_instances(CLUSTER)
    assert local.record(inst.instance_id) is None
    assert not (state_dir / "agents" / inst.instance_id).exists()
