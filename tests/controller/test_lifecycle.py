"""The instance lifecycle: the one transition table, and timeouts derived from the history."""

from __future__ import annotations

import itertools
from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.controller.errors import ControllerError, IllegalTransitionError
from autoscaler.controller.lifecycle import (
    TERMINAL,
    TIMEOUT_EDGES,
    TRANSITIONS,
    InstanceStatus,
    LifecycleTimeouts,
    StatusChange,
    TimeoutAction,
    check_transition,
    is_terminal,
    request_retries,
    terminate_retries,
    timed_out,
    timeout_from_history,
)
from autoscaler.errors import AutoscalerError, InvalidInputError
from coadapt_common.clock import FakeClock

S = InstanceStatus
ALL_PAIRS = list(itertools.product(S, S))
EDGES = [(a, b) for a, b in ALL_PAIRS if b in TRANSITIONS[a]]
NON_EDGES = [(a, b) for a, b in ALL_PAIRS if b not in TRANSITIONS[a]]


def reachable(start: InstanceStatus) -> set[InstanceStatus]:
    seen, todo = {start}, deque([start])
    while todo:
        for nxt in TRANSITIONS[todo.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


# ---- the table -----------------------------------------------------------------------------


def test_the_table_covers_every_status_and_names_every_cause() -> None:
    assert set(TRANSITIONS) == set(S)
    for edges in TRANSITIONS.values():
        assert set(edges) <= set(S)
        assert all(isinstance(cause, str) and len(cause) > 10 for cause in edges.values())


def test_the_table_cannot_be_changed_at_run_time() -> None:
    with pytest.raises(TypeError):
        TRANSITIONS[S.QUEUED] = {}  # type: ignore[index]
    with pytest.raises(TypeError):
        TRANSITIONS[S.QUEUED][S.TERMINATED] = "no"  # type: ignore[index]


@pytest.mark.parametrize(("before", "after"), EDGES)
def test_every_edge_is_allowed_and_gives_its_cause(
    before: InstanceStatus, after: InstanceStatus
) -> None:
    assert check_transition("i-1", before, after) == TRANSITIONS[before][after]


@pytest.mark.parametrize(("before", "after"), NON_EDGES)
def test_every_other_change_is_refused(before: InstanceStatus, after: InstanceStatus) -> None:
    with pytest.raises(IllegalTransitionError) as err:
        check_transition("i-7", before, after)
    assert (err.value.instance_id, err.value.from_status, err.value.to_status) == (
        "i-7",
        before.value,
        after.value,
    )
    assert "i-7" in str(err.value) and before.value in str(err.value)
    assert isinstance(err.value, ControllerError) and isinstance(err.value, AutoscalerError)


def test_the_documented_edges() -> None:
    """The decisions the module docstring states, pinned."""
    assert set(TRANSITIONS[S.QUEUED]) == {S.REQUESTED, S.ALLOCATION_FAILED}
    assert set(TRANSITIONS[S.REQUESTED]) == {S.RUNNING, S.QUEUED, S.ALLOCATION_FAILED}
    assert set(TRANSITIONS[S.RUNNING]) == {S.DRAINING, S.TERMINATING, S.TERMINATED}
    assert set(TRANSITIONS[S.DRAINING]) == {S.DRAINING, S.TERMINATING, S.TERMINATED}
    assert set(TRANSITIONS[S.TERMINATING]) == {S.TERMINATING, S.TERMINATED, S.TERMINATION_FAILED}
    assert set(TRANSITIONS[S.TERMINATION_FAILED]) == {S.TERMINATING, S.TERMINATED}
    assert set(TRANSITIONS[S.ALLOCATION_FAILED]) == {S.TERMINATING, S.TERMINATED}
    assert TRANSITIONS[S.TERMINATED] == {}
    # Nothing whose launch was sent may be forgotten before the cloud is known to be empty.
    assert S.TERMINATED not in TRANSITIONS[S.QUEUED]
    assert S.TERMINATED not in TRANSITIONS[S.REQUESTED]
    # An instance is adopted once, from requested only, and never resurrected.
    assert [a for a, b in EDGES if b is S.RUNNING] == [S.REQUESTED]


def test_terminal_is_terminated_only() -> None:
    assert sorted(TERMINAL) == [S.TERMINATED]
    assert [s for s in S if is_terminal(s)] == [S.TERMINATED]
    assert not is_terminal(S.ALLOCATION_FAILED)  # a late fill is still cleaned up through it


def test_every_status_is_reachable_and_every_row_can_end() -> None:
    assert reachable(S.QUEUED) == set(S)
    for status in S:
        assert S.TERMINATED in reachable(status)


def test_unknown_statuses_are_invalid_input() -> None:
    with pytest.raises(InvalidInputError):
        check_transition("i-1", "launching", S.RUNNING)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        is_terminal("gone")  # type: ignore[arg-type]


# ---- timeouts ------------------------------------------------------------------------------


def test_every_timeout_action_is_an_edge_of_the_table() -> None:
    assert set(TIMEOUT_EDGES) == set(TimeoutAction)
    for action, (before, after) in TIMEOUT_EDGES.items():
        assert action.edge == (before, after)
        check_transition("i-1", before, after)


def test_each_timeout_fires_only_from_its_own_status() -> None:
    t = LifecycleTimeouts()
    for status in S:
        for retries in range(4):
            action = timed_out(status, 0.0, 1e9, retries, t)
            if action is not None:
                assert action.edge[0] is status
    for status in (S.QUEUED, S.RUNNING, S.TERMINATED):
        assert timed_out(status, 0.0, 1e9, 0, t) is None


@pytest.mark.parametrize(
    ("status", "limit", "action"),
    [
        (S.REQUESTED, "requested_s", TimeoutAction.RETRY_REQUEST),
        (S.DRAINING, "draining_s", TimeoutAction.FORCE_TERMINATE_DRAIN),
        (S.TERMINATING, "terminating_s", TimeoutAction.RETRY_TERMINATE),
        (
            S.TERMINATION_FAILED,
            "termination_failed_retry_s",
            TimeoutAction.RETRY_FAILED_TERMINATION,
        ),
        (S.ALLOCATION_FAILED, "allocation_failed_settle_s", TimeoutAction.SETTLE_FAILED_ALLOCATION),
    ],
)
def test_too_long_is_strictly_longer_than_the_limit(
    status: InstanceStatus, limit: str, action: TimeoutAction
) -> None:
    t = LifecycleTimeouts()
    since = 1_000.0
    limit_s = getattr(t, limit)
    assert timed_out(status, since, since + limit_s, 0, t) is None
    assert timed_out(status, since, since + limit_s + 0.001, 0, t) is action
    assert timed_out(status, since, since - 50.0, 0, t) is None  # the clock stepped back


def test_request_tries_bound_the_retries() -> None:
    t = LifecycleTimeouts(max_request_tries=3)
    late = t.requested_s + 1
    assert timed_out(S.REQUESTED, 0.0, late, 0, t) is TimeoutAction.RETRY_REQUEST
    assert timed_out(S.REQUESTED, 0.0, late, 1, t) is TimeoutAction.RETRY_REQUEST
    assert timed_out(S.REQUESTED, 0.0, late, 2, t) is TimeoutAction.FAIL_ALLOCATION
    one = LifecycleTimeouts(max_request_tries=1)
    assert timed_out(S.REQUESTED, 0.0, late, 0, one) is TimeoutAction.FAIL_ALLOCATION


def history_of(*entries: tuple[InstanceStatus, float]) -> list[StatusChange]:
    return [StatusChange(s, at) for s, at in entries]


def test_requested_too_long_from_the_history_with_a_fake_clock() -> None:
    """A launch that never fills: tried ``max_request_tries`` times, then failed, then settled."""
    clock = FakeClock()
    t = LifecycleTimeouts(requested_s=600, max_request_tries=3, allocation_failed_settle_s=900)
    history = [StatusChange(S.QUEUED, clock.now_s(), "wanted")]
    launches = 0
    for _ in range(100):
        action = timeout_from_history(history, clock.now_s(), t)
        if action is None:
            if history[-1].status is S.QUEUED:  # the controller launches a queued row
                launches += 1
                history.append(StatusChange(S.REQUESTED, clock.now_s(), "launch"))
            elif history[-1].status is S.TERMINATED:
                break
            clock.advance(60)
            continue
        before, after = action.edge
        assert history[-1].status is before
        history.append(StatusChange(after, clock.now_s(), action.value))
    assert launches == 3
    assert [c.status for c in history] == [
        S.QUEUED,
        S.REQUESTED,
        S.QUEUED,
        S.REQUESTED,
        S.QUEUED,
        S.REQUESTED,
        S.ALLOCATION_FAILED,
        S.TERMINATED,
    ]
    assert request_retries(history) == 2
    # Each wait is measured from the last entry: a retry restarts the clock.
    waits = [b.at_s - a.at_s for a, b in itertools.pairwise(history)]
    assert waits[1] > 600 and waits[3] > 600 and waits[5] > 600 and waits[6] > 900


def test_terminate_retries_are_counted_per_spell() -> None:
    t = LifecycleTimeouts(terminating_s=300, max_terminate_tries=3)
    base = [(S.QUEUED, 0.0), (S.REQUESTED, 1.0), (S.RUNNING, 2.0), (S.TERMINATING, 10.0)]
    h = history_of(*base)
    assert terminate_retries(h) == 0
    assert timeout_from_history(h, 310.0, t) is None
    assert timeout_from_history(h, 310.5, t) is TimeoutAction.RETRY_TERMINATE
    h = history_of(*base, (S.TERMINATING, 311.0))
    assert terminate_retries(h) == 1
    assert timeout_from_history(h, 612.0, t) is TimeoutAction.RETRY_TERMINATE
    h = history_of(*base, (S.TERMINATING, 311.0), (S.TERMINATING, 612.0))
    assert terminate_retries(h) == 2
    assert timeout_from_history(h, 913.0, t) is TimeoutAction.FAIL_TERMINATION
    h = history_of(*base, (S.TERMINATING, 311.0), (S.TERMINATION_FAILED, 913.0))
    assert timeout_from_history(h, 913.0 + t.termination_failed_retry_s + 1, t) is (
        TimeoutAction.RETRY_FAILED_TERMINATION
    )
    # A new spell after termination_failed starts its tries again.
    h = history_of(
        *base, (S.TERMINATING, 311.0), (S.TERMINATION_FAILED, 913.0), (S.TERMINATING, 3e3)
    )
    assert terminate_retries(h) == 0
    assert timeout_from_history(h, 3e3 + 301, t) is TimeoutAction.RETRY_TERMINATE


def test_draining_too_long_forces_termination() -> None:
    t = LifecycleTimeouts(draining_s=120)
    h = history_of((S.QUEUED, 0.0), (S.REQUESTED, 1.0), (S.RUNNING, 2.0), (S.DRAINING, 100.0))
    assert timeout_from_history(h, 220.0, t) is None
    assert timeout_from_history(h, 220.5, t) is TimeoutAction.FORCE_TERMINATE_DRAIN


def test_history_must_be_non_empty_and_in_time_order() -> None:
    t = LifecycleTimeouts()
    with pytest.raises(InvalidInputError):
        timeout_from_history([], 0.0, t)
    with pytest.raises(InvalidInputError):
        timeout_from_history(history_of((S.QUEUED, 5.0), (S.REQUESTED, 4.0)), 1e6, t)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"requested_s": 0},
        {"draining_s": -1.0},
        {"terminating_s": float("nan")},
        {"allocation_failed_settle_s": float("inf")},
        {"termination_failed_retry_s": True},
        {"max_request_tries": 0},
        {"max_terminate_tries": 2.0},
    ],
)
def test_timeouts_are_validated(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidInputError):
        LifecycleTimeouts(**kwargs)  # type: ignore[arg-type]


