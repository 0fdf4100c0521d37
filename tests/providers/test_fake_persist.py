"""``FakeProvider(state_path=...)``: a fake cloud that outlives the adapter's process.

Several adapters (in this process, or real child processes killed with SIGKILL) share one
state file; the cloud side survives, the adapter side (capacity marks, calls, injected errors)
does not.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coadapt_common.clock import FakeClock
from providers.base import InstanceState, InterruptionKind, LaunchRequest, Market, Offering
from providers.errors import (
    AuthError,
    FakeStateError,
    InstanceNotFoundError,
    InsufficientCapacityError,
    ProviderError,
)
from providers.fake import STATE_FORMAT, STATE_VERSION, FakeProvider, default_capacity
from providers.tags import CLUSTER_ID_TAG, REQUEST_ID_TAG, ownership_tags
from tests.providers.contract import ProviderContract
from tests.providers.test_fake_contract import FakeHarness

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "c1"
T0 = 1_700_000_000.0


def pool(provider: FakeProvider, itype: str, zone: str, market: Market = Market.SPOT) -> Offering:
    return next(
        o
        for o in provider.offerings()
        if (o.instance_type, o.zone, o.market) == (itype, zone, market)
    )


def req(rid: str, offerings: list[Offering], count: int, cluster: str = CLUSTER) -> LaunchRequest:
    return LaunchRequest(rid, cluster, tuple(offerings), count)


def ids(provider: FakeProvider, cluster: str = CLUSTER) -> set[str]:
    return {i.instance_id for i in provider.list_instances(cluster)}


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "cloud" / "cloud.json"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def fake(path: Path, clock: FakeClock) -> FakeProvider:
    return FakeProvider(clock=clock, state_path=path)


@pytest.fixture
def a(fake: FakeProvider) -> Offering:
    return pool(fake, "g4dn.xlarge", "us-east-1a")


@pytest.fixture
def b(fake: FakeProvider) -> Offering:
    return pool(fake, "g4dn.xlarge", "us-east-1b")


# ------------------------------------------------------------- one process


def test_a_new_file_holds_the_initial_cloud_under_its_header(path: Path, clock: FakeClock) -> None:
    FakeProvider(capacity=default_capacity(), clock=clock, state_path=path)
    doc = json.loads(path.read_text())
    assert (doc["format"], doc["version"], doc["provider"]) == (STATE_FORMAT, STATE_VERSION, "fake")
    assert len(doc["catalogue"]) == 16
    assert doc["capacity"] == default_capacity()
    assert (doc["instances"], doc["notices"], doc["next_id"]) == ([], {}, 1)


def test_two_objects_over_one_file_see_each_others_changes(
    path: Path, clock: FakeClock, fake: FakeProvider, a: Offering
) -> None:
    other = FakeProvider(clock=clock, state_path=path)
    launched = fake.launch(req("r1", [a], 3)).instances
    assert ids(other) == {i.instance_id for i in launched}
    first, second, third = (i.instance_id for i in launched)

    assert other.terminate(CLUSTER, [first], "t1").terminated == (first,)
    assert ids(fake) == {second, third}
    assert fake.instance_state(first) is InstanceState.TERMINATED

    notice = other.preempt(second, notice_s=60.0)
    assert fake.interruptions(CLUSTER) == [notice]
    assert other.interruptions(CLUSTER) == [], "draining is a cloud change"
    clock.advance(60.0)
    assert ids(fake) == {third}
    assert other.instance_state(second) is InstanceState.TERMINATED

    other.set_capacity(a.key, 2)
    assert fake.remaining_capacity(a.key) == 1
    fake.set_spot_price("g4dn.xlarge", "us-east-1a", 0.42)
    assert pool(other, "g4dn.xlarge", "us-east-1a").price_usd_per_hour == 0.42


def test_relaunching_a_request_after_a_restart_creates_nothing(
    path: Path, fake: FakeProvider, a: Offering, b: Offering
) -> None:
    first = fake.launch(req("r1", [a], 3))
    restarted = FakeProvider(clock=FakeClock(T0 + 600.0), state_path=path)
    again = restarted.launch(req("r1", [a], 3))
    assert again.instances == first.instances
    assert restarted.call_count("launch") == 0

    restarted.terminate(CLUSTER, [first.instances[0].instance_id], "t1")
    third = FakeProvider(clock=FakeClock(T0 + 900.0), state_path=path)
    topped = third.launch(req("r1", [b], 3))
    assert topped.instances[:2] == first.instances[1:]
    assert [i.offering_key for i in topped.instances[2:]] == [b.key]
    assert third.call_count("launch") == 1
    assert len({i.instance_id for i in (*first.instances, *topped.instances)}) == 4, "no id reuse"


def test_foreign_instances_survive_and_stay_invisible(
    path: Path, clock: FakeClock, fake: FakeProvider, a: Offering
) -> None:
    fake.set_capacity(a.key, 3)
    untagged = fake.add_foreign_instance(a)
    other_cluster = fake.add_foreign_instance(a, ownership_tags("c2", "r9"))
    half_tagged = fake.add_foreign_instance(a, {CLUSTER_ID_TAG: CLUSTER})
    foreign = [untagged, other_cluster, half_tagged]

    restarted = FakeProvider(clock=clock, state_path=path)
    assert restarted.list_instances(CLUSTER) == []
    assert ids(restarted, "c2") == {other_cluster}
    assert restarted.terminate(CLUSTER, foreign, "t1").refused == tuple(foreign)
    assert {restarted.instance_state(i) for i in foreign} == {InstanceState.RUNNING}
    result = restarted.launch(req("r1", [a], 1))  # they still hold the pool's capacity
    assert result.instances == ()
    assert isinstance(result.errors[0].error, InsufficientCapacityError)


def test_cloud_state_survives_with_absolute_timestamps(
    path: Path, clock: FakeClock, fake: FakeProvider, a: Offering
) -> None:
    doomed, warned = fake.launch(req("r1", [a], 2)).instances
    fake.preempt(doomed.instance_id, notice_s=120.0)
    fake.rebalance(warned.instance_id)
    fake.set_spot_price("g4dn.xlarge", "us-east-1a", 0.31)
    fake.set_capacity(a.key, 5)

    later = FakeClock(T0 + 200.0)  # a process restarted later, with its own clock
    restarted = FakeProvider(clock=later, state_path=path)
    (left,) = restarted.list_instances(CLUSTER)
    assert left.instance_id == warned.instance_id and left.launched_at_s == T0
    notices = restarted.interruptions(CLUSTER)
    assert [(n.instance_id, n.kind, n.deadline_s) for n in notices] == [
        (doomed.instance_id, InterruptionKind.SPOT_INTERRUPTION, T0 + 120.0),
        (warned.instance_id, InterruptionKind.REBALANCE, None),
    ]
    assert restarted.instance_state(doomed.instance_id) is InstanceState.TERMINATED
    assert pool(restarted, "g4dn.xlarge", "us-east-1a").price_usd_per_hour == 0.31
    assert restarted.remaining_capacity(a.key) == 4
    doc = json.loads(path.read_text())
    assert {r["id"]: r["terminated_at_s"] for r in doc["instances"]} == {
        doomed.instance_id: T0 + 120.0,
        warned.instance_id: None,
    }


def test_the_adapter_side_is_not_persisted(
    path: Path, clock: FakeClock, fake: FakeProvider, a: Offering, b: Offering
) -> None:
    fake.set_capacity(a.key, 0)
    fake.launch(req("r1", [a, b], 1))
    assert fake.unavailable.is_unavailable(a.key)
    fake.next_error("list", AuthError("denied"))

    restarted = FakeProvider(clock=clock, state_path=path)
    assert restarted.calls == []
    assert not restarted.unavailable.is_unavailable(a.key), "capacity marks die with the adapter"
    assert len(restarted.list_instances(CLUSTER)) == 1, "injected errors stay with their object"
    with pytest.raises(AuthError):
        fake.list_instances(CLUSTER)


def test_a_provider_error_still_commits_what_the_cloud_did(
    path: Path, clock: FakeClock, fake: FakeProvider, a: Offering
) -> None:
    (inst,) = fake.launch(req("r1", [a], 1)).instances
    fake.preempt(inst.instance_id, notice_s=30.0)
    clock.advance(30.0)
    with pytest.raises(InstanceNotFoundError):  # the deadline passed first: a cloud change
        fake.preempt(inst.instance_id)
    (record,) = json.loads(path.read_text())["instances"]
    assert record["terminated_at_s"] == T0 + 30.0


def test_reset_and_restarted_act_on_the_file(
    path: Path, clock: FakeClock, fake: FakeProvider, a: Offering
) -> None:
    twin = fake.restarted()
    launched = twin.launch(req("r1", [a], 2))
    assert ids(fake) == {i.instance_id for i in launched.instances}
    other = FakeProvider(clock=clock, state_path=path)
    fake.reset()
    assert other.list_instances(CLUSTER) == [] and twin.list_instances(CLUSTER) == []
    assert json.loads(path.read_text())["next_id"] == 1


def test_without_a_state_path_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    monkeypatch.chdir(tmp_path)
    fake = FakeProvider(clock=clock)
    a = pool(fake, "g4dn.xlarge", "us-east-1a")
    (inst,) = fake.launch(req("r1", [a], 1)).instances
    fake.preempt(inst.instance_id, notice_s=0.0)
    fake.reset()
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------ a bad file


def _valid_text(path: Path) -> str:
    provider = FakeProvider(clock=FakeClock(T0), state_path=path)
    provider.launch(req("r1", [pool(provider, "g4dn.xlarge", "us-east-1a")], 2))
    return path.read_text()


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(lambda text: "not json at all", id="garbage"),
        pytest.param(lambda text: text[: len(text) // 2], id="truncated"),
        pytest.param(lambda text: "", id="empty"),
        pytest.param(lambda text: "[1, 2]", id="a-list"),
        pytest.param(lambda text: text.replace(STATE_FORMAT, "something-else"), id="format"),
        pytest.param(lambda text: text.replace('"version": 1', '"version": 2'), id="version"),
        pytest.param(
            lambda text: text.replace('"provider": "fake"', '"provider": "aws"'), id="name"
        ),
        pytest.param(lambda text: text.replace('"next_id": 3', '"next_id": "3"'), id="next-id"),
        pytest.param(lambda text: text.replace('"pool": "fake/', '"pool": "nowhere/'), id="pool"),
        pytest.param(
            lambda text: json.dumps({**json.loads(text), "instances": None}), id="instances"
        ),
    ],
)
def test_a_bad_state_file_raises_a_typed_error_naming_it(
    path: Path, corrupt: Callable[[str], str]
) -> None:
    text = _valid_text(path)
    bad = corrupt(text)
    assert bad != text
    path.write_text(bad)
    with pytest.raises(FakeStateError) as caught:
        FakeProvider(clock=FakeClock(T0), state_path=path)
    assert isinstance(caught.value, ProviderError)
    assert caught.value.path == str(path)
    assert str(path) in str(caught.value)


def test_a_file_that_goes_bad_or_away_later_raises_at_the_next_operation(
    path: Path, fake: FakeProvider
) -> None:
    path.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(FakeStateError, match=str(path)):
        fake.list_instances(CLUSTER)
    path.unlink()
    with pytest.raises(FakeStateError, match="gone"):
        fake.offerings()


# ------------------------------------------------------- real processes


def _spawn(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lines(proc: subprocess.Popen[str], n: int) -> list[str]:
    """The first ``n`` lines the child prints (fails with its stderr if it exits first)."""
    assert proc.stdout is not None
    out: list[str] = []
    while len(out) < n:
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=10)
            assert proc.stderr is not None
            raise AssertionError(f"child exited {proc.returncode}: {proc.stderr.read()}")
        out.append(line.strip())
    return out


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    spawned: list[subprocess.Popen[str]] = []
    yield spawned
    for proc in spawned:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


_COMMIT_SCRIPT = """
    import os, signal, sys
    import coadapt_common.atomic
    import providers.fake
    from coadapt_common.clock import FakeClock
    from providers.base import LaunchRequest

    path, mode = sys.argv[1], sys.argv[2]
    fake = providers.fake.FakeProvider(clock=FakeClock(), state_path=path)
    pool = next(o for o in fake.offerings() if o.instance_type == "g4dn.xlarge")
    real_write = providers.fake.write_text_atomic

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    def write_then_die(*args, **kwargs):
        real_write(*args, **kwargs)
        die()

    if mode == "before-write":
        providers.fake.write_text_atomic = die
    elif mode == "before-rename":  # the new text is written and fsynced, not yet renamed
        coadapt_common.atomic.os.replace = die
    else:
        providers.fake.write_text_atomic = write_then_die
    fake.launch(LaunchRequest("r2", "c1", (pool,), 3))
    print("not killed", flush=True)
