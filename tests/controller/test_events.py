"""The cluster's story (issue 28, item 2): an EventRecorder over a real store, watching a
controller's rounds on the fake cloud, records one event per thing that matters, with its
time and its reason; `coadapt events` reads them back from the store, cluster up or not."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from autoscaler.cli.main import app
from autoscaler.controller.events import EventKind, EventRecorder, format_event
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.store import JobStatus
from tests.controller.fakes import fake_controller


def test_a_run_is_told_event_by_event_with_reasons(tmp_path: Path) -> None:
    store, cloud, clock, ctl = fake_controller(tmp_path, "story", jobs=2, max_instances=4)
    recorder = EventRecorder(store, clock)  # job-0 and job-1 were submitted before it
    huge = JobSubmission("huge", 128, 8192, 128, 32, min_gpus=4000, command=("train.py",))
    store.add_job(huge.name, huge.to_json())
    seen = []
    for r in range(6):
        ctl.run_round()
        for i in store.list_instances(statuses=(InstanceStatus.RUNNING,)):
            store.record_heartbeat(i.instance_key, clock.now_s())  # its agent, once booted
        seen += recorder.observe()
        clock.advance(60.0)
        if r == 1:
            held = {key for (_job, key) in store.list_assignments()}
            victim = next(
                i for i in store.list_instances(statuses=(InstanceStatus.RUNNING,))
                if i.instance_key in held
            )  # fmt: skip
            assert victim.provider_instance_id is not None
            cloud.preempt(victim.provider_instance_id, notice_s=30.0)
        if r == 3:
            job = store.get_job("job-0")
            store.update_job("job-0", job.version, status=JobStatus.COMPLETED)
            ctl.job_exited("job-1", failed=True)
    assert ctl.down().clean
    seen += recorder.observe()
    kinds = [e.kind for e in seen]
    for kind in (
        EventKind.SUBMIT,
        EventKind.LAUNCH,
        EventKind.BOOT,
        EventKind.READY,
        EventKind.START,
        EventKind.NOTICE,
        EventKind.PREEMPTION,
        EventKind.RELEASE,
        EventKind.COMPLETION,
        EventKind.FAILURE,
        EventKind.REFUSAL,
    ):
        assert kind in kinds, (kind, [format_event(e) for e in seen])
    by_kind = {e.kind: e for e in seen}
    assert by_kind[EventKind.NOTICE].subject == victim.instance_key
    assert by_kind[EventKind.PREEMPTION].subject == victim.instance_key
    assert "needs at least 4000 GPUs" in by_kind[EventKind.REFUSAL].message
    assert [e.subject for e in seen if e.kind is EventKind.SUBMIT] == ["huge"]
    assert by_kind[EventKind.LAUNCH].message.endswith("wanted by the plan")
    # only the noticed instance is a preemption; every other one that ran is a release
    ran = {r.instance_key for r in store.list_instances() if r.provider_instance_id}
    ended = {e.subject: e.kind for e in seen if e.kind in (EventKind.RELEASE, EventKind.PREEMPTION)}
    assert set(ended) == ran
    assert [k for k, v in ended.items() if v is EventKind.PREEMPTION] == [victim.instance_key]
    # a job that ran on the noticed instance is told why it stopped or moved
    moved = [
        e for e in seen
        if e.kind in (EventKind.STOP, EventKind.MOVE, EventKind.RESCALE)
        and "spot notice" in e.message
    ]  # fmt: skip
    assert moved, [format_event(e) for e in seen]
    # what the recorder returned is what the store keeps, in order; each is one line
    rows = store.events_after(0)
    assert [(r.kind, r.subject, r.message) for r in rows] == [
        (e.kind.value, e.subject, e.message) for e in seen
    ]
    assert all("\n" not in format_event(e) for e in seen)
    store.close()
    # a new recorder starts from the store as it is: nothing told twice
    from autoscaler.controller.store import Store

    with Store.open(tmp_path / "store.db", clock) as again:
        assert EventRecorder(again, clock).observe() == ()


def test_coadapt_events_reads_the_story_from_the_store(tmp_path: Path) -> None:
    store, _cloud, clock, ctl = fake_controller(tmp_path, "told", jobs=1, max_instances=2)
    recorder = EventRecorder(store, clock)
    for _ in range(3):
        ctl.run_round()
        recorder.observe()
        clock.advance(30.0)
    count = len(store.events_after(0))
    assert count >= 3
    store.close()
    runner = CliRunner()
    text = runner.invoke(app, ["events", "--state-dir", str(tmp_path)])
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert len(lines) == count
    assert any(" launch " in line for line in lines) and any(" start " in line for line in lines)
    last = runner.invoke(app, ["events", "--state-dir", str(tmp_path), "--last", "1", "--json"])
    assert last.exit_code == 0, last.output
    doc = json.loads(last.output)
    assert set(doc) == {"seq", "at_s", "kind", "subject", "message"} and doc["seq"] == count
    missing = runner.invoke(app, ["events", "--state-dir", str(tmp_path / "nowhere")])
    assert missing.exit_code == 1 and "no cluster store" in missing.output
    assert "Traceback" not in missing.output


def test_up_takes_quiet_or_verbose_not_both(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["up", "--state-dir", str(tmp_path), "--quiet", "--verbose"])
    assert out.exit_code == 2 and "--quiet and --verbose: choose one" in out.output
    assert not (tmp_path / "up.json").exists()


def test_a_new_batch_for_the_same_placement_is_a_re_batch(tmp_path: Path) -> None:
    """The policy keeps a job's GPUs but changes its batch: one ``rebatch`` event, naming
    the batch before and after."""
    store, _cloud, clock, ctl = fake_controller(tmp_path, "rebatch", jobs=1, max_instances=2)
    for _ in range(2):
        ctl.run_round()
        clock.advance(30.0)
    recorder = EventRecorder(store, clock)
    batch = store.get_batch("job-0")
    assert batch is not None
    store.set_batch(
        "job-0",
        global_batch_size=batch.global_batch_size * 2,
        local_batch_size=batch.local_batch_size,
        accum_steps=batch.accum_steps * 2,
        gpus=batch.gpus,
    )
    events = recorder.observe()
    assert [e.kind for e in events] == [EventKind.REBATCH], events
    before = f"batch {batch.global_batch_size} "
    after = f"batch {batch.global_batch_size * 2} "
    assert before in events[0].message and after in events[0].message
    assert recorder.observe() == ()
    store.close()


def test_coadapt_events_follow_prints_new_events_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    """`coadapt events --follow` in its own process: the story so far, then each new event
    as the store gets it; Ctrl-C (SIGINT) ends it with status 0 and no traceback."""
    import signal
    import subprocess
    import sys
    import time

    from autoscaler.controller.store import Store
    from coadapt_common.clock import FakeClock

    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", "follow", clock)
    store.add_events([(clock.now_s(), "submit", "job-a", "submitted")])
    follow = subprocess.Popen(
        [sys.executable, "-m", "autoscaler.cli", "events", "--follow", "--state-dir",
         str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()
        assert " submit " in first and "job-a: submitted" in first
        store.add_events([(clock.now_s(), "completion", "job-a", "completed in 60 s")])
        deadline = time.monotonic() + 30
        second = follow.stdout.readline()
        assert time.monotonic() < deadline
        assert " completion " in second and "job-a: completed in 60 s" in second
        follow.send_signal(signal.SIGINT)
        assert follow.wait(timeout=30) == 0
        assert "Traceback" not in (follow.stderr.read() if follow.stderr else "")
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
        store.close()


def test_a_rescale_says_what_the_jobs_model_predicts_and_what_it_costs(tmp_path: Path) -> None:
    """Once a job's goodput model is fitted from its trainer's reports, a rescale names the
    goodput its model predicts before and after and the USD per hour of the GPUs held."""
    from emulators.reports import synthetic_report

    store, _cloud, clock, ctl = fake_controller(tmp_path, "predict", jobs=1, max_instances=3)
    for r in range(4):
        ctl.run_round()
        for (job, _key), gpus in store.list_assignments().items():
            report = synthetic_report(
                job, gpus=gpus, nodes=1, local_bsz=32, step_s=0.1, sync_s=0.0,
                progress=10.0 * (r + 1), now_s=clock.now_s(), init_batch_size=128,
                max_batch_size=1024,
            )  # fmt: skip
            store.add_report(job, report.to_json())
        clock.advance(60.0)
    ctl.run_round()  # reads the last reports: the model is fitted
    views = {v.name: v for v in ctl.job_views(clock.now_s())}
    assert views["job-0"].model is not None or views["job-0"].models
    recorder = EventRecorder(store, clock, views=lambda: ctl.job_views(clock.now_s()))
    held = {k: g for (_j, k), g in store.list_assignments(job="job-0").items()}
    assert held
    base = store.get_instance(sorted(held)[0])
    extra = store.add_instance(
        instance_key="i-extra",
        request_id="predict-i-extra",
        offering_key=base.offering_key,
        provider=base.provider,
        instance_type=base.instance_type,
        zone=base.zone,
        market=base.market.value,
        gpu_type=base.gpu_type,
        gpus=base.gpus,
        price_usd_per_hour=base.price_usd_per_hour,
    )
    extra = store.transition("i-extra", extra.version, InstanceStatus.REQUESTED, reason="test")
    store.transition("i-extra", extra.version, InstanceStatus.RUNNING, reason="test",
                     provider_instance_id="p-extra")  # fmt: skip
    recorder.observe()  # the new instance's launch and ready
    store.set_assignments("job-0", {**held, "i-extra": base.gpus})
    events = [e for e in recorder.observe() if e.kind is EventKind.RESCALE]
    assert len(events) == 1, events
    message = events[0].message
    assert "the policy gives it more GPUs" in message
    assert re.search(r"its model predicts [\d.e+]+ -> [\d.e+]+ samples/s of goodput for "
                     r"[\d.e+-]+ -> [\d.e+-]+ USD/h", message), message  # fmt: skip
    store.close()


def _stopped_then_placed_again(tmp_path: Path, reports: list[dict]) -> str:
    """A job placed, stopped (no placement), then placed again, its trainer having sent
    ``reports`` (progress fields) meanwhile: the resume event's message."""
    import dataclasses

    from autoscaler.controller.store import Store
    from coadapt_common.clock import FakeClock
    from emulators.reports import synthetic_report

    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", "resume", clock)
    spec = JobSubmission("job", 128, 1024, 128, 32, application="cifar10", command=("t.py",))
    store.add_job(spec.name, spec.to_json())
    store.add_instance(
        instance_key="i-1", request_id="r-1", offering_key="fake/z/t/spot", provider="fake",
        instance_type="t", zone="z", market="spot", gpu_type="T4", gpus=1,
        price_usd_per_hour=0.5,
    )  # fmt: skip
    recorder = EventRecorder(store, clock)
    store.set_assignments("job", {"i-1": 1})
    recorder.observe()
    for fields in reports:
        base = synthetic_report(
            "job", gpus=1, nodes=1, local_bsz=128, step_s=0.2, sync_s=0.0,
            progress=fields["progress"], now_s=clock.now_s(), init_batch_size=128,
        )  # fmt: skip
        report = dataclasses.replace(base, **fields, target_progress=1000.0)
        store.add_report("job", report.to_json())
    store.set_assignments("job", {})
    recorder.observe()
    store.set_assignments("job", {"i-1": 1})
    (resume,) = [e for e in recorder.observe() if e.kind is EventKind.RESUME]
    store.close()
    return resume.message


