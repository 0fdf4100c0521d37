"""Finding cost records in parsed JSON: a record itself, a simulation result holding one under
``"cost_record"``, a list of such results, or a results file (``{"runs": [...]}``). A result
may also carry its run's cost floors under ``"floor"`` (``coadapt simulate --fleet ...
--floor``): read and checked with its record (:func:`read_floor`).

Pure: takes the parsed JSON, never a file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoscaler.accounting.costs import CostRecord, record_from_json
from autoscaler.errors import InvalidInputError

__all__ = ["LABEL_KEYS", "Found", "LabelledRecord", "RunFloor", "find_cost_records", "read_floor"]

LABEL_KEYS = ("policy", "strategy", "workload")
"""Keys of a result whose values label its record, joined in this order."""


@dataclass(frozen=True)
class RunFloor:
    """A run's cost floors (USD): ``floor_usd`` (a) no time limit, ``floor_at_jct_usd`` (b)
    every job by its finish time in the run; ``cost_usd`` the run's cost; and the same per
    application (``per_application[app]``: ``floor_usd``, ``floor_at_jct_usd``,
    ``cost_usd``). See :mod:`autoscaler.analysis.floor`."""

    floor_usd: float
    floor_at_jct_usd: float
    cost_usd: float
    per_application: Mapping[str, Mapping[str, float]]

    @staticmethod
    def ratio(cost_usd: float, floor_usd: float) -> float | None:
        """``cost / floor``; ``None`` where the floor is zero."""
        return cost_usd / floor_usd if floor_usd > 0 else None


@dataclass(frozen=True)
class LabelledRecord:
    """A record and its label (``None`` for a bare record), and its run's floors if given."""

    label: str | None
    record: CostRecord
    floor: RunFloor | None = None


_FLOOR_KEYS = ("floor_usd", "floor_at_jct_usd", "cost_usd")
_MAX_APPLICATIONS = 1000


def _usd(data: Mapping[str, Any], key: str, where: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(f"{where}.{key}: expected a number", field=f"{where}.{key}")
    if not (math.isfinite(value) and 0 <= value < 1e12):
        raise InvalidInputError(
            f"{where}.{key}: expected a finite amount >= 0, got {value!r}", field=f"{where}.{key}"
        )
    return float(value)


def read_floor(data: object, where: str = "floor") -> RunFloor:
    """A result's ``"floor"`` object, checked: the three amounts (finite, >= 0), and per
    application (at most 1000, names up to 200 characters) the same three. Raises
    :class:`~autoscaler.errors.InvalidInputError` naming the field."""
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"{where}: expected an object", field=where)
    amounts = {k: _usd(data, k, where) for k in _FLOOR_KEYS}
    apps = data.get("per_application", {})
    if not isinstance(apps, Mapping) or len(apps) > _MAX_APPLICATIONS:
        raise InvalidInputError(
            f"{where}.per_application: expected an object of at most {_MAX_APPLICATIONS}",
            field=f"{where}.per_application",
        )
    per_app: dict[str, Mapping[str, float]] = {}
    for name, row in apps.items():
        at = f"{where}.per_application.{str(name)[:200]}"
        if not isinstance(name, str) or not 0 < len(name) <= 200:
            raise InvalidInputError(f"{at}: bad application name", field=at)
        if not isinstance(row, Mapping):
            raise InvalidInputError(f"{at}: expected an object", field=at)
        per_app[name] = {k: _usd(row, k, at) for k in _FLOOR_KEYS}
    return RunFloor(**amounts, per_application=per_app)


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
        return Found((LabelledRecord(_label(payload, None), record, _floor_of(payload, "")),), ())
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
            found.append(LabelledRecord(label, record, _floor_of(result, f"{base}[{n}]")))
        else:
            skipped.append(label or f"run {n + 1}")
    if not found:
        raise InvalidInputError(
            f"no cost record in any of the {len(results)} results (fixed-cluster runs have none)",
            field=base or None,
        )
    return Found(tuple(found), tuple(skipped))


def _floor_of(result: Mapping[str, Any], where: str) -> RunFloor | None:
    if result.get("floor") is None:
        return None
    return read_floor(result["floor"], f"{where}.floor" if where else "floor")
