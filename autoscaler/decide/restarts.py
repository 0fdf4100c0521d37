"""What a restart costs a job's goodput: the one rule the policy and the fleet sizing share.

A change of a running job's allocation (more or fewer GPUs, other instances, another type)
stops it for ``restart_delay_s``. Over the time the new allocation serves, ``H``, the smaller
of the job's time left and :data:`RESTART_HORIZON_S`, only ``max(H - delay, 0) / H`` of it is
productive: the *restart factor*. The ``coadapt`` policy multiplies a candidate allocation's
goodput by it (its ``"horizon"`` rule), so a running job grows only when the new goodput beats
the current one by more than the restart; the fleet sizing values the growth of a running job
the same way (:func:`autoscaler.decide.strategies.demands_of`), so that it buys no instance for
a growth the policy will not make.
"""

from __future__ import annotations

from typing import Final

import numpy as np

__all__ = ["RESTART_HORIZON_S", "restart_factor", "restart_factors"]

RESTART_HORIZON_S: Final = 145.0
"""The longest time a new allocation is counted to serve (the ``coadapt`` policy's
``restart_horizon_s`` default, tuned with it)."""


def restart_factors(
    time_left_s: np.ndarray, delay_s: float, horizon_s: float = RESTART_HORIZON_S
) -> np.ndarray:
    """The restart factor of each time left (``inf``: unknown), see the module docstring."""
    horizon = np.maximum(np.minimum(np.asarray(time_left_s, dtype=float), horizon_s), 1e-9)
    return np.maximum(horizon - delay_s, 0.0) / horizon


def restart_factor(
    time_left_s: float | None, delay_s: float, horizon_s: float = RESTART_HORIZON_S
) -> float:
    """:func:`restart_factors` of one job (``None``: its time left is unknown)."""
    left = np.inf if time_left_s is None else time_left_s
    return float(restart_factors(np.array([left]), delay_s, horizon_s)[0])
