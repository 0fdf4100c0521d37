"""Re-pin the fidelity test's exact record after an intended change of the simulator or a
policy: ``.venv/bin/python scripts/pin_fidelity.py`` (about 30 s on 2 cores) rewrites
``tests/sim/fidelity_pinned.json`` and prints each run's mean JCT before -> after. Say in the
commit why the figures moved; ``tests/sim/test_fidelity.py`` still checks them against the
paper (+-5%) on its own."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.sim.fidelity_runs import PINNED_PATH, read_pinned, run_records, write_pinned


def main() -> int:
    before = read_pinned() if PINNED_PATH.exists() else {}
    after = run_records()
    write_pinned(after)
    for key, record in after.items():
        old = before.get(key, {}).get("summary", {}).get("mean_jct_s")
        new = record["summary"]["mean_jct_s"]
        print(f"{key}: mean JCT {old if old is None else f'{old:.2f}'} -> {new:.2f} s")
    print(f"wrote {PINNED_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
