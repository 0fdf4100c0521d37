"""Finding cost records in parsed JSON: a record itself, a simulation result holding one under
``"cost_record"``, a list of such results, or a results file (``{"runs": [...]}``).

Pure: takes the parsed JSON, never a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoscaler.costs import CostRecord, record_from_json
from autoscaler.errors import InvalidInputError

__all__ = ["LABEL_KEYS", "Found", "LabelledRecord", "find_cost_records"]

LABEL_KEYS = ("policy", "strategy", "workload")
"""Keys of a result whose values label its record, joined in this order."""


@dataclass(frozen=True)
class LabelledRecord:
    """A record and its label (``None`` for a bare record)."""

    label: str | None
    record: CostRecord


@dataclass(frozen=True)
class Found:
    """The records found, and the labels of the results that held none (skipped)."""

    records: tuple[LabelledRecord, ...]
    skipped: tuple[str, ...]


def _is_record(data: object) -> bool:
    return isinstance(data, Mapping) and "version" in data and "instances" in data


def _label(result: Mapping[str, Any], fallback: str | None) -> str | None:
    parts = [str(result[k]) for k in LABEL_KEYS if isinstance(result.get(k), str | int | float)]
    return " / ".join(parts) if parts else fallback


def _read(data: object, where: str) -> CostRecord:
    try:
        return record_from_json(data)
    except InvalidInputError as e:
        inner = e.field or ""
        path = f"{where}.{inner}" if where and inner else where or inner or None
        message = str(e).removeprefix("cost record: ")
        raise InvalidInputError(
            f"cost record at {where or '(top)'}: {message}", field=path
        ) from None


def find_cost_records(payload: object) -> Found:
    """The cost records in ``payload`` (see the module docstring), labelled by their result's
    "policy", "strategy" and "workload" values (``run N`` when none is present). Raises
    :class:`~autoscaler.errors.InvalidInputError` when there is none, or when one is
    malformed (naming its path, e.g. ``[1].cost_record.instances[0].gpus``)."""
    if _is_record(payload):
        return Found((LabelledRecord(None, _read(payload, "")),), ())
    if isinstance(payload, Mapping) and "cost_record" in payload:
        if payload["cost_record"] is None:
            raise InvalidInputError("the result's cost_record is null", field="cost_record")
        record = _read(payload["cost_record"], "cost_record")
        return Found((LabelledRecord(_label(payload, None), record),), ())
    base = ""
    results: object = payload
    if isinstance(payload, Mapping) and isinstance(payload.get("runs"), list):
        base, results = "runs", payload["runs"]
    if not isinstance(results, list):
        raise InvalidInputError(
            "no cost record: expected a cost record, a result with a 'cost_record', or a list "
            "of results",
            field=None,
        )
    found, skipped = [], []
    for n, result in enumerate(results):
        label = _label(result, f"run {n + 1}") if isinstance(result, Mapping) else f"run {n + 1}"
        if isinstance(result, Mapping) and result.get("cost_record") is not None:
            record = _read(result["cost_record"], f"{base}[{n}].cost_record")
            found.append(LabelledRecord(label, record))
        else:
            skipped.append(label or f"run {n + 1}")
    if not found:
        raise InvalidInputError(
            f"no cost record in any of the {len(results)} results (fixed-cluster runs have none)",
            field=base or None,
        )
    return Found(tuple(found), tuple(skipped))
