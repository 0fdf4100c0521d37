"""The Pollux scheduling policy (Qiao et al., OSDI'21, Section 4.2), vectorised.

Each round, Pollux searches over *replica matrices* ``A`` (jobs x nodes, ``A[j, n]`` = GPUs of
job ``j`` on node ``n``) for the one that maximises the cluster-wide fitness::

    FITNESS_p(A) = ( sum_j SPEEDUP_j(A_j)^p / J )^(1/p)          (power mean, p = -1 default)
    SPEEDUP_j(A_j) = max_batch GOODPUT_j(A_j) / max_batch GOODPUT_j(fair share)

where ``GOODPUT_j`` is job ``j``'s goodput model fitted online from its own profiles
(:mod:`autoscaler.model.goodput`), maximised over the batch configuration for the allocation, and
the fair share is ``ceil(total GPUs / J)`` GPUs packed onto the fewest nodes. ``p < 0`` favours
fairness: a job left without GPUs drags the mean towards 0. A job that has never run has no
model yet; its speedup is taken as linear, ``GPUs / fair-share GPUs``.

The search is a genetic algorithm over a population of replica matrices (``population`` x
``generations``), warm-started from the previous round's final population and always containing
the current allocation. Operators, all vectorised over the population:

- *selection*: binary tournaments on fitness;
- *crossover*: single-point over the job axis (rows before the point from one parent, after it
  from the other);
- *mutation*: reset a job's row to its current allocation (probability 0.1); zero some of a
  job's entries; grow jobs on nodes with free GPUs, to a random count up to the node's
  capacity — each such node is grown by about one job drawn from all jobs and one of the jobs
  already on it (per job and node, probabilities ``1 / jobs`` and ``1 / jobs on the node``).
  Growth is per free node, not per job: when every job grew at once, a crowded cluster (tens
  of jobs, a few free GPUs) got children so over-subscribed that repair emptied other jobs in
  every one of them, the search stalled at the current allocation and jobs waited beside idle
  GPUs — the cause of this policy's drift above the published results as load grew;
- *repair*, in this order: at most one multi-node job per node (interference avoidance, when
  asked for; earlier jobs in priority order keep their place); at most ``max_gpus`` per job
  (excess removed from randomly ordered nodes); node capacity (GPUs taken from the
  lowest-priority jobs first);
- *survival*: the best ``population`` distinct individuals of parents and children (elitist;
  duplicates only fill places left over — without this, copies of the incumbent crowd the
  population and the search stalls).

The search runs all ``generations`` unless ``patience`` is set; on the paper's workloads it is
still improving after 100 generations, so stopping early costs JCT.

Jobs are prioritised (for repair) by least attained service, then by submission time.

**Restart penalty.** A job whose row differs from its current allocation must restart; its
speedup is multiplied by ``max(age - restarts * delay, 0) / (age + delay)``, so young jobs and
jobs restarted often are moved reluctantly.

**Exploration.** A job may get at most ``exploration_factor`` (2) times the largest number of
GPUs it has been profiled on (1 GPU before its first profile), never more than its largest
batch allows (``max_batch_size // min_local_bsz``) nor the cluster.

**Batch size.** Each running job's batch configuration is the goodput-optimal one for its new
allocation (via its :class:`~autoscaler.model.speedup.SpeedupTable`); a job without a model runs at
``max(M0, min_local_bsz * GPUs)``. A job whose user opted out of adaptation
(``JobView.adaptive`` false) keeps its own batch size and at most its requested GPUs.

The policy is pure: the same :class:`~autoscaler.decide.views.RoundInput`, state and seed give the
same plan. Its state (:class:`PolluxState`) carries the final population and the jobs' speedup
tables (rebuilt only when a job's model or GPU cap changes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from autoscaler.decide.policy.base import Decision
from autoscaler.decide.views import (
    Allocation,
    BatchChoice,
    ClusterView,
    JobView,
    Plan,
    PolicyName,
    RoundInput,
    fixed_batch_choice,
)
from autoscaler.errors import InvalidInputError
from autoscaler.model.goodput import GoodputModel
from autoscaler.model.speedup import SpeedupTable

__all__ = ["PolluxOptions", "PolluxPolicy", "PolluxState", "power_mean"]

_EPS = 1e-3  # added to every speedup in the power mean, so a job with no GPUs stays finite


@dataclass(frozen=True)
class PolluxOptions:
    """Tunables of the Pollux policy (defaults as in the paper, except the population).

    ``population`` x ``generations``: genetic-algorithm size. The paper uses 100 x 100; with
    duplicate-free survival, 64 individuals reach about the same best fitness, cold-started,
    5 seeds (``benchmarks/ga_population.py``): on six rounds (5-8 jobs) of the paper's
    workload-1 at 0.5x load (defaults), mean best fitness 0.16952 (64, every seed) vs 0.16956
    (100), a decision 0.064 s vs 0.084 s; on a crowded round (31 jobs; ``--load 1.0
    --arrival-scale 2 --min-jobs 30 --every 20``), 0.15048 vs 0.15086 (-0.25%), 0.16 s vs
    0.21 s, no job left waiting by either. ``power``: the power-mean
    exponent ``p`` (0 = geometric mean); ``restart_penalty``: apply the restart factor;
    ``exploration_factor``: GPU cap as a multiple of the largest profiled GPU count;
    ``max_gpus_per_job``: hard cap on any job; ``reset_prob``/``zero_prob``: mutation rates;
    ``patience``: stop the search early once the best fitness has not improved for this many
    generations (``None``: always run all ``generations``).
    """

    population: int = 64
    generations: int = 100
    power: float = -1.0
    restart_penalty: bool = True
    exploration_factor: float = 2.0
    max_gpus_per_job: int = 64
    reset_prob: float = 0.1
    zero_prob: float = 0.1
    patience: int | None = None

    def __post_init__(self) -> None:
        if self.population < 2 or self.generations < 0:
            raise InvalidInputError(
                "population must be >= 2 and generations >= 0", field="population"
            )
        if self.patience is not None and self.patience < 1:
            raise InvalidInputError("patience must be >= 1 or None", field="patience")
        if not math.isfinite(self.power) or self.power > 1:
            raise InvalidInputError("power must be finite and <= 1", field="power")
        if self.exploration_factor < 1 or self.max_gpus_per_job < 1:
            raise InvalidInputError(
                "exploration_factor and max_gpus_per_job must be >= 1",
                field="exploration_factor",
            )


@dataclass(frozen=True, eq=False)
class _TableEntry:
    model: GoodputModel
    max_gpus: int
    max_nodes: int
    table: SpeedupTable
    fair_goodput: dict[tuple[int, int], float] = field(default_factory=dict)  # memo

    def fair(self, num_nodes: int, num_gpus: int) -> float:
        """Best goodput on the fair-share allocation (memoised)."""
        key = (num_nodes, num_gpus)
        value = self.fair_goodput.get(key)
        if value is None:
            value = float(self.model.optimize(num_nodes, num_gpus).goodput)
            if value <= 0:
                value = self.table.base_goodput
            self.fair_goodput[key] = value
        return value


@dataclass(frozen=True, eq=False)
class PolluxState:
    """What Pollux carries from one round to the next.

    ``job_names`` labels the job axis and ``instance_keys`` the node axis of ``population`` (shape
    population x jobs x nodes): the next round maps both by name, so nodes that joined or left
    the fleet in between shift nothing; ``tables`` caches each job's speedup table with the
    model it was built from.
    """

    job_names: tuple[str, ...] = ()
    instance_keys: tuple[str, ...] = ()
    population: np.ndarray | None = None
    tables: Mapping[str, _TableEntry] = field(default_factory=dict)
    table_builds: int = 0


def _user_bounds(
    jobs: list[JobView], cluster: ClusterView
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The search's per-job GPU floor (``gpus.min``; exactly its GPUs for a job that does not
    adapt) and its allowed nodes (:meth:`~autoscaler.decide.views.JobView.allows_node`:
    ``gpu_types``, ``markets``, ``offerings``); ``None`` for either when no job sets it (the search
    is then exactly the paper's)."""
    floor = np.array([j.fewest_gpus for j in jobs], dtype=np.float32)
    allowed = None
    if any(j.restricts_nodes for j in jobs):
        allowed = np.array(
            [[j.allows_node(n) for n in cluster.nodes] for j in jobs], dtype=bool
        ).reshape(len(jobs), cluster.num_nodes)
    return (floor if (floor > 1).any() else None), allowed


