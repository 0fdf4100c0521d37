"""What the controller knows of its jobs: the submitted spec, and the views the policy reads.

:class:`JobSubmission` is a job as submitted (stored as JSON in the store's ``jobs`` table;
the YAML job spec of ``coadapt submit`` maps onto it). :class:`JobBook` turns trainer reports
into what the decision core reads: profiles go to a :class:`~autoscaler.model.fitting.ModelBook`
(one fit per job and GPU type, refit together and warm-started only when a report changed a
fit), gradient statistics, progress and the declared length are kept per job, and
:meth:`JobBook.view` builds each job's :class:`~autoscaler.decide.views.JobView` with its goodput
models by GPU type, its remaining work (from the length its script declared, else the one
its spec declared, :func:`~autoscaler.decide.deadlines.length_in_force`, by the trainer's own
rule, :func:`trainer.report.remaining_progress`) and the bounds of its spec. :func:`admit` is
the check at submission: a deadline the spec's declared length cannot meet at the speed the
cluster measured of its application is refused with the estimate.

A report carries no GPU type: it is credited to the type of the instances the job is assigned to
when the report is read (a job runs on one GPU type at a time, the policies' rule) only if it
describes that assignment (:func:`credited_gpu_type`: its world size, nodes and launch), and a
report of a launch older than one already read is ignored (:meth:`JobBook.record`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass
from pathlib import PurePosixPath
from typing import Any, Final, Protocol

from autoscaler.decide.deadlines import length_estimate_s, length_in_force
from autoscaler.decide.views import Allocation, JobView, OfferingRef, Oracle
from autoscaler.errors import InvalidInputError
from autoscaler.market.terms import MARKETS
from autoscaler.model.fitting import ModelBook
from autoscaler.model.goodput import (
    BatchLimits,
    GoodputModel,
    GradParams,
    PerfParams,
    ProfileSample,
)
from autoscaler.model.gputypes import KNOWN_GPU_TYPES, SpeedTable, default_speed_table, limits_on
from trainer.report import TrainerReport, epochs_progress, remaining_progress

__all__ = [
    "BOUNDS_DOC",
    "GENERIC_APPLICATION",
    "JOB_NAME_PATTERN",
    "LAUNCH_CLOCK_SKEW_S",
    "LENGTH_FIELDS",
    "MAX_DEADLINE_S",
    "MAX_LENGTH",
    "REMOVED_FIELDS",
    "AssignedRun",
    "JobBook",
    "JobSubmission",
    "credited_gpu_type",
    "fixed_job_defaults",
    "parse_deadline",
    "submission_deadline",
    "submission_problems",
]

_PERF_KEYS: Final = tuple(f.name for f in dataclasses.fields(PerfParams))
POOLED_KEY: Final = "*"
"""The store's key (in place of a GPU type) of a job's pooled fit, over all its profiles."""

GENERIC_APPLICATION = "generic"
"""The application name of a job whose model the speed table does not know (its speed on
other GPU types is the generic ratio)."""


MAX_JOB_GPUS: Final = 4096
"""The most GPUs one job may ask for (``min_gpus``, ``max_gpus``)."""
MAX_BATCH_SIZE: Final = 1 << 24
"""The largest total batch (``init_batch_size``, ``max_batch_size``): 16,777,216 samples."""
MAX_LOCAL_BATCH_SIZE: Final = 1 << 20
"""The largest per-GPU micro-batch (``max_local_bsz``, ``min_local_bsz``)."""
MAX_ACCUM_STEPS: Final = 1024
"""The most gradient-accumulation steps (``max_accum_steps``)."""
MAX_COMMAND_WORDS: Final = 256
MAX_COMMAND_WORD_CHARS: Final = 4096
MAX_COMMAND_CHARS: Final = 32768
MAX_TEXT_CHARS: Final = 1024
"""The longest ``application`` or ``checkpoint_uri``."""
MAX_GPU_TYPES: Final = 32
MAX_OFFERINGS: Final = 256
"""The most offerings one job may name (``offerings``)."""
REMOVED_FIELDS: Final = {
    "optimizer": (
        "optimizer was removed: the trainer takes its learning-rate scaling rule from the "
        "optimizer object your script gives it (SGD: AdaScale; Adam, AdamW: square root), so "
        "a spec value could only disagree with it; delete this line"
    ),
    "weight": (
        "weight was removed: it has no meaning every policy shares (a share of the power "
        "mean in coadapt and pollux, a queue priority in tiresias, nothing in optimus' "
        "greedy), so no policy read it; delete this line"
    ),
    "budget_share": (
        "budget_share was removed: the fleet has one budget (the sizing's "
        "budget_usd_per_hour) for all jobs, which share its instances, so no job's share of "
        "it could be kept; delete this line"
    ),
}
"""Fields earlier versions accepted and ignored: a spec that names one is refused with this
reason, by the YAML spec of ``coadapt submit`` and the API alike."""
MAX_LENGTH: Final = 1 << 50
"""The largest number a declared length may give (``length_samples``, ``length_steps``,
``length_epochs``, ``dataset_samples``): 2^50, about 1.1e15."""
LENGTH_FIELDS: Final = ("length_samples", "length_steps", "length_epochs", "dataset_samples")
"""The :class:`JobSubmission` fields of a declared length (the spec's ``length`` mapping)."""
MAX_DEADLINE_S: Final = 366 * 86400.0
"""The furthest deadline a job may have: a year (and a day) after its submission."""
_DURATION: Final = re.compile(r"(?:(\d{1,6})d)?(?:(\d{1,6})h)?(?:(\d{1,7})m)?(?:(\d{1,9})s)?")
JOB_NAME_PATTERN: Final = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
"""A job name: a DNS label (1-63 of ``a-z 0-9 -``, starting and ending with a letter or a
digit). It is a URL path segment, a folder name and a rendezvous id: nothing else is safe."""
_NOT_A_SCRIPT: Final = re.compile(r"(coadapt-launch|torchrun|python[0-9.]*)")
_CHECKPOINT_SCHEMES: Final = ("file", "s3", "gs")

BOUNDS_DOC: Final = "\n".join(
    (
        "name: a DNS label, 1-63 of a-z 0-9 -, starting and ending with a letter or a digit",
        f"command: 1-{MAX_COMMAND_WORDS} strings of at most {MAX_COMMAND_WORD_CHARS} "
        f"characters ({MAX_COMMAND_CHARS} in all, no NUL); the first is the training script, "
        "not an option (-...), a launcher or an interpreter",
        f"init_batch_size: an integer in [1, {MAX_BATCH_SIZE}]",
        f"max_batch_size: an integer in [init_batch_size, {MAX_BATCH_SIZE}]",
        f"min_local_bsz: an integer in [1, {MAX_LOCAL_BATCH_SIZE}], at most max_batch_size",
        f"max_local_bsz: an integer in [min_local_bsz, {MAX_LOCAL_BATCH_SIZE}]",
        f"max_accum_steps: an integer in [1, {MAX_ACCUM_STEPS}], or null (16)",
        f"min_gpus: an integer in [1, {MAX_JOB_GPUS}]",
        f"max_gpus: an integer in [min_gpus, {MAX_JOB_GPUS}], or null (no cap); equal to "
        "min_gpus for a job that does not adapt",
        f"requested_gpus: an integer in [min_gpus, max_gpus or {MAX_JOB_GPUS}], or null (min_gpus)",
        f"batch_size: an integer in [1, {MAX_BATCH_SIZE}], or null (init_batch_size)",
        f"gpu_types: 1-{MAX_GPU_TYPES} distinct known GPU types, or null (any)",
        f"markets: 1-{len(MARKETS)} distinct of {', '.join(MARKETS)}, or null (any)",
        f"offerings: 1-{MAX_OFFERINGS} distinct offering keys provider/instance_type/zone/market "
        "(each market in markets when both are given), or null (any)",
        f"application: 1-{MAX_TEXT_CHARS} printable characters",
        "adaptive: true or false",
        f"deadline: seconds after submission in (0, {MAX_DEADLINE_S:.0f}], a duration such as "
        "'90m' or '2h30m' (d, h, m, s), or an ISO 8601 time with its zone "
        "('2026-12-05T18:00:00Z'), not in the past; or null (none)",
        "checkpoint_uri: a path, file://, s3://BUCKET[/PREFIX] or gs://BUCKET[/PREFIX] "
        f"(1-{MAX_TEXT_CHARS} printable characters), or null",
        f"length_samples, length_steps, length_epochs: an integer in [1, {MAX_LENGTH}], or null; "
        "at most one of them; length_epochs needs dataset_samples",
        f"dataset_samples: an integer in [1, {MAX_LENGTH}] (only with length_epochs), or null",
    )
)
"""The accepted range of every field of a job, one line each (``coadapt submit --help`` and
the API's docstring show it)."""


def fixed_job_defaults(values: Mapping[str, Any]) -> dict[str, int]:
    """The batch limits a job that does not adapt (``adaptive`` false) may leave out, from
    its ``init_batch_size`` (the one rule for the API's body and the YAML spec):
    ``max_batch_size`` = ``init_batch_size`` (its batch never changes) and ``max_local_bsz`` =
    ``init_batch_size`` capped at :data:`MAX_LOCAL_BATCH_SIZE` (a per-GPU batch is at most
    the whole batch, so the batch is split across the GPUs with no accumulation). Only the
    fields absent (or null) from ``values`` are given; nothing for an adaptive job, or when
    ``init_batch_size`` is not a valid integer (its own check then says why)."""
    init = values.get("init_batch_size")
    if values.get("adaptive", True) is not False or _int_problem(init, 1, MAX_BATCH_SIZE, "1"):
        return {}
    assert isinstance(init, int)  # checked just above
    defaults = {"max_batch_size": init, "max_local_bsz": min(init, MAX_LOCAL_BATCH_SIZE)}
    return {k: v for k, v in defaults.items() if values.get(k) is None}


def submission_problems(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every problem with a submission's field values, as ``(field, reason)`` in field order
    (empty: valid). The one check of a job's fields: :class:`JobSubmission` (the API's body)
    and the YAML spec of ``coadapt submit`` (:mod:`autoscaler.controller.jobspec`) both run
    it, so both refuse the same jobs. Absent keys take :class:`JobSubmission`'s defaults;
    ranges are in :data:`BOUNDS_DOC`. Never raises, whatever the values' types."""
    defaults = {
        f.name: f.default for f in dataclasses.fields(JobSubmission) if f.default is not MISSING
    }
    v = {**defaults, **values}
    out: list[tuple[str, str]] = []
    name = v.get("name")
    if not isinstance(name, str) or not JOB_NAME_PATTERN.fullmatch(name):
        out.append(
            (
                "name",
                "must be a DNS label: 1-63 lowercase letters, digits and '-', starting and "
                f"ending with a letter or digit, got {_show(name)}",
            )
        )
    out.extend(_command_problems(v.get("command")))
    ok: dict[str, int] = {}
    ranges = (  # field, the field it may not be below (or None), lowest, highest, optional
        ("init_batch_size", None, 1, MAX_BATCH_SIZE, False),
        ("max_batch_size", "init_batch_size", 1, MAX_BATCH_SIZE, False),
        ("min_local_bsz", None, 1, MAX_LOCAL_BATCH_SIZE, False),
        ("max_local_bsz", "min_local_bsz", 1, MAX_LOCAL_BATCH_SIZE, False),
        ("min_gpus", None, 1, MAX_JOB_GPUS, False),
        ("max_gpus", "min_gpus", 1, MAX_JOB_GPUS, True),
        ("max_accum_steps", None, 1, MAX_ACCUM_STEPS, True),
        ("requested_gpus", "min_gpus", 1, MAX_JOB_GPUS, True),
        ("batch_size", None, 1, MAX_BATCH_SIZE, True),
    )
    for field_, lower, low, high, optional in ranges:
        value = v.get(field_)
        if optional and value is None:
            continue
        floor = f"{lower} ({ok[lower]})" if lower in ok else str(low)
        problem = _int_problem(value, max(low, ok.get(lower or "", low)), high, floor)
        if problem is None:
            ok[field_] = int(value)  # type: ignore[arg-type]  # checked: an int
        else:
            out.append((field_, problem))
    if (
        "min_local_bsz" in ok
        and "max_batch_size" in ok
        and ok["min_local_bsz"] > ok["max_batch_size"]
    ):
        out.append(
            (
                "min_local_bsz",
                f"must be <= max_batch_size ({ok['max_batch_size']}), got {ok['min_local_bsz']}: "
                "no placement could hold a batch within the limits",
            )
        )
    if "requested_gpus" in ok and "max_gpus" in ok and ok["requested_gpus"] > ok["max_gpus"]:
        out.append(
            (
                "requested_gpus",
                f"must be <= max_gpus ({ok['max_gpus']}), got {ok['requested_gpus']}",
            )
        )
    adaptive = v.get("adaptive")
    if not isinstance(adaptive, bool):
        out.append(("adaptive", f"must be true or false, got {_show(adaptive)}"))
    elif (
        not adaptive and "max_gpus" in ok and "min_gpus" in ok and ok["max_gpus"] != ok["min_gpus"]
    ):
        out.append(
            (
                "max_gpus",
                f"a job that does not adapt runs on exactly min_gpus ({ok['min_gpus']}) GPUs: "
                f"leave max_gpus out or make it {ok['min_gpus']}, got {ok['max_gpus']}",
            )
        )
    application = v.get("application")
    if not _is_text(application):
        out.append(
            (
                "application",
                f"must be 1-{MAX_TEXT_CHARS} printable characters, got {_show(application)}",
            )
        )
    out.extend(_gpu_type_problems(v.get("gpu_types")))
    out.extend(_offering_problems(v.get("markets"), v.get("offerings")))
    if v.get("checkpoint_uri") is not None:
        reason = _checkpoint_problem(v["checkpoint_uri"])
        if reason is not None:
            out.append(("checkpoint_uri", reason))
    if v.get("deadline") is not None:
        try:
            parse_deadline(v["deadline"])
        except InvalidInputError as e:
            out.append(("deadline", str(e)))
    out.extend(_length_problems(v))
    return out


def _length_problems(v: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A declared length: each of :data:`LENGTH_FIELDS` an integer in ``[1, MAX_LENGTH]``
    or ``None``; at most one of samples, steps and epochs; epochs with the dataset's size,
    and the dataset's size only with epochs."""
    out: list[tuple[str, str]] = []
    given = [f for f in LENGTH_FIELDS if v.get(f) is not None]
    for field_ in given:
        problem = _int_problem(v[field_], 1, MAX_LENGTH, "1")
        if problem is not None:
            out.append((field_, problem))
    kinds = [f for f in given if f != "dataset_samples"]
    if len(kinds) > 1:
        out.append(
            (
                kinds[1],
                f"give one of length_samples, length_steps and length_epochs, got "
                f"{' and '.join(kinds)}",
            )
        )
    if "length_epochs" in given and "dataset_samples" not in given:
        out.append(
            ("dataset_samples", "length_epochs needs dataset_samples (the samples in one epoch)")
        )
    if "dataset_samples" in given and "length_epochs" not in given:
        out.append(("dataset_samples", "is the size of an epoch: give it with length_epochs"))
    return out


def parse_deadline(value: object) -> tuple[float | None, float | None]:
    """A spec's ``deadline`` as ``(after_s, at_s)``: seconds after submission (a number, or a
    duration string ``[Nd][Nh][Nm][Ns]``), or a Unix time (an ISO 8601 time with its zone);
    the other is ``None``, both for ``None``. Raises :class:`InvalidInputError` for anything
    else, a duration of 0 or over :data:`MAX_DEADLINE_S`, or a time without a zone. Whether
    a time is in the past is the submitting side's check (it knows the time)."""
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidInputError(
            f"must be seconds, a duration ('2h') or a time, got {_show(value)}", field="deadline"
        )
    if isinstance(value, str):
        text = value.strip()
        match = _DURATION.fullmatch(text) if len(text) <= 40 else None
        if match is not None and any(match.groups()):
            d, h, m, sec = (int(g or 0) for g in match.groups())
            value = float(d * 86400 + h * 3600 + m * 60 + sec)
        else:
            return None, _deadline_time(text)
    after = float(value)
    if not (math.isfinite(after) and 0 < after <= MAX_DEADLINE_S):
        raise InvalidInputError(
            f"must be a duration in (0, {MAX_DEADLINE_S:.0f}] seconds, got {_show(value)}",
            field="deadline",
        )
    return after, None


EARLIEST_DONE_S: Final = 180.0
"""The soonest after its submission any job is estimated to be done, for the check at
submission: a GPU instance's provisioning (the simulator's 2 minutes) and a round to start
it. A job whose spec declares its length is estimated longer where the cluster has measured
its application (:func:`length_estimate`)."""
_EFFICIENT: Final = GradParams(0.0, 1.0)
"""Gradient statistics of an efficiency of 1 at every batch (noise-dominated): the most
progress per sample any job makes, for a lower bound of its time before it runs."""


@dataclass(frozen=True)
class LengthEstimate:
    """What a spec's declared length takes, estimated at submission (:func:`length_estimate`):
    ``work_samples`` (``M0``-equivalent samples: the length in samples), ``fastest_s`` the
    fewest seconds from submission to done on any GPU type the job may use, at the
    application's measured speed (``None``: unknown, the cluster has measured no job of
    ``application``), ``fits`` how many measured fits the estimate read."""

    work_samples: float
    fastest_s: float | None
    application: str
    fits: int = 0

    def text(self) -> str:
        """The estimate in words, for a refusal or the log."""
        length = f"its declared length ({self.work_samples:.0f} samples)"
        if self.fastest_s is None:
            why = (
                f"application {self.application!r} names no model"
                if self.application == GENERIC_APPLICATION
                else f"this cluster has measured no job of application {self.application!r}"
            )
            return f"{length} takes an unknown time ({why})"
        return (
            f"{length} takes at least an estimated {self.fastest_s:.0f} s on any offering "
            f"(the measured speed of application {self.application!r}, {self.fits} fit(s), at "
            "perfect scaling and statistical efficiency 1, start included)"
        )


def length_estimate(
    spec: JobSubmission,
    fits: Iterable[tuple[str, str]],
    speeds: SpeedTable | None = None,
) -> LengthEstimate | None:
    """At submission, the fewest seconds ``spec``'s declared length could take (``None``:
    it declares none): over ``fits``, the ``(gpu_type, params_json)`` model rows of the
    earlier jobs of its application (the store's :meth:`~autoscaler.controller.store.Store.
    application_models`; a row without fitted parameters or of the pooled fit is skipped),
    the least :func:`~autoscaler.decide.deadlines.length_estimate_s` of each fit (its
    throughput on that type, estimated on the other types by the speed table, at an
    efficiency of 1, on as many GPUs as the job may have: a lower bound), plus
    :data:`EARLIEST_DONE_S`. Unknown (``fastest_s`` ``None``) when no fit is usable, and for
    the ``generic`` application (it names no model: two generic jobs share no speed)."""
    progress = spec.length_progress
    if progress is None:
        return None
    if spec.application == GENERIC_APPLICATION:
        fits = ()
    speeds = speeds or default_speed_table()
    best: float | None = None
    used = 0
    for gpu_type, params_json in fits:
        perf = _fitted_perf(gpu_type, params_json)
        if perf is None or gpu_type not in KNOWN_GPU_TYPES:
            continue
        # The fit's own type, and the types the speed table relates to it.
        related = speeds.gpu_types if speeds.has_type(gpu_type) else (gpu_type,)
        kinds = [(t, 1) for t in related if spec.gpu_types is None or t in spec.gpu_types]
        limits = limits_on(spec.limits, spec.application, gpu_type, speeds)
        view = JobView(
            name=spec.name,
            application=spec.application,
            submit_time_s=0.0,
            age_s=0.0,
            attained_gpu_s=0.0,
            num_restarts=0,
            allocation=Allocation(),
            limits=spec.limits,
            requested_gpus=spec.requested_gpus or spec.min_gpus,
            fixed_batch_size=spec.batch_size or spec.init_batch_size,
            models={gpu_type: GoodputModel(perf, _EFFICIENT, limits)},
            adaptive=spec.adaptive,
            remaining_progress=progress,
            target_progress=progress,
            **spec.view_bounds(),
        )
        left = length_estimate_s(
            view, kinds, speeds, most_gpus=MAX_JOB_GPUS, start_s=EARLIEST_DONE_S
        )
        if left is not None:
            used += 1
            best = left if best is None else min(best, left)
    return LengthEstimate(progress * spec.init_batch_size, best, spec.application, used)


class ModelSource(Protocol):
    """Where :func:`admit` reads an application's measured fits (the controller's store)."""

    def application_models(self, application: str) -> Sequence[Any]: ...


def admit(
    spec: JobSubmission, now_s: float, models: ModelSource
) -> tuple[float | None, float | None, LengthEstimate | None]:
    """A submission's check at ``now_s``, the one the API and the simulator's world both run:
    the estimate of its declared length (:func:`length_estimate` over the fits ``models``
    holds of its application, read only when it declares one) and the deadline
    :func:`submission_deadline` fixes, refusing one no offering can meet. Returns
    ``(deadline_after_s, deadline_at_s, estimate)``."""
    estimate = None
    if spec.length_progress is not None:
        rows = models.application_models(spec.application)
        estimate = length_estimate(spec, ((r.gpu_type, r.params_json) for r in rows))
    after, at = submission_deadline(spec, now_s, estimate)
    return after, at, estimate


def _fitted_perf(gpu_type: str, params_json: str) -> PerfParams | None:
    """The fitted throughput parameters of a stored model row (:meth:`JobBook.profile_json`'s
    form), ``None`` for the pooled fit, a row not fitted yet or one that cannot be read."""
    if gpu_type == POOLED_KEY:
        return None
    try:
        perf = json.loads(params_json).get("perf")
        return None if perf is None else PerfParams(**perf)
    except (ValueError, TypeError, AttributeError, InvalidInputError):
        return None


def submission_deadline(
    spec: JobSubmission, now_s: float, estimate: LengthEstimate | None = None
) -> tuple[float | None, float | None]:
    """The ``(deadline_after_s, deadline_at_s)`` the store keeps for ``spec`` submitted at
    ``now_s`` (:meth:`Store.add_job <autoscaler.controller.store.Store.add_job>`). Refuses,
    with :class:`InvalidInputError` on ``deadline`` giving the estimate, a deadline that is
    past or sooner than :data:`EARLIEST_DONE_S` (no job could meet it), sooner than the
    ``estimate`` of the spec's declared length (:func:`length_estimate`: no offering can
    meet it; an unknown estimate is said so in the first refusal), or further than
    :data:`MAX_DEADLINE_S`. The API and the simulator's world both submit through it."""
    after, at = parse_deadline(spec.deadline)
    left = after if at is None else at - now_s
    if left is not None and left > MAX_DEADLINE_S:
        raise InvalidInputError(
            f"job {spec.name}: deadline is {left:.0f} s after submission, more than "
            f"{MAX_DEADLINE_S:.0f}",
            field="deadline",
        )
    if left is not None and left < EARLIEST_DONE_S:
        when = "is in the past" if left <= 0 else f"is {left:.0f} s after submission"
        length = "" if estimate is None else f"; {estimate.text()}"
        raise InvalidInputError(
            f"job {spec.name}: deadline {when}; no job can be done sooner than an estimated "
            f"{EARLIEST_DONE_S:.0f} s (an instance's provisioning and its start), so it cannot "
            f"be met even on demand{length}",
            field="deadline",
        )
    fastest = None if estimate is None else estimate.fastest_s
    if left is not None and estimate is not None and fastest is not None and left < fastest:
        raise InvalidInputError(
            f"job {spec.name}: deadline is {left:.0f} s after submission; {estimate.text()}, "
            "so no offering can meet it",
            field="deadline",
        )
    return after, at


def _deadline_time(text: str) -> float:
    """An ISO 8601 time with its zone as a Unix time (see :func:`parse_deadline`)."""
    import datetime as _dt

    try:
        when = _dt.datetime.fromisoformat(text) if 10 <= len(text) <= 40 else None
    except ValueError:
        when = None
    if when is None:
        raise InvalidInputError(
            "must be seconds, a duration such as '90m' or '2h30m' (d, h, m, s) or an ISO 8601 "
            f"time with its zone ('2026-12-05T18:00:00Z'), got {_show(text)}",
            field="deadline",
        )
    if when.tzinfo is None:
        raise InvalidInputError(
            f"a deadline time needs its zone (add 'Z' for UTC), got {_show(text)}",
            field="deadline",
        )
    return when.timestamp()


def _show(value: object) -> str:
    """A value for a message, cut short (a huge number or string is not echoed whole)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_text(value: object, limit: int = MAX_TEXT_CHARS) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit and value.isprintable()


def _int_problem(value: object, low: int, high: int, floor: str) -> str | None:
    """Why ``value`` is not an integer in ``[low, high]`` (``floor`` names ``low``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an integer, got {_show(value)}"
    if value < low:
        return f"must be >= {floor}, got {_show(value)}"
    if value > high:
        return f"must be <= {high}, got {_show(value)}"
    return None


def _command_problems(command: object) -> list[tuple[str, str]]:
    """The command: what the node agent runs after the launcher's options (see
    :func:`~autoscaler.controller.agent.launch_argv`)."""
    if isinstance(command, str) or not isinstance(command, list | tuple):
        return [("command", f"must be a list of strings, got {_show(command)}")]
    if not command:
        return [("command", "must not be empty: give the training script and its arguments")]
    if len(command) > MAX_COMMAND_WORDS:
        return [("command", f"has {len(command)} words; at most {MAX_COMMAND_WORDS}")]
    out = []
    total = 0
    for i, word in enumerate(command):
        if not isinstance(word, str):
            out.append((f"command[{i}]", f"must be a string, got {_show(word)}"))
        elif i == 0 and not word:
            out.append(("command[0]", "must be the training script, got an empty string"))
        elif len(word) > MAX_COMMAND_WORD_CHARS or "\0" in word:
            out.append(
                (f"command[{i}]", f"must be at most {MAX_COMMAND_WORD_CHARS} characters, no NUL")
            )
        else:
            total += len(word)
    if total > MAX_COMMAND_CHARS:
        out.append(("command", f"has {total} characters; at most {MAX_COMMAND_CHARS}"))
    script = command[0]
    if isinstance(script, str) and script:
        if script.startswith("-"):
            out.append(
                (
                    "command[0]",
                    f"must be the training script, got the option {_show(script)}: options "
                    "before the script would be read as the launcher's",
                )
            )
        elif _NOT_A_SCRIPT.fullmatch(PurePosixPath(script).name):
            out.append(
                (
                    "command[0]",
                    f"must be the training script, got {_show(script)}: the command is what "
                    "follows the launcher's options (the node agent runs it under the launcher), "
                    "e.g. [train.py, --epochs, 3]",
                )
            )
    return out


def _gpu_type_problems(types: object) -> list[tuple[str, str]]:
    if types is None:
        return []
    if isinstance(types, str) or not isinstance(types, list | tuple) or not types:
        return [
            (
                "gpu_types",
                f"must be a non-empty list (leave it out to allow any), got {_show(types)}",
            )
        ]
    if len(types) > MAX_GPU_TYPES:
        return [("gpu_types", f"lists {len(types)} types; at most {MAX_GPU_TYPES}")]
    out: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(types):
        if not isinstance(item, str) or item not in KNOWN_GPU_TYPES:
            choices = ", ".join(KNOWN_GPU_TYPES)
            hint = ""
            if isinstance(item, str):
                by_lower = {t.lower(): t for t in KNOWN_GPU_TYPES}
                close = difflib.get_close_matches(item.lower(), list(by_lower), n=1)
                hint = f"; did you mean {by_lower[close[0]]!r}?" if close else ""
            out.append((f"gpu_types[{i}]", f"must be one of {choices}, got {_show(item)}{hint}"))
        elif item in seen:
            out.append(
                (f"gpu_types[{i}]", f"{item!r} is listed twice (first as gpu_types[{seen[item]}])")
            )
        else:
            seen[item] = i
    return out


def _offering_problems(markets: object, offerings: object) -> list[tuple[str, str]]:
    """``markets`` and ``offerings``: non-empty lists of distinct markets, and of offering
    keys in :meth:`OfferingRef.parse`'s format (``provider/instance_type/zone/market``, the
    format of :attr:`OfferingRef.key`) whose market ``markets`` allows."""
    out: list[tuple[str, str]] = []
    allowed: Sequence[str] | None = None
    for key, items, most in (
        ("markets", markets, len(MARKETS)),
        ("offerings", offerings, MAX_OFFERINGS),
    ):
        if items is None:
            continue
        if isinstance(items, str) or not isinstance(items, list | tuple) or not items:
            out.append(
                (key, f"must be a non-empty list (leave it out to allow any), got {_show(items)}")
            )
            continue
        if len(items) > most:
            out.append((key, f"lists {len(items)} items; at most {most}"))
            continue
        first: dict[str, int] = {}
        good = True
        for i, item in enumerate(items):
            path = f"{key}[{i}]"
            problem = None
            if not isinstance(item, str) or not _is_text(item, 256):
                problem = f"must be a string of 1-256 printable characters, got {_show(item)}"
            elif item in first:
                problem = f"{item!r} is listed twice (first as {key}[{first[item]}])"
            elif key == "markets" and item not in MARKETS:
                hint = difflib.get_close_matches(item.lower(), MARKETS, n=1)
                more = f"; did you mean {hint[0]!r}?" if hint else ""
                problem = f"must be one of {', '.join(MARKETS)}, got {_show(item)}{more}"
            elif key == "offerings":
                try:
                    market = OfferingRef.parse(item).market
                except InvalidInputError as e:
                    problem = str(e)
                else:
                    if allowed is not None and market not in allowed:
                        problem = f"its market {market!r} is not in markets ({', '.join(allowed)})"
            if problem is not None:
                out.append((path, problem))
                good = False
            else:
                first[item] = i
        if key == "markets" and good:
            allowed = tuple(items)
    return out


def _checkpoint_problem(uri: object) -> str | None:
    if not _is_text(uri) or not str(uri).strip():
        return (
            f"must be a non-empty location of at most {MAX_TEXT_CHARS} printable characters, "
            f"got {_show(uri)}"
        )
    assert isinstance(uri, str)
    if "://" not in uri:
        return None  # a local path
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme not in _CHECKPOINT_SCHEMES:
        return (
            f"unsupported scheme {parsed.scheme!r} in {uri!r}: use a local path, file://, "
            "s3://BUCKET/PREFIX or gs://BUCKET/PREFIX"
        )
    if parsed.scheme in ("s3", "gs") and not parsed.netloc:
        return f"{uri!r} names no bucket: expected {parsed.scheme}://BUCKET/PREFIX"
    if parsed.scheme == "file" and not parsed.path:
        return f"{uri!r} names no folder: expected file:///PATH"
    return None


@dataclass(frozen=True)
class JobSubmission:
    """A submitted job, as the API takes it and the store keeps it (JSON; the YAML job spec of
    ``coadapt submit`` maps onto it). Every field is checked on construction by
    :func:`submission_problems` (ranges in :data:`BOUNDS_DOC`); :class:`InvalidInputError`
    names the first bad field, and its message lists them all.

    Batch sizes are totals across GPUs except ``*_local_bsz`` (per GPU). ``min_gpus``: the
    fewest GPUs it runs on (for a job that does not adapt, exactly its GPUs); ``max_gpus``:
    the most (``None``: no cap); ``gpu_types``: the GPU types it may run on (``None``: any);
    ``max_accum_steps``: the most gradient-accumulation steps per optimizer step (``None``:
    16). ``application`` names the model for the speed table (``generic``: unknown).
    ``adaptive`` false pins the batch at ``init_batch_size`` and the GPUs at ``min_gpus``.
    ``checkpoint_uri``: where the job checkpoints (``None``: the cluster's checkpoint root).
    ``requested_gpus`` and ``batch_size`` are the user's own choice, what a policy that does not
    choose them gives the job (``tiresias``; ``optimus`` starts from it) and what a job that
    does not adapt keeps (``None``: ``min_gpus`` and ``init_batch_size``): a non-adaptive job
    trains at ``batch_size`` on ``min_gpus`` to ``requested_gpus`` GPUs (the Pollux paper's
    fixed-batch jobs; give ``min_gpus`` alone for exactly that many).
    ``deadline``: when the job must be done (:func:`parse_deadline`: seconds or a duration
    after submission, or a time; ``None``: no deadline), fixed as a time at submission (the
    store's ``deadline_s``). ``markets`` and ``offerings``: the markets (``spot``,
    ``on-demand``) and offerings (keys ``provider/instance_type/zone/market``, the format of
    :attr:`~autoscaler.decide.views.OfferingRef.key`, compared by their four parts) the job may run
    on (``None``: any). Every policy and the fleet sizing honour these bounds
    (:meth:`~autoscaler.decide.views.JobView.allows_node`)."""

    name: str
    init_batch_size: int
    max_batch_size: int
    max_local_bsz: int
    min_local_bsz: int = 1
    min_gpus: int = 1
    max_gpus: int | None = None
    gpu_types: tuple[str, ...] | None = None
    max_accum_steps: int | None = None
    application: str = GENERIC_APPLICATION
    adaptive: bool = True
    command: tuple[str, ...] = ()
    checkpoint_uri: str | None = None
    requested_gpus: int | None = None
    batch_size: int | None = None
    deadline: float | str | None = None
    markets: tuple[str, ...] | None = None
    offerings: tuple[str, ...] | None = None
    length_samples: int | None = None
    length_steps: int | None = None
    length_epochs: int | None = None
    dataset_samples: int | None = None

    def __post_init__(self) -> None:
        for name in ("command", "gpu_types", "markets", "offerings"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        problems = submission_problems(self.__dict__)
        if problems:
            field_ = problems[0][0]
            label = f"job {self.name}" if isinstance(self.name, str) and self.name else "a job"
            text = "; ".join(f"{f}: {r}" for f, r in problems)
            raise InvalidInputError(f"{label}: {text}", field=field_)

    @property
    def limits(self) -> BatchLimits:
        extra = {} if self.max_accum_steps is None else {"max_accum_steps": self.max_accum_steps}
        return BatchLimits(
            self.init_batch_size,
            self.max_batch_size,
            self.max_local_bsz,
            self.min_local_bsz,
            **extra,
        )

    @property
    def length_progress(self) -> float | None:
        """The declared length in the trainer's unit of progress (initial-batch-size
        iterations, :mod:`trainer.report`), by the one rule samples = steps x
        ``init_batch_size`` = epochs x ``dataset_samples``: ``length_samples /
        init_batch_size``, ``length_steps``, or ``length_epochs x dataset_samples /
        init_batch_size`` (:func:`trainer.report.epochs_progress`, the rule the trainer's
        own ``ElasticJob.epochs`` declares by). ``None``: no length declared."""
        if self.length_samples is not None:
            return epochs_progress(1, self.length_samples, self.init_batch_size)
        if self.length_steps is not None:
            return epochs_progress(
                1, self.length_steps * self.init_batch_size, self.init_batch_size
            )
        if self.length_epochs is not None and self.dataset_samples is not None:
            return epochs_progress(self.length_epochs, self.dataset_samples, self.init_batch_size)
        return None

    def to_json(self) -> str:
        """The stored form: every field, except ``markets``, ``offerings`` and the length's
        fields when not given (so that a job that sets none is stored as before they
        existed)."""
        data = asdict(self)
        for name in ("markets", "offerings", *LENGTH_FIELDS):
            if data[name] is None:
                del data[name]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> JobSubmission:
        """Parse a submission (a stored spec, or an API body); :class:`InvalidInputError`
        names the bad field."""
        try:
            data: Any = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise InvalidInputError(f"job spec is not JSON: {e}", field="spec") from e
        return cls.from_mapping(data)

    @classmethod
    def from_mapping(cls, data: object) -> JobSubmission:
        """A submission from a JSON object: unknown fields and missing required ones are
        refused with the field named, then every value is checked."""
        if not isinstance(data, Mapping):
            raise InvalidInputError("job spec must be a JSON object", field="spec")
        known = {f.name for f in dataclasses.fields(cls)}
        removed = sorted(str(k) for k in data if k in REMOVED_FIELDS)
        if removed:
            raise InvalidInputError(REMOVED_FIELDS[removed[0]], field=removed[0])
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise InvalidInputError(f"unknown job spec field {_show(unknown[0])}", field=unknown[0])
        values = {**data, **fixed_job_defaults(data)}
        for f in dataclasses.fields(cls):
            if f.default is MISSING and f.default_factory is MISSING and f.name not in values:
                raise InvalidInputError(f"the job spec lacks {f.name!r}", field=f.name)
        if values.get("command") is None:
            values.pop("command", None)
        return cls(**values)

    def view_bounds(self) -> dict[str, Any]:
        """The :class:`~autoscaler.decide.views.JobView` fields the spec's bounds fill."""
        return {
            "min_gpus": self.min_gpus,
            "gpu_limit": self.max_gpus,
            "gpu_types": None if self.gpu_types is None else frozenset(self.gpu_types),
            "markets": None if self.markets is None else frozenset(self.markets),
            "offerings": None
            if self.offerings is None
            else frozenset(OfferingRef.parse(key) for key in self.offerings),
        }


LAUNCH_CLOCK_SKEW_S: Final = 5.0
"""How far a trainer node's clock may lag the controller's: a launch that started (by its
rank 0's clock) up to this long before its job's current placement was recorded is still
taken as that placement's launch (:func:`credited_gpu_type`)."""


@dataclass(frozen=True)
class AssignedRun:
    """A job's current assignment, as its reports are read against it: ``num_gpus`` GPUs of
    type ``gpu_type`` over ``num_nodes`` instances, held as they are since ``placed_at_s``
    (the store's clock: the latest placement, rescale, move or relaunch of the job,
    :meth:`~autoscaler.controller.store.Store.placed_at`)."""

    gpu_type: str
    num_gpus: int
    num_nodes: int
    placed_at_s: float


def credited_gpu_type(report: TrainerReport, run: AssignedRun | None) -> str | None:
    """The GPU type whose profile ``report``'s profile entries update: ``run``'s, if the
    report describes ``run`` (its world size is ``run``'s GPUs, its node count ``run``'s
    instances, and its launch started no earlier than ``run``'s placement, less
    :data:`LAUNCH_CLOCK_SKEW_S`), else ``None``: a late report of the configuration the job
    ran before a rescale, a move to another GPU type or a relaunch is **dropped** from the
    profiles, never credited to the new one. It is not credited to the type it ran on either
    (which instances those were is not in the report): little is lost, since a launch's
    profile is cumulative and its earlier reports, read while it was current, carried nearly
    all of it. ``None`` too for a job not placed now (``run`` ``None``)."""
    if run is None:
        return None
    if report.world_size != run.num_gpus or report.num_nodes != run.num_nodes:
        return None
    if report.started_at_s < run.placed_at_s - LAUNCH_CLOCK_SKEW_S:
        return None
    return run.gpu_type


@dataclass
class _Known:
    grad: GradParams | None = None
    max_gpus: int = 0
    max_nodes: int = 0
    models: dict[str, GoodputModel] | None = None
    progress: float = 0.0
    target_progress: float | None = None
    done: bool = False
    launch: tuple[float, int] | None = None  # (started_at_s, attempt) of the newest launch read


class JobBook:
    """Reports in, job views out (see the module docstring)."""

    def __init__(
        self, refit_tolerance: float = 0.05, *, typed: bool = True, speeds: SpeedTable | None = None
    ) -> None:
        """``typed``: also fit each job per GPU type (what a type-aware policy reads); the
        pooled fit over all its profiles (:attr:`~autoscaler.decide.views.JobView.model`, what a
        type-unaware policy reads, and the sizing's fallback) is always kept. ``speeds``:
        where a per-type model takes the micro-batch that type's memory holds
        (:func:`~autoscaler.model.gputypes.limits_on`; default: the shipped table)."""
        self.models = ModelBook(refit_tolerance=refit_tolerance)
        self.typed = typed
        self.speeds = speeds or default_speed_table()
        self._known: dict[str, _Known] = {}

    def record(self, report: TrainerReport, gpu_type: str | None) -> bool:
        """Take one report of a job running on ``gpu_type`` (``None``: not placed now, or the
        report does not describe its placement, :func:`credited_gpu_type`: only its gradient
        statistics and progress are kept); whether it added a profile sample. A report of a
        launch older (by ``(started_at_s, attempt)``) than one this book has read of the job
        is ignored whole: a late report of a stopped launch neither updates a profile nor
        turns the job's progress and gradient statistics back."""
        known = self._known.setdefault(report.job_id, _Known())
        launch = (report.started_at_s, report.attempt)
        if known.launch is not None and launch < known.launch:
            return False
        known.launch = launch
        self.record_gradient(report)
        if gpu_type is None:
            return False
        added = False
        for p in report.profiles:
            if p.step_s <= 0 or p.num_replicas < p.num_nodes:
                continue  # a malformed entry: skipped, never fitted
            placement = _placement(p.num_replicas, p.num_nodes)
            sample = ProfileSample(
                placement, p.local_batch_size, p.accum_steps, p.step_s, min(p.sync_s, p.step_s)
            )
            added |= self.add_sample(report.job_id, gpu_type, sample)
        return added

    def record_gradient(self, report: TrainerReport) -> None:
        """Keep the report's gradient statistics (the latest win), its progress and declared
        length, and whether its trainer finished (a finished job stays finished)."""
        known = self._known.setdefault(report.job_id, _Known())
        known.progress = report.progress
        known.target_progress = report.target_progress
        known.done = known.done or report.done
        if report.gradient is not None:
            g = report.gradient
            if math.isfinite(g.grad_sqr) and math.isfinite(g.grad_var):
                known.grad = GradParams(g.grad_sqr, g.grad_var)

    def add_sample(self, job: str, gpu_type: str, sample: ProfileSample) -> bool:
        """One profile sample of ``job`` on ``gpu_type``; whether it was new."""
        known = self._known.setdefault(job, _Known())
        key: str | None = gpu_type if self.typed else None
        before = self.models.profile_size(job, key)
        if self.typed:
            self.models.record(job, gpu_type, sample)
        self.models.record(job, None, sample)
        known.max_gpus = max(known.max_gpus, sample.num_gpus)
        known.max_nodes = max(known.max_nodes, sample.num_nodes)
        return self.models.profile_size(job, key) != before or before == self.models.max_samples

    def changed_keys(self, gpu_type: str) -> tuple[str, ...]:
        """The store keys (:data:`POOLED_KEY` for the pooled fit) a new sample on ``gpu_type``
        touches."""
        return (gpu_type, POOLED_KEY) if self.typed else (POOLED_KEY,)

    def profile_json(self, job: str, gpu_type: str) -> str:
        """The profile of ``(job, gpu_type)`` as stored (the store's ``models`` row; the
        pooled fit under :data:`POOLED_KEY`), with its fitted parameters when fitted."""
        key = None if gpu_type == POOLED_KEY else gpu_type
        return self._profile_json(job, key)

    def _profile_json(self, job: str, gpu_type: str | None) -> str:
        perf = self.models.perf(job, gpu_type)
        return json.dumps(
            {
                "samples": [
                    [list(x.placement), x.local_bsz, x.accum_steps, x.step_time_s, x.sync_time_s]
                    for x in self.models.samples(job, gpu_type)
                ],
                "perf": None if perf is None else {k: getattr(perf, k) for k in _PERF_KEYS},
            },
            sort_keys=True,
        )

    def restore(self, job: str, gpu_type: str, profile_json: str) -> None:
        """Take back a profile written by :meth:`profile_json` (after a restart)."""
        data = json.loads(profile_json)
        samples = [
            ProfileSample(tuple(placement), local, accum, step, sync)
            for placement, local, accum, step, sync in data.get("samples", ())
        ]
        perf = data.get("perf")
        key = None if gpu_type == POOLED_KEY else gpu_type
        if key is not None and not self.typed:
            return  # a per-type fit this book does not keep
        self.models.restore(job, key, samples, None if perf is None else PerfParams(**perf))
        known = self._known.setdefault(job, _Known())
        for sample in samples:
            known.max_gpus = max(known.max_gpus, sample.num_gpus)
            known.max_nodes = max(known.max_nodes, sample.num_nodes)

    def refit(self) -> int:
        """Refit the fits that reports changed (together, warm-started); how many."""
        return self.models.refit()

    def drop(self, name: str) -> None:
        """Forget a job that ended."""
        self.models.drop(name)
        self._known.pop(name, None)

    def done(self, name: str) -> bool:
        """Whether the job's trainer reported that it finished training."""
        known = self._known.get(name)
        return known is not None and known.done

    def remaining_progress(self, name: str) -> float | None:
        """Progress the job has left by its script's declared length (:func:`trainer.report.
        remaining_progress` of its latest report; ``None``: nothing declared, or no report).
        The spec's own length is :meth:`view`'s (:func:`~autoscaler.decide.deadlines.
        length_in_force`)."""
        known = self._known.get(name)
        if known is None:
            return None
        return remaining_progress(known.progress, known.target_progress)

    def view(
        self,
        spec: JobSubmission,
        submitted_at_s: float,
        now_s: float,
        allocation: Allocation,
        *,
        attained_gpu_s: float = 0.0,
        num_restarts: int = 0,
        oracle: Oracle | None = None,
        deadline_s: float | None = None,
    ) -> JobView:
        """The job as the policy sees it now (``attained_gpu_s`` and ``num_restarts`` from
        the store's assignment history; ``oracle`` only where an observer has one;
        ``deadline_s`` the store's, the same clock as ``submitted_at_s``)."""
        known = self._known.get(spec.name, _Known())
        target = length_in_force(known.target_progress, spec.length_progress)
        models: dict[str, GoodputModel] = {}
        pooled: GoodputModel | None = None
        if known.grad is not None:
            cache = known.models if known.models is not None else {}
            for key in self.models.keys(spec.name):
                perf = self.models.perf(spec.name, key)
                if perf is None:
                    continue
                model = cache.get(key or POOLED_KEY)
                if model is None or model.perf != perf or model.grad != known.grad:
                    limits = spec.limits
                    if key is not None:
                        limits = limits_on(limits, spec.application, key, self.speeds)
                    model = GoodputModel(perf, known.grad, limits)
                    cache[key or POOLED_KEY] = model
                if key is None:
                    pooled = model
                else:
                    models[key] = model
            known.models = cache
        return JobView(
            name=spec.name,
            application=spec.application,
            submit_time_s=submitted_at_s,
            age_s=max(0.0, now_s - submitted_at_s),
            attained_gpu_s=attained_gpu_s,
            num_restarts=num_restarts,
            model=pooled,
            oracle=oracle,
            allocation=allocation,
            limits=spec.limits,
            requested_gpus=spec.requested_gpus or spec.min_gpus,
            fixed_batch_size=spec.batch_size or spec.init_batch_size,
            max_profiled_gpus=known.max_gpus,
            max_profiled_nodes=known.max_nodes,
            models=models,
            adaptive=spec.adaptive,
            remaining_progress=remaining_progress(known.progress, target),
            target_progress=target,
            deadline_s=deadline_s,
            **spec.view_bounds(),
        )


def _placement(gpus: int, nodes: int) -> tuple[int, ...]:
    """GPUs per node, as even as the counts allow (a report gives only the totals)."""
    base, extra = divmod(gpus, nodes)
    return tuple(base + 1 if i < extra else base for i in range(nodes))
