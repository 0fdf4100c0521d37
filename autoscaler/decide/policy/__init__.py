"""Scheduling policies: pure functions from one round's state to a plan.

Every policy has the same shape (:class:`~autoscaler.decide.policy.base.Policy`):
``decide(round_input, state)`` takes the round's :class:`~autoscaler.decide.views.RoundInput` and
the policy's own state from the previous round (``initial_state()`` at first) and returns a
:class:`~autoscaler.decide.policy.base.Decision` — the :class:`~autoscaler.decide.views.Plan` and
the state to pass next round. No I/O, no clock: the same input, state and seed give the same
decision. The simulator and the controller call the same objects.

Policies:

- ``coadapt`` (:mod:`autoscaler.decide.policy.coadapt`) — the default: type-aware co-adaptive
  scheduling, a deterministic knapsack over each job's menu of (GPU type, GPU count) shapes;
- ``pollux`` (:mod:`autoscaler.decide.policy.pollux`) — co-adaptive: a genetic search over replica
  matrices maximising the power mean of goodput speedups, batch size from the goodput model;
- ``tiresias`` (:mod:`autoscaler.decide.policy.tiresias`) — two-queue discretised least attained
  service, gang-scheduled at the user's GPU count and batch size;
- ``optimus`` (:mod:`autoscaler.decide.policy.optimus`) — Optimus+Oracle: greedy GPU assignment by
  marginal reduction of (oracle) remaining time, at the user's batch size.

The interface lives in :mod:`autoscaler.decide.policy.base`, which the policy modules import; this
package module only builds policies by name (importing each policy module lazily), so no policy
module ever imports the package back.
"""

from __future__ import annotations

from typing import Any

from autoscaler.decide.policy.base import Policy
from autoscaler.decide.views import PolicyName
from autoscaler.errors import InvalidInputError

__all__ = ["make_policy"]


def make_policy(name: str | PolicyName, *, seed: int = 0, **options: Any) -> Policy:
    """Build a policy by name. ``seed`` drives any randomised search (Pollux's genetic
    algorithm); ``options`` are passed to the policy's constructor. Raises
    :class:`InvalidInputError` for an unknown name."""
    try:
        kind = PolicyName(name)
    except ValueError:
        choices = ", ".join(p.value for p in PolicyName)
        raise InvalidInputError(
            f"unknown policy {name!r}; expected one of {choices}", field="policy"
        ) from None
    if kind is PolicyName.COADAPT:
        from autoscaler.decide.policy.coadapt import CoadaptPolicy

        return CoadaptPolicy(**options)
    if kind is PolicyName.POLLUX:
        from autoscaler.decide.policy.pollux import PolluxPolicy

        return PolluxPolicy(seed=seed, **options)
    if kind is PolicyName.TIRESIAS:
        from autoscaler.decide.policy.tiresias import TiresiasPolicy

        return TiresiasPolicy(**options)
    from autoscaler.decide.policy.optimus import OptimusPolicy

    return OptimusPolicy(**options)
