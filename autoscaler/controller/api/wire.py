"""JSON in and out of the API: answers, error answers, request bodies and query counts.

Every answer is a JSON object, ``Cache-Control: no-store``; an error is ``{"error", "field"}``
(a 401 also says ``WWW-Authenticate: Bearer``). A body is read only up to the app's limit:
:func:`read_body` refuses a larger one (413) from its ``Content-Length`` before reading it, or
once the limit is passed for a body without one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, NoReturn

from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.wrappers import Request, Response

from autoscaler.controller.client import ApiError

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_QUERY_INT",
    "error_response",
    "int_arg",
    "json_response",
    "no_constant",
    "read_body",
    "too_large",
]

DEFAULT_MAX_BODY_BYTES: Final = 1 << 20
"""Bodies larger than this (1 MiB) are refused with 413."""
MAX_QUERY_INT: Final = (1 << 63) - 1
"""The largest count a query argument may carry (a log offset: no file is larger)."""


def json_response(
    payload: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """``payload`` as a JSON answer (keys sorted; NaN and infinities refused)."""
    body = json.dumps(payload, sort_keys=True, allow_nan=False) + "\n"
    response = Response(body, status, mimetype="application/json")
    response.headers["Cache-Control"] = "no-store"
    for key, value in (headers or {}).items():
        response.headers[key] = value
    return response


def error_response(status: int, message: str, field: str | None = None) -> Response:
    """The error answer ``{"error": message, "field": field}`` with ``status``."""
    response = json_response({"error": message, "field": field}, status)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="coadapt"'
    return response


def too_large(limit: int) -> ApiError:
    """The 413 of a body over ``limit`` bytes."""
    return ApiError(413, f"the body is larger than {limit} bytes")


def no_constant(name: str) -> NoReturn:
    """``json.loads``' ``parse_constant``: ``NaN`` and ``Infinity`` are not JSON numbers."""
    raise ValueError(f"{name} is not a JSON number")


def read_body(request: Request, max_body_bytes: int, *, optional: bool = False) -> dict[str, Any]:
    """The body as a JSON object ({} for an empty ``optional`` one): 413 over
    ``max_body_bytes`` (from ``Content-Length`` before reading), 400 if malformed."""
    length = request.content_length
    if length is not None and length > max_body_bytes:
        raise too_large(max_body_bytes)
    if length is None:
        # A streamed (chunked) body: Werkzeug's stream stops quietly at the limit, so it
        # is read with a limit one byte higher, and a body that reaches it is too large.
        request.max_content_length = max_body_bytes + 1
    try:
        raw = request.get_data(cache=False)
    except RequestEntityTooLarge as e:
        raise too_large(max_body_bytes) from e
    if len(raw) > max_body_bytes:
        raise too_large(max_body_bytes)
    if not raw.strip():
        if optional:
            return {}
        raise ApiError(400, "the body is empty: expected a JSON object")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=no_constant)
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the body is not UTF-8: {e.reason} at byte {e.start}") from e
    except ValueError as e:
        raise ApiError(400, f"the body is not valid JSON: {e}") from e
    except RecursionError as e:
        raise ApiError(400, "the body is not valid JSON: nested too deeply") from e
    if not isinstance(data, dict):
        raise ApiError(400, f"the body must be a JSON object, not {_json_type(data)}")
    return data


def int_arg(request: Request, name: str, default: int, *, maximum: int = MAX_QUERY_INT) -> int:
    """A query argument that is a count (``0..maximum``): 400 for anything else, without
    converting more digits than ``maximum`` has (a 5,000-digit number is refused as what it
    is, not parsed)."""
    text = request.args.get(name)
    if text is None:
        return default
    if not text.isdigit() or not text.isascii():
        raise ApiError(400, f"{name} must be an integer >= 0, got {text[:40]!r}", name)
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(maximum)) or int(digits) > maximum:
        raise ApiError(400, f"{name} must be at most {maximum} ({len(digits)} digits given)", name)
    return int(digits)


def _json_type(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return "a boolean" if isinstance(value, bool) else "a number"