def test_retries_are_validated() -> None:
    with pytest.raises(InvalidInputError):
        timed_out(S.REQUESTED, 0.0, 1.0, -1, LifecycleTimeouts())


# ---- properties ----------------------------------------------------------------------------


@given(
    start=st.sampled_from([S.REQUESTED, S.DRAINING, S.TERMINATING]),
    requested_s=st.floats(1, 1e4),
    terminating_s=st.floats(1, 1e4),
    max_request_tries=st.integers(1, 6),
    max_terminate_tries=st.integers(1, 6),
    step_fraction=st.floats(0.05, 3.0),
)
def test_a_silent_cloud_never_gets_more_calls_than_the_tries(
    start: InstanceStatus,
    requested_s: float,
    terminating_s: float,
    max_request_tries: int,
    max_terminate_tries: int,
    step_fraction: float,
) -> None:
    """Launch and terminate calls that are never answered: driven by timeouts alone, a row
    moves only along edges of the table, makes at most ``max_request_tries`` launches, and at
    most ``max_terminate_tries`` terminate calls per spell in ``terminating``."""
    t = LifecycleTimeouts(
        requested_s=requested_s,
        terminating_s=terminating_s,
        max_request_tries=max_request_tries,
        max_terminate_tries=max_terminate_tries,
    )
    step_s = step_fraction * min(requested_s, terminating_s)
    now = 0.0
    history = [StatusChange(start, now)]
    for _ in range(300):
        now += step_s
        action = timeout_from_history(history, now, t)
        if action is None:
            continue
        before, after = action.edge
        assert before is history[-1].status
        check_transition("i-1", before, after)
        if after is S.QUEUED:  # the controller relaunches at once, same request id
            history += [StatusChange(S.QUEUED, now), StatusChange(S.REQUESTED, now)]
        else:
            history.append(StatusChange(after, now))
        if after is S.TERMINATED:
            break
    assert sum(1 for c in history if c.status is S.REQUESTED) <= max_request_tries
    spell = 0
    for c in history:
        spell = spell + 1 if c.status is S.TERMINATING else 0
        assert spell <= max_terminate_tries
