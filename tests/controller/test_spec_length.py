"""A spec's declared length (``length:``): one unit rule, the estimate at submission from the
application's measured speed, and the controller's remaining work and ETA from it until the
trainer declares its own length, which replaces it (issue 40, Build item 7)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from autoscaler.controller.jobbook import (
    EARLIEST_DONE_S,
    JobSubmission,
    admit,
    length_estimate,
    submission_deadline,
)
from autoscaler.controller.jobspec import JobSpecError, parse_job_spec, submission_from_body
from autoscaler.controller.loop import Controller, ControllerConfig
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import Store
from autoscaler.decide.sizing import SizingConfig
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import FakeClock
from emulators.reports import synthetic_report
from providers.fake import FakeProvider
from trainer.report import TrainerReport

SPEC = """\
name: bert-a
command: [train.py]
application: bert
batch_size: {initial: 64, max: 1024}
local_batch_size: {max: 128}
"""

#: A measured fit whose one-GPU throughput is 100 samples/s at any batch (10 ms a sample,
#: nothing fixed, no sync on one GPU), as the store keeps it (JobBook.profile_json's form).
PERF_100 = json.dumps(
    {
        "samples": [],
        "perf": {
            "alpha_c": 0.0,
            "beta_c": 0.01,
            "alpha_n": 0.0,
            "beta_n": 0.0,
            "alpha_r": 0.0,
            "beta_r": 0.0,
            "gamma": 1.0,
        },
    }
)


def sub(**kw: object) -> JobSubmission:
    base: dict[str, object] = {
        "name": "bert-b",
        "init_batch_size": 64,
        "max_batch_size": 1024,
        "max_local_bsz": 128,
        "command": ("train.py",),
        "application": "bert",
    }
    return JobSubmission(**{**base, **kw})  # type: ignore[arg-type]


# ---- the spec field and its unit rule ----------------------------------------------------


def test_a_length_in_samples_steps_or_epochs_is_one_length_in_the_trainers_unit() -> None:
    """samples = steps x batch_size.initial = epochs x dataset_size: the three forms of the
    same length give the same progress (initial-batch-size iterations), the unit the trainer
    declares in (ElasticJob.epochs: epochs x len(dataset) / M0)."""
    forms = (
        "length: {samples: 196608}",
        "length: {steps: 3072}",
        "length: {epochs: 3, dataset_size: 65536}",
    )
    lengths = [parse_job_spec(SPEC + f).submission().length_progress for f in forms]
    assert lengths == [3072.0, 3072.0, 3072.0]
    assert parse_job_spec(SPEC).submission().length_progress is None
    # Stored and sent in the API's body with the spec's names, read back the same.
    spec = parse_job_spec(SPEC + forms[2]).submission()
    assert JobSubmission.from_json(spec.to_json()) == spec
    body = {**json.loads(spec.to_json())}
    assert (body["length_epochs"], body["dataset_samples"]) == (3, 65536)
    nested = {
        "name": "x",
        "command": ["t.py"],
        "batch_size": {"initial": 64, "max": 512},
        "local_batch_size": {"max": 64},
        "length": {"steps": 10},
    }
    assert submission_from_body(nested)[0].length_progress == 10.0
    # A job without a length is stored as before the field existed.
    assert "length_samples" not in json.loads(parse_job_spec(SPEC).submission().to_json())


@pytest.mark.parametrize(
    ("length", "field", "words"),
    [
        ("{epochs: 3}", "length.dataset_size", "length.epochs needs length.dataset_size"),
        ("{samples: 10, steps: 4}", "length.steps", "give one of length.samples"),
        ("{dataset_size: 10}", "length.dataset_size", "give it with length.epochs"),
        ("{samples: 0}", "length.samples", "must be >= 1"),
        ("{samples: 1.5}", "length.samples", "expected an integer"),
        ("{sample: 3}", "length.sample", "did you mean 'samples'"),
    ],
)
def test_a_bad_length_is_refused_naming_its_field(length: str, field: str, words: str) -> None:
    with pytest.raises(JobSpecError) as e:
        parse_job_spec(SPEC + f"length: {length}\n")
    assert e.value.field == field and words in str(e.value)


# ---- the estimate at submission ------------------------------------------------------------


def test_a_deadline_the_declared_length_cannot_meet_is_refused_with_the_estimate() -> None:
    """At 100 samples/s measured on V100 (efficiency 1, one GPU allowed, V100 only), a
    million samples take 10,000 s, plus the 180 s of provisioning and start: a 2 h deadline
    is refused with that estimate, a 3 h one is accepted."""
    fits = [("V100", PERF_100), ("*", PERF_100)]  # the pooled fit is not a GPU type's
    job = sub(max_gpus=1, gpu_types=("V100",), length_samples=1_000_000, deadline="2h")
    estimate = length_estimate(job, fits)
    assert estimate is not None and estimate.fits == 1
    assert estimate.fastest_s == pytest.approx(EARLIEST_DONE_S + 10_000.0)
    with pytest.raises(InvalidInputError) as e:
        submission_deadline(job, 0.0, estimate)
    assert e.value.field == "deadline"
    assert "is 7200 s after submission" in str(e.value)
    assert "1000000 samples" in str(e.value) and "at least an estimated 10180 s" in str(e.value)
    assert "no offering can meet it" in str(e.value)
    ok = dataclasses.replace(job, deadline="3h")
    assert submission_deadline(ok, 0.0, length_estimate(ok, fits)) == (10_800.0, None)
    # More GPUs allowed: the bound scales with them (perfect scaling, a lower bound of time).
    wide = dataclasses.replace(job, max_gpus=4)
    assert length_estimate(wide, fits).fastest_s == pytest.approx(180.0 + 2_500.0)  # type: ignore[union-attr]


def test_an_unmeasured_application_has_an_unknown_estimate_said_in_a_refusal() -> None:
    """No fit of the application (or the generic one, which names no model): the length's
    time is unknown, the deadline checked only against provisioning, and a refusal says the
    estimate is unknown."""
    job = sub(length_samples=1_000_000, deadline="1h")
    estimate = length_estimate(job, [])
    assert estimate is not None and estimate.fastest_s is None
    assert submission_deadline(job, 0.0, estimate) == (3600.0, None)
    generic = length_estimate(sub(application="generic", length_steps=5), [("V100", PERF_100)])
    assert generic is not None and generic.fastest_s is None
    assert "'generic' names no model" in generic.text()
    with pytest.raises(InvalidInputError) as e:
        submission_deadline(dataclasses.replace(job, deadline=60), 0.0, estimate)
    assert "estimated 180 s" in str(e.value)
    assert "takes an unknown time (this cluster has measured no job of application 'bert')" in (
        str(e.value)
    )
    assert length_estimate(sub(), [("V100", PERF_100)]) is None  # no length declared


def test_admit_reads_the_applications_fits_from_the_store(tmp_path: Path) -> None:
    """admit (the API's and the simulated world's check) reads the fits of every job of the
    same application, and of no other."""
    store = Store.create(tmp_path / "s.db", "c1", FakeClock(1_000.0))
    earlier = sub(name="bert-a")
    store.add_job(earlier.name, earlier.to_json())
    store.upsert_model("bert-a", "V100", PERF_100)
    other = sub(name="gpt-a", application="gpt")
    store.add_job(other.name, other.to_json())
    store.upsert_model("gpt-a", "V100", PERF_100.replace("0.01", "0.0001"))
    job = sub(max_gpus=1, gpu_types=("V100",), length_samples=1_000_000, deadline="2h")
    with pytest.raises(InvalidInputError, match="at least an estimated 10180 s"):
        admit(job, 1_000.0, store)
    after, at, estimate = admit(dataclasses.replace(job, deadline="3h"), 1_000.0, store)
    assert (after, at) == (10_800.0, None)
    assert estimate is not None and estimate.fits == 1
    assert admit(sub(deadline="1h"), 1_000.0, store) == (3600.0, None, None)


# ---- the controller's remaining work and ETA ---------------------------------------------

CONFIG = ControllerConfig(
    "len1",
    sizing=SizingConfig(max_instances=4),
    reconcile=ReconcileConfig(heartbeat_timeout_s=None),
)


def test_the_specs_length_gives_the_eta_until_the_trainer_declares_its_own(
    tmp_path: Path,
) -> None:
    """A running job whose script declares no length gets its remaining work, and its ETA,
    from its spec's length; the trainer's own declaration, when it comes, replaces it."""
    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", "len1", clock)
    for name, length in (("spec-only", 51_200), ("both", 51_200), ("none", None)):
        spec = JobSubmission(
            name, 128, 1024, 128, 32, application="cifar10", command=("train.py",),
            length_samples=length,
        )  # fmt: skip
        store.add_job(spec.name, spec.to_json())
    ctl = Controller(store, FakeProvider(clock=clock), clock, CONFIG)
    for _ in range(4):
        ctl.run_round()
        clock.advance(60.0)
        placed: dict[str, int] = {}
        for (job, _), gpus in store.list_assignments().items():
            placed[job] = placed.get(job, 0) + gpus
        for job, gpus in placed.items():
            report = synthetic_report(
                job, gpus=gpus, nodes=1, local_bsz=128, step_s=0.2, sync_s=0.02, progress=1.0,
                now_s=clock.now_s(), init_batch_size=128, max_batch_size=1024, grad_var=3.0,
            )  # fmt: skip
            if job == "both":  # its script declares 200 units; its spec said 400
                report = dataclasses.replace(report, target_progress=200.0)
            store.add_report(job, TrainerReport.to_json(report))
    ctl.run_round()
    said = clock.now_s()
    views = {v.name: v for v in ctl.job_views(said)}
    # 51,200 samples at an initial batch of 128 are 400 units; 1 made: 399 left.
    assert views["spec-only"].target_progress == 400.0
    assert views["spec-only"].remaining_progress == 399.0
    assert (views["both"].target_progress, views["both"].remaining_progress) == (200.0, 199.0)
    assert views["none"].remaining_progress is None
    etas = store.list_etas()
    assert set(etas) == {"spec-only", "both"}, etas
    for name, left in (("spec-only", 399.0), ("both", 199.0)):
        view = views[name]
        model = next(iter(view.models.values()))
        goodput = float(np.ravel(model.optimize(view.num_nodes, view.num_gpus).goodput)[0])
        assert etas[name].eta_s - said == pytest.approx(left * 128 / goodput, rel=1e-6)