"""


@pytest.mark.parametrize(
    ("mode", "created"), [("before-write", 0), ("before-rename", 0), ("after-write", 3)]
)
def test_the_write_is_the_commit_point(
    path: Path, fake: FakeProvider, a: Offering, mode: str, created: int
) -> None:
    fake.launch(req("r1", [a], 1))
    before = ids(fake)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_COMMIT_SCRIPT), str(path), mode],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    after = FakeProvider(clock=FakeClock(T0), state_path=path)  # the lock died with the child
    assert ids(after) >= before
    assert len(ids(after)) == len(before) + created
    relaunch = after.launch(req("r2", [a], 3))  # the crashed intent, re-issued
    assert len(relaunch.instances) == 3
    assert after.call_count("launch") == (0 if created else 1)


_LOOP_SCRIPT = """
    import sys
    from coadapt_common.clock import SystemClock
    from providers.base import LaunchRequest
    from providers.fake import FakeProvider

    fake = FakeProvider(clock=SystemClock(), state_path=sys.argv[1])
    pool = next(o for o in fake.offerings() if o.instance_type == "g4dn.xlarge")
    k = 0
    while True:
        launched = fake.launch(LaunchRequest(f"r{k}", "c1", (pool,), 2))
        fake.terminate("c1", [launched.instances[0].instance_id], f"t{k}")
        print(k, flush=True)
        k += 1
