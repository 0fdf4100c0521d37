"""The YAML job spec: a full spec into a JobSubmission, the example specs under the launcher,
every kind of error with its exact line and field, and seeded property tests (random valid
specs written with ``yaml.safe_dump`` parse back to what was written; random documents give a
spec or a JobSpecError, nothing else)."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.accounting.costs import MARKETS
from autoscaler.controller.agent import JobAssignment, launch_argv
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.jobspec import (
    REMOVED_FIELDS,
    JobSpec,
    JobSpecError,
    load_job_spec,
    parse_job_spec,
)
from autoscaler.errors import AutoscalerError, InvalidInputError
from autoscaler.model.gputypes import KNOWN_GPU_TYPES
from trainer import launch

ROOT = Path(__file__).resolve().parents[2]
# The example specs whose script takes --initial-batch-size (ours and Lightning's); the HF one
# sets its batch through the Trainer's arguments: tests/trainer/test_hf_integration.py checks it.
EXAMPLES = sorted(
    p for p in (ROOT / "examples" / "jobs").glob("*.yaml") if p.name != "hf-classifier.yaml"
)

FULL = """\
# a job that sets every field
name: resnet-50-a
command: [train.py, --epochs, 90, --lr, 0.10, --amp, yes, "--tag", "x y"]
gpus: {min: 2, max: 16}
batch_size:
  initial: 256
  max: 4096
local_batch_size: {min: 32, max: 512}
max_accum_steps: 8
checkpoint: s3://ckpt-bucket/resnet-50-a
gpu_types: [T4, A100]
markets: [spot, on-demand]
offerings: [aws/g4dn.12xlarge/us-east-1a/spot, aws/p4d.24xlarge/us-east-1b/on-demand]
application: resnet50
adaptive: true
"""

# Line numbers matter in the error cases below.
BASE = """\
name: job-a
command: [train.py, --epochs, 3]
gpus:
  min: 2
  max: 4
batch_size:
  initial: 256
  max: 1024
local_batch_size:
  max: 128
"""


def test_full_spec_round_trips_into_a_submission() -> None:
    spec = parse_job_spec(FULL, "full.yaml")
    assert spec == JobSpec(
        name="resnet-50-a",
        command=("train.py", "--epochs", "90", "--lr", "0.10", "--amp", "yes", "--tag", "x y"),
        init_batch_size=256,
        max_batch_size=4096,
        max_local_bsz=512,
        min_local_bsz=32,
        min_gpus=2,
        max_gpus=16,
        max_accum_steps=8,
        checkpoint_uri="s3://ckpt-bucket/resnet-50-a",
        gpu_types=("T4", "A100"),
        markets=("spot", "on-demand"),
        offerings=("aws/g4dn.12xlarge/us-east-1a/spot", "aws/p4d.24xlarge/us-east-1b/on-demand"),
        application="resnet50",
        adaptive=True,
    )
    submission = spec.submission()
    assert submission == JobSubmission(
        name="resnet-50-a",
        init_batch_size=256,
        max_batch_size=4096,
        max_local_bsz=512,
        min_local_bsz=32,
        min_gpus=2,
        max_gpus=16,
        gpu_types=("T4", "A100"),
        markets=("spot", "on-demand"),
        offerings=("aws/g4dn.12xlarge/us-east-1a/spot", "aws/p4d.24xlarge/us-east-1b/on-demand"),
        max_accum_steps=8,
        application="resnet50",
        adaptive=True,
        command=spec.command,
        checkpoint_uri="s3://ckpt-bucket/resnet-50-a",
    )
    assert submission.limits.max_accum_steps == 8
    assert JobSubmission.from_json(submission.to_json()) == submission


def test_defaults_of_a_minimal_spec() -> None:
    spec = parse_job_spec(
        "name: j\ncommand: train.py --lr 0.1\nbatch_size: {initial: 8, max: 8}\n"
        "local_batch_size: {max: 8}\n"
    )
    assert spec.command == ("train.py", "--lr", "0.1")
    assert (spec.min_local_bsz, spec.min_gpus, spec.max_gpus, spec.max_accum_steps) == (
        1,
        1,
        None,
        None,
    )
    assert spec.checkpoint_uri is None
    assert (spec.gpu_types, spec.markets, spec.offerings) == (None, None, None)
    assert (spec.application, spec.adaptive) == ("generic", True)
    assert spec.submission() == JobSubmission("j", 8, 8, 8, command=spec.command)


def test_empty_values_mean_absent() -> None:
    spec = parse_job_spec(BASE + "markets:\nofferings: ~\n")
    assert (spec.markets, spec.offerings) == (None, None)
    spec = parse_job_spec(BASE.replace("  min: 2\n  max: 4\n", ""))
    assert (spec.min_gpus, spec.max_gpus) == (1, None)


def test_anchors_and_aliases_work() -> None:
    text = BASE.replace("  max: 128\n", "  max: &local 128\nmax_accum_steps: *local\n")
    assert parse_job_spec(text).max_accum_steps == 128


@pytest.mark.parametrize(
    "path",
    # the Lightning example imports Lightning (seconds): slow
    [pytest.param(p, marks=pytest.mark.slow) if "lightning" in p.name else p for p in EXAMPLES],
    ids=lambda p: p.name,
)
def test_example_specs_run_their_script_under_the_launcher(path: Path) -> None:
    """Each example loads; the argv the node agent builds from it is a valid launcher command
    for its example script whose arguments the script accepts, with the script's initial
    batch size equal to the spec's."""
    pytest.importorskip("torch")
    spec = load_job_spec(path)
    assert spec.name == path.stem
    assignment = JobAssignment(
        job=spec.name,
        gpus=spec.min_gpus,
        nodes=(("i-0", spec.min_gpus),),
        rendezvous="127.0.0.1:29500",
        command=spec.command,
    )
    argv = launch_argv(assignment, controller_url=None)
    assert argv[1:3] == ["-m", "trainer.launch"]
    config = launch.parse_args(argv[3:])
    # the spec's path, relative to its folder, sent absolute: the same from any folder
    assert config.script.startswith(f"{ROOT}/examples/") and config.script.endswith(".py")
    launch.preflight(config, cwd="/")
    args = _example(config.script).parse_args(list(config.script_args))
    assert args.initial_batch_size == spec.init_batch_size
    assert spec.submission().name == spec.name


