"""Synthetic trainer reports (dev only): what a job's rank 0 would send, built from numbers.

The controller's tests and benchmark play the trainers: one function builds a valid
:class:`trainer.report.TrainerReport` with one profile entry and gradient statistics, so every
caller writes the same schema the real trainer sends.
"""

from __future__ import annotations

from trainer.report import BatchConfig, GradientStats, JobHints, ProfileEntry, TrainerReport


def synthetic_report(
    job: str,
    *,
    gpus: int,
    nodes: int,
    local_bsz: int,
    step_s: float,
    sync_s: float,
    progress: float,
    now_s: float,
    init_batch_size: int,
    max_batch_size: int | None = None,
    grad_sqr: float = 1.0,
    grad_var: float = 4.0,
) -> TrainerReport:
    """A report sent at ``now_s`` by a launch that started a minute earlier, with one profile
    entry (``gpus`` over ``nodes``, ``local_bsz`` per GPU, ``step_s`` of which ``sync_s``
    synchronisation) and gradient statistics at ``init_batch_size``."""
    return TrainerReport(
        job_id=job,
        attempt=1,
        started_at_s=now_s - 60,
        sent_at_s=now_s,
        world_size=gpus,
        num_nodes=nodes,
        batch=BatchConfig(local_bsz * gpus, 1),
        step=int(progress * 10),
        skipped_steps=0,
        epoch=0,
        epoch_position=0,
        progress=progress,
        gradient=GradientStats(init_batch_size, grad_sqr, grad_var, 10, False),
        profiles=(ProfileEntry(nodes, gpus, local_bsz, 1, 10, step_s, step_s - sync_s, sync_s),),
        hints=JobHints(init_batch_size, max_batch_size),
    )