"""


def test_a_process_killed_while_looping_leaves_a_consistent_cloud(
    path: Path, children: list[subprocess.Popen[str]]
) -> None:
    proc = _spawn(_LOOP_SCRIPT, str(path))
    children.append(proc)
    _lines(proc, 8)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)

    doc = json.loads(path.read_text())  # a whole file, never a half-written one
    assert (doc["format"], doc["version"]) == (STATE_FORMAT, STATE_VERSION)
    after = FakeProvider(clock=FakeClock(time.time()), state_path=path)
    listed = after.list_instances(CLUSTER)
    assert listed, "the child launched before it was killed"
    for inst in listed:
        assert inst.tags[REQUEST_ID_TAG] == inst.request_id
    live = Counter(i.request_id for i in listed)
    last = max(int(rid[1:]) for rid in live)
    assert set(live) == {f"r{k}" for k in range(last + 1)}, "no launch lost"
    assert all(n == 1 for rid, n in live.items() if rid != f"r{last}")
    assert live[f"r{last}"] in (1, 2), "killed between the launch and its terminate, or not"
    assert len(doc["instances"]) == 2 * (last + 1)
    assert doc["next_id"] == 2 * (last + 1) + 1


_RACE_SCRIPT = """
    import sys
    from coadapt_common.clock import SystemClock
    from providers.base import LaunchRequest
    from providers.fake import FakeProvider

    fake = FakeProvider(clock=SystemClock(), state_path=sys.argv[1])
    pool = next(o for o in fake.offerings() if o.instance_type == "g4dn.xlarge")
    for k in range(int(sys.argv[2])):
        fake.launch(LaunchRequest(f"r{k}", "c1", (pool,), 1))
        print(k, flush=True)