def test_there_are_four_examples_here_and_the_hf_one_has_its_own_test() -> None:
    assert [p.name for p in EXAMPLES] == [
        "lightning-classifier.yaml",
        "mlp-medium.yaml",
        "mlp-small.yaml",
        "mlp-wide.yaml",
    ]
    assert (ROOT / "examples" / "jobs" / "hf-classifier.yaml").is_file()


@pytest.mark.parametrize("field", ["optimizer", "weight", "budget_share"])
@pytest.mark.parametrize("value", ["sgd", "2", "0.5", "", "[1, 2]"])
def test_removed_fields_are_refused_with_one_line(field: str, value: str) -> None:
    """A spec of an earlier version that names ``optimizer``, ``weight`` or ``budget_share``
    (accepted and ignored then) is refused, whatever the value, with one line saying the
    field was removed, why, and what to do; a JSON body naming one is refused too."""
    with pytest.raises(JobSpecError) as info:
        parse_job_spec(BASE + f"{field}: {value}\n", "old.yaml")
    e = info.value
    assert (e.line, e.field, len(e.problems)) == (11, field, 1)
    assert str(e) == f"old.yaml:11 [{field}]: {REMOVED_FIELDS[field]}"
    assert e.reason.startswith(f"{field} was removed: ") and "\n" not in str(e)
    assert e.reason.endswith("delete this line")
    with pytest.raises(InvalidInputError) as api:
        JobSubmission.from_mapping(
            {"name": "a", "init_batch_size": 8, "max_batch_size": 8, "max_local_bsz": 8, field: 1}
        )
    assert api.value.field == field


