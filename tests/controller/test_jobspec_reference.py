"""The job-spec reference (``docs/jobspec.md``) is what its generator prints, from the one
field table the reader and the API are made of (issue 41)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.jobspec import (
    FIELDS,
    REFERENCE_PATH,
    JobSpec,
    parse_job_spec,
    reference,
    submission_body,
    submission_from_body,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_checked_in_reference_is_the_generators_output() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "autoscaler.controller.jobspec", "--reference"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    checked_in = (ROOT / REFERENCE_PATH).read_text()
    assert out.stdout == checked_in, (
        f"{REFERENCE_PATH} is stale: run "
        f"`python -m autoscaler.controller.jobspec --reference > {REFERENCE_PATH}`"
    )


def test_the_generator_without_an_action_fails_in_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "autoscaler.controller.jobspec"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "give --reference" in out.stderr, out.stderr


def test_every_field_of_a_spec_is_in_the_table_and_the_reference() -> None:
    """A field added to JobSpec without a row in FIELDS (and so in the reference) fails."""
    attributes = {f.name for f in dataclasses.fields(JobSpec)}
    assert {f.attribute for f in FIELDS} == attributes
    text = reference()
    for f in FIELDS:
        assert f"| `{f.path}` |" in text, f.path


def test_the_references_examples_are_valid_specs() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", reference(), re.S)
    assert len(blocks) == 2
    adaptive, fixed = (parse_job_spec(b, "reference") for b in blocks)
    assert adaptive.adaptive and (adaptive.min_gpus, adaptive.max_gpus) == (1, 2)
    # the fixed one runs with the defaults the table states for the fields it leaves out
    assert not fixed.adaptive
    assert (fixed.init_batch_size, fixed.max_batch_size, fixed.max_local_bsz) == (64, 64, 64)
    base = {
        "name": "mlp-small",
        "command": "[examples/elastic_mlp.py]",
        "batch_size": {"initial": "64", "max": "512"},
        "local_batch_size": {"max": "256"},
    }
    # Fields that are given together: epochs are counted in the dataset's size.
    companions = {"length.epochs": "length.dataset_size", "length.dataset_size": "length.epochs"}
    by_path = {f.path: f for f in FIELDS}
    for f in FIELDS:  # each field's example, alone in a valid spec, is read as valid
        doc: dict[str, object] = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
        for g in (f, *([by_path[companions[f.path]]] if f.path in companions else [])):
            head, _, key = g.path.partition(".")
            if key:
                group = doc.setdefault(head, {})
                assert isinstance(group, dict)
                group[key] = g.example
            else:
                doc[head] = g.example
        text = "".join(
            f"{k}: {{{', '.join(f'{a}: {b}' for a, b in v.items())}}}\n"
            if isinstance(v, dict)
            else f"{k}: {v}\n"
            for k, v in doc.items()
        )
        parse_job_spec(text, f"example of {f.path}")


def test_a_submission_round_trips_through_the_spec_shaped_body() -> None:
    spec = parse_job_spec(
        "name: rt\ncommand: [train.py, --epochs, 3]\ngpus: {min: 2, max: 4}\n"
        "batch_size: {initial: 64, max: 512}\nlocal_batch_size: {min: 8, max: 128}\n"
        "checkpoint: s3://b/p\nmarkets: [spot]\nmax_accum_steps: 4\n"
    ).submission()
    body = submission_body(spec)
    assert body["gpus"] == {"min": 2, "max": 4} and body["checkpoint"] == "s3://b/p"
    assert "min_gpus" not in body and "checkpoint_uri" not in body
    again, deprecated = submission_from_body(body)
    assert again == spec and deprecated == ()
    # what only the flat form can say is sent flat
    flat = submission_body(dataclasses.replace(spec, requested_gpus=3))
    assert flat["min_gpus"] == 2 and flat["requested_gpus"] == 3
    assert submission_from_body(flat)[0] == JobSubmission.from_mapping(flat)


def test_the_readme_links_the_reference() -> None:
    readme = (ROOT / "README.md").read_text()
    assert f"]({REFERENCE_PATH})" in readme