"""


def test_two_processes_never_interleave(path: Path, children: list[subprocess.Popen[str]]) -> None:
    rounds = 40
    mine = FakeProvider(state_path=path)  # SystemClock, like the child
    a = pool(mine, "g4dn.xlarge", "us-east-1a")
    proc = _spawn(_RACE_SCRIPT, str(path), str(rounds))
    children.append(proc)
    _lines(proc, 1)
    victim = next(iter(ids(mine)))
    notice = mine.preempt(victim, notice_s=0.0)  # a test preempting while a controller runs
    for k in range(rounds):
        mine.launch(req(f"q{k}", [a], 1, cluster="c2"))
    _lines(proc, rounds - 1)
    assert proc.wait(timeout=60) == 0

    theirs = ids(mine)
    assert len(theirs) == rounds - 1 and victim not in theirs
    assert len(ids(mine, "c2")) == rounds
    assert mine.interruptions(CLUSTER) == [notice]
    doc = json.loads(path.read_text())
    assert len({r["id"] for r in doc["instances"]}) == 2 * rounds == doc["next_id"] - 1


# ------------------------------------------------- the contract, file-backed


class FileBackedHarness(FakeHarness):
    """``ContractHarness`` over a file-backed ``FakeProvider``; a restart is a new object over
    the file (a new process, as far as the fake can tell)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.provider = FakeProvider(clock=self.clock, state_path=path)
        self.providers = [self.provider]

    def restarted_provider(self) -> FakeProvider:
        provider = FakeProvider(clock=self.clock, state_path=self.path)
        self.providers.append(provider)
        return provider

    def cloud_launch_calls(self, offering_key: str) -> int:
        return sum(p.call_count("launch", pool=offering_key) for p in self.providers)

    def cloud_calls(self) -> int:
        return sum(len(p.calls) for p in self.providers)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[FileBackedHarness]:
    yield FileBackedHarness(tmp_path / "cloud.json")


class TestFileBackedFakeProviderContract(ProviderContract):
    pass