def _example(script: str) -> Any:
    spec = importlib.util.spec_from_file_location(Path(script).stem, ROOT / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- errors ---------------------------------------------------------------------------------


def _sub(old: str, new: str) -> str:
    assert BASE.count(old) == 1, old
    return BASE.replace(old, new)


ERRORS = [
    # (text, line, field, words the message contains)
    pytest.param("", 1, "spec", "the file is empty", id="empty file"),
    pytest.param("# nothing here\n\n", 1, "spec", "the file is empty", id="comments only"),
    pytest.param(
        "# a job\n- name: a\n",
        2,
        "spec",
        "expected a mapping of job fields, got a list",
        id="a list",
    ),
    pytest.param("job-a\n", 1, "spec", "got the string 'job-a'", id="a scalar"),
    pytest.param(BASE + "markets: [spot\n", 12, "spec", "not valid YAML", id="bad YAML"),
    pytest.param(
        BASE + "---\nname: b\n", 11, "spec", "expected a single document", id="two documents"
    ),
    pytest.param("name: a\n\tcommand: x\n", 2, "spec", "not valid YAML", id="tab indentation"),
    pytest.param(
        BASE.replace("name: job-a\n", ""), 1, "name", "required field missing", id="missing name"
    ),
    pytest.param(
        _sub("name: job-a", "name:"), 1, "name", "required field missing", id="empty name"
    ),
    pytest.param(
        _sub("local_batch_size:\n  max: 128\n", ""),
        1,
        "local_batch_size",
        "required",
        id="missing section",
    ),
    pytest.param(
        _sub("  max: 1024\n", ""),
        6,
        "batch_size.max",
        "required field missing",
        id="missing sub-field",
    ),
    pytest.param(
        _sub("  max: 128", "  min: 4"),
        9,
        "local_batch_size.max",
        "required",
        id="missing local max",
    ),
    pytest.param(
        BASE + "batchsize: 3\n", 11, "batchsize", "did you mean 'batch_size'?", id="unknown key"
    ),
    pytest.param(
        _sub("  min: 2", "  mn: 2"), 4, "gpus.mn", "did you mean 'min'?", id="unknown nested"
    ),
    pytest.param(BASE + "zzz: 1\n", 11, "zzz", "known: name, command", id="unknown, no hint"),
    pytest.param(
        _sub("name: job-a", "Name: job-a"), 1, "Name", "did you mean 'name'?", id="case of a key"
    ),
    pytest.param(
        BASE + "name: job-b\n", 11, "name", "duplicate key (first at line 1)", id="duplicate key"
    ),
    pytest.param(
        _sub("  max: 4", "  max: 4\n  min: 3"),
        6,
        "gpus.min",
        "first at line 4",
        id="duplicate nested",
    ),
    pytest.param(
        BASE + "3: x\n", 11, "spec", "expected a field name, got the integer 3", id="non-string key"
    ),
    pytest.param(
        BASE + "<<: {weight: 2}\n", 11, "spec", "merge keys (<<) are not supported", id="merge key"
    ),
    pytest.param(
        _sub("initial: 256", 'initial: "256"'),
        7,
        "batch_size.initial",
        "got the string '256' (write numbers without quotes)",
        id="quoted int",
    ),
    pytest.param(
        _sub("max: 1024", "max: true"),
        8,
        "batch_size.max",
        "expected an integer, got the boolean true",
        id="bool for int",
    ),
    pytest.param(
        _sub("initial: 256", "initial: 256.0"),
        7,
        "batch_size.initial",
        "got the float 256.0",
        id="float for int",
    ),
    pytest.param(
        _sub("  min: 2", "  min: [2]"),
        4,
        "gpus.min",
        "expected an integer, got a list",
        id="list for int",
    ),
    pytest.param(
        _sub("name: job-a", "name: {first: a}"),
        1,
        "name",
        "expected a string, got a mapping",
        id="mapping for str",
    ),
    pytest.param(
        _sub("name: job-a", "name: 123"),
        1,
        "name",
        "got the integer 123 (quote it",
        id="int for str",
    ),
    pytest.param(
        _sub("gpus:\n  min: 2\n  max: 4", "gpus: [2, 4]\n\n"),
        3,
        "gpus",
        "expected a mapping with keys min, max, got a list",
        id="list for mapping",
    ),
    pytest.param(
        BASE + "application: !env APP\n", 11, "application", "of YAML type !env", id="custom tag"
    ),
    pytest.param(
        BASE + "application: 2024-01-01\n", 11, "application", "!!timestamp", id="date for str"
    ),
    pytest.param(
        _sub("  max: 1024", "  max:\n    128"),
        9,
        "batch_size.max",
        "must be >= batch_size.initial (256), got 128",
        id="value on next line",
    ),
    pytest.param(
        _sub("name: job-a", "name: Job_A"), 1, "name", "must be a DNS label", id="name not a label"
    ),
    pytest.param(
        _sub("name: job-a", "name: job-"), 1, "name", "must be a DNS label", id="name ends with -"
    ),
    pytest.param(_sub("name: job-a", "name: " + "a" * 64), 1, "name", "1-63", id="name too long"),
    pytest.param(
        _sub("command: [train.py, --epochs, 3]", "command: []"),
        2,
        "command",
        "must not be empty",
        id="empty command",
    ),
    pytest.param(
        _sub("command: [train.py, --epochs, 3]", "command: '  '"),
        2,
        "command",
        "must not be empty",
        id="blank command",
    ),
    pytest.param(
        _sub("[train.py, --epochs, 3]", "[train.py, {a: 1}]"),
        2,
        "command[1]",
        "expected a string, got a mapping",
        id="command item mapping",
    ),
    pytest.param(
        _sub("[train.py, --epochs, 3]", "\n  - train.py\n  -\n  - x"),
        4,
        "command[1]",
        "got an empty value",
        id="command item empty",
    ),
    pytest.param(
        _sub("[train.py, --epochs, 3]", "train.py --name 'a b"),
        2,
        "command",
        "cannot split into words",
        id="command unclosed quote",
    ),
    pytest.param(
        _sub("[train.py, --epochs, 3]", "7"),
        2,
        "command",
        "expected a list or a string",
        id="command an int",
    ),
    pytest.param(
        _sub("[train.py,", "[coadapt-launch, train.py,"),
        2,
        "command[0]",
        "what follows the launcher's options",
        id="command with launcher",
    ),
    pytest.param(
        _sub("command: [train.py, --epochs, 3]", "command: python3 train.py"),
        2,
        "command[0]",
        "must be the training script",
        id="command with python",
    ),
    pytest.param(
        _sub("[train.py,", "[--nproc-per-node, train.py,"),
        2,
        "command[0]",
        "must be the training script",
        id="command an option",
    ),
    pytest.param(
        _sub("  min: 2", "  min: 0"), 4, "gpus.min", "must be >= 1, got 0", id="gpus.min 0"
    ),
    pytest.param(
        _sub("  max: 4", "  max: 1"),
        5,
        "gpus.max",
        "must be >= gpus.min (2), got 1",
        id="gpus.max < min",
    ),
    pytest.param(
        _sub("  min: 2\n", "").replace("  max: 4", "  max: 0"),
        4,
        "gpus.max",
        "must be >= gpus.min (1), got 0",
        id="gpus.max < default min",
    ),
    pytest.param(
        _sub("initial: 256", "initial: 0"),
        7,
        "batch_size.initial",
        "must be >= 1, got 0",
        id="initial 0",
    ),
    pytest.param(
        _sub("  max: 128", "  min: 64\n  max: 32"),
        11,
        "local_batch_size.max",
        "must be >= local_batch_size.min (64), got 32",
        id="local max < min",
    ),
    pytest.param(
        _sub("  max: 128", "  min: 2048\n  max: 4096"),
        10,
        "local_batch_size.min",
        "must be <= batch_size.max (1024), got 2048",
        id="local min > batch max",
    ),
    pytest.param(
        BASE + "max_accum_steps: 0\n", 11, "max_accum_steps", "must be >= 1, got 0", id="accum 0"
    ),
    pytest.param(
        BASE + "checkpoint: http://host/x\n",
        11,
        "checkpoint",
        "unsupported scheme 'http'",
        id="checkpoint scheme",
    ),
    pytest.param(
        BASE + "checkpoint: s3:///prefix\n",
        11,
        "checkpoint",
        "names no bucket",
        id="checkpoint no bucket",
    ),
    pytest.param(
        BASE + "checkpoint: ''\n", 11, "checkpoint", "non-empty location", id="checkpoint empty"
    ),
    pytest.param(
        BASE + "weight: 2\n",
        11,
        "weight",
        "weight was removed: it has no meaning",
        id="weight removed",
    ),
    pytest.param(
        BASE + "gpu_types: [T4, a100]\n",
        11,
        "gpu_types[1]",
        "did you mean 'A100'?",
        id="gpu type unknown",
    ),
    pytest.param(
        BASE + "gpu_types:\n  - T4\n  - T4\n",
        13,
        "gpu_types[1]",
        "listed twice (first as gpu_types[0])",
        id="gpu type twice",
    ),
    pytest.param(
        BASE + "gpu_types: T4\n",
        11,
        "gpu_types",
        "expected a list of strings",
        id="gpu types a string",
    ),
    pytest.param(
        BASE + "markets: []\n",
        11,
        "markets",
        "non-empty list (leave it out to allow any)",
        id="markets empty",
    ),
    pytest.param(
        BASE + "markets: [ondemand]\n",
        11,
        "markets[0]",
        "did you mean 'on-demand'?",
        id="market typo",
    ),
    pytest.param(
        BASE + "offerings: [aws/g4dn.xlarge/spot]\n",
        11,
        "offerings[0]",
        "provider/instance_type/zone/market",
        id="offering malformed",
    ),
    pytest.param(
        BASE + "offerings: [a/b/c/preemptible]\n",
        11,
        "offerings[0]",
        "must be one of spot, on-demand",
        id="offering market",
    ),
    pytest.param(
        BASE + "markets: [spot]\nofferings:\n  - a/b/c/spot\n  - a/b/c/on-demand\n",
        14,
        "offerings[1]",
        "its market 'on-demand' is not in markets (spot)",
        id="offering outside markets",
    ),
    pytest.param(
        BASE + "application: ''\n", 11, "application", "1-1024 printable", id="application empty"
    ),
    pytest.param(
        BASE + "adaptive: 'false'\n",
        11,
        "adaptive",
        "expected true or false, got the string 'false'",
        id="adaptive quoted",
    ),
    pytest.param(
        BASE + "adaptive: 0\n",
        11,
        "adaptive",
        "expected true or false, got the integer 0",
        id="adaptive int",
    ),
]


@pytest.mark.parametrize(("text", "line", "field", "words"), ERRORS)
def test_errors_name_the_file_line_and_field(text: str, line: int, field: str, words: str) -> None:
    with pytest.raises(JobSpecError) as info:
        parse_job_spec(text, "job.yaml")
    e = info.value
    assert (e.path, e.line, e.field) == ("job.yaml", line, field), str(e)
    assert words in e.reason
    assert str(e.problems[0]) == f"job.yaml:{line} [{field}]: {e.reason}"
    assert f"job.yaml:{line} [{field}]: {e.reason}" in str(e)


def test_the_message_reads_as_documented() -> None:
    text = _sub("  max: 1024", "  max: 128")
    with pytest.raises(JobSpecError) as info:
        parse_job_spec(text, "job.yaml")
    assert (
        str(info.value)
        == "job.yaml:8 [batch_size.max]: must be >= batch_size.initial (256), got 128"
    )
    assert isinstance(info.value, InvalidInputError)
    assert isinstance(info.value, AutoscalerError)
    assert info.value.field == "batch_size.max"


def test_duplicate_keys_are_refused_not_overwritten() -> None:
    """PyYAML's loader keeps the last of two equal keys; the spec refuses them, at any depth,
    also when they are written in flow style on one line."""
    assert yaml.safe_load("a: 1\na: 2\n") == {"a": 2}
    for text, line, field in [
        (BASE + "command: [other.py]\n", 11, "command"),
        (_sub("gpus:\n  min: 2\n  max: 4", "gpus: {min: 2, max: 4, max: 8}"), 3, "gpus.max"),
        (_sub("  max: 128", "  max: 128\n  max: 64"), 11, "local_batch_size.max"),
    ]:
        with pytest.raises(JobSpecError, match="duplicate key") as info:
            parse_job_spec(text, "job.yaml")
        assert (info.value.line, info.value.field) == (line, field)


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(JobSpecError, match="cannot read") as info:
        load_job_spec(missing)
    assert (info.value.path, info.value.line, info.value.field) == (str(missing), None, None)
    binary = tmp_path / "latin1.yaml"
    binary.write_bytes(b"name: a\ncommand: caf\xe9.py\n")
    with pytest.raises(JobSpecError, match="not UTF-8") as info:
        load_job_spec(binary)
    assert (info.value.line, info.value.field) == (2, "spec")
    control = tmp_path / "control.yaml"
    control.write_text("name: a\n\ncommand: a\x07.py\n")
    with pytest.raises(JobSpecError, match="U\\+0007") as info:
        load_job_spec(control)
    assert info.value.line == 3


def test_huge_and_deep_files_are_refused_before_their_values_are_read(tmp_path: Path) -> None:
    """A 100 MB file is refused from its first 64 KiB (it is never read whole); 100,000
    nested brackets, or a billion-laughs of aliases, are refused as nested too deeply or
    within the size limit, on one line, without a RecursionError."""
    import time

    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as f:
        f.write(BASE.encode())
        f.seek(100 * 1024 * 1024)
        f.write(b"\n")
    started = time.monotonic()
    with pytest.raises(JobSpecError, match="larger than 64 KiB") as info:
        load_job_spec(huge)
    assert time.monotonic() - started < 1.0
    assert (info.value.line, info.value.field) == (1, "spec")
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: " + "[" * 30_000 + "\n")  # under the size limit: the depth
    with pytest.raises(JobSpecError) as info:
        load_job_spec(deep)
    assert info.value.field == "spec" and "\n" not in str(info.value)
    nested = "name: a\ncommand: " + "[" * 20 + "x.py" + "]" * 20 + "\n"
    with pytest.raises(JobSpecError, match="nested too deeply"):
        parse_job_spec(nested)
    laughs = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 12):
        prev = chr(ord("a") + i - 1)
        laughs.append(f"{chr(ord('a') + i)}: &{chr(ord('a') + i)} [{', '.join(['*' + prev] * 10)}]")
    started = time.monotonic()
    with pytest.raises(JobSpecError):
        parse_job_spec("\n".join(laughs) + "\n")
    assert time.monotonic() - started < 2.0


def test_the_cli_and_the_api_refuse_the_same_jobs() -> None:
    """One rule: what the API refuses in a JSON body, a spec refuses too (naming its own
    field path), and the other way round."""
    bodies = [
        ({"min_gpus": 9223372036854775808}, "gpus.min", "min_gpus"),
        ({"max_gpus": 5000}, "gpus.max", "max_gpus"),
        ({"command": ["--controller-url", "http://x", "t.py"]}, "command[0]", "command[0]"),
        ({"command": ["torchrun", "t.py"]}, "command[0]", "command[0]"),
        ({"init_batch_size": 2**30, "max_batch_size": 2**30}, "batch_size.initial", None),
        ({"gpu_types": ["T4", "T4"]}, "gpu_types[1]", "gpu_types[1]"),
    ]
    base = {
        "name": "job-a",
        "command": ["train.py"],
        "init_batch_size": 64,
        "max_batch_size": 256,
        "max_local_bsz": 64,
    }
    for changes, spec_field, api_field in bodies:
        with pytest.raises(InvalidInputError) as api:
            JobSubmission.from_mapping({**base, **changes})
        assert api.value.field == (api_field or next(iter(changes)))
        attrs = {
            "name": "job-a",
            "command": tuple(changes.get("command", ["train.py"])),
            "init_batch_size": changes.get("init_batch_size", 64),
            "max_batch_size": changes.get("max_batch_size", 256),
            "max_local_bsz": 64,
            "min_gpus": changes.get("min_gpus", 1),
            "max_gpus": changes.get("max_gpus"),
            "gpu_types": changes.get("gpu_types"),
        }
        with pytest.raises(InvalidInputError) as cli:
            JobSpec(**attrs)
        assert cli.value.field == spec_field


def test_constructing_a_spec_checks_the_same_rules() -> None:
    good = parse_job_spec(BASE)
    with pytest.raises(InvalidInputError) as info:
        JobSpec(**{**good.__dict__, "max_batch_size": 128})
    assert info.value.field == "batch_size.max"
    assert "must be >= batch_size.initial (256), got 128" in str(info.value)
    with pytest.raises(InvalidInputError) as info:
        JobSpec(**{**good.__dict__, "init_batch_size": True})
    assert info.value.field == "batch_size.initial"
    with pytest.raises(InvalidInputError) as info:
        JobSpec(**{**good.__dict__, "markets": ["spot", "preemptible"]})
    assert info.value.field == "markets[1]"
    made = JobSpec(**{**good.__dict__, "markets": ["on-demand"], "command": ["t.py"]})
    assert made.markets == ("on-demand",)
    assert made.command == ("t.py",)


# ---- properties -----------------------------------------------------------------------------

_NAMES = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)
_SCRIPTS = st.from_regex(r"[a-z_][a-z0-9_/]{0,16}\.py", fullmatch=True)
_WORDS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)
# A process argument cannot hold NUL (argv is C strings): the one rule refuses it.
_ARGS = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=10
)


