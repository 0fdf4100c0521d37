"""The YAML job spec of ``coadapt submit job.yaml``: read, validated, mapped onto a submission.

A spec is one YAML mapping::

    name: mlp-small                     # required
    command: [examples/elastic_mlp.py, --epochs, 3, --initial-batch-size, 64]  # required
    gpus: {min: 1, max: 2}
    batch_size: {initial: 64, max: 512}  # initial required; max of an adaptive job
    local_batch_size: {max: 256}         # required of an adaptive job
    markets: [on-demand]
    length: {epochs: 3, dataset_size: 65536}  # or {samples: N}, or {steps: N}
    deadline: 2h

Every field, its type, bounds, default and an example is in :data:`FIELDS`, the one table the
reader, the API's JSON body (:func:`submission_from_body`) and the reference are made from:
``python -m autoscaler.controller.jobspec --reference`` prints the reference, checked in as
``docs/jobspec.md`` (a test keeps the two equal). ``batch_size.max`` and
``local_batch_size.max`` are required of an adaptive job only: with ``adaptive: false`` they
default to ``batch_size.initial`` (the second capped at 2^20;
:func:`~autoscaler.controller.jobbook.fixed_job_defaults`, the API's rule too).

A field given as an empty value (``gpus:`` or ``null``) is the same as an absent one.
Integers are YAML integers (``64``; not ``"64"``, ``64.0`` or ``true``); floats accept integers.
The items of a ``command`` list are taken as written, so ``--epochs, 3`` needs no quotes
(``3`` stays ``"3"``, ``010`` stays ``"010"``). A file over 64 KiB, or nested deeper than 16
levels, is refused before its values are read.

**Paths.** A spec read from a file (:func:`load_job_spec`, ``coadapt submit``) names its
script relative to the spec's folder (or absolutely); the script must be a readable file
there, and the job is sent with its absolute path (a local ``checkpoint`` likewise), so it
runs whichever folder ``coadapt submit`` or ``coadapt up`` was started from
(:func:`resolve_paths`). The script's arguments are passed as written.

``command`` is what follows the launcher's options: the node agent starts a job as
``python -m trainer.launch --job-id NAME --nproc-per-node GPUS ... -- COMMAND``
(:func:`autoscaler.controller.agent.launch_argv`; after ``--`` nothing is read as a launcher
option), and a command that starts with an option (``-...``), a launcher
(``coadapt-launch``, ``torchrun``) or an interpreter (``python``) is refused.

**One check for the CLI and the API.** Every field a submission has is checked by
:func:`~autoscaler.controller.jobbook.submission_problems`, the function the API runs on a JSON
body: ``coadapt submit`` and ``POST /v1/jobs`` refuse the same jobs, and both name the spec's
field paths (``gpus.min``) in their errors; a body in the API's old flat form (``min_gpus``)
is still accepted, deprecated, and its errors name its own field names.

**What the controller acts on: every field.** :meth:`JobSpec.submission` gives the
:class:`~autoscaler.controller.jobbook.JobSubmission` the controller stores and schedules, with
every field of the spec. Every policy and the fleet sizing honour the GPU bounds, and place
the job only on instances of a GPU type, market and offering it allows
(:meth:`~autoscaler.decide.views.JobView.allows_node`, one rule for all of them; offering keys
are compared as :class:`~autoscaler.decide.views.OfferingRef` parts, in the format
``provider/instance_type/zone/market`` of :attr:`~autoscaler.decide.views.OfferingRef.key`); a
job no fleet the controller may build could ever run (:mod:`autoscaler.decide.bounds`: no
offering of a type, market and offering it allows, or too few GPUs) is ``refused`` with the reason.

**A declared length.** ``length`` gives the job's length in samples, steps or epochs (with
the dataset's size), converted by one rule to the trainer's unit of progress
(:attr:`~autoscaler.controller.jobbook.JobSubmission.length_progress`: samples = steps x
``batch_size.initial`` = epochs x ``length.dataset_size``). At submission, a deadline it cannot
meet on any offering, at the speed the cluster measured of the application, is refused with
the estimate (:func:`~autoscaler.controller.jobbook.admit`); while the job runs, it gives the
job's remaining work and ETA until the script declares its own length, which replaces it.

**Removed fields.** ``optimizer``, ``weight`` and ``budget_share`` were accepted and ignored
by earlier versions; a spec that names one is refused with a one-line reason
(:data:`REMOVED_FIELDS`): the trainer takes its learning-rate scaling rule from the optimizer
object the script gives it (a spec value could only disagree with it); a weight has no
meaning all four policies share (a power-mean share, a queue priority, nothing in a greedy),
and none read it; the fleet has one budget for all jobs, which share its instances.

**Errors.** Every problem raises :class:`JobSpecError` naming the file, the line (1-based: the
offending key, or value; for a missing field, the key of the mapping that lacks it, or the
document's first line) and the
field path, e.g. ``job.yaml:7 [batch_size.max]: must be >= batch_size.initial (256), got
128``: invalid YAML, an empty file, a document that is not a mapping, duplicate keys (PyYAML
would keep the last silently), unknown keys (with a "did you mean" when one is close), missing
fields, wrong types, values out of range. Anchors and aliases work as YAML defines them; merge
keys (``<<``) and tags other than the basic ones (string, integer, float, boolean, null) are
refused.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Final, NoReturn

import yaml

from autoscaler.controller.jobbook import (
    GENERIC_APPLICATION,
    MAX_ACCUM_STEPS,
    MAX_BATCH_SIZE,
    MAX_COMMAND_CHARS,
    MAX_COMMAND_WORD_CHARS,
    MAX_COMMAND_WORDS,
    MAX_DEADLINE_S,
    MAX_GPU_TYPES,
    MAX_JOB_GPUS,
    MAX_LENGTH,
    MAX_LOCAL_BATCH_SIZE,
    MAX_OFFERINGS,
    MAX_TEXT_CHARS,
    REMOVED_FIELDS,
    JobSubmission,
    fixed_job_defaults,
    submission_problems,
)
from autoscaler.errors import InvalidInputError
from autoscaler.market.terms import MARKETS
from autoscaler.model.gputypes import KNOWN_GPU_TYPES

__all__ = [
    "API_ONLY_FIELDS",
    "FIELDS",
    "REFERENCE_PATH",
    "REMOVED_FIELDS",
    "ROOT_FIELD",
    "JobSpec",
    "JobSpecError",
    "SpecField",
    "load_job_spec",
    "parse_job_spec",
    "reference",
    "resolve_paths",
    "submission_body",
    "submission_from_body",
]

ROOT_FIELD: Final = "spec"
"""The field an error names when the document as a whole is wrong (empty, not a mapping)."""

MAX_SPEC_BYTES: Final = 64 * 1024
"""The largest spec file read (checked before it is parsed)."""
MAX_SPEC_DEPTH: Final = 16
"""The deepest nesting of mappings and lists a spec may have (checked while parsing)."""

_STR: Final = "tag:yaml.org,2002:str"
_INT: Final = "tag:yaml.org,2002:int"
_FLOAT: Final = "tag:yaml.org,2002:float"
_BOOL: Final = "tag:yaml.org,2002:bool"
_NULL: Final = "tag:yaml.org,2002:null"
_MERGE: Final = "tag:yaml.org,2002:merge"
_MAP: Final = "tag:yaml.org,2002:map"
_SEQ: Final = "tag:yaml.org,2002:seq"


class JobSpecError(InvalidInputError):
    """A job spec is malformed. ``path``: the file; ``line``: 1-based (``None`` only when the
    file cannot be read); ``field``: the spec's field path (``gpus.min``, ``command[2]``,
    ``spec`` for the document as a whole; ``None`` only when the file cannot be read);
    ``reason``: the message without the location. A spec with several problems raises one
    error naming the first, whose ``problems`` has them all (its message lists them, one a
    line)."""

    def __init__(
        self, reason: str, *, path: str, line: int | None, field: str | None = None
    ) -> None:
        where = path if line is None else f"{path}:{line}"
        if field is not None:
            where += f" [{field}]"
        super().__init__(f"{where}: {reason}", field=field)
        self.path = path
        self.line = line
        self.reason = reason
        self.problems: tuple[JobSpecError, ...] = (self,)

    @classmethod
    def several(cls, problems: Sequence[JobSpecError]) -> JobSpecError:
        """One error for every problem of a spec: the first's ``path``, ``line``, ``field``
        and ``reason``, a message with one problem a line (a count, then each), and every
        problem in ``problems``, in the order of the file."""
        ordered = sorted(problems, key=lambda p: p.line or 0)
        first = ordered[0]
        out = cls(first.reason, path=first.path, line=first.line, field=first.field)
        if len(ordered) > 1:
            lines = "\n".join(f"  {p}" for p in ordered)
            out.args = (f"{first.path}: {len(ordered)} problems:\n{lines}",)
        out.problems = tuple(ordered)
        return out


@dataclass(frozen=True)
class JobSpec:
    """A validated job spec (the module docstring has the fields, their spec names and their
    defaults). Constructing one directly runs the same value checks as parsing, raising
    :class:`~autoscaler.errors.InvalidInputError` whose ``field`` is the spec's field path."""

    name: str
    command: tuple[str, ...]
    init_batch_size: int
    max_batch_size: int
    max_local_bsz: int
    min_local_bsz: int = 1
    min_gpus: int = 1
    max_gpus: int | None = None
    max_accum_steps: int | None = None
    checkpoint_uri: str | None = None
    gpu_types: tuple[str, ...] | None = None
    markets: tuple[str, ...] | None = None
    offerings: tuple[str, ...] | None = None
    application: str = GENERIC_APPLICATION
    adaptive: bool = True
    deadline: float | str | None = None
    length_samples: int | None = None
    length_steps: int | None = None
    length_epochs: int | None = None
    dataset_samples: int | None = None

    def __post_init__(self) -> None:
        for name in ("command", "gpu_types", "markets", "offerings"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        problem = _first_problem(self.__dict__)
        if problem is not None:
            field, reason = problem
            raise InvalidInputError(f"job spec {field}: {reason}", field=field)

    def submission(self) -> JobSubmission:
        """What the controller stores and acts on (see the module docstring for the rest)."""
        return JobSubmission(
            name=self.name,
            init_batch_size=self.init_batch_size,
            max_batch_size=self.max_batch_size,
            max_local_bsz=self.max_local_bsz,
            min_local_bsz=self.min_local_bsz,
            min_gpus=self.min_gpus,
            max_gpus=self.max_gpus,
            gpu_types=self.gpu_types,
            markets=self.markets,
            offerings=self.offerings,
            max_accum_steps=self.max_accum_steps,
            application=self.application,
            adaptive=self.adaptive,
            command=self.command,
            checkpoint_uri=self.checkpoint_uri,
            deadline=self.deadline,
            length_samples=self.length_samples,
            length_steps=self.length_steps,
            length_epochs=self.length_epochs,
            dataset_samples=self.dataset_samples,
        )


def load_job_spec(path: str | Path, *, resolve: bool = True) -> JobSpec:
    """Read and validate the spec file at ``path``; :class:`JobSpecError` on any problem
    (an unreadable file too). With ``resolve`` (a cluster on this machine, whose nodes see
    its files), its relative paths are the spec folder's (:func:`parse_job_spec` with
    ``base`` the file's folder): the script must be a readable file there, and the spec
    returned names it (and a local checkpoint folder) by absolute path, so the job runs the
    same whichever folder ``coadapt submit`` or ``coadapt up`` was started from. Without it
    (a deployed cluster: its nodes run the script from their own disk, not this machine's)
    the paths are kept as written."""
    spath = str(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as e:
        raise JobSpecError(f"cannot read: {e.strerror or e}", path=spath, line=None) from e
    if len(data) > MAX_SPEC_BYTES:
        raise JobSpecError(
            f"the file is larger than {MAX_SPEC_BYTES // 1024} KiB: not a job spec",
            path=spath,
            line=1,
            field=ROOT_FIELD,
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise JobSpecError("not UTF-8 text", path=spath, line=line, field=ROOT_FIELD) from e
    return parse_job_spec(text, spath, base=Path(path).resolve().parent if resolve else None)


def parse_job_spec(text: str, path: str = "<string>", *, base: Path | None = None) -> JobSpec:
    """Validate the spec in ``text``; ``path`` names it in errors (:class:`JobSpecError`).
    A text over :data:`MAX_SPEC_BYTES` (UTF-8) or nested deeper than :data:`MAX_SPEC_DEPTH` is
    refused before its values are read. With ``base`` (a folder), the spec's paths are
    resolved against it (:func:`resolve_paths`); without it they are kept as written."""
    if len(text) > MAX_SPEC_BYTES or len(text.encode("utf-8", "replace")) > MAX_SPEC_BYTES:
        raise JobSpecError(
            f"the text is larger than {MAX_SPEC_BYTES // 1024} KiB: not a job spec",
            path=path,
            line=1,
            field=ROOT_FIELD,
        )
    deep_at = _flow_depth_exceeded(text)
    if deep_at is not None:
        raise JobSpecError(
            f"nested too deeply (at most {MAX_SPEC_DEPTH} levels)",
            path=path,
            line=text.count("\n", 0, deep_at) + 1,
            field=ROOT_FIELD,
        )
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError as e:
        raise JobSpecError(
            f"nested too deeply (at most {MAX_SPEC_DEPTH} levels)",
            path=path,
            line=1,
            field=ROOT_FIELD,
        ) from e
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = ", ".join(p for p in (e.context, e.problem) if p) or str(e)
        line = mark.line + 1 if mark is not None else 1
        raise JobSpecError(
            f"not valid YAML: {problem}", path=path, line=line, field=ROOT_FIELD
        ) from e
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        raise JobSpecError(
            f"not valid YAML: character U+{_code(e.character):04X} is not allowed",
            path=path,
            line=line,
            field=ROOT_FIELD,
        ) from e
    except yaml.YAMLError as e:  # pragma: no cover - every PyYAML error is one of the above
        raise JobSpecError(f"not valid YAML: {e}", path=path, line=1, field=ROOT_FIELD) from e
    deepest = _depth(root)
    if deepest is not None:
        raise JobSpecError(
            f"nested too deeply (at most {MAX_SPEC_DEPTH} levels)",
            path=path,
            line=deepest,
            field=ROOT_FIELD,
        )
    reader = _Reader(path)
    try:
        spec = reader.spec(root)
    except _Stop:
        spec = None
    if reader.problems or spec is None:
        raise JobSpecError.several(reader.problems)
    if base is not None:
        spec = resolve_paths(spec, base, path=path, line_of=reader.line_of)
    return spec


def resolve_paths(
    spec: JobSpec,
    base: Path,
    *,
    path: str = "<string>",
    line_of: Callable[[str], int] | None = None,
) -> JobSpec:
    """``spec`` with its relative paths resolved against the folder ``base``: the script
    (``command[0]``) and a local ``checkpoint`` (a path or ``file://``; ``~`` expanded),
    made absolute; its arguments are kept as written. The script must be a readable file:
    :class:`JobSpecError` (at ``line_of(field)``, 1 without it) says where it was looked for
    and the fix. (The node agent runs the job from its own folder: a relative path there is
    the ``coadapt up`` folder's, which is how a spec submitted from elsewhere once ran a
    script that was not there.)"""

    def where(field: str) -> int:
        return line_of(field) if line_of is not None else 1

    word = spec.command[0]
    script = Path(word).expanduser()
    script = script if script.is_absolute() else base / script
    fix = (
        f"give its path relative to the spec's folder ({base}) or an absolute one"
        if not Path(word).is_absolute()
        else "give the path of an existing script"
    )
    if script.is_dir():
        problem = f"{word}: is a folder, not a script ({script}); {fix}"
    elif not script.is_file():
        problem = f"{word}: no such file ({script}); {fix}"
    elif not os.access(script, os.R_OK):
        problem = f"{word}: cannot be read ({script}); make it readable (chmod a+r {script})"
    else:
        problem = None
    if problem is not None:
        raise JobSpecError(problem, path=path, line=where("command[0]"), field="command[0]")
    command = (str(script.resolve()), *spec.command[1:])
    checkpoint = spec.checkpoint_uri
    if checkpoint is not None and ("://" not in checkpoint or checkpoint.startswith("file://")):
        local = Path(checkpoint.removeprefix("file://")).expanduser()
        checkpoint = str(local if local.is_absolute() else (base / local).resolve())
    try:
        return replace(spec, command=command, checkpoint_uri=checkpoint)
    except InvalidInputError as e:  # a resolved path over a length limit
        field = e.field or "command[0]"
        raise JobSpecError(str(e), path=path, line=where(field), field=field) from e


class _Stop(Exception):
    """A field could not be read (its problem is recorded): the reader goes on with the
    next field."""


def _flow_depth_exceeded(text: str) -> int | None:
    """Where ``[`` / ``{`` nesting first passes :data:`MAX_SPEC_DEPTH` (``None``: never): a
    linear scan before the parser, which takes seconds over thousands of open brackets.
    Quoted scalars and comments are skipped (a conservative reading of YAML's rules: at worst
    a bracket inside a plain scalar counts, and a spec that deep is refused anyway)."""
    depth = 0
    quote = ""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"" and (i == 0 or text[i - 1] in " \t\n[{,:"):
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in " \t\n"):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c in "[{":
            depth += 1
            if depth > MAX_SPEC_DEPTH:
                return i
        elif c in "]}":
            depth = max(0, depth - 1)
        i += 1
    return None


def _depth(root: Any) -> int | None:
    """The line of the first node nested deeper than :data:`MAX_SPEC_DEPTH` (``None``: none
    is). Iterative: a deep document cannot exhaust the stack here."""
    stack = [(root, 1)] if root is not None else []
    seen: set[int] = set()  # an alias is the node it names: visited once (no "billion laughs")
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SPEC_DEPTH:
            return _line(node)
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            stack.extend((child, depth + 1) for pair in node.value for child in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
    return None


# ---- reading the node tree ------------------------------------------------------------------

REQUIRED: Final = "required"
"""A :class:`SpecField`'s ``required``: every job gives it."""
ADAPTIVE_ONLY: Final = "adaptive"
"""A :class:`SpecField`'s ``required``: an adaptive job gives it; one with ``adaptive: false``
may leave it out (:func:`~autoscaler.controller.jobbook.fixed_job_defaults`)."""
OPTIONAL: Final = "optional"
"""A :class:`SpecField`'s ``required``: it has a default."""


@dataclass(frozen=True)
class SpecField:
    """One field of a job spec: the one description the YAML reader, the API's JSON body
    (:func:`submission_from_body`) and the reference (:func:`reference`, checked in as
    ``docs/jobspec.md``) are made from. ``path``: the spec's name (``gpus.min``; a dotted path
    is a key of a nested mapping); ``attribute``: the :class:`JobSpec` and
    :class:`~autoscaler.controller.jobbook.JobSubmission` field it fills (where it differs
    from ``path``, the API's old flat name, ``min_gpus``); ``kind``: how its value is read
    (``string``, ``integer``, ``boolean``, ``strings``: a list of strings, ``command``,
    ``deadline``); ``required``: :data:`REQUIRED`, :data:`ADAPTIVE_ONLY` or :data:`OPTIONAL`;
    ``accepts``, ``default``, ``example`` (YAML) and ``meaning``: the reference's text. The
    bounds in ``accepts`` are written from the constants
    :func:`~autoscaler.controller.jobbook.submission_problems` checks against."""

    path: str
    attribute: str
    kind: str
    required: str
    accepts: str
    default: str
    example: str
    meaning: str


_LENGTH_RULE: Final = (
    "the job's length, in the trainer's one unit rule: samples = steps x `batch_size.initial` "
    "= epochs x `length.dataset_size`"
)

FIELDS: Final[tuple[SpecField, ...]] = (
    SpecField(
        "name",
        "name",
        "string",
        REQUIRED,
        "a DNS label: 1-63 of `a-z 0-9 -`, starting and ending with a letter or digit",
        "required",
        "mlp-small",
        "the job's name, unique in the cluster",
    ),
    SpecField(
        "command",
        "command",
        "command",
        REQUIRED,
        f"a list of 1-{MAX_COMMAND_WORDS} strings (at most {MAX_COMMAND_WORD_CHARS} characters "
        f"each, {MAX_COMMAND_CHARS} in all, no NUL), or one string split like a shell (shlex); "
        "the first word is the script, not an option (`-...`), a launcher (`coadapt-launch`, "
        "`torchrun`) or an interpreter (`python`)",
        "required",
        "[examples/elastic_mlp.py, --epochs, 3]",
        "the training script and its arguments, run as `python -m trainer.launch ... -- COMMAND`",
    ),
    SpecField(
        "gpus.min",
        "min_gpus",
        "integer",
        OPTIONAL,
        f"[1, {MAX_JOB_GPUS}]",
        "1",
        "1",
        "the fewest GPUs the job runs on (with `adaptive: false`: exactly its GPUs)",
    ),
    SpecField(
        "gpus.max",
        "max_gpus",
        "integer",
        OPTIONAL,
        f"[`gpus.min`, {MAX_JOB_GPUS}]; equal to `gpus.min` with `adaptive: false`",
        "none (no cap)",
        "4",
        "the most GPUs the job runs on",
    ),
    SpecField(
        "batch_size.initial",
        "init_batch_size",
        "integer",
        REQUIRED,
        f"[1, {MAX_BATCH_SIZE}]",
        "required",
        "64",
        "the total batch (all GPUs together) the hyper-parameters were tuned for; the batch "
        "of a job with `adaptive: false`",
    ),
    SpecField(
        "batch_size.max",
        "max_batch_size",
        "integer",
        ADAPTIVE_ONLY,
        f"[`batch_size.initial`, {MAX_BATCH_SIZE}]",
        "required for an adaptive job; `batch_size.initial` with `adaptive: false`",
        "512",
        "the largest total batch the controller may choose",
    ),
    SpecField(
        "local_batch_size.max",
        "max_local_bsz",
        "integer",
        ADAPTIVE_ONLY,
        f"[`local_batch_size.min`, {MAX_LOCAL_BATCH_SIZE}]",
        f"required for an adaptive job; `batch_size.initial` (at most {MAX_LOCAL_BATCH_SIZE}) "
        "with `adaptive: false`",
        "256",
        "the largest per-GPU micro-batch (what one GPU's memory holds); a larger batch is "
        "reached by gradient accumulation",
    ),
    SpecField(
        "local_batch_size.min",
        "min_local_bsz",
        "integer",
        OPTIONAL,
        f"[1, {MAX_LOCAL_BATCH_SIZE}], at most `batch_size.max`",
        "1",
        "1",
        "the smallest per-GPU micro-batch",
    ),
    SpecField(
        "max_accum_steps",
        "max_accum_steps",
        "integer",
        OPTIONAL,
        f"[1, {MAX_ACCUM_STEPS}]",
        "none (16)",
        "8",
        "the most gradient-accumulation steps per optimizer step",
    ),
    SpecField(
        "checkpoint",
        "checkpoint_uri",
        "string",
        OPTIONAL,
        "a local path, `file://`, `s3://BUCKET[/PREFIX]` or `gs://BUCKET[/PREFIX]` "
        f"(1-{MAX_TEXT_CHARS} printable characters)",
        "none (the cluster's checkpoint root)",
        "s3://my-bucket/ckpt",
        "where the job checkpoints",
    ),
    SpecField(
        "gpu_types",
        "gpu_types",
        "strings",
        OPTIONAL,
        f"1-{MAX_GPU_TYPES} distinct of {', '.join(f'`{t}`' for t in KNOWN_GPU_TYPES)}",
        "none (any)",
        "[T4, A100]",
        "the job runs only on GPUs of these types",
    ),
    SpecField(
        "markets",
        "markets",
        "strings",
        OPTIONAL,
        f"1-{len(MARKETS)} distinct of {', '.join(f'`{m}`' for m in MARKETS)}",
        "none (any)",
        "[on-demand]",
        "the job runs only on instances of these markets (`[on-demand]`: never on spot)",
    ),
    SpecField(
        "offerings",
        "offerings",
        "strings",
        OPTIONAL,
        f"1-{MAX_OFFERINGS} distinct keys `provider/instance_type/zone/market` (each market in "
        "`markets` when both are given)",
        "none (any)",
        "[aws/g4dn.xlarge/us-east-1a/spot]",
        "the job runs only on instances of these offerings",
    ),
    SpecField(
        "application",
        "application",
        "string",
        OPTIONAL,
        f"1-{MAX_TEXT_CHARS} printable characters",
        f"`{GENERIC_APPLICATION}`",
        "bert",
        "the model's name in the GPU speed table (a name it does not know gets the generic "
        "speed ratios)",
    ),
    SpecField(
        "adaptive",
        "adaptive",
        "boolean",
        OPTIONAL,
        "`true` or `false`",
        "true",
        "false",
        "false keeps the batch at `batch_size.initial` and the GPUs at exactly `gpus.min`",
    ),
    SpecField(
        "deadline",
        "deadline",
        "deadline",
        OPTIONAL,
        f"seconds after submission in (0, {MAX_DEADLINE_S:.0f}], a duration (`90m`, `2h30m`: "
        'd, h, m, s) or a quoted ISO 8601 time with its zone (`"2026-12-05T18:00:00Z"`), '
        "not in the past",
        "none",
        "2h",
        "when the job must be done (fixed as a time at submission); with a `length`, a "
        "deadline no offering can meet at the application's measured speed is refused at "
        "submission with the estimate (an unknown speed is said so)",
    ),
    SpecField(
        "length.samples",
        "length_samples",
        "integer",
        OPTIONAL,
        f"[1, {MAX_LENGTH}]; one of `length.samples`, `length.steps`, `length.epochs`",
        "none (unknown until the script declares it)",
        "3000000",
        f"{_LENGTH_RULE}: samples processed at `batch_size.initial` (at a larger batch the "
        "job runs on until it has made the same progress)",
    ),
    SpecField(
        "length.steps",
        "length_steps",
        "integer",
        OPTIONAL,
        f"[1, {MAX_LENGTH}]; one of `length.samples`, `length.steps`, `length.epochs`",
        "none",
        "20000",
        f"{_LENGTH_RULE}: optimizer steps at `batch_size.initial`",
    ),
    SpecField(
        "length.epochs",
        "length_epochs",
        "integer",
        OPTIONAL,
        f"[1, {MAX_LENGTH}], with `length.dataset_size`; one of `length.samples`, "
        "`length.steps`, `length.epochs`",
        "none",
        "3",
        f"{_LENGTH_RULE}: passes over the dataset",
    ),
    SpecField(
        "length.dataset_size",
        "dataset_samples",
        "integer",
        OPTIONAL,
        f"[1, {MAX_LENGTH}], only with `length.epochs`",
        "none",
        "65536",
        "the samples in one epoch. The script's own declaration (`ElasticJob.epochs`, its "
        "reports' `target_progress`) replaces the spec's `length` once it comes",
    ),
)
"""Every field of a job spec, in the reference's order."""

_BY_PATH: Final = {f.path: f for f in FIELDS}
_TOP: Final = tuple(dict.fromkeys(f.path.split(".")[0] for f in FIELDS))
# A top-level key that holds a mapping -> its keys.
_GROUPS: Final = {
    head: tuple(f.path.split(".", 1)[1] for f in FIELDS if f.path.startswith(head + "."))
    for head in _TOP
    if head not in _BY_PATH
}
# JobSpec attribute -> the spec's field path (what errors name), where they differ.
_PATHS: Final = {f.attribute: f.path for f in FIELDS if f.attribute != f.path}


def _needed(field: SpecField, fixed: bool) -> bool:
    """Whether a spec must give ``field`` (``fixed``: the spec says ``adaptive: false``)."""
    return field.required == REQUIRED or (field.required == ADAPTIVE_ONLY and not fixed)


def _code(character: int | str) -> int:
    return character if isinstance(character, int) else ord(character)


def _line(node: Any) -> int:
    return int(node.start_mark.line) + 1


def _is_null(node: Any) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == _NULL


def _describe(node: Any) -> str:
    """What a node holds, for messages."""
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    described = {
        _STR: f"the string {node.value!r}",
        _INT: f"the integer {node.value}",
        _FLOAT: f"the float {node.value}",
        _BOOL: f"the boolean {node.value}",
        _NULL: "an empty value",
    }
    tag = str(node.tag).replace("tag:yaml.org,2002:", "!!")
    return described.get(node.tag, f"{node.value!r} of YAML type {tag}")


def _suggest(word: str, choices: Sequence[str]) -> str:
    """A "did you mean" for a close choice (case aside), else nothing."""
    by_lower = {str(c).lower(): str(c) for c in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1)
    return f"; did you mean {by_lower[close[0]]!r}?" if close else ""


def _parent(field: str) -> str:
    """``gpus.min`` -> ``gpus``, ``command[2]`` -> ``command``, ``name`` -> the root."""
    if "." not in field and "[" not in field:
        return ROOT_FIELD
    return re.sub(r"(\.[^.\[]*|\[\d+\])$", "", field)


class _Reader:
    """One walk over a composed document: typed values out, the line of every field written
    remembered; every failure is a :class:`JobSpecError` naming the file, line and field."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.value_lines: dict[str, int] = {}  # field -> line of its value
        self.key_lines: dict[str, int] = {}  # field -> line of its key (ROOT_FIELD: the mapping)
        self._construct = yaml.constructor.SafeConstructor()
        self.problems: list[JobSpecError] = []  # every problem found, in the order found
        self.failed: set[str] = set()  # fields that could not be read

    def note(self, line: int, field: str, reason: str) -> None:
        """Record a problem and go on reading."""
        self.problems.append(JobSpecError(reason, path=self.path, line=line, field=field))

    def fail(self, line: int, field: str, reason: str) -> NoReturn:
        """Record a problem; the field being read is given up (:class:`_Stop`)."""
        self.note(line, field, reason)
        raise _Stop

    def read(self, field: str, reader: Callable[..., Any], *args: Any) -> Any:
        """``reader(*args)``, or :data:`_UNREAD` when it failed (``field`` is then not checked
        further: no second message about a value that could not be read)."""
        try:
            return reader(*args)
        except _Stop:
            self.failed.add(field)
            return _UNREAD

    def line_of(self, field: str) -> int:
        """The line of ``field``'s value, else of the key of the nearest enclosing field
        written (a value taken by default is blamed on the mapping that lacks it)."""
        if field in self.value_lines:
            return self.value_lines[field]
        while field not in self.key_lines:
            field = _parent(field)
        return self.key_lines[field]

    # -- the document --------------------------------------------------------------------

    def spec(self, root: Any) -> JobSpec:
        if root is None:
            self.fail(1, ROOT_FIELD, "the file is empty; expected a mapping of job fields")
        if not isinstance(root, yaml.MappingNode):
            self.fail(
                _line(root), ROOT_FIELD, f"expected a mapping of job fields, got {_describe(root)}"
            )
        self.key_lines[ROOT_FIELD] = _line(root)
        top = self.mapping(root, ROOT_FIELD, _TOP)
        values: dict[str, Any] = {
            "name": self.read("name", lambda: self.string(self.required(top, "name"), "name")),
            "command": self.read("command", lambda: self.command(self.required(top, "command"))),
        }
        readers: dict[str, Callable[[Any, str], object]] = {
            "integer": self.integer,
            "string": self.string,
            "strings": self.string_list,
            "boolean": self.boolean,
            "deadline": self.deadline,
        }
        for f in FIELDS:  # the top-level fields but name and command
            if f.path in top and f.path not in values and f.path not in ("name", "command"):
                values[f.attribute] = self.read(f.path, readers[f.kind], top[f.path], f.path)
        fixed = values.get("adaptive") is False
        for head, keys in _GROUPS.items():
            group = [_BY_PATH[f"{head}.{key}"] for key in keys]
            if head not in top and not any(_needed(f, fixed) for f in group):
                continue
            entries = self.read(head, self.group, top, head, keys)
            for f in group:
                if entries is _UNREAD or (not _needed(f, fixed) and f.path not in entries):
                    continue
                values[f.attribute] = self.read(f.path, self.required_integer, entries, f.path)
        if fixed:
            read = {k: v for k, v in values.items() if v is not _UNREAD}
            values.update(fixed_job_defaults(read))
            for f in FIELDS:  # a default that could not be worked out: nothing more to say
                if f.required == ADAPTIVE_ONLY and f.attribute not in values:
                    self.failed.add(f.path)
        values = {k: v for k, v in values.items() if v is not _UNREAD}
        for field, reason in all_problems(values):
            if not any(_related(field, unread) for unread in self.failed):
                self.note(self.line_of(field), field, reason)
        if self.problems:
            raise _Stop
        return JobSpec(**values)

    # -- collections ---------------------------------------------------------------------

    def mapping(self, node: Any, field: str, known: Sequence[str]) -> dict[str, Any]:
        """The value nodes of a mapping by key, empty values left out (they mean "absent"),
        after refusing non-mappings, keys that are not field names, duplicate and unknown
        keys. Keyed by field path (``gpus.min``; top-level fields by name)."""
        if not isinstance(node, yaml.MappingNode) or node.tag != _MAP:
            self.fail(
                _line(node),
                field,
                f"expected a mapping with keys {', '.join(known)}, got {_describe(node)}",
            )
        first: dict[str, int] = {}
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = _line(key_node)
            if key_node.tag == _MERGE:
                self.fail(line, field, "YAML merge keys (<<) are not supported")
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR:
                self.fail(line, field, f"expected a field name, got {_describe(key_node)}")
            key = key_node.value
            path = key if field == ROOT_FIELD else f"{field}.{key}"
            if key in first:
                self.note(line, path, f"duplicate key (first at line {first[key]})")
                continue
            if field == ROOT_FIELD and key in REMOVED_FIELDS:
                self.note(line, path, REMOVED_FIELDS[key])
                continue
            if key not in known:
                hint = _suggest(key, known) or f"; known: {', '.join(known)}"
                self.note(line, path, f"unknown field{hint}")
                continue
            first[key] = line
            self.key_lines[path] = line
            if not _is_null(value_node):
                self.value_lines[path] = _line(value_node)
                out[path] = value_node
        return out

    def group(self, top: Mapping[str, Any], head: str, keys: Sequence[str]) -> dict[str, Any]:
        """The entries of the top-level mapping ``head`` (required: it was asked for because
        a field in it is)."""
        return self.mapping(self.required(top, head), head, keys)

    def required(self, entries: Mapping[str, Any], field: str) -> Any:
        """The value node of a required field; a missing one is blamed on the line of the
        key of the mapping that lacks it."""
        if field not in entries:
            inside = [f for f in FIELDS if f.path == field or f.path.startswith(field + ".")]
            hint = ""
            if not any(f.required == REQUIRED for f in inside):
                hint = " (an adaptive job needs it; with adaptive: false it has a default)"
            self.fail(self.key_lines[_parent(field)], field, "required field missing" + hint)
        return entries[field]

    def required_integer(self, entries: Mapping[str, Any], field: str) -> int:
        return self.integer(self.required(entries, field), field)

    def string_list(self, node: Any, field: str) -> tuple[str, ...]:
        return tuple(self.string(item, path) for path, item in self.items(node, field, "strings"))

    def items(self, node: Any, field: str, what: str) -> list[tuple[str, Any]]:
        """The item nodes of a list with their field paths (``field[i]``)."""
        if not isinstance(node, yaml.SequenceNode) or node.tag != _SEQ:
            self.fail(_line(node), field, f"expected a list of {what}, got {_describe(node)}")
        out = []
        for i, item in enumerate(node.value):
            path = f"{field}[{i}]"
            self.value_lines[path] = _line(item)
            out.append((path, item))
        return out

    def command(self, node: Any) -> tuple[str, ...]:
        """A list of words (plain numbers and booleans taken as written), or one string
        split like a shell would."""
        if isinstance(node, yaml.ScalarNode) and node.tag == _STR:
            try:
                return tuple(shlex.split(node.value))
            except ValueError as e:
                self.fail(_line(node), "command", f"cannot split into words: {e}")
        if not isinstance(node, yaml.SequenceNode):
            self.fail(_line(node), "command", f"expected a list or a string, got {_describe(node)}")
        words = []
        for path, item in self.items(node, "command", "strings"):
            plain = isinstance(item, yaml.ScalarNode) and item.style is None
            if plain and item.tag in (_INT, _FLOAT, _BOOL):
                words.append(str(item.value))  # as written: 3, 0.10, 010, yes
            else:
                words.append(self.string(item, path))
        return tuple(words)

    # -- scalars -------------------------------------------------------------------------

    def scalar(self, node: Any, field: str, wanted: str, tags: Sequence[str]) -> Any:
        if not isinstance(node, yaml.ScalarNode) or node.tag not in tags:
            hint = ""
            if isinstance(node, yaml.ScalarNode) and node.tag == _STR and _INT in tags:
                hint = " (write numbers without quotes)"
            elif isinstance(node, yaml.ScalarNode) and tags == (_STR,) and node.style is None:
                hint = " (quote it to make it a string)"
            self.fail(_line(node), field, f"expected {wanted}, got {_describe(node)}{hint}")
        return self._construct.construct_object(node)

    def integer(self, node: Any, field: str) -> int:
        return int(self.scalar(node, field, "an integer", (_INT,)))

    def number(self, node: Any, field: str) -> float:
        value = self.scalar(node, field, "a number", (_INT, _FLOAT))
        try:
            return float(value)
        except OverflowError:
            self.fail(_line(node), field, f"{value} is out of range")

    def boolean(self, node: Any, field: str) -> bool:
        return bool(self.scalar(node, field, "true or false", (_BOOL,)))

    def string(self, node: Any, field: str) -> str:
        return str(self.scalar(node, field, "a string", (_STR,)))

    def deadline(self, node: Any, field: str) -> float | str:
        value = self.scalar(
            node, field, "seconds, a duration ('2h') or a quoted time", (_INT, _FLOAT, _STR)
        )
        return value if isinstance(value, str) else float(value)


_UNREAD: Final = object()
"""What :meth:`_Reader.read` gives for a field it could not read."""


def _related(field: str, other: str) -> bool:
    """Whether ``field`` is ``other``, inside it or holds it (``gpus.min`` and ``gpus``)."""
    if field == other:
        return True
    return any(
        a.startswith(b) and a[len(b)] in ".["
        for a, b in ((field, other), (other, field))
        if len(a) > len(b)
    )


# ---- value checks, shared by the parser and JobSpec ------------------------------------------


def _first_problem(values: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first problem with JobSpec attribute values, as (spec field path, reason); ``None``
    when they are valid. Absent keys take JobSpec's defaults. Every field is checked by
    :func:`~autoscaler.controller.jobbook.submission_problems` (the API's own check: one rule
    for both)."""
    problems = all_problems(values)
    return problems[0] if problems else None


def all_problems(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every problem with JobSpec attribute values, as (spec field path, reason)."""
    defaults = {f.name: f.default for f in fields(JobSpec)}
    v = {**defaults, **values}
    shared = {f.name: v[f.name] for f in fields(JobSubmission) if f.name in v}
    return [(_spec_path(f), _spec_words(reason)) for f, reason in submission_problems(shared)]


def _spec_words(reason: str) -> str:
    """A submission's reason with its field names written as the spec's (``min_gpus`` ->
    ``gpus.min``)."""
    return re.sub(
        r"\b(" + "|".join(sorted(_PATHS, key=len, reverse=True)) + r")\b",
        lambda m: _PATHS[m.group(1)],
        reason,
    )


def _spec_path(field: str) -> str:
    """A submission field (``min_gpus``, ``command[2]``) as the spec's path (``gpus.min``)."""
    head, bracket, rest = field.partition("[")
    return _PATHS.get(head, head) + bracket + rest


# ---- the API's JSON body: the spec's names and shape -----------------------------------------

API_ONLY_FIELDS: Final = ("requested_gpus", "batch_size")
""":class:`~autoscaler.controller.jobbook.JobSubmission` fields a spec has no name for (the
user's own gang size and fixed batch, which only the simulator sets): a body in the old flat
form may carry them."""


def submission_from_body(data: object) -> tuple[JobSubmission, tuple[str, ...]]:
    """The submission in an API body (``POST /v1/jobs``), and the deprecated names it used.

    The body has the YAML spec's names and shape (:data:`FIELDS`: ``{"gpus": {"min": 1},
    "batch_size": {"initial": 64, "max": 512}, "checkpoint": ...}``); errors then name the
    spec's field paths (``gpus.min``). The old flat form (``min_gpus``, ``init_batch_size``,
    ... as :meth:`JobSubmission.to_json` stores it) is still accepted, as v1 promised, and the
    flat names it used come back (the API answers them with a ``Deprecation`` header); a body
    that mixes the two forms is refused, naming the first flat field and its spec name. Both
    forms end in :meth:`JobSubmission.from_mapping` (the one check, and the defaults of a job
    that does not adapt). :class:`InvalidInputError` names the bad field."""
    if not isinstance(data, Mapping):
        raise InvalidInputError("job spec must be a JSON object", field=ROOT_FIELD)
    flat = sorted(
        str(k)
        for k in data
        if k in _PATHS
        or k == "requested_gpus"
        or (k == "batch_size" and data[k] is not None and not isinstance(data[k], Mapping))
    )
    nested = sorted(
        str(k) for k in data if k == "checkpoint" or (k in _GROUPS and isinstance(data[k], Mapping))
    )
    if flat and nested:
        old = flat[0]
        new = _PATHS.get(old)
        fix = f"write {new!r}" if new else "it has no spec name: send the old flat form whole"
        raise InvalidInputError(
            f"{old} is the old flat name and the body also uses the spec's ({nested[0]}): "
            f"{fix}, one naming for every field (docs/jobspec.md)",
            field=old,
        )
    if flat:
        return JobSubmission.from_mapping(data), tuple(f for f in flat if f in _PATHS)
    return _from_spec_shape(data), ()


def _from_spec_shape(data: Mapping[Any, Any]) -> JobSubmission:
    values: dict[str, Any] = {}
    for key, value in data.items():
        key = str(key)
        if key in REMOVED_FIELDS:
            raise InvalidInputError(REMOVED_FIELDS[key], field=key)
        if key in _GROUPS:
            if value is None:
                continue
            keys = _GROUPS[key]
            if not isinstance(value, Mapping):
                raise InvalidInputError(
                    f"must be an object with keys {', '.join(keys)}, got {_json_kind(value)}",
                    field=key,
                )
            for sub, item in value.items():
                path = f"{key}.{sub}"
                if path not in _BY_PATH:
                    hint = _suggest(str(sub), keys) or f"; known: {', '.join(keys)}"
                    raise InvalidInputError(f"unknown field {path!r}{hint}", field=path)
                if item is not None:
                    values[_BY_PATH[path].attribute] = item
        elif key in _BY_PATH:
            values[_BY_PATH[key].attribute] = value
        else:
            hint = _suggest(key, _TOP) or f"; known: {', '.join(_TOP)}"
            raise InvalidInputError(f"unknown field {key!r}{hint}", field=key)
    values = {**values, **fixed_job_defaults(values)}
    fixed = values.get("adaptive") is False
    for f in FIELDS:
        if _needed(f, fixed) and values.get(f.attribute) is None:
            hint = "" if f.required == REQUIRED else " (an adaptive job needs it)"
            raise InvalidInputError(f"the job spec lacks {f.path!r}{hint}", field=f.path)
    problems = submission_problems(values)
    if problems:
        name = values.get("name")
        label = f"job {name}" if isinstance(name, str) and name else "a job"
        text = "; ".join(f"{_spec_path(f)}: {_spec_words(r)}" for f, r in problems)
        raise InvalidInputError(f"{label}: {text}", field=_spec_path(problems[0][0]))
    return JobSubmission.from_mapping(values)


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else type(value).__name__


def submission_body(submission: JobSubmission) -> dict[str, Any]:
    """The API body for ``submission`` in the spec's names and shape (what
    :func:`submission_from_body` reads back as the same submission); the old flat form when it
    sets a field the spec has no name for (:data:`API_ONLY_FIELDS`)."""
    stored = dataclasses.asdict(submission)
    if any(stored[name] is not None for name in API_ONLY_FIELDS):
        return stored
    body: dict[str, Any] = {}
    for f in FIELDS:
        value = stored[f.attribute]
        if value is None:
            continue
        if isinstance(value, tuple):
            value = list(value)
        head, _, key = f.path.partition(".")
        if key:
            body.setdefault(head, {})[key] = value
        else:
            body[head] = value
    return body


# ---- the reference ---------------------------------------------------------------------------

REFERENCE_PATH: Final = "docs/jobspec.md"
"""Where the reference is checked in (relative to the repository root)."""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference() -> str:
    """The job-spec reference in Markdown, made from :data:`FIELDS` (``python -m
    autoscaler.controller.jobspec --reference`` prints it; ``docs/jobspec.md`` is a copy that
    a test keeps equal to it)."""
    rows = [
        "| field | type | accepted values | default | example | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for f in FIELDS:
        kind = {
            "strings": "list of strings",
            "command": "list of strings, or a string",
            "deadline": "number or string",
        }.get(f.kind, f.kind)
        rows.append(
            "| "
            + " | ".join(
                _cell(x)
                for x in (f"`{f.path}`", kind, f.accepts, f.default, f"`{f.example}`", f.meaning)
            )
            + " |"
        )
    renames = [
        "| spec and API name | old flat API name (deprecated) |",
        "|---|---|",
        *(f"| `{f.path}` | `{f.attribute}` |" for f in FIELDS if f.attribute != f.path),
    ]
    lines = [
        "# Job spec reference",
        "",
        "<!-- Generated by `python -m autoscaler.controller.jobspec --reference > "
        f"{REFERENCE_PATH}` from the field table in `autoscaler/controller/jobspec.py` "
        "(`FIELDS`); `tests/controller/test_jobspec_reference.py` fails when this file "
        "differs. Do not edit by hand. -->",
        "",
        "A job is one YAML mapping, given to `coadapt submit job.yaml`, or the same names and "
        "shape as a JSON object in `POST /v1/jobs`. An adaptive job (the default) lets the "
        "controller choose its GPUs and its batch:",
        "",
        "```yaml",
        "name: mlp-small",
        "command: [examples/elastic_mlp.py, --epochs, 3]",
        "gpus: {min: 1, max: 2}",
        "batch_size: {initial: 64, max: 512}",
        "local_batch_size: {max: 256}",
        "```",
        "",
        "A fixed job (`adaptive: false`) runs at `batch_size.initial` on exactly `gpus.min` "
        "GPUs, and needs neither `batch_size.max` nor `local_batch_size.max`:",
        "",
        "```yaml",
        "name: fixed-mlp",
        "command: [examples/elastic_mlp.py, --epochs, 3]",
        "adaptive: false",
        "gpus: {min: 2}",
        "batch_size: {initial: 64}",
        "```",
        "",
        "## Fields",
        "",
        "A dotted name is a key of a nested mapping: `gpus.min` is `gpus: {min: 1}`.",
        "",
        *rows,
        "",
        "## Rules for every field",
        "",
        "- A field given as an empty value (`gpus:` or `null`) is the same as an absent one.",
        '- Integers are YAML integers (`64`; not `"64"`, `64.0` or `true`).',
        "- The items of a `command` list are taken as written, so `--epochs, 3` needs no "
        'quotes (`3` stays `"3"`, `010` stays `"010"`).',
        f"- A file over {MAX_SPEC_BYTES // 1024} KiB, or nested deeper than {MAX_SPEC_DEPTH} "
        "levels, is refused before its values are read.",
        '- Unknown keys are refused (with a "did you mean" when one is close); so are '
        f"{', '.join(f'`{k}`' for k in REMOVED_FIELDS)}, which earlier versions accepted and "
        "ignored, each with a one-line reason.",
        "- Every error names the file, the line and the field path, e.g. `job.yaml:7 "
        "[batch_size.max]: must be >= batch_size.initial (256), got 128`; a spec with several "
        "problems lists them all.",
        "",
        "## The API's JSON body",
        "",
        "`POST /v1/jobs` takes the same names and shape as JSON, and its errors name the same "
        'field paths: `{"name": "mlp-small", "command": ["examples/elastic_mlp.py"], '
        '"gpus": {"min": 1, "max": 2}, "batch_size": {"initial": 64, "max": 512}, '
        '"local_batch_size": {"max": 256}}`. The old flat names below are still accepted '
        "(v1 promised them; stored jobs use them) and the answer then carries a "
        "`Deprecation: true` header; a body that mixes the two namings is refused, naming the "
        "field to rename. Only the flat form carries "
        f"{' and '.join(f'`{k}`' for k in API_ONLY_FIELDS)} (the user's own gang size and "
        "fixed total batch, which only the simulator sets).",
        "",
        *renames,
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m autoscaler.controller.jobspec --reference``: print the reference."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m autoscaler.controller.jobspec")
    parser.add_argument("--reference", action="store_true", help="print the job-spec reference")
    args = parser.parse_args(argv)
    if not args.reference:
        parser.error("nothing to do: give --reference")
    print(reference(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
