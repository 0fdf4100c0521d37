"""Checks of the values a caller hands the store: each returns the value (normalized) or
raises :class:`~autoscaler.errors.InvalidInputError` naming the field. Nothing here touches
SQLite."""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import TypeVar

from autoscaler.errors import InvalidInputError
from providers.errors import InvalidRequestError
from providers.tags import validate_id

__all__ = [
    "valid_count",
    "valid_enum",
    "valid_json_object",
    "valid_number",
    "valid_request_id",
    "valid_text",
    "valid_version",
]

_E = TypeVar("_E", bound=StrEnum)


def valid_text(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{field} must be a non-empty string, got {value!r}", field=field)
    return value


def valid_json_object(value: object, field: str) -> str:
    text = valid_text(value, field)
    try:
        parsed = json.loads(text)
    except ValueError as e:
        raise InvalidInputError(f"{field} is not JSON: {e}", field=field) from e
    if not isinstance(parsed, dict):
        raise InvalidInputError(f"{field} must be a JSON object", field=field)
    return text


def valid_number(value: object, field: str, *, minimum: float | None = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInputError(f"{field} must be a finite number, got {value!r}", field=field)
    if minimum is not None and value < minimum:
        raise InvalidInputError(f"{field} must be >= {minimum}, got {value!r}", field=field)
    return float(value)


def valid_count(value: object, field: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInputError(
            f"{field} must be an integer >= {minimum}, got {value!r}", field=field
        )
    return value


def valid_version(value: object) -> int:
    return valid_count(value, "expected_version", minimum=1)


def valid_enum(kind: type[_E], value: object, field: str) -> _E:
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            pass
    known = ", ".join(m.value for m in kind)
    raise InvalidInputError(f"{field} must be one of {known}; got {value!r}", field=field)


def valid_request_id(value: object) -> str:
    try:
        return validate_id(valid_text(value, "request_id"), field="request_id")
    except InvalidRequestError as e:
        raise InvalidInputError(str(e), field="request_id") from e
