"""Placement helpers shared by the fixed-size baselines."""

from __future__ import annotations

import numpy as np

from autoscaler.decide.views import ClusterView, JobView
from autoscaler.errors import InvalidInputError

__all__ = ["allowed_nodes", "on_allowed", "pack", "pack_on"]


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


def allowed_nodes(job: JobView, cluster: ClusterView) -> np.ndarray | None:
    """A mask of the nodes the job allows (:meth:`~autoscaler.decide.views.JobView.allows_node`: GPU
    type, market, offering; ``None``: it allows every node)."""
    if not job.restricts_nodes:
        return None
    return np.array([job.allows_node(n) for n in cluster.nodes], dtype=bool)


def on_allowed(job: JobView, cluster: ClusterView) -> bool:
    """Whether every node the job holds now is one it allows (nodes that left are not
    counted)."""
    if not job.restricts_nodes:
        return True
    return all(
        job.allows_node(cluster.nodes[i])
        for i in (cluster.index_of(n) for n in job.allocation)
        if i is not None
    )


def pack_on(num_gpus: int, free: np.ndarray, allowed: np.ndarray | None) -> tuple[int, ...] | None:
    """:func:`pack` on the ``allowed`` nodes only (``None``: all); ``None`` when they have
    fewer than ``num_gpus`` GPUs free (nothing is taken then)."""
    if allowed is None:
        return pack(num_gpus, free) if num_gpus <= int(free.sum()) else None
    room = np.where(allowed, free, 0)
    if num_gpus > int(room.sum()):
        return None
    row = pack(num_gpus, room)
    free -= np.asarray(row, dtype=free.dtype)
    return row
