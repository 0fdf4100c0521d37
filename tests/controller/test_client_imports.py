"""A GPU node's agent imports what a node needs: its API client and the report schema, not
the server, the store or the decision core (a real interpreter, its modules listed)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = (
    "autoscaler.controller.api",
    "autoscaler.controller.store",
    "autoscaler.controller.jobbook",
    "autoscaler.controller.loop",
    "autoscaler.model.goodput",
    "autoscaler.decide.policy",
    "autoscaler.sim",
    "numpy",
    "waitress",
    "werkzeug",
    "sqlite3",
)


def test_the_agent_imports_neither_the_server_nor_the_store_nor_the_decision_core() -> None:
    code = (
        "import sys, autoscaler.controller.agent, autoscaler.controller.client\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    loaded = [m for m in out if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert loaded == []
    assert "trainer.report" in out and "autoscaler.controller.client" in out
