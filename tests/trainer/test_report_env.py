"""The shared report payload and the worker environment: typed, versioned, torch-free."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainer.env import TrainerEnv
from trainer.errors import ReportSchemaError, TrainerConfigError
from trainer.report import (
    SCHEMA_VERSION,
    BatchConfig,
    GradientStats,
    JobHints,
    ProfileEntry,
    ReportReply,
    TrainerReport,
    report_path,
)

from .harness import ROOT


def _report(**overrides: object) -> TrainerReport:
    fields = dict(
        job_id="j1",
        attempt=2,
        started_at_s=1.5e9,
        sent_at_s=1.5e9 + 30,
        world_size=4,
        num_nodes=2,
        batch=BatchConfig(256, 2),
        step=120,
        skipped_steps=1,
        epoch=3,
        epoch_position=512,
        progress=140.25,
        gradient=GradientStats(
            64, grad_sqr=0.5, grad_var=2.0, measurements=30, preconditioned=True
        ),
        profiles=(ProfileEntry(2, 4, 32, 2, 100, 0.2, 0.15, 0.05),),
        hints=JobHints(64, max_batch_size=4096, scaling_rule="sqrt"),
    )
    fields.update(overrides)
    return TrainerReport(**fields)  # type: ignore[arg-type]


def test_report_round_trips_through_json() -> None:
    report = _report()
    again = TrainerReport.from_json(report.to_json())
    assert again == report
    assert json.loads(report.to_json())["schema_version"] == SCHEMA_VERSION
    assert report.gradient is not None and report.gradient.noise_scale == pytest.approx(256.0)


def test_report_without_gradient_statistics_round_trips() -> None:
    report = _report(gradient=None, profiles=())
    assert TrainerReport.from_json(report.to_json()) == report


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema_version=SCHEMA_VERSION + 1), "schema_version"),
        (lambda d: d.pop("step"), "missing field 'step'"),
        (lambda d: d.update(step=True), "step"),
        (lambda d: d.update(world_size=0), "world_size"),
        (lambda d: d["batch"].update(accum_steps=0), "accum_steps"),
        (lambda d: d["profiles"][0].update(step_s="fast"), "step_s"),
        (lambda d: d["gradient"].update(grad_var=None), "grad_var"),
    ],
)
def test_report_rejects_schema_violations(mutate, message: str) -> None:
    data = json.loads(_report().to_json())
    mutate(data)
    with pytest.raises(ReportSchemaError, match=message):
        TrainerReport.from_dict(data)


def test_reply_parses_empty_batch_and_stop() -> None:
    assert ReportReply.from_json(b"") == ReportReply()
    reply = ReportReply(batch=BatchConfig(128, 4), stop=True)
    assert ReportReply.from_json(reply.to_json()) == reply
    with pytest.raises(ReportSchemaError):
        ReportReply.from_json('{"schema_version": 1, "stop": "yes"}')


@given(st.integers(1, 10_000), st.integers(1, 16), st.integers(1, 64))
def test_local_batch_size_covers_the_global_batch(size: int, accum: int, world: int) -> None:
    batch = BatchConfig(size, accum)
    assert batch.local_batch_size(world) * accum * world >= size


def test_report_path_is_per_job() -> None:
    assert report_path("job-7") == "/v1/jobs/job-7/reports"


def test_shared_modules_do_not_import_torch() -> None:
    code = (
        "import sys, trainer, trainer.report, trainer.env, trainer.reporter, trainer.launch, "
        "trainer.preload, trainer.errors, trainer.control, trainer.storage\n"
        "bad = [m for m in ('torch', 'boto3', 'google.cloud') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_environment_defaults_to_a_standalone_single_process() -> None:
    env = TrainerEnv.from_environ({})
    assert (env.rank, env.world_size, env.distributed, env.standalone) == (0, 1, False, True)
    assert env.batch is None and env.report_interval_s == 30.0
    assert env.job_id == "standalone" and env.checkpoint_uri.endswith("standalone")


def test_environment_reads_launcher_and_torchrun_variables() -> None:
    env = TrainerEnv.from_environ(
        {
            "RANK": "3",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29500",
            "TORCHELASTIC_RESTART_COUNT": "2",
            "COADAPT_JOB_ID": "j-9",
            "COADAPT_ATTEMPT": "5",
            "COADAPT_CHECKPOINT_URI": "s3://b/j-9",
            "COADAPT_CONTROLLER_URL": "http://ctl:8080/",
            "COADAPT_BATCH_SIZE": "512",
            "COADAPT_ACCUM_STEPS": "2",
            "COADAPT_REPORT_INTERVAL_S": "5",
            "COADAPT_STOP_FILE": "/run/notice",
        }
    )
    assert (env.rank, env.local_rank, env.world_size, env.num_nodes) == (3, 1, 4, 2)
    assert env.distributed and not env.standalone
    assert env.controller_url == "http://ctl:8080"
    assert env.batch == BatchConfig(512, 2)
    assert (env.restart_count, env.attempt, env.report_interval_s) == (2, 5, 5.0)
    assert env.stop_file == "/run/notice" and env.checkpoint_uri == "s3://b/j-9"


@pytest.mark.parametrize(
    ("environ", "field"),
    [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE"),
        ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK"),
        ({"WORLD_SIZE": "2"}, ""),
        ({"COADAPT_BATCH_SIZE": "0"}, "COADAPT_BATCH_SIZE"),
        ({"COADAPT_ACCUM_STEPS": "2"}, "COADAPT_ACCUM_STEPS"),
        ({"COADAPT_CONTROLLER_URL": "ctl:80"}, "COADAPT_CONTROLLER_URL"),
        ({"COADAPT_JOB_ID": "bad id"}, "COADAPT_JOB_ID"),
        ({"COADAPT_REPORT_INTERVAL_S": "-1"}, "COADAPT_REPORT_INTERVAL_S"),
    ],
)
def test_environment_rejects_invalid_values_naming_the_variable(
    environ: dict[str, str], field: str
) -> None:
    with pytest.raises(TrainerConfigError) as info:
        TrainerEnv.from_environ(environ)
    assert info.value.field == field
