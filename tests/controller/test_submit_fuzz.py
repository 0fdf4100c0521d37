"""Generated job bodies against a running controller (issue 27, item 1): over 1,000 bodies,
every field at and past its bounds, wrong types, huge integers, unicode, through the real API
server; after each batch the controller completes a round, and every job the API accepted is
either schedulable (queued or running) or refused with a reason. Nothing a user sends can stop
a round, and nothing accepted waits forever without a word."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.controller.api import generate_tokens, make_app, serve
from autoscaler.controller.jobbook import MAX_BATCH_SIZE, MAX_JOB_GPUS
from autoscaler.controller.loop import Controller, ControllerConfig
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import JobStatus, Store
from autoscaler.decide.sizing import SizingConfig
from coadapt_common.clock import FakeClock
from providers.fake import FakeProvider

pytestmark = pytest.mark.slow

BATCHES, PER_BATCH = 26, 40  # 1,040 bodies

_HUGE = st.sampled_from([2**31, 2**53 + 1, 2**63, 9223372036854775808, 10**30, -(2**63)])
_EDGES = st.sampled_from([0, 1, 2, 4096, 4097, MAX_BATCH_SIZE, MAX_BATCH_SIZE + 1, -1])
_INTS = _EDGES | _HUGE | st.integers(-5, 600)
_JUNK = (
    st.none()
    | st.booleans()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.lists(st.integers(), max_size=3)
    | st.dictionaries(st.text(max_size=4), st.integers(), max_size=2)
)
_NAMES = (
    st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
    | st.sampled_from(["../etc", "A_b", "", "x" * 64, "ünï", "a b", "-a"])
    | _JUNK
)
_COMMANDS = (
    st.lists(st.text(max_size=8), min_size=1, max_size=4).map(lambda w: ["train.py", *w])
    | st.sampled_from(
        [
            ["--controller-url", "http://elsewhere", "t.py"],
            ["python", "t.py"],
            ["torchrun", "t.py"],
            [],
            ["t.py", "\x00"],
            ["x" * 5000],
            ["t.py"] * 300,
        ]
    )
    | _JUNK
)
_TYPES = (
    st.lists(st.sampled_from(["T4", "A100", "V100", "H100", "t4", "Z80", "ü"]), max_size=4) | _JUNK
)


@st.composite
def _bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A job body: a valid one (its optional fields drawn within their bounds), then none, one
    or two fields pushed to or past their bounds, given the wrong type, or an unknown field
    added."""
    init = draw(st.sampled_from([1, 16, 64, 256]))
    body: dict[str, Any] = {
        "name": draw(st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)),
        "command": ["train.py", *draw(st.lists(st.sampled_from(["--lr", "0.1", "ü", ""])))],
        "init_batch_size": init,
        "max_batch_size": init * draw(st.sampled_from([1, 4, 64])),
        "max_local_bsz": draw(st.sampled_from([16, 64, 256])),
    }
    valid: dict[str, st.SearchStrategy[Any]] = {
        "min_gpus": st.integers(1, 8) | st.sampled_from([64, 4096]),
        "gpu_types": st.lists(st.sampled_from(["T4", "A100", "V100"]), min_size=1, unique=True),
        "max_accum_steps": st.integers(1, 1024),
        "application": st.sampled_from(["cifar10", "bert", "generic", "ünïcode-model"]),
        "adaptive": st.booleans(),
        "checkpoint_uri": st.sampled_from(["s3://b/p", "/ckpt", "file:///c"]),
    }
    for key, values in valid.items():
        if draw(st.booleans()):
            body[key] = draw(values)
    if body.get("adaptive") is False:
        body.pop("max_gpus", None)
    elif draw(st.booleans()):
        body["max_gpus"] = body.get("min_gpus", 1) + draw(st.integers(0, 8))
    bad: dict[str, st.SearchStrategy[Any]] = {
        "name": _NAMES,
        "command": _COMMANDS,
        "init_batch_size": _INTS | _JUNK,
        "max_batch_size": _INTS | _JUNK,
        "max_local_bsz": _INTS | _JUNK,
        "min_local_bsz": _INTS | _JUNK,
        "min_gpus": _INTS | _JUNK,
        "max_gpus": _INTS | _JUNK,
        "gpu_types": _TYPES,
        "max_accum_steps": _INTS | _JUNK,
        "application": _JUNK | st.text(min_size=1000, max_size=1100),
        "adaptive": _JUNK,
        "checkpoint_uri": st.sampled_from(["gs://", "ftp://x", ""]) | _JUNK,
        "unknown_knob": _JUNK,
    }
    for key in draw(st.lists(st.sampled_from(sorted(bad)), max_size=2, unique=True)):
        body[key] = draw(bad[key])
    return body


def _post(url: str, token: str, body: dict[str, Any]) -> int:
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        url + "/v1/jobs",
        data=data,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        with e:
            e.read()
        return int(e.code)


def test_over_a_thousand_generated_bodies_never_stop_a_round(tmp_path: Path) -> None:
    clock = FakeClock(1_700_000_000.0)
    store = Store.create(tmp_path / "store.db", "fuzz", clock)
    tokens = generate_tokens(tmp_path / "tokens.json")
    app = make_app(
        tmp_path / "store.db",
        tokens,
        clock,
        logs_dir=tmp_path / "logs",
        on_job_exit=lambda name, *, failed: JobStatus.COMPLETED,
    )
    config = ControllerConfig(
        "fuzz",
        sizing=SizingConfig(max_instances=4),
        reconcile=ReconcileConfig(heartbeat_timeout_s=None),
    )
    ctl = Controller(store, FakeProvider(clock=clock), clock, config)
    answers: dict[int, int] = {}
    accepted: set[str] = set()
    rounds = [0]

    @settings(
        max_examples=BATCHES,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(_bodies(), min_size=PER_BATCH, max_size=PER_BATCH))
    def batch(bodies: list[dict[str, Any]]) -> None:
        for body in bodies:
            status = _post(server.url, tokens.user, body)
            answers[status] = answers.get(status, 0) + 1
            assert status in (201, 400, 409), (status, body)
            if status == 201:
                accepted.add(body["name"])
        ctl.run_round()  # raises if anything a user sent could stop it
        rounds[0] += 1
        clock.advance(60.0)
        for row in store.list_jobs():
            assert row.name in accepted
            assert row.status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.REFUSED), row
            if row.status is JobStatus.REFUSED:
                assert row.reason, row

    with serve(app) as server:
        batch()
    app.close()
    assert sum(answers.values()) >= 1000 and rounds[0] >= BATCHES
    assert answers.get(201, 0) >= 50 and answers.get(400, 0) >= 200, answers
    refused = [r for r in store.list_jobs() if r.status is JobStatus.REFUSED]
    assert refused, "some accepted job asked for more than any fleet here can hold"
    assert all(
        json.loads(r.spec_json).get("min_gpus", 1) <= MAX_JOB_GPUS for r in store.list_jobs()
    )
    store.close()
