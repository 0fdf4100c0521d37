"""Atomic JSON writes: complete or absent, usual permissions, no temporary files left."""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from pathlib import Path

import pytest

from coadapt_common.atomic import write_bytes_atomic, write_json_atomic, write_text_atomic
from tests.conftest import UNPRIVILEGED_ID, Unprivileged


def test_writes_sorted_json_with_umask_permissions(tmp_path: Path) -> None:
    target = tmp_path / "new" / "folder" / "out.json"
    old = os.umask(0o022)
    try:
        write_json_atomic(target, {"b": 1, "a": [1.5]})
    finally:
        os.umask(old)
    assert json.loads(target.read_text()) == {"a": [1.5], "b": 1}
    assert target.read_text().index('"a"') < target.read_text().index('"b"')
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["out.json"]


def test_failure_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    write_json_atomic(target, {"v": 1}, durable=True)
    with pytest.raises(ValueError):
        write_json_atomic(target, {"v": math.nan})  # NaN is not JSON
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_bytes_write_is_durable_and_hides_its_temporary(tmp_path: Path) -> None:
    target = tmp_path / "blob.bin"
    write_bytes_atomic(target, b"\x00\x01payload", durable=True)
    write_text_atomic(tmp_path / "note.txt", "héllo\n")
    assert target.read_bytes() == b"\x00\x01payload"
    assert (tmp_path / "note.txt").read_text(encoding="utf-8") == "héllo\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob.bin", "note.txt"]


WRITE_INTO_READ_ONLY = """\
import sys
from pathlib import Path
from coadapt_common.atomic import write_bytes_atomic
target = Path(sys.argv[1])
try:
    write_bytes_atomic(target, b"new")
except OSError as e:
    print("refused:", type(e).__name__)
else:
    print("written")
"""


def test_bytes_write_into_an_unwritable_folder_raises_and_leaves_the_old_file(
    unprivileged: Unprivileged,
) -> None:
    """Run by a user the folder's mode binds (nobody when the suite runs as root)."""
    folder = unprivileged.folder / "ro"
    target = folder / "blob.bin"
    write_bytes_atomic(target, b"old")
    target.chmod(0o644)
    if unprivileged.as_nobody:
        os.chown(folder, UNPRIVILEGED_ID, UNPRIVILEGED_ID)
    folder.chmod(0o500)
    out = unprivileged.run([sys.executable, "-c", WRITE_INTO_READ_ONLY, str(target)])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "refused: PermissionError"
    assert target.read_bytes() == b"old"
    assert [p.name for p in folder.iterdir()] == ["blob.bin"]  # no temporary left


def test_a_secret_gets_exactly_its_mode_and_never_replaces_when_asked(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    old = os.umask(0)
    try:
        write_bytes_atomic(secret, b"one", mode=0o600, replace=False)
    finally:
        os.umask(old)
    assert secret.stat().st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        write_bytes_atomic(secret, b"two", mode=0o600, replace=False)
    assert secret.read_bytes() == b"one"
    assert [p.name for p in tmp_path.iterdir()] == ["secret.json"]  # no temporary left
    write_bytes_atomic(secret, b"three", mode=0o600, durable=True)
    assert secret.read_bytes() == b"three" and secret.stat().st_mode & 0o777 == 0o600