def power_mean(values: np.ndarray, p: float, axis: int = -1) -> np.ndarray:
    """Power mean of ``values + 1e-3`` along ``axis`` (geometric mean for ``p == 0``)."""
    v = np.asarray(values, dtype=float) + _EPS
    if p == 0:
        return np.exp(np.mean(np.log(v), axis=axis))
    return np.mean(v**p, axis=axis) ** (1.0 / p)


class PolluxPolicy:
    """Goodput-driven co-adaptive scheduling (see the module docstring)."""

    name = PolicyName.POLLUX
    uses_model = True
    uses_oracle = False
    avoids_interference = True

    def __init__(self, seed: int = 0, options: PolluxOptions | None = None, **kwargs: object):
        if options is not None and kwargs:
            raise InvalidInputError("pass either options or keyword options", field="options")
        self.options = options or PolluxOptions(**kwargs)  # type: ignore[arg-type]
        self.seed = int(seed)

    def initial_state(self) -> PolluxState:
        return PolluxState()

    # ---- bounds ----------------------------------------------------------------------------

    def gpu_bounds(self, job: JobView, cluster: ClusterView) -> tuple[int, int]:
        """(0, cap): a job may wait; it may get at most ``exploration_factor`` x its largest
        profiled GPU count (1 before any profile), within its batch limits and the cluster."""
        opt = self.options
        explore = max(1, math.floor(opt.exploration_factor * job.max_profiled_gpus))
        by_batch = max(1, job.limits.max_batch_size // job.limits.min_local_bsz)
        cap = min(explore, by_batch, cluster.total_gpus, opt.max_gpus_per_job)
        return 0, cap if job.max_gpus is None else min(cap, job.max_gpus)

    # ---- the round -------------------------------------------------------------------------

    def decide(self, round_input: RoundInput, state: PolluxState) -> Decision:
        """One scheduling round (see the module docstring)."""
        cluster = round_input.cluster
        opt = self.options
        if not round_input.jobs:
            return Decision(Plan({}, {}), PolluxState(table_builds=state.table_builds))
        jobs = sorted(round_input.jobs, key=lambda j: (j.attained_gpu_s, j.submit_time_s, j.name))
        num_jobs = len(jobs)
        capacity = np.asarray(cluster.gpus_per_node, dtype=np.int16)
        max_gpus = np.array([self.gpu_bounds(j, cluster)[1] for j in jobs], dtype=np.int16)

        speed, tables, builds = self._speedups(jobs, cluster, max_gpus, state)
        base = np.array([cluster.dense(j.allocation) for j in jobs], dtype=np.int16)
        if opt.restart_penalty:
            delay = cluster.restart_delay_s
            age = np.array([j.age_s for j in jobs])
            restarts = np.array([j.num_restarts for j in jobs])
            penalty = np.maximum(age - restarts * delay, 0.0) / (age + delay)
        else:
            penalty = np.ones(num_jobs)

        floor, allowed = _user_bounds(jobs, cluster)
        search = _Search(
            speed=speed,
            base=base,
            capacity=capacity,
            max_gpus=max_gpus,
            min_gpus=floor,
            allowed=allowed,
            penalty=penalty,
            power=opt.power,
            avoid_interference=cluster.interference_avoidance,
            rng=np.random.default_rng([self.seed, cluster.round_index, num_jobs]),
            reset_prob=opt.reset_prob,
            zero_prob=opt.zero_prob,
        )
        population = self._initial_population(jobs, cluster.instance_keys, base, state)
        population, _ = search.run(population, opt.generations, opt.patience)
        best = population[0]

        allocations: dict[str, Allocation] = {}
        batches: dict[str, BatchChoice] = {}
        for j, job in enumerate(jobs):
            row = tuple(int(g) for g in best[j])
            allocations[job.name] = cluster.sparse(row)
            if sum(row):
                batches[job.name] = self._batch(job, tables.get(job.name), row)
        names = tuple(job.name for job in jobs)
        population.setflags(write=False)
        new_state = PolluxState(names, cluster.instance_keys, population, tables, builds)
        return Decision(Plan(allocations, batches, cluster.fleet()), new_state)

    # ---- helpers ---------------------------------------------------------------------------

    def _speedups(
        self,
        jobs: list[JobView],
        cluster: ClusterView,
        max_gpus: np.ndarray,
        state: PolluxState,
    ) -> tuple[np.ndarray, dict[str, _TableEntry], int]:
        """Per-job speedup lookup ``speed[j, nodes, gpus]``, scaled so that a node's worth of
        fair-share speedup is 1 (only the 1e-3 floor of the power mean sees the scale)."""
        num_jobs = len(jobs)
        total = cluster.total_gpus
        per_node = max(cluster.gpus_per_node)
        top = int(max_gpus.max())
        max_nodes = min(cluster.num_nodes, top)
        speed = np.zeros((num_jobs, max_nodes + 1, top + 1))
        gpus_axis = np.arange(top + 1)
        tables: dict[str, _TableEntry] = {}
        builds = state.table_builds
        fair_gpus_all = max(1, math.ceil(total / num_jobs))
        for j, job in enumerate(jobs):
            cap = int(max_gpus[j])
            by_batch = max(1, job.limits.max_batch_size // job.limits.min_local_bsz)
            fair_gpus = min(fair_gpus_all, by_batch)
            if job.model is None:
                speed[j, 1:, :] = gpus_axis / fair_gpus
                speed[j, :, 0] = 0.0
                continue
            nodes_cap = min(cluster.num_nodes, cap)
            if not job.adaptive:  # Fixed batch size: goodput of that batch on each allocation.
                n = np.arange(max_nodes + 1)[:, None]
                g = np.broadcast_to(gpus_axis[None, :], (max_nodes + 1, top + 1))
                n_ok = np.broadcast_to(np.minimum(n, np.maximum(g, 1)), g.shape)
                fixed = job.model.optimize(n_ok, g, fixed_batch_size=job.fixed_batch_size)
                fair = job.model.optimize(
                    max(1, math.ceil(fair_gpus / per_node)),
                    fair_gpus,
                    fixed_batch_size=job.fixed_batch_size,
                )
                good = np.where((n >= 1) & (g >= n) & (g <= cap), fixed.goodput, 0.0)
                speed[j] = good / max(float(fair.goodput), 1e-12)
                continue
            entry = state.tables.get(job.name)
            if (
                entry is None
                or entry.max_gpus != cap
                or entry.max_nodes != nodes_cap
                or entry.model != job.model
            ):
                entry = _TableEntry(
                    job.model, cap, nodes_cap, SpeedupTable(job.model, nodes_cap, cap)
                )
                builds += 1
            tables[job.name] = entry
            fair_nodes = max(1, math.ceil(fair_gpus / per_node))
            base = entry.fair(fair_nodes, fair_gpus)
            n = np.arange(max_nodes + 1)[:, None]
            speed[j] = entry.table.goodput(n, gpus_axis[None, :]) / base
        speed *= cluster.num_nodes / total
        return speed, tables, builds

    def _initial_population(
        self,
        jobs: list[JobView],
        instance_keys: tuple[str, ...],
        base: np.ndarray,
        state: PolluxState,
    ) -> np.ndarray:
        """The previous final population mapped onto this round's jobs and nodes by name (new
        jobs and new nodes: no GPUs; nodes that left: dropped), or copies of the current
        allocation; the first individual is the current allocation."""
        size = self.options.population
        pop = np.zeros((size, len(jobs), len(instance_keys)), dtype=np.int16)
        prev = state.population
        if prev is not None and prev.shape[0] == size:
            jobs_before = {name: i for i, name in enumerate(state.job_names)}
            nodes_before = {instance_key: i for i, instance_key in enumerate(state.instance_keys)}
            cols = [
                (n, nodes_before[instance_key])
                for n, instance_key in enumerate(instance_keys)
                if instance_key in nodes_before
            ]
            now_cols = np.array([c[0] for c in cols], dtype=np.int64)
            old_cols = np.array([c[1] for c in cols], dtype=np.int64)
            for j, job in enumerate(jobs):
                i = jobs_before.get(job.name)
                if i is not None and cols:
                    pop[:, j, now_cols] = prev[:, i, old_cols]
        else:
            pop[:] = base
        pop[0] = base
        return pop

    @staticmethod
    def _batch(job: JobView, entry: _TableEntry | None, row: tuple[int, ...]) -> BatchChoice:
        gpus = sum(row)
        nodes = sum(1 for g in row if g)
        if not job.adaptive:
            return fixed_batch_choice(job.fixed_batch_size, gpus, job.limits)
        if entry is not None:
            total, local, accum = entry.table.batch_config(nodes, gpus)
            if total > 0:
                return BatchChoice(int(total), int(local), int(accum))
        limits = job.limits
        start = max(limits.init_batch_size, limits.min_local_bsz * gpus)
        return fixed_batch_choice(start, gpus, limits)


@dataclass
class _Search:
    """The genetic algorithm of one round.

    The public interface (``run``, ``mutate``, ``repair``, ``fitness``) takes and returns
    populations as int16 arrays of shape (population, jobs, nodes). Internally they are float32
    arrays of shape (jobs, population, nodes): job-major, so that the scans over jobs (node
    capacity, interference) walk contiguous slices, and per-(job, individual) sums over nodes
    are matrix-vector products — numpy's cumsum along a middle axis is an order of magnitude
    slower on these small arrays.
    """

    speed: np.ndarray  # (jobs, nodes + 1, gpus + 1) speedup lookup
    base: np.ndarray  # (jobs, nodes) current allocation
    capacity: np.ndarray  # (nodes,)
    max_gpus: np.ndarray  # (jobs,)
    penalty: np.ndarray  # (jobs,) restart factor
    power: float
    avoid_interference: bool
    rng: np.random.Generator
    reset_prob: float
    zero_prob: float
    min_gpus: np.ndarray | None = None  # (jobs,) the user's floor; None: 1 for every job
    allowed: np.ndarray | None = None  # (jobs, nodes) the nodes each job allows

    def __post_init__(self) -> None:
        num_jobs, num_nodes = self.base.shape
        self._floor = (
            None if self.min_gpus is None else np.asarray(self.min_gpus, np.float32)[:, None]
        )
        self._allowed = (
            None if self.allowed is None else np.asarray(self.allowed, np.float32)[:, None, :]
        )
        self._ones = np.ones(num_nodes, dtype=np.float32)
        self._base = self.base.astype(np.float32)[:, None, :]  # (jobs, 1, nodes)
        self._cap = np.asarray(self.capacity, dtype=np.float32)
        self._max = np.asarray(self.max_gpus, dtype=np.float32)[:, None]  # (jobs, 1)
        self._jidx = np.arange(num_jobs)[:, None]
        self._rank = (num_jobs - np.arange(num_jobs, dtype=np.float32))[:, None, None]
        self._upper = np.triu(np.ones((num_nodes, num_nodes), dtype=np.float32))
        self._lower = np.tril(np.ones((num_jobs, num_jobs), dtype=np.float32))
        # Random projection identifying individuals (to drop duplicates at survival).
        self._hash = np.random.default_rng(12345).random((num_jobs, num_nodes)).astype(np.float32)

    # ---- public (population, jobs, nodes) interface ------------------------------------------

    def run(
        self, pop: np.ndarray, generations: int, patience: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Evolve ``pop`` for up to ``generations``; returns the final population (best first)
        and its fitness. Stops early after ``patience`` generations without improvement."""
        x = self._to_internal(pop)
        size = x.shape[1]
        x = self._repair(self._mutate(x, keep_first=True))
        fit = self._fitness(x)
        order = np.argsort(-fit, kind="stable")
        x, fit = x[:, order], fit[order]
        stale = 0
        for _ in range(generations):
            parents = self._select(fit, 2 * size)
            children = self._crossover(x, parents[:size], parents[size:])
            children = self._repair(self._mutate(children))
            child_fit = self._fitness(children)
            merged = np.concatenate([x, children], axis=1)
            merged_fit = np.concatenate([fit, child_fit])
            keep = self._survivors(merged, merged_fit, size)
            improved = merged_fit[keep[0]] > fit[0] * (1 + 1e-9) + 1e-12
            x, fit = merged[:, keep], merged_fit[keep]
            stale = 0 if improved else stale + 1
            if patience is not None and stale >= patience:
                break
        return self._to_public(x), fit

    def fitness(self, pop: np.ndarray) -> np.ndarray:
        return self._fitness(self._to_internal(pop))

    def mutate(self, pop: np.ndarray, keep_first: bool = False) -> np.ndarray:
        return self._to_public(self._mutate(self._to_internal(pop), keep_first))

    def repair(self, pop: np.ndarray) -> np.ndarray:
        return self._to_public(self._repair(self._to_internal(pop)))

    @staticmethod
    def _to_internal(pop: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.transpose(pop, (1, 0, 2)), dtype=np.float32)

    @staticmethod
    def _to_public(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.transpose(x, (1, 0, 2))).astype(np.int16)

    # ---- internal (jobs, population, nodes) float32 ------------------------------------------

    def _fitness(self, x: np.ndarray) -> np.ndarray:
        """Power mean over jobs of the (restart-penalised) speedups of each individual."""
        gpus = (x @ self._ones).astype(np.int64)  # (jobs, population)
        nodes = ((x > 0).astype(np.float32) @ self._ones).astype(np.int64)
        nodes = np.minimum(nodes, self.speed.shape[1] - 1)
        s = self.speed[self._jidx, nodes, gpus]
        changed = (np.abs(x - self._base) @ self._ones) > 0
        s = np.where(changed, s * self.penalty[:, None], s)
        return power_mean(s, self.power, axis=0)

    def _survivors(self, x: np.ndarray, fit: np.ndarray, size: int) -> np.ndarray:
        """Indices of the ``size`` fittest distinct individuals, best first (duplicates only
        fill places left over), so that copies of one solution do not crowd out the rest."""
        key = np.einsum("jpn,jn->p", x, self._hash)
        _, first = np.unique(key, return_index=True)
        distinct = np.zeros(len(fit), dtype=bool)
        distinct[first] = True
        order = np.lexsort((-fit, ~distinct))  # distinct first, then by fitness
        keep = order[:size]
        return keep[np.argsort(-fit[keep], kind="stable")]

    def _select(self, fit: np.ndarray, count: int) -> np.ndarray:
        """Binary tournaments."""
        a = self.rng.integers(0, len(fit), size=count)
        b = self.rng.integers(0, len(fit), size=count)
        return np.where(fit[a] >= fit[b], a, b)

    def _crossover(self, x: np.ndarray, pa: np.ndarray, pb: np.ndarray) -> np.ndarray:
        """Single point over jobs: child ``i`` takes the jobs before a random point from parent
        ``pa[i]`` and the rest from parent ``pb[i]`` (indices into the population ``x``)."""
        num_jobs = x.shape[0]
        point = self.rng.integers(0, num_jobs + 1, size=len(pa))
        source = np.where(self._jidx < point[None, :], pa[None, :], pb[None, :])  # (jobs, size)
        return x[self._jidx, source]

    def _mutate(self, x: np.ndarray, keep_first: bool = False) -> np.ndarray:
        """Mutates ``x`` in place (and returns it)."""
        rng = self.rng
        num_jobs, size, num_nodes = x.shape
        rows = num_jobs * size
        # (1) Reset some jobs to their current allocation.
        reset = (rng.random((num_jobs, size), dtype=np.float32) < self.reset_prob)[:, :, None]
        np.copyto(x, self._base, where=reset)
        by_row = x.reshape(rows, num_nodes)
        # (2) Zero out some entries (each with probability 0.1) of some jobs.
        chosen = np.flatnonzero(rng.random(rows, dtype=np.float32) < self.zero_prob)
        if chosen.size:
            by_row[chosen] *= rng.random((chosen.size, num_nodes), dtype=np.float32) >= 0.1
        # (3) Grow jobs on nodes with free GPUs. Each such node is grown, in expectation, by one
        # job drawn from all jobs and by one of the jobs already on it: a job grows on a free
        # node with probability p1 = 1 / jobs, or, if it already uses that node, also with
        # p2 = 1 / (jobs on that node). The entry becomes a random count between its current
        # value and the node's capacity (repair trims what does not fit).
        free = self._cap[None, :] - x.sum(axis=0)  # (population, nodes)
        has_free = (free > 0).astype(np.float32)
        p1 = has_free / num_jobs  # (population, nodes)
        mine = (x > 0) * has_free[None, :, :]  # (jobs, population, nodes)
        p2 = mine / np.maximum(mine.sum(axis=0), 1.0)[None, :, :]
        grow_p = p1[None, :, :] + p2 - p1[None, :, :] * p2
        hit = rng.random(x.shape, dtype=np.float32) < grow_p
        if hit.any():
            cur = x[hit]
            cap = np.broadcast_to(self._cap, x.shape)[hit]
            step = np.floor(rng.random(cur.size, dtype=np.float32) * (cap - cur + 1))
            x[hit] = np.minimum(cur + step, cap)
        if keep_first:
            x[:, 0] = self._base[:, 0]
        return x

    def _repair(self, x: np.ndarray) -> np.ndarray:
        """Repairs ``x`` in place where it can; returns the repaired population."""
        num_jobs = x.shape[0]
        # (0) The user's limits: a job holds nothing on a node it does not allow.
        if self._allowed is not None:
            x *= self._allowed
        # (1) Interference avoidance: on each node, only the first multi-node job stays.
        if self.avoid_interference:
            used = x > 0
            spread = (used.astype(np.float32) @ self._ones) > 1  # (jobs, population)
            present = used & spread[:, :, None]
            if present.sum(axis=0, dtype=np.int16).max(initial=0) > 1:
                first = (present * self._rank).max(axis=0)  # num_jobs - index of the first
                np.copyto(x, 0.0, where=present & (self._rank != first[None]))
        # (2) Per-job GPU cap: keep GPUs node by node, in a random order of the nodes, up to
        # the cap; the excess goes.
        totals = x @ self._ones
        over = np.flatnonzero(totals > self._max)  # flat (job, individual) rows
        if over.size:
            by_row = x.reshape(-1, x.shape[2])
            order = np.argsort(self.rng.random((over.size, x.shape[2])), axis=1)
            rows = np.take_along_axis(by_row[over], order, axis=1)
            cap = self._max.reshape(-1).take(over // x.shape[1])
            kept = np.minimum(np.cumsum(rows, axis=1), cap[:, None])
            kept[:, 1:] -= kept[:, :-1].copy()
            restored = np.empty_like(kept)
            np.put_along_axis(restored, order, kept, axis=1)
            by_row[over] = restored
        # (3) Node capacity: lower-priority jobs (later rows) give their GPUs back first. The
        # cumulative sum over jobs is a product with a lower-triangular matrix (much faster
        # than numpy's cumsum along an outer axis).
        if np.any(x.sum(axis=0) > self._cap[None, :]):
            cum = (self._lower @ x.reshape(num_jobs, -1)).reshape(x.shape)
            kept = np.minimum(cum, self._cap)
            kept[1:] -= kept[:-1].copy()
            x = kept
        # (4) The user's floor: a job given fewer GPUs than it may run on waits instead.
        if self._floor is not None:
            totals = x @ self._ones  # (jobs, population)
            short = (totals > 0) & (totals < self._floor)
            if short.any():
                x[short] = 0.0
        return x
