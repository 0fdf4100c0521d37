"""A job that tries to read the control plane's secrets (tests/controller/test_job_isolation.py):
one line per attempt, ``probe NAME: read|denied|<error>``, then what it may use of its own."""

import os
import sys
from pathlib import Path

state = Path(sys.argv[1])
key = os.environ["COADAPT_AGENT_ID"]
job = os.environ["COADAPT_JOB_ID"]
secrets = {
    "tokens": state / "tokens.json",
    "store": state / "store.db",
    "agent-token": state / "agents" / key / "agent-token.json",
    "job-credentials": state / "agents" / key / "credentials" / f"{job}.token",
}
for name, path in secrets.items():
    try:
        path.read_bytes()
        print(f"probe {name}: read", flush=True)
    except PermissionError:
        print(f"probe {name}: denied", flush=True)
    except OSError as e:
        print(f"probe {name}: {type(e).__name__}", flush=True)
try:
    os.listdir(state)
    print("probe state-listing: read", flush=True)
except PermissionError:
    print("probe state-listing: denied", flush=True)
own = Path(os.environ["COADAPT_REPORT_TOKEN_FILE"]).read_text().strip()
print(f"probe own-credential: {'read' if own else 'empty'}", flush=True)
checkpoint = Path(os.environ["COADAPT_CHECKPOINT_URI"])
checkpoint.mkdir(parents=True, exist_ok=True)
(checkpoint / "probe.txt").write_text("written by the job\n")
(Path(os.environ["HOME"]) / "scratch").write_text("x")
print(f"probe own-files: written as uid {os.getuid()}", flush=True)
