"""A job's AWS credential for boto3, as a ``credential_process``.

The node agent writes the job's own S3 credential (scoped to its checkpoints) to a 0600 file
the job alone reads, in the ``credential_process`` output format (``Version`` 1,
``AccessKeyId``, ``SecretAccessKey``, ``SessionToken``, ``Expiration``), renews it there
before it expires, and gives the job an ``AWS_CONFIG_FILE`` whose ``credential_process`` is::

    python -m trainer.aws_credentials FILE

This prints the file's credential on stdout, after checking it has every field (exit status
1 and one line on stderr otherwise), so boto3 runs it again, reading the renewed file, once
the ``Expiration`` it printed is near. Standard library only.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["FIELDS", "main", "read_credential"]

FIELDS = ("AccessKeyId", "SecretAccessKey", "SessionToken", "Expiration")


def read_credential(path: str | Path) -> dict[str, object]:
    """The credential in ``path`` in ``credential_process`` form; :class:`ValueError` (what
    is wrong, never the secret) when it is not JSON or lacks a field."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON") from e
    if not isinstance(data, dict) or data.get("Version") != 1:
        raise ValueError(f"{path}: not a credential_process credential (Version 1)")
    missing = [f for f in FIELDS if not isinstance(data.get(f), str) or not data[f]]
    if missing:
        raise ValueError(f"{path}: lacks {', '.join(missing)}")
    return {"Version": 1, **{f: data[f] for f in FIELDS}}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m trainer.aws_credentials FILE", file=sys.stderr)
        return 2
    try:
        credential = read_credential(args[0])
    except (OSError, ValueError) as e:
        print(f"coadapt aws credentials: {e}", file=sys.stderr)
        return 1
    print(json.dumps(credential))
    return 0


if __name__ == "__main__":
    sys.exit(main())
