"""The interface every scheduling policy implements, and its output (see
:mod:`autoscaler.decide.policy`).

The policy modules import these from here, never from the package ``__init__``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from autoscaler.decide.views import ClusterView, JobView, Plan, PolicyName, RoundInput

__all__ = ["Decision", "Policy"]


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
