"""Scheduling policies: pure functions from one round's state to a plan.

Every policy has the same shape (:class:`Policy`): ``decide(round_input, state)`` takes the
round's :class:`~autoscaler.jobs.RoundInput` and the policy's own state from the previous round
(``initial_state()`` at first) and returns a :class:`Decision` — the :class:`~autoscaler.jobs.Plan`
and the state to pass next round. No I/O, no clock: the same input, state and seed give the same
decision. The simulator and the controller call the same objects.

Policies:

- ``pollux`` (:mod:`autoscaler.policy.pollux`) — co-adaptive: a genetic search over replica
  matrices maximising the power mean of goodput speedups, batch size from the goodput model;
- ``tiresias`` (:mod:`autoscaler.policy.tiresias`) — two-queue discretised least attained
  service, gang-scheduled at the user's GPU count and batch size;
- ``optimus`` (:mod:`autoscaler.policy.optimus`) — Optimus+Oracle: greedy GPU assignment by
  marginal reduction of (oracle) remaining time, at the user's batch size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from autoscaler.errors import InvalidInputError
from autoscaler.jobs import ClusterView, JobView, Plan, PolicyName, RoundInput

__all__ = ["Decision", "Policy", "PolicyName", "make_policy"]


@dataclass(frozen=True)
class Decision:
    """A policy's output for one round: the plan, and the state to hand back next round."""

    plan: Plan
    state: Any


class Policy(Protocol):
    """The interface every scheduling policy implements.

    ``uses_model``/``uses_oracle`` tell the observer which optional :class:`JobView` fields the
    policy reads (so it can skip fitting models or computing oracles for policies that do not).
    ``avoids_interference`` says whether the policy honours
    ``ClusterView.interference_avoidance``. ``gpu_bounds`` gives the fewest and most GPUs the
    policy may give a job this round (0 = the job may be left waiting).
    """

    name: PolicyName
    uses_model: bool
    uses_oracle: bool
    avoids_interference: bool

    def initial_state(self) -> Any: ...

    def decide(self, round_input: RoundInput, state: Any) -> Decision: ...

    def gpu_bounds(self, job: JobView, cluster: ClusterView) -> tuple[int, int]: ...


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
    if kind is PolicyName.POLLUX:
        from autoscaler.policy.pollux import PolluxPolicy

        return PolluxPolicy(seed=seed, **options)
    if kind is PolicyName.TIRESIAS:
        from autoscaler.policy.tiresias import TiresiasPolicy

        return TiresiasPolicy(**options)
    from autoscaler.policy.optimus import OptimusPolicy

    return OptimusPolicy(**options)
