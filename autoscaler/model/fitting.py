"""Online fitting of throughput models: each job's profiles per GPU type, refitted together.

The observer of the jobs (the simulator today, the controller later) records what the trainers
report with :meth:`ModelBook.record`; once per round :meth:`ModelBook.refit` refits every fit
whose profile really changed, all together in one vectorised call
(:func:`autoscaler.model.goodput_batch.fit_perf_params_many`), each warm-started from its previous
parameters; :meth:`ModelBook.perf` then answers with the fitted parameters.

**When a fit is stale.** A sample of a configuration (placement, micro-batch, accumulation
steps) already in the profile changes nothing. A new configuration is added to the profile; it
makes the fit stale only if the current parameters mispredict its iteration time by more than
``refit_tolerance`` (relative; 0 refits on every new configuration), or if there are no
parameters yet. A profile keeps at most ``max_samples`` configurations, the most recent ones
(an old one is dropped when a new one arrives), so that a long-lived job's refit costs stay
bounded.

Fits are keyed by ``(job, key)``: ``key`` is a GPU type, or ``None`` for the pooled fit of all
the job's profiles whatever type they ran on (what a type-unaware policy sees). Pure state and
numbers: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field

from autoscaler.errors import InvalidInputError
from autoscaler.model.goodput import PerfParams, ProfileSample, predict_step_time_s
from autoscaler.model.goodput_batch import fit_perf_params_many

__all__ = ["ModelBook"]

_ConfigKey = tuple[tuple[int, ...], int, int]


@dataclass
class _Fit:
    profile: dict[_ConfigKey, ProfileSample] = field(default_factory=dict)
    perf: PerfParams | None = None
    stale: bool = False


class ModelBook:
    """Profiles and fitted throughput parameters per (job, key); see the module docstring.

    ``refits`` counts the fits redone so far, ``refit_rounds`` the :meth:`refit` calls that had
    something to do.
    """

    def __init__(self, refit_tolerance: float = 0.05, max_samples: int = 64) -> None:
        if not refit_tolerance >= 0:
            raise InvalidInputError("refit_tolerance must be >= 0", field="refit_tolerance")
        if max_samples < 1:
            raise InvalidInputError("max_samples must be >= 1", field="max_samples")
        self.refit_tolerance = float(refit_tolerance)
        self.max_samples = int(max_samples)
        self._fits: dict[Hashable, dict[str | None, _Fit]] = {}
        self.refits = 0
        self.refit_rounds = 0

    def record(self, job: Hashable, key: str | None, sample: ProfileSample) -> bool:
        """Add ``sample`` to the profile of ``(job, key)``; returns whether that fit is now
        stale (see the module docstring)."""
        fit = self._fits.setdefault(job, {}).setdefault(key, _Fit())
        config = (sample.placement, sample.local_bsz, sample.accum_steps)
        if config in fit.profile:
            return fit.stale
        fit.profile[config] = sample
        if len(fit.profile) > self.max_samples:
            del fit.profile[next(iter(fit.profile))]
        if fit.perf is None:
            fit.stale = True
        elif not fit.stale:
            predicted = float(
                predict_step_time_s(
                    fit.perf,
                    sample.num_nodes,
                    sample.num_gpus,
                    sample.local_bsz,
                    sample.accum_steps,
                )
            )
            error = abs(predicted - sample.step_time_s)
            fit.stale = error > self.refit_tolerance * sample.step_time_s
        return fit.stale

    def refit(self) -> int:
        """Refit every stale fit, together, warm-started; returns how many."""
        stale = [
            (k, f) for fits in self._fits.values() for k, f in fits.items() if f.stale and f.profile
        ]
        if not stale:
            return 0
        params = fit_perf_params_many(
            [list(f.profile.values()) for _, f in stale], warm=[f.perf for _, f in stale]
        )
        for (_, fit), perf in zip(stale, params, strict=True):
            fit.perf = perf
            fit.stale = False
        self.refits += len(stale)
        self.refit_rounds += 1
        return len(stale)

    def perf(self, job: Hashable, key: str | None) -> PerfParams | None:
        """The fitted parameters of ``(job, key)`` (``None`` before its first refit)."""
        fit = self._fits.get(job, {}).get(key)
        return None if fit is None else fit.perf

    def keys(self, job: Hashable) -> Iterator[str | None]:
        """The keys ``job`` has a profile under."""
        return iter(tuple(self._fits.get(job, {})))

    def restore(
        self,
        job: Hashable,
        key: str | None,
        samples: Sequence[ProfileSample],
        perf: PerfParams | None,
    ) -> None:
        """Put back a profile and its fit as they were saved (a restarted observer): the fit
        is not redone (stale only if ``perf`` is ``None``), so models are what they were."""
        fit = _Fit()
        for sample in list(samples)[-self.max_samples :]:
            fit.profile[(sample.placement, sample.local_bsz, sample.accum_steps)] = sample
        fit.perf = perf
        fit.stale = perf is None and bool(fit.profile)
        self._fits.setdefault(job, {})[key] = fit

    def samples(self, job: Hashable, key: str | None) -> tuple[ProfileSample, ...]:
        """The profile of ``(job, key)``, oldest first (empty if none)."""
        fit = self._fits.get(job, {}).get(key)
        return () if fit is None else tuple(fit.profile.values())

    def profile_size(self, job: Hashable, key: str | None) -> int:
        fit = self._fits.get(job, {}).get(key)
        return 0 if fit is None else len(fit.profile)

    def drop(self, job: Hashable) -> None:
        """Forget everything about ``job`` (it finished)."""
        self._fits.pop(job, None)
