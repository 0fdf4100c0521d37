"""Agent liveness judged only on what the controller could hear while it ran.

Pure tests of the rule (:mod:`autoscaler.controller.liveness` and reconcile's use of it:
tables and hypothesis properties), then the controller's round over a real store and the
behavioural fake cloud with an injected clock: a controller stalled for three heartbeat
timeouts releases nothing when it resumes, and still finds a dead agent dead afterwards.
(The real process, SIGSTOP and all: test_stall_e2e.py.)"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.controller.lifecycle import InstanceStatus as S
from autoscaler.controller.liveness import MAX_STALLS, AwakeLog, mass_silence, silence_s
from autoscaler.controller.reconcile import ReconcileConfig, ReconcileInput, RowView, reconcile
from autoscaler.errors import InvalidInputError
from providers.base import Instance, InstanceState, Market

NOW = 10_000.0
POOL = "fake/g4dn.xlarge/us-east-1a/spot"
TIMEOUT = 60.0
CFG = ReconcileConfig(heartbeat_timeout_s=TIMEOUT, boot_grace_s=300.0)


def _row(key: str, last: float | None, started: float = NOW - 5000) -> RowView:
    return RowView(
        key=key,
        request_id=f"req-{key}",
        offering_key=POOL,
        status=S.RUNNING,
        since_s=started,
        provider_instance_id=f"i-{key}",
        last_heartbeat_s=last,
        started_s=started,
    )


def _listed(key: str) -> Instance:
    return Instance(
        f"i-{key}", "fake", "g4dn.xlarge", "us-east-1a", Market.SPOT, InstanceState.RUNNING,
        "c1", f"req-{key}",
    )  # fmt: skip


def _round(rows: list[RowView], stalls=(), cfg: ReconcileConfig = CFG, now: float = NOW):
    return reconcile(
        ReconcileInput(
            now,
            tuple(rows),
            tuple(_listed(r.key) for r in rows),
            target={POOL: len(rows)},
            stalls=tuple(stalls),
        ),
        cfg,
    )


@pytest.mark.parametrize(
    ("since", "now", "stalls", "expected"),
    [
        (0.0, 100.0, [], 100.0),
        (0.0, 100.0, [(10.0, 40.0)], 70.0),
        (0.0, 100.0, [(-math.inf, 50.0)], 50.0),  # the time before the controller started
        (0.0, 100.0, [(10.0, 40.0), (20.0, 60.0)], 50.0),  # overlapping: the union counts
        (0.0, 100.0, [(60.0, 200.0)], 60.0),  # a stall still going on at "now"
        (0.0, 100.0, [(-10.0, 300.0)], 0.0),
        (50.0, 40.0, [], 0.0),  # a heartbeat stamped after "now"
        (0.0, 100.0, [(200.0, 300.0), (-50.0, -10.0)], 100.0),  # outside the span
    ],
)
def test_silence_counts_only_the_time_the_controller_ran(since, now, stalls, expected) -> None:
    assert silence_s(since, now, stalls) == pytest.approx(expected)


@settings(max_examples=200, deadline=None)
@given(
    since=st.floats(0, 1e5),
    span=st.floats(0, 1e5),
    stalls=st.lists(st.tuples(st.floats(-1e5, 2e5), st.floats(0, 1e5)), max_size=8),
)
def test_silence_is_bounded_by_the_span_and_shrinks_with_more_stalls(since, span, stalls) -> None:
    now = since + span
    spans = [(a, a + length) for a, length in stalls]
    total = silence_s(since, now, spans)
    assert 0.0 <= total <= span + 1e-6
    for k in range(len(spans)):  # a stall more never makes an agent look more silent
        assert silence_s(since, now, spans[: k + 1]) <= silence_s(since, now, spans[:k]) + 1e-6


@pytest.mark.parametrize(
    ("dead", "population", "suspect"),
    [(0, 10, False), (2, 2, False), (3, 3, True), (3, 6, False), (4, 7, True), (5, 100, False)],
)
def test_mass_silence_thresholds(dead: int, population: int, suspect: bool) -> None:
    assert mass_silence(dead, population, fraction=0.55, min_instances=3) is suspect


def test_a_stall_of_three_timeouts_releases_no_healthy_instance() -> None:
    """The agents beat until the controller stopped (SIGSTOP) at NOW - 3 x TIMEOUT - 1; it
    runs again at NOW. Counted from the last heartbeat it saw, every one is dead; counted
    while it ran, none is."""
    stop = NOW - 3 * TIMEOUT - 1
    rows = [_row("a", stop - 1), _row("b", stop - 2)]
    stalled = _round(rows, stalls=[(stop, NOW)])
    assert not stalled.terminate and not stalled.transitions and not stalled.suspected
    # Today's rule (no stall known) releases both: what the issue saw.
    assert sorted(_round(rows).terminate) == ["a", "b"]
    # After the resume, an agent that stays silent a whole timeout more is dead.
    later = _round(rows, stalls=[(stop, NOW)], now=NOW + TIMEOUT + 2)
    assert sorted(later.terminate) == ["a", "b"]


def test_the_boot_grace_does_not_run_while_the_controller_is_stopped() -> None:
    booting = _row("a", None, started=NOW - 400)  # no heartbeat yet, past the 300 s grace
    assert _round([booting]).terminate == ("a",)
    assert _round([booting], stalls=[(NOW - 200, NOW - 10)]).terminate == ()


def test_many_dead_at_once_suspects_the_controller_and_releases_slowly() -> None:
    silent = [_row(k, NOW - 100) for k in "abcd"]
    alive = [_row("e", NOW - 5)]
    out = _round(silent + alive)
    assert out.terminate == () and out.suspected == ("a", "b", "c", "d")
    # Past the hold, one a round, the longest silent first.
    cfg = ReconcileConfig(heartbeat_timeout_s=TIMEOUT, mass_silence_hold_s=90.0)
    held = [_row("a", NOW - 95), *(_row(k, NOW - 100) for k in "bcd"), *alive]
    out = _round(held, cfg=cfg)
    assert out.terminate == ("b",) and out.suspected == ("a", "c", "d")
    # Below the share (2 of 5), the dead are released at once.
    out = _round([*silent[:2], *(_row(k, NOW - 5) for k in "xyz")])
    assert sorted(out.terminate) == ["a", "b"] and out.suspected == ()


@settings(max_examples=150, deadline=None)
@given(
    beats=st.lists(st.floats(0, 2000), min_size=1, max_size=12),
    stall=st.tuples(st.floats(0, 3000), st.floats(0, 3000)),
)
def test_an_instance_released_was_silent_a_whole_timeout_while_the_controller_ran(
    beats: list[float], stall: tuple[float, float]
) -> None:
    now = 3000.0
    start, length = stall
    stalls = [(-math.inf, 0.0), (start, start + length)]
    rows = [_row(f"r{k:02d}", t, started=0.0) for k, t in enumerate(beats)]
    out = _round(rows, stalls=stalls, now=now)
    last = {r.key: r.last_heartbeat_s for r in rows}
    for key in out.terminate:
        assert silence_s(last[key] or 0.0, now, stalls) > TIMEOUT
    for key in out.suspected:
        assert key not in out.terminate
    assert len(out.terminate) <= len(rows)


def test_awake_log_records_gaps_longer_than_the_stall_gap() -> None:
    log = AwakeLog(100.0, stall_gap_s=5.0)
    assert log.note(101.0) is None and log.note(105.5) is None
    assert log.note(300.0) == (105.5, 300.0)
    assert log.stalls() == ((-math.inf, 100.0), (105.5, 300.0))
    assert AwakeLog(0.0).note(1e6) is None  # no ticker: only the time before the start
    with pytest.raises(ValueError):
        AwakeLog(0.0, stall_gap_s=0.0)


def test_awake_log_stays_bounded_and_only_errs_towards_leniency() -> None:
    log = AwakeLog(0.0, stall_gap_s=1.0)
    t = 0.0
    for _ in range(3 * MAX_STALLS):
        t += 2.0  # every note a stall of 2 s, 0 s awake between
        log.note(t)
        t += 0.5
        log.note(t)
    stalls = log.stalls()
    assert len(stalls) <= MAX_STALLS
    # The merged log never shows more awake time than the full one would have.
    exact = [(-math.inf, 0.0)] + [(2.5 * k, 2.5 * k + 2.0) for k in range(3 * MAX_STALLS)]
    assert silence_s(0.0, t, stalls) <= silence_s(0.0, t, exact) + 1e-9


def test_config_refuses_bad_thresholds() -> None:
    with pytest.raises(InvalidInputError):
        ReconcileConfig(mass_silence_fraction=0.0)
    with pytest.raises(InvalidInputError):
        ReconcileConfig(mass_silence_min_instances=-1)
    with pytest.raises(InvalidInputError):
        ReconcileConfig(mass_silence_hold_s=math.nan)


# ---- the controller's round: real store, fake cloud, injected clock ---------------------------


def test_a_stalled_controller_releases_nothing_on_resume(tmp_path: Path) -> None:
    from autoscaler.controller.loop import Controller, ControllerConfig
    from autoscaler.controller.store import Store
    from autoscaler.decide.sizing import SizingConfig
    from autoscaler.decide.strategies import FixedFleet
    from coadapt_common.clock import FakeClock
    from providers.fake import FakeProvider

    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", "stall1", clock)
    cloud = FakeProvider(clock=clock)
    offering = cloud.offerings()[0].key
    cfg = ControllerConfig(
        "stall1",
        sizing=SizingConfig(max_instances=2),
        reconcile=ReconcileConfig(heartbeat_timeout_s=TIMEOUT, boot_grace_s=300.0),
        stall_gap_s=5.0,
    )
    ctl = Controller(store, cloud, clock, cfg, strategy=FixedFleet("fixed", {offering: 2}))

    def beat() -> None:
        for r in store.list_instances(statuses=(S.RUNNING,)):
            store.record_heartbeat(r.instance_key, clock.now_s())

    def live(seconds: float, *, agents: bool = True) -> None:  # the service's ticker
        for _ in range(int(seconds)):
            clock.advance(1.0)
            ctl.note_alive()
            if agents:
                beat()
        ctl.run_round()

    for _ in range(6):
        live(10.0)
    running = {r.instance_key for r in store.list_instances(statuses=(S.RUNNING,))}
    assert len(running) == 2
    clock.advance(3 * TIMEOUT)  # SIGSTOP: no tick, no heartbeat, no round
    live(3.0)  # SIGCONT: the round comes before any agent is heard again
    live(10.0)
    assert {r.instance_key for r in store.list_instances(statuses=(S.RUNNING,))} == running
    reasons = [h.reason for k in running for h in store.history(k)]
    assert "agent stopped heartbeating" not in reasons
    # Without the ticker's evidence of the stall (today's rule) they would have gone; and an
    # agent that stays silent a whole timeout after the resume is still found dead.
    for _ in range(8):
        live(10.0, agents=False)
    reasons = [h.reason for k in running for h in store.history(k)]
    assert "agent stopped heartbeating" in reasons
