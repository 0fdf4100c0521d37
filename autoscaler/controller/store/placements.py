"""A job's placements, read from its assignment spans: the store's one definition of a restart.

A job is **placed** at each distinct instant a span of it opened (a change of assignment opens
all its new spans at one instant; an agent's relaunch,
:meth:`~autoscaler.controller.store.assignment_table.AssignmentTable.record_relaunch`, opens
one); its **restarts** are its placements after the first.
:meth:`~autoscaler.controller.store.assignment_table.AssignmentTable.restart_counts` counts them
in the store (what the policy weighs); :func:`placement_instants` gives their times from spans
already read, for a reader that needs when, not only how many (the bill's ``restart`` events).
The two agree on any history (``tests/controller/test_rules.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from autoscaler.controller.store.assignment_table import AssignmentSpan

__all__ = ["placement_instants"]


def placement_instants(spans: Iterable[AssignmentSpan]) -> dict[str, tuple[float, ...]]:
    """Each job's placement instants (see the module docstring), oldest first; the first is
    its start, each later one a restart. Jobs with no span are left out."""
    out: dict[str, set[float]] = {}
    for span in spans:
        out.setdefault(span.job_name, set()).add(span.from_s)
    return {job: tuple(sorted(times)) for job, times in sorted(out.items())}
