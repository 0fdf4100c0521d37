"""Job lengths learned online from the cluster's finished jobs: how much service a job of
unknown length is expected to still need, given the service it has had.

A controller learns nothing of a job's length unless its script declares one. What it does
see is the attained service (GPU-seconds) at which each of its completed jobs ended
(:attr:`~autoscaler.decide.views.RoundInput.finished_gpu_s`): an empirical distribution of job
lengths, the one Tiresias (Gu et al., NSDI'19, section 4.1) computes its Gittins index from.
For a job that has had ``a`` GPU-seconds, with ``R = L - a`` the residual of a finished length
``L > a``:

* ``"expected"``: the mean residual ``E[L - a | L > a]``, the expected remaining service;
* ``"gittins"``: the reciprocal of the Gittins index (Gittins, J. R. Stat. Soc. B 41, 1979;
  as Tiresias uses it), ``min over quanta D of E[min(R, D)] / P(R <= D)``: the least expected
  service spent per completion over any quantum, itself a service time (with ``D`` past
  every residual it is the mean residual, so it is never above ``"expected"``); a job likely to
  end within a short quantum counts as short;
* ``"censored"``: the mean residual of the Kaplan-Meier estimate (Kaplan and Meier, JASA 53,
  1958) that also counts the jobs still running (the ``attained_gpu_s`` passed) as lengths of
  at least their service, right-censored: only jobs that ended early have finished at first,
  and the finished lengths alone understate the lengths of the jobs that run; the mass left
  past the last observation ``t`` is taken to run ``t`` more (Gott, below).

Where the finished jobs say nothing -- fewer than :data:`MIN_FINISHED_JOBS` have finished, or
the job has already outlived every one of them -- the prior is Gott's Copernican rule (J. R.
Gott III, Nature 363, 315-319, 1993): with nothing else known, a process that has lasted ``a``
is as likely to end before ``2a`` as after, so its remaining service is taken to be ``a``
(job lengths are heavy-tailed: one that has run longer is expected to run longer still). Every
result is floored at ``floor_gpu_s`` (the caller passes one GPU for the longer of a round and a
restart, the least a job that runs at all receives; service below it is the job's start), so a
job that has not run yet is not taken as done.
No constant here is fitted to any workload: the quantities come from the finished jobs,
the prior from Gott's argument, :data:`MIN_FINISHED_JOBS` says only how few samples are too
few to call a distribution.

Pure: numbers in, numbers out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from autoscaler.errors import InvalidInputError

__all__ = ["LENGTH_RULES", "MIN_FINISHED_JOBS", "remaining_service_gpu_s"]

MIN_FINISHED_JOBS: Final = 5
"""Below this many finished jobs the learned distribution is not used (Gott's prior is)."""
LENGTH_RULES: Final = ("expected", "gittins", "censored")


def _censored(attained: np.ndarray, lengths: np.ndarray, floor_gpu_s: float) -> np.ndarray:
    """The ``"censored"`` rule: Kaplan-Meier over the finished lengths (events) and the
    running jobs' attained service (censored), the mass left past the last observation
    ``t`` taken to run ``t`` more (Gott); a job at or past ``t``: Gott's prior."""
    times = np.concatenate((lengths, attained))
    event = np.concatenate((np.ones(lengths.size), np.zeros(attained.size)))
    t_max = float(np.max(times))
    ev_times = np.unique(lengths)
    at_risk = np.array([np.count_nonzero(times >= t) for t in ev_times], dtype=float)
    deaths = np.array([np.count_nonzero((times == t) & (event == 1)) for t in ev_times])
    surv = np.cumprod(1.0 - deaths / at_risk)  # S just after each event time
    knots = np.concatenate(([0.0], ev_times, [t_max]))
    level = np.concatenate(([1.0], surv))  # S on [knots[i], knots[i + 1])
    out = np.maximum(attained, floor_gpu_s)
    tail = float(level[-1]) * t_max
    for j, a in enumerate(attained):
        if a >= t_max:
            continue
        i = int(np.searchsorted(knots, a, side="right")) - 1
        s_a = float(level[i])
        if s_a <= 0:
            continue
        area = s_a * (knots[i + 1] - a) + float(np.dot(level[i + 1 :], np.diff(knots[i + 1 :])))
        out[j] = max((area + tail) / s_a, floor_gpu_s)
    return out


def remaining_service_gpu_s(
    attained_gpu_s: Sequence[float] | np.ndarray,
    finished_gpu_s: Sequence[float] | np.ndarray,
    *,
    rule: str = "expected",
    floor_gpu_s: float = 1.0,
) -> np.ndarray:
    """Each job's expected remaining service (GPU-seconds) by ``rule`` (the module
    docstring), given its attained service and the finished jobs' lengths. Every value is
    finite and >= ``floor_gpu_s``. :class:`InvalidInputError` for an unknown rule, a
    non-finite or negative input, or ``floor_gpu_s <= 0``."""
    if rule not in LENGTH_RULES:
        raise InvalidInputError(f"rule must be one of {LENGTH_RULES}, got {rule!r}", field="rule")
    if not (np.isfinite(floor_gpu_s) and floor_gpu_s > 0):
        raise InvalidInputError("floor_gpu_s must be > 0", field="floor_gpu_s")
    attained = np.asarray(attained_gpu_s, dtype=float).reshape(-1)
    lengths = np.sort(np.asarray(finished_gpu_s, dtype=float).reshape(-1))
    for name, values in (("attained_gpu_s", attained), ("finished_gpu_s", lengths)):
        if values.size and not (np.all(np.isfinite(values)) and np.all(values >= 0)):
            raise InvalidInputError(f"{name} must be finite and >= 0", field=name)
    out = np.maximum(attained, floor_gpu_s)  # Gott's prior: as long again as it has run
    if lengths.size < MIN_FINISHED_JOBS:
        return out
    if rule == "censored":
        return _censored(attained, lengths, floor_gpu_s)
    n = lengths.size
    prefix = np.concatenate(([0.0], np.cumsum(lengths)))
    first = np.searchsorted(lengths, attained, side="right")  # the lengths above each job's
    for j in np.flatnonzero(first < n):
        a, lo = float(attained[j]), int(first[j])
        m = n - lo
        if rule == "expected":
            rem = (prefix[n] - prefix[lo]) / m - a
        else:
            # Quantum D = the k-th smallest residual r_k (k = 1..m): E[min(R, D)] x m is the
            # sum of the k smallest residuals plus (m - k) x r_k, P(R <= D) x m is k (the
            # last of tied residuals gives the smallest ratio, so ties need no care).
            k = np.arange(1, m + 1, dtype=float)
            resid = lengths[lo:] - a
            spent = (prefix[lo + 1 : n + 1] - prefix[lo]) - k * a + (m - k) * resid
            rem = float(np.min(spent / k))
        out[j] = max(float(rem), floor_gpu_s)
    return out