def test_a_resume_claims_only_the_checkpoint_the_trainer_reported(tmp_path: Path) -> None:
    """Issue 37, item 2: the event said "resumes from its checkpoint (progress 3336 of
    12800)" for a job killed before it saved, which restarted near 424. It now names the
    checkpoint the trainer's last report vouches for, and how much progress was lost."""
    cases = [
        # A clean stop: the final report comes after the stop checkpoint.
        ([{"progress": 300.0, "checkpoint_progress": 300.0}], "from its checkpoint at progress "
         "300 of 1000 on", None),
        # Killed: its last checkpoint is older than its last report.
        ([{"progress": 424.0, "checkpoint_progress": 424.0},
          {"progress": 3336.0, "checkpoint_progress": 424.0}],
         "from its checkpoint at progress 424 of 1000: its last report was at 3336, so at "
         "least 2912 of progress is lost", None),
        # No checkpoint at all: never "from its checkpoint".
        ([{"progress": 3336.0}], "names no checkpoint: unless it saved one since, it starts "
         "over (3336 of progress lost)", "from its checkpoint"),
    ]  # fmt: skip
    for i, (reports, said, never) in enumerate(cases):
        message = _stopped_then_placed_again(tmp_path / str(i), reports)
        assert said in message, message
        if never is not None:
            assert never not in message, message