@st.composite
def _specs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A valid spec as a YAML-able dict, and the JobSpec attributes it must give."""
    command = [draw(_SCRIPTS), *draw(st.lists(_ARGS, max_size=6))]
    init = draw(st.integers(1, 10_000))
    max_batch = draw(st.integers(init, 100_000))
    min_local = draw(st.integers(1, max_batch))
    max_local = draw(st.integers(min_local, 1_000_000))
    data: dict[str, Any] = {
        "name": draw(_NAMES),
        "command": shlex.join(command) if draw(st.booleans()) else command,
        "batch_size": {"initial": init, "max": max_batch},
        "local_batch_size": {"max": max_local},
    }
    want: dict[str, Any] = {
        "name": data["name"],
        "command": tuple(command),
        "init_batch_size": init,
        "max_batch_size": max_batch,
        "max_local_bsz": max_local,
    }
    if draw(st.booleans()):
        data["local_batch_size"]["min"] = want["min_local_bsz"] = min_local
    if draw(st.booleans()):
        data["gpus"] = {}
        if draw(st.booleans()):
            data["gpus"]["min"] = want["min_gpus"] = draw(st.integers(1, 64))
        if draw(st.booleans()):
            low = want.get("min_gpus", 1)
            data["gpus"]["max"] = want["max_gpus"] = draw(st.integers(low, 1024))
    markets = draw(st.none() | st.lists(st.sampled_from(MARKETS), min_size=1, unique=True))
    offering = st.tuples(*[st.from_regex(r"[a-z0-9.-]{1,12}", fullmatch=True)] * 3).map("/".join)
    optional: dict[str, tuple[str, Any]] = {
        "max_accum_steps": ("max_accum_steps", st.integers(1, 64)),
        "checkpoint": (
            "checkpoint_uri",
            st.sampled_from(["ckpt/j", "/abs/ckpt", "file:///tmp/c", "s3://b/p", "gs://b"]),
        ),
        "gpu_types": (
            "gpu_types",
            st.lists(st.sampled_from(KNOWN_GPU_TYPES), min_size=1, unique=True).map(tuple),
        ),
        "markets": ("markets", st.just(None if markets is None else tuple(markets))),
        "offerings": (
            "offerings",
            st.lists(
                st.tuples(offering, st.sampled_from(markets or MARKETS)).map("/".join),
                min_size=1,
                unique=True,
            ).map(tuple),
        ),
        "application": ("application", _WORDS.filter(lambda w: bool(w) and w.isprintable())),
        "adaptive": ("adaptive", st.booleans()),
    }
    for key, (attribute, values) in optional.items():
        how = draw(st.sampled_from(["absent", "null", "given"]))
        value = draw(values)
        if how == "null" or (how == "given" and value is None):
            data[key] = None
        elif how == "given":
            want[attribute] = value
            data[key] = list(value) if isinstance(value, tuple) else value
    if want.get("adaptive") is False and "max_gpus" in want:  # it runs on exactly gpus.min
        data["gpus"]["max"] = want["max_gpus"] = want.get("min_gpus", 1)
    order = draw(st.permutations(list(data)))
    return {key: data[key] for key in order}, want


@pytest.mark.slow
@given(_specs(), st.sampled_from([None, False, True]))
def test_random_valid_specs_parse_back(
    case: tuple[dict[str, Any], dict[str, Any]], flow: bool | None
) -> None:
    data, want = case
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=flow)
    spec = parse_job_spec(text)
    assert spec == JobSpec(**want)
    submission = spec.submission()
    assert (submission.name, submission.command, submission.min_gpus) == (
        spec.name,
        spec.command,
        spec.min_gpus,
    )


_SCALARS = st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats() | _WORDS
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_WORDS, inner, max_size=3),
    max_leaves=6,
)


@given(
    _specs(),
    st.sampled_from(
        [
            "name",
            "command",
            "gpus",
            "batch_size",
            "local_batch_size",
            "weight",
            "markets",
            "offerings",
            "adaptive",
            "extra",
        ]
    ),
    _VALUES,
)
@pytest.mark.slow
def test_random_documents_give_a_spec_or_a_located_error(
    case: tuple[dict[str, Any], dict[str, Any]], key: str, value: Any
) -> None:
    """Any value at any key: a JobSpec, or a JobSpecError whose line lies in the file."""
    data, _ = case
    data[key] = value
    text = yaml.safe_dump(data, sort_keys=False)
    try:
        parse_job_spec(text, "job.yaml")
    except JobSpecError as e:
        assert e.line is not None and 1 <= e.line <= text.count("\n") + 1
        assert e.field


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"requested_gpus": 0}, "requested_gpus"),
        ({"requested_gpus": 4097}, "requested_gpus"),
        ({"min_gpus": 2, "requested_gpus": 1}, "requested_gpus"),
        ({"max_gpus": 4, "requested_gpus": 5}, "requested_gpus"),
        ({"requested_gpus": True}, "requested_gpus"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": (1 << 24) + 1}, "batch_size"),
        ({"batch_size": "64"}, "batch_size"),
    ],
)
def test_the_users_own_gpus_and_batch_are_bounded(extra: dict, field: str) -> None:
    """``requested_gpus`` and ``batch_size`` (what a fixed-batch policy gives a job) are
    refused past their bounds, with the field named; at their bounds they pass."""
    from autoscaler.controller.jobbook import JobSubmission, submission_problems

    base = {"name": "j", "init_batch_size": 64, "max_batch_size": 256, "max_local_bsz": 64}
    base["command"] = ["train.py"]
    assert field in [f for f, _ in submission_problems({**base, **extra})]
    with pytest.raises(InvalidInputError):
        JobSubmission(**{**base, **extra})
    ok = JobSubmission(**{**base, "requested_gpus": 4096, "batch_size": 1 << 24})
    assert ok.requested_gpus == 4096 and ok.batch_size == 1 << 24


# ---- a fixed job needs no batch limits (issue 41) -------------------------------------------


@pytest.mark.parametrize(
    ("batch", "want"),
    [
        pytest.param("batch_size: {initial: 64}\n", (64, 64, 64), id="neither"),
        pytest.param(
            "batch_size: {initial: 64}\nlocal_batch_size: {max: 16}\n",
            (64, 64, 16),
            id="local max given",
        ),
        pytest.param("batch_size: {initial: 64, max: 64}\n", (64, 64, 64), id="max given"),
    ],
)
def test_a_fixed_job_may_leave_out_the_batch_limits(batch: str, want: tuple[int, ...]) -> None:
    spec = parse_job_spec(
        "name: fixed\ncommand: [train.py]\nadaptive: false\ngpus: {min: 2}\n" + batch
    )
    assert (spec.init_batch_size, spec.max_batch_size, spec.max_local_bsz) == want
    sub = spec.submission()
    assert (sub.min_gpus, sub.adaptive, sub.min_local_bsz) == (2, False, 1)
    # the API's body defaults the same fields the same way (one rule)
    flat = {"name": "fixed", "command": ["train.py"], "adaptive": False, "min_gpus": 2}
    flat |= {"init_batch_size": 64}
    if want[2] != 64:
        flat["max_local_bsz"] = want[2]
    assert JobSubmission.from_mapping(flat) == sub


def test_a_fixed_jobs_local_batch_default_is_capped() -> None:
    spec = parse_job_spec(
        "name: big\ncommand: [train.py]\nadaptive: false\nbatch_size: {initial: 4194304}\n"
    )
    assert (spec.max_batch_size, spec.max_local_bsz) == (4194304, 1 << 20)


def test_an_adaptive_job_still_needs_the_batch_limits_and_is_told_why() -> None:
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec("name: a\ncommand: [train.py]\nbatch_size: {initial: 64}\n", "job.yaml")
    got = {(p.field, p.reason) for p in caught.value.problems}
    hint = " (an adaptive job needs it; with adaptive: false it has a default)"
    assert got == {
        ("batch_size.max", "required field missing" + hint),
        ("local_batch_size", "required field missing" + hint),
    }


def test_a_fixed_job_with_a_bad_initial_batch_gets_one_message() -> None:
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec("name: a\ncommand: [x.py]\nadaptive: false\nbatch_size: {initial: x}\n")
    assert [p.field for p in caught.value.problems] == ["batch_size.initial"]
