"""Placement helpers shared by the fixed-size baselines."""

from __future__ import annotations

import numpy as np

from autoscaler.errors import InvalidInputError

__all__ = ["pack"]


def pack(num_gpus: int, free: np.ndarray) -> tuple[int, ...]:
    """Take ``num_gpus`` GPUs from ``free`` (GPUs free per node, updated in place), repeatedly
    from the node with the most free GPUs (lowest index on ties), so a job lands on as few
    nodes as the free space allows. Returns the GPUs taken per node (a dense row).

    Raises :class:`InvalidInputError` if fewer than ``num_gpus`` GPUs are free.
    """
    if num_gpus > int(free.sum()):
        raise InvalidInputError(
            f"cannot place {num_gpus} GPUs: only {int(free.sum())} free", field="num_gpus"
        )
    alloc = np.zeros(len(free), dtype=np.int64)
    left = num_gpus
    while left > 0:
        node = int(np.argmax(free))
        take = min(int(free[node]), left)
        alloc[node] += take
        free[node] -= take
        left -= take
    return tuple(int(g) for g in alloc)