def test_a_report_cannot_claim_a_checkpoint_past_its_progress() -> None:
    import pytest

    from emulators.reports import synthetic_report
    from trainer.errors import ReportSchemaError
    from trainer.report import TrainerReport

    base = synthetic_report(
        "job", gpus=1, nodes=1, local_bsz=128, step_s=0.2, sync_s=0.0, progress=10.0,
        now_s=0.0, init_batch_size=128,
    ).to_dict()  # fmt: skip
    for bad in (11.0, -1.0, "1", float("nan")):
        with pytest.raises(ReportSchemaError):
            TrainerReport.from_dict({**base, "checkpoint_progress": bad})
    assert TrainerReport.from_dict({**base, "checkpoint_progress": 10.0}).checkpoint_progress == 10
    assert TrainerReport.from_dict(base).checkpoint_progress is None  # an older trainer's


def test_the_story_is_told_in_time_order_across_rounds(tmp_path: Path) -> None:
    """Issue 41: the demo printed events out of time order. A row written after a round was
    told but stamped before it (another thread's clock: here the store's, 60 s behind the
    recorder's) is told at the last told time, never before it; `coadapt events` agrees."""
    from coadapt_common.clock import FakeClock

    store, _cloud, clock, ctl = fake_controller(tmp_path, "order", jobs=2, max_instances=2)
    for _ in range(2):
        ctl.run_round()
        clock.advance(30.0)
    assert any(job == "job-1" for job, _ in store.list_assignments()), "placed"
    ahead = FakeClock(clock.now_s() + 60.0)
    recorder = EventRecorder(store, ahead)
    store.set_assignments("job-1", {})
    first = recorder.observe()  # told at the recorder's now, 60 s ahead of the store
    assert first and first[-1].at_s == ahead.now_s()
    job = store.get_job("job-0")
    store.update_job(job.name, job.version, status=JobStatus.COMPLETED)  # stamped 60 s earlier
    later = recorder.observe()
    assert [e.kind for e in later] == [EventKind.COMPLETION], later
    assert later[0].at_s == first[-1].at_s
    told = [e.at_s for e in store.events_after(0)]
    assert told == sorted(told), told
    store.close()


