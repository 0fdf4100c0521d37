"""Decisions that hold: the one rule by which the controller keeps what it just decided.

A round's plan (the fleet sizing's target, the policy's allocations and batches) is taken
over here before it is acted on, so that the controller does not reverse itself within
seconds (issue 40: an instance bought after a spot notice drained 8 s after the job resumed
on it; a fixed job stopped for cost; a batch 16 -> 17 -> 16 in 4 s). The simulator runs the
controller's round, so a simulated fleet obeys the same rule as a live one.

The horizon is :meth:`HoldConfig.hold_s`: ``rounds`` rounds of the controller, and never less
than one restart of a job (``restart_delay_s``): a job moved sooner has not yet won back the
restart it paid. Within it:

* **An instance a job was just placed on is not drained for cost** (:func:`held_instances`):
  one on which a job was placed (or resumed) less than the horizon ago is not chosen as a
  surplus to drain. A spot notice, the cloud taking it back, a dead agent or ``down`` are not
  cost decisions and always win. (An instance's own age is no reason: holding every instance
  younger than the horizon kept the fresh ones and drained busy ones instead; on E2's
  workload-1 it raised coadapt's bill from $344.93 to $421.74 and its launches from 179 to
  335, ``benchmarks/cloud_cost.py --experiment E2 --workloads 1 --strategies coadapt``.)
* **An empty instance is kept while keeping it is cheaper than a relaunch**
  (:func:`kept_empty`, :func:`hold_target`): a ready instance that runs no job stays for
  ``empty_keep_s`` from when it became empty, the boot the sizing believes a relaunch takes
  (:attr:`~autoscaler.decide.sizing.SizingConfig.provisioning_delay_s`): the rent-or-buy
  break-even (idle that long costs what a relaunch's billed boot costs; the next job that
  arrives meanwhile starts without a boot). Only while the plan wants every instance that is
  busy or booting: a plan that wants fewer releases the empty ones first. Past it, the
  reconcile releases it in the round the plan drops it.
* **A non-adaptive job is never moved or stopped for cost** (:func:`fixed_allocations`,
  :func:`held_instances`): a running ``adaptive: false`` job whose instances all stay keeps
  its allocation and batch whatever the policy would do, and its instances are not drained
  for cost. When one of its instances leaves (a notice, a preemption, a dead agent) the
  policy places it again.
* **Batch changes are damped** (:func:`damp_batches`): on an unchanged allocation, a batch
  change in the direction opposite to the job's last batch change on that allocation, at
  most the horizon after it, is not made; the job keeps the batch it runs. This is the
  reversal the churn figures count (:func:`autoscaler.accounting.churn.batch_reversals`): a
  noisy estimate that swings the optimum up and down moves the batch one way at a time. A
  change of allocation takes its batch with it (the job restarts anyway) and starts afresh:
  the first batch chosen from the new allocation's own measurements may go either way
  (holding it against the batch the old allocation's change set cost simulated jobs time).

Pure functions over numbers: the controller reads the store and passes them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from autoscaler.controller.records import JobBatch
from autoscaler.decide.views import Allocation, BatchChoice, JobView
from autoscaler.errors import InvalidInputError

__all__ = [
    "BatchLeft",
    "HoldConfig",
    "damp_batches",
    "fixed_allocations",
    "held_instances",
    "hold_target",
    "kept_empty",
]


@dataclass(frozen=True)
class HoldConfig:
    """How long decisions hold (see the module docstring): ``rounds`` controller rounds (5:
    the issue's acceptance counts reversals and drains of young instances within 5 rounds),
    never less than one restart; ``keep_empty``: keep an empty ready instance for the
    rent-or-buy break-even (:meth:`empty_keep_s`)."""

    rounds: int = 5
    keep_empty: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 0:
            raise InvalidInputError("hold rounds must be an integer >= 0", field="hold.rounds")

    def empty_keep_s(self, boot_s: float) -> float:
        """How long an empty ready instance is kept: ``boot_s``, the boot the sizing believes
        a relaunch takes (the rent-or-buy break-even); 0 when nothing holds (``rounds`` 0)
        or ``keep_empty`` is off."""
        if self.rounds == 0 or not self.keep_empty:
            return 0.0
        return max(0.0, boot_s)

    def hold_s(self, interval_s: float, restart_delay_s: float) -> float:
        """The horizon in seconds: ``rounds x interval_s``, at least ``restart_delay_s``
        (0 when ``rounds`` is 0: nothing is held)."""
        if self.rounds == 0:
            return 0.0
        return max(self.rounds * interval_s, restart_delay_s)


@dataclass(frozen=True)
class BatchLeft:
    """A job's last batch change on its allocation: at ``at_s`` (the clock's seconds), to a
    larger batch (``rose`` true) or a smaller one."""

    at_s: float
    rose: bool


def held_instances(
    now_s: float,
    hold_s: float,
    placed_s: Mapping[str, float],
    fixed_on: Iterable[str] = (),
    *,
    within_cap: bool = True,
) -> frozenset[str]:
    """Instance keys not to drain for cost this round: those on which a job's current
    placement began (``placed_s``: the latest open assignment span per instance) less than
    ``hold_s`` before ``now_s``, and ``fixed_on`` (instances running a non-adaptive job). A
    fleet above the user's cap (``within_cap`` false: more instances held than
    ``max_instances``, as while the sizing moves the fleet to another offering) holds no
    recently placed instance: a hold never keeps the fleet above what the user allows. A hold
    of 0 s (``HoldConfig(rounds=0)``) holds nothing, a non-adaptive job's instances
    included."""
    if hold_s <= 0:
        return frozenset()
    out = set(fixed_on)
    if not within_cap:
        return frozenset(out)
    for key, at in placed_s.items():
        if now_s - at < hold_s:
            out.add(key)
    return frozenset(out)


def kept_empty(now_s: float, keep_s: float, empty_since_s: Mapping[str, float]) -> frozenset[str]:
    """The ready instances without a job (``empty_since_s``: key -> when it was first seen
    empty) that have been empty less than ``keep_s``: kept for the next job (see the module
    docstring). ``keep_s`` 0: none."""
    return frozenset(k for k, at in empty_since_s.items() if now_s - at < keep_s)


def hold_target(
    target: Mapping[str, int],
    held_rows: Mapping[str, Iterable[str]],
    empty: Iterable[str],
    kept: Iterable[str],
) -> dict[str, int]:
    """The fleet target with the kept empty instances added back: per offering (``held_rows``:
    offering key -> the keys of its queued, requested or running instances), when the plan
    wants at least every instance of it that is not an empty ready one (``empty``), it wants
    the ``kept`` empty ones too; a plan that wants fewer is taken as it is (the empty ones go
    first)."""
    empty_set, kept_set = set(empty), set(kept)
    out = dict(target)
    for key, rows in held_rows.items():
        keys = list(rows)
        others = sum(1 for k in keys if k not in empty_set)
        keep = sum(1 for k in keys if k in kept_set and k in empty_set)
        want = int(target.get(key, 0))
        if keep and want >= others:
            out[key] = max(want, others + keep)
    return out


def fixed_allocations(
    jobs: Iterable[JobView], staying: Iterable[str], hold_s: float
) -> dict[str, Allocation]:
    """The running non-adaptive jobs of ``jobs`` whose instances all stay (``staying``: the
    ready instance keys not leaving this round), by name, with the allocation they keep;
    none with a hold of 0 s (``HoldConfig(rounds=0)`` holds nothing)."""
    if hold_s <= 0:
        return {}
    stay = set(staying)
    return {
        job.name: job.allocation
        for job in jobs
        if not job.adaptive and job.allocation and set(job.allocation) <= stay
    }


def damp_batches(
    batches: Mapping[str, BatchChoice],
    allocations: Mapping[str, Allocation],
    held: Mapping[str, Allocation],
    planned: Mapping[str, JobBatch],
    left: Mapping[str, BatchLeft],
    now_s: float,
    hold_s: float,
) -> tuple[dict[str, BatchChoice], dict[str, BatchLeft]]:
    """The batches to act on and the memory of each job's last batch change (see the module
    docstring). ``batches``: the plan's; ``allocations``: the round's final ones; ``held``:
    what each job held when the round read it; ``planned``: the batch each runs now (the
    store's planned batches); ``left``: the memory from the last round. A job of ``batches``
    that keeps its allocation and would change its batch in the direction opposite to its
    last change there, at most ``hold_s`` after it, keeps its planned batch; every change
    made on an unchanged allocation is remembered (when, and its direction), a
    change of allocation forgets the job's last change. Only the jobs of ``batches`` are
    remembered, and only for ``hold_s`` (its end included, as the churn figures count)."""
    out: dict[str, BatchChoice] = {}
    memory: dict[str, BatchLeft] = {}
    for name, choice in batches.items():
        now_batch = planned.get(name)
        before = left.get(name)
        alloc = allocations.get(name, Allocation())
        recent = before is not None and now_s - before.at_s <= hold_s  # as churn counts
        if before is not None and recent:
            memory[name] = before
        if now_batch is None or choice.batch_size == now_batch.global_batch_size:
            out[name] = choice
            continue
        rose = choice.batch_size > now_batch.global_batch_size
        same_place = alloc == held.get(name, Allocation()) and alloc.num_gpus == now_batch.gpus
        if same_place and before is not None and recent and rose != before.rose:
            out[name] = BatchChoice(
                now_batch.global_batch_size, now_batch.local_batch_size, now_batch.accum_steps
            )
            continue
        out[name] = choice
        if same_place:
            memory[name] = BatchLeft(now_s, rose)
        else:
            memory.pop(name, None)
    return out, memory
