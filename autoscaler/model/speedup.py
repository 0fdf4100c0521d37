"""Per-job speedup tables over allocations, cached and vectorised.

``speedup(job, allocation) = best goodput on the allocation / best goodput on one GPU`` — the
quantity Pollux's fairness objective averages. A ``SpeedupTable`` evaluates every allocation
``(num_nodes, num_gpus)`` with ``1 <= num_nodes <= max_nodes`` and
``num_nodes <= num_gpus <= max_gpus`` once, in a single vectorised ``GoodputModel.optimize``
call, and then answers lookups by array indexing. ``SpeedupCache`` keeps one table per job and
rebuilds it only when that job's model (parameters, gradient statistics or limits) changes.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
from numpy.typing import ArrayLike

from autoscaler.errors import InvalidInputError
from autoscaler.model.goodput import GoodputModel


class SpeedupTable:
    """Speedups and best batch configurations for every allocation up to a size.

    Allocations outside the table (more nodes than GPUs, zero GPUs, beyond the maxima) and
    allocations with no feasible batch configuration have speedup 0.
    """

    def __init__(self, model: GoodputModel, max_nodes: int, max_gpus: int) -> None:
        if max_nodes < 1 or max_gpus < 1:
            raise InvalidInputError("max_nodes and max_gpus must be >= 1", field="max_nodes")
        self.model = model
        self.max_nodes = int(max_nodes)
        self.max_gpus = int(max_gpus)
        nodes, gpus = np.meshgrid(
            np.arange(self.max_nodes + 1), np.arange(self.max_gpus + 1), indexing="ij"
        )
        valid = (nodes >= 1) & (gpus >= nodes)
        cfg = model.optimize(np.where(valid, nodes, 1), np.where(valid, gpus, 0))
        self._goodput = np.where(valid, cfg.goodput, 0.0)
        self._batch_size = np.where(valid, cfg.batch_size, 0)
        self._local_bsz = np.where(valid, cfg.local_bsz, 0)
        self._accum_steps = np.where(valid, cfg.accum_steps, 0)
        base = float(self._goodput[1, 1]) if self.max_gpus >= 1 else 0.0
        if base <= 0:
            # One GPU cannot run the job within its limits (e.g. M0 needs more micro-batches
            # than allowed): normalise by the best small allocation instead, so ratios stay
            # meaningful.
            positive = self._goodput[self._goodput > 0]
            base = float(positive.min()) if positive.size else 1.0
        self.base_goodput = base
        self._speedup = self._goodput / base

    def _index(self, num_nodes: ArrayLike, num_gpus: ArrayLike) -> tuple[np.ndarray, ...]:
        n = np.asarray(num_nodes, dtype=np.int64)
        k = np.asarray(num_gpus, dtype=np.int64)
        inside = (n >= 0) & (n <= self.max_nodes) & (k >= 0) & (k <= self.max_gpus)
        return np.where(inside, n, 0), np.where(inside, k, 0), inside

    def speedup(self, num_nodes: ArrayLike, num_gpus: ArrayLike) -> np.ndarray:
        """Speedup per allocation (broadcasting); 0 outside the table or when infeasible."""
        n, k, inside = self._index(num_nodes, num_gpus)
        return np.where(inside, self._speedup[n, k], 0.0)

    def goodput(self, num_nodes: ArrayLike, num_gpus: ArrayLike) -> np.ndarray:
        """Best goodput per allocation (broadcasting)."""
        n, k, inside = self._index(num_nodes, num_gpus)
        return np.where(inside, self._goodput[n, k], 0.0)

    def batch_config(self, num_nodes: int, num_gpus: int) -> tuple[int, int, int]:
        """(total batch size, local batch, accumulation steps) chosen for one allocation.

        Zeros when the allocation is outside the table or infeasible.
        """
        n, k, inside = self._index(num_nodes, num_gpus)
        if not bool(inside):
            return (0, 0, 0)
        return (
            int(self._batch_size[n, k]),
            int(self._local_bsz[n, k]),
            int(self._accum_steps[n, k]),
        )


class SpeedupCache:
    """One ``SpeedupTable`` per job, rebuilt only when the job's model changes."""

    def __init__(self, max_nodes: int, max_gpus: int) -> None:
        self.max_nodes = max_nodes
        self.max_gpus = max_gpus
        self._tables: dict[Hashable, SpeedupTable] = {}
        self.builds = 0  # how many tables were (re)built; lets callers check caching

    def get(self, job_id: Hashable, model: GoodputModel) -> SpeedupTable:
        table = self._tables.get(job_id)
        if table is None or table.model != model:
            table = SpeedupTable(model, self.max_nodes, self.max_gpus)
            self._tables[job_id] = table
            self.builds += 1
        return table

    def drop(self, job_id: Hashable) -> None:
        self._tables.pop(job_id, None)

    def __len__(self) -> int:
        return len(self._tables)