def test_events_json_gives_each_drain_the_age_of_its_instance(tmp_path: Path) -> None:
    """Issue 40: `coadapt events --json` gives a drain (and a notice) ``instance_age_s``, the
    seconds from the instance's launch to the event, so a drain of a fresh instance shows."""
    store, _cloud, clock, ctl = fake_controller(tmp_path, "aged", jobs=1, max_instances=2)
    recorder = EventRecorder(store, clock)
    for _ in range(2):
        ctl.run_round()
        recorder.observe()
        clock.advance(30.0)
    row = store.list_instances(statuses=(InstanceStatus.RUNNING,))[0]
    launched = next(
        h.at_s for h in store.history(row.instance_key) if h.status.value == "requested"
    )
    store.transition(row.instance_key, row.version, InstanceStatus.DRAINING, reason="test drain")
    drained_at = clock.now_s()
    recorder.observe()
    store.close()
    out = CliRunner().invoke(app, ["events", "--state-dir", str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output
    docs = [json.loads(line) for line in out.output.splitlines()]
    drains = [d for d in docs if d["kind"] == "drain"]
    assert [d["subject"] for d in drains] == [row.instance_key]
    assert drains[0]["instance_age_s"] == drained_at - launched > 0
    assert all("instance_age_s" not in d for d in docs if d["kind"] not in ("drain", "notice"))
