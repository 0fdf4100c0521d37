"""``GET /metrics``: the controller's Prometheus metrics (:mod:`autoscaler.controller.metrics`),
in the text format, for the users' token or the scrape token (``coadapt tokens scrape``: good
for this endpoint only)."""

from __future__ import annotations

from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST
from werkzeug.wrappers import Request, Response

from autoscaler.controller.api.state import ApiState, Route
from autoscaler.controller.credentials import Role

__all__ = ["METRICS_ROLES", "ROUTES"]

METRICS_ROLES: Final = frozenset({Role.USER, Role.SCRAPE})
"""Who may scrape: the users, and a scraper with its own token."""


def _metrics(state: ApiState, request: Request) -> Response:
    """Every family, read now (the fleet's from the store: a store failure is a 503)."""
    response = Response(state.metrics.exposition(), content_type=CONTENT_TYPE_LATEST)
    response.headers["Cache-Control"] = "no-store"
    return response


ROUTES: Final[tuple[Route, ...]] = (("GET", "/metrics", METRICS_ROLES, _metrics),)
"""The scraper's route."""
