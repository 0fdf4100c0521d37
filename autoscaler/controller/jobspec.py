"""The YAML job spec of ``coadapt submit job.yaml``: read, validated, mapped onto a submission.

A spec is one YAML mapping::

    name: mlp-small                     # required
    command: [examples/elastic_mlp.py, --epochs, 3, --initial-batch-size, 64]  # required
    gpus: {min: 1, max: 2}
    batch_size: {initial: 64, max: 512}  # required
    local_batch_size: {max: 256}         # required
    markets: [on-demand]

========================  ===================================================  =============
field                     value                                                default
========================  ===================================================  =============
``name``                  DNS label: 1-63 of ``a-z 0-9 -``, starting and       required
                          ending with a letter or digit
``command``               the training script and its arguments: a list of     required
                          strings, or one string split like a shell (shlex)
``gpus.min``              int in [1, 4096]: the fewest GPUs the job runs on    1
``gpus.max``              int in [``gpus.min``, 4096]: the most                none (no cap)
``batch_size.initial``    int in [1, 2^24]: total batch the hyper-parameters   required
                          were tuned for
``batch_size.max``        int in [``batch_size.initial``, 2^24]                required
``local_batch_size.max``  int in [``local_batch_size.min``, 2^20]: per-GPU     required
                          batch
``local_batch_size.min``  int in [1, 2^20], <= ``batch_size.max``              1
``max_accum_steps``       int in [1, 1024]                                     none (16)
``checkpoint``            a local path, ``file://``, ``s3://BUCKET[/PREFIX]``  none
                          or ``gs://BUCKET[/PREFIX]``
``gpu_types``             non-empty list of distinct names of                  none (any)
                          :data:`~autoscaler.model.gputypes.KNOWN_GPU_TYPES`: the
                          job runs only on GPUs of these types
``markets``               non-empty list of distinct ``spot``, ``on-demand``:  none (any)
                          the job runs only on instances of these markets
                          (``[on-demand]``: never on spot)
``offerings``             non-empty list of distinct offering keys             none (any)
                          ``provider/instance_type/zone/market`` (market in
                          ``markets`` when both are given): the job runs only
                          on instances of these offerings
``application``           the model name for the speed table (a name it does   ``generic``
                          not know gets the generic speed ratios)
``adaptive``              bool: false keeps the batch at                       true
                          ``batch_size.initial`` and the GPUs at exactly
                          ``gpus.min`` (``gpus.max``, if given, must equal it)
``deadline``              seconds after submission (a number in (0, one        none
                          year]), a duration string (``90m``, ``2h30m``:
                          d, h, m, s) or a quoted ISO 8601 time with its zone
                          (``"2026-12-05T18:00:00Z"``), not in the past
========================  ===================================================  =============

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
body: ``coadapt submit`` and ``POST /v1/jobs`` refuse the same jobs (a spec's errors name its
field paths, ``gpus.min``; the API's its field names, ``min_gpus``).

**What the controller acts on: every field.** :meth:`JobSpec.submission` gives the
:class:`~autoscaler.controller.jobbook.JobSubmission` the controller stores and schedules, with
every field of the spec. Every policy and the fleet sizing honour the GPU bounds, and place
the job only on instances of a GPU type, market and offering it allows
(:meth:`~autoscaler.decide.views.JobView.allows_node`, one rule for all of them; offering keys
are compared as :class:`~autoscaler.decide.views.OfferingRef` parts, in the format
``provider/instance_type/zone/market`` of :attr:`~autoscaler.decide.views.OfferingRef.key`); a
job no fleet the controller may build could ever run (:mod:`autoscaler.decide.bounds`: no
offering of a type, market and offering it allows, or too few GPUs) is ``refused`` with the reason.

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
    REMOVED_FIELDS,
    JobSubmission,
    submission_problems,
)
from autoscaler.errors import InvalidInputError

__all__ = [
    "REMOVED_FIELDS",
    "ROOT_FIELD",
    "JobSpec",
    "JobSpecError",
    "load_job_spec",
    "parse_job_spec",
    "resolve_paths",
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
        )


def load_job_spec(path: str | Path) -> JobSpec:
    """Read and validate the spec file at ``path``; :class:`JobSpecError` on any problem
    (an unreadable file too). Its relative paths are the spec folder's
    (:func:`parse_job_spec` with ``base`` the file's folder): the script must be a readable
    file there, and the spec returned names it (and a local checkpoint folder) by absolute
    path, so the job runs the same whichever folder ``coadapt submit`` or ``coadapt up`` was
    started from."""
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
    return parse_job_spec(text, spath, base=Path(path).resolve().parent)


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

_TOP: Final = (
    "name",
    "command",
    "gpus",
    "batch_size",
    "local_batch_size",
    "max_accum_steps",
    "checkpoint",
    "gpu_types",
    "markets",
    "offerings",
    "application",
    "adaptive",
    "deadline",
)

# JobSpec attribute -> the spec's field path (what errors name).
_PATHS: Final = {
    "min_gpus": "gpus.min",
    "max_gpus": "gpus.max",
    "init_batch_size": "batch_size.initial",
    "max_batch_size": "batch_size.max",
    "max_local_bsz": "local_batch_size.max",
    "min_local_bsz": "local_batch_size.min",
    "checkpoint_uri": "checkpoint",
}


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
        gpus = {}
        if "gpus" in top:
            gpus = self.read("gpus", lambda: self.mapping(top["gpus"], "gpus", ("min", "max")))
        batch = self.read(
            "batch_size",
            lambda: self.mapping(
                self.required(top, "batch_size"), "batch_size", ("initial", "max")
            ),
        )
        local = self.read(
            "local_batch_size",
            lambda: self.mapping(
                self.required(top, "local_batch_size"), "local_batch_size", ("max", "min")
            ),
        )
        fields_: list[tuple[str, Any, str, bool]] = [  # attribute, mapping, field path, required
            ("min_gpus", gpus, "gpus.min", False),
            ("max_gpus", gpus, "gpus.max", False),
            ("init_batch_size", batch, "batch_size.initial", True),
            ("max_batch_size", batch, "batch_size.max", True),
            ("max_local_bsz", local, "local_batch_size.max", True),
            ("min_local_bsz", local, "local_batch_size.min", False),
        ]
        for attribute, entries, path, required in fields_:
            if entries is _UNREAD or (not required and path not in entries):
                continue
            values[attribute] = self.read(path, self.required_integer, entries, path)
        readers: dict[str, Callable[[Any, str], object]] = {
            "max_accum_steps": self.integer,
            "checkpoint": self.string,
            "gpu_types": self.string_list,
            "markets": self.string_list,
            "offerings": self.string_list,
            "application": self.string,
            "adaptive": self.boolean,
            "deadline": self.deadline,
        }
        for key, read in readers.items():
            if key in top:
                values[_ATTRIBUTES.get(key, key)] = self.read(key, read, top[key], key)
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

    def required(self, entries: Mapping[str, Any], field: str) -> Any:
        """The value node of a required field; a missing one is blamed on the line of the
        key of the mapping that lacks it."""
        if field not in entries:
            self.fail(self.key_lines[_parent(field)], field, "required field missing")
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


# Top-level spec keys whose JobSpec attribute has another name.
_ATTRIBUTES: Final = {"checkpoint": "checkpoint_uri"}


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
