"""Run a job's process as its own unprivileged user, away from the control plane's secrets.

A node agent that runs as root starts each job's launcher through this module::

    python -m coadapt_common.jobexec --uid U --gid G [--bind SRC DST ...] [--expose PATH ...]
        -- ARGV...

It (still root) enters a mount namespace of its own (every mount in it private, so nothing
leaks back to the host), bind-mounts each ``SRC`` (a folder of the job's own, e.g. its
checkpoint folder under the state folder, whose parents the job may not traverse) onto
``DST`` (an empty folder the job can reach), and shows the job each ``PATH`` it needs (the
Python it runs, its working folder, its script) where a parent of it is closed to other users
(``/root`` is 0700): that parent is covered with an empty tmpfs in which only the way down to
each such ``PATH`` is made again, ``PATH`` itself mounted there, its own mode kept (so a root
home's other files, ``~/.ssh`` or a cloud's credentials, are hidden from the job, not shown).
Then it forbids itself new privileges (``PR_SET_NO_NEW_PRIVS``:
no setuid program gives root back), drops every supplementary group, becomes ``G``/``U`` (real,
effective and saved ids: there is no way back) and executes ``ARGV``. Its exit status is then
``ARGV``'s. A step that fails is said on stderr in one line and the status is 126: nothing runs
with more rights than asked for.

:func:`job_uid` gives each job name its own uid (and gid) in a range no account uses, so two
jobs cannot read each other's files either; :func:`unreachable_by_others` says whether a user
with no group of its own could read a path (the job's interpreter and working folder must be).

Standard library only (it runs in the instance, before anything else of the job).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from coadapt_common.procfs import PROC_ROOT

__all__ = [
    "JOB_UID_BASE",
    "JOB_UID_SPAN",
    "closed_parent",
    "job_uid",
    "jobexec_argv",
    "main",
    "probe",
    "unreachable_by_others",
]

JOB_UID_BASE: Final = 1_900_000_000
"""The first uid of jobs: above the ranges systemd gives to users, dynamic users and
containers (up to 1,879,048,191), below 2**31 (tools that read uids as signed numbers)."""
JOB_UID_SPAN: Final = 1 << 24
"""How many uids jobs get: two job names share one with a chance of 1 in 16.8 million."""

_CLONE_NEWNS: Final = 0x00020000
_MS_REC: Final = 0x4000
_MS_PRIVATE: Final = 1 << 18
_MS_BIND: Final = 4096
_MS_NOSUID: Final = 2
_MS_NODEV: Final = 4
_PR_SET_NO_NEW_PRIVS: Final = 38
_EXIT_SETUP: Final = 126


def job_uid(job: str) -> int:
    """The uid (and gid) ``job``'s processes run as: fixed by its name, so every node of a
    job, and every relaunch, is the same user (its checkpoints stay its own)."""
    digest = hashlib.sha256(job.encode("utf-8")).digest()
    return JOB_UID_BASE + int.from_bytes(digest[:8], "big") % JOB_UID_SPAN


def jobexec_argv(
    argv: Sequence[str],
    uid: int,
    *,
    binds: Sequence[tuple[str, str]] = (),
    exposed: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """The command that runs ``argv`` as ``uid`` (gid the same) with ``binds`` (source,
    target) mounted for it and ``exposed`` shown to it (see the module docstring)."""
    out = [python, "-m", "coadapt_common.jobexec", "--uid", str(uid), "--gid", str(uid)]
    for source, target in binds:
        out += ["--bind", source, target]
    for path in exposed:
        out += ["--expose", path]
    return [*out, "--", *argv]


def probe(python: str = sys.executable, timeout_s: float = 60.0) -> str | None:
    """Whether jobs can run isolated here: runs ``python`` as a job's user through this
    module (a mount namespace, the interpreter shown behind closed parents). ``None``: they
    can; else why not, in one line (not root, no mount namespaces in this container, ...)."""
    import subprocess

    exposed = [sys.base_prefix, sys.prefix]
    argv = jobexec_argv([python, "-c", "pass"], JOB_UID_BASE, exposed=exposed, python=python)
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if out.returncode == 0:
        return None
    lines = out.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {out.returncode}"


def closed_parent(path: str | Path) -> Path | None:
    """The outermost parent of ``path`` (links resolved) that a user who owns none of them and
    is in none of their groups could not pass (no ``o+x``); ``None``: none is closed."""
    for folder in reversed(Path(os.path.realpath(path)).parents):
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def unreachable_by_others(path: str | Path) -> Path | None:
    """The first of ``path`` and its parents that a user who owns none of them and is in none
    of their groups could not pass (a folder without ``o+x``) or read (``path`` itself without
    ``o+r``); ``None`` when every step is open to it. Links are followed, as the job would."""
    target = Path(os.path.realpath(path))
    blocked = closed_parent(target)
    if blocked is not None:
        return blocked
    mode = os.stat(target).st_mode
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    return None if mode & need == need else target


def _libc() -> ctypes.CDLL:
    """The C library this interpreter runs on (its symbols: no ``find_library``, which
    starts ``ldconfig``)."""
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _bind(libc: ctypes.CDLL, source: str, target: str) -> None:
    _check(
        libc.mount(os.fsencode(source), os.fsencode(target), None, _MS_BIND | _MS_REC, None),
        f"mount --bind {source} {target}",
    )


def _expose(libc: ctypes.CDLL, paths: Sequence[str]) -> None:
    """Show the job ``paths`` behind closed parents (see the module docstring)."""
    wanted = sorted({Path(os.path.realpath(p)) for p in paths})
    shown: list[tuple[Path, Path]] = []  # (path, the closed parent it is behind)
    for path in wanted:
        blocked = closed_parent(path)
        if blocked is not None and not any(path.is_relative_to(p) for p, _ in shown):
            shown.append((path, blocked))
    covers = sorted({b for _, b in shown})
    covers = [c for c in covers if not any(c != o and c.is_relative_to(o) for o in covers)]
    handles = [(path, os.open(path, os.O_PATH | os.O_CLOEXEC)) for path, _ in shown]
    for cover in covers:
        _check(
            libc.mount(b"tmpfs", os.fsencode(cover), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                       b"mode=0755,size=1m"),
            f"mount tmpfs on {cover}",
        )  # fmt: skip
    for path, fd in handles:
        for folder in reversed(path.parents):
            if any(folder != c and folder.is_relative_to(c) for c in covers):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(folder, 0o755)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o755)
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        _bind(libc, str(PROC_ROOT / "self" / "fd" / str(fd)), str(path))
        os.close(fd)


def _enter(
    uid: int, gid: int, binds: Sequence[tuple[str, str]], exposed: Sequence[str] = ()
) -> None:
    libc = _libc()
    if binds or exposed:
        _check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
        for source, target in binds:
            _bind(libc, source, target)
        umask = os.umask(0o022)  # the way down is open to the job whatever the umask
        try:
            _expose(libc, exposed)
        finally:
            os.umask(umask)  # what the job writes keeps the agent's (077: private)
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.geteuid() != uid or os.getegid() != gid or os.getgroups():
        raise OSError(f"still uid {os.geteuid()} gid {os.getegid()} groups {os.getgroups()}")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    uid = gid = -1
    binds: list[tuple[str, str]] = []
    exposed: list[str] = []
    try:
        cut = args.index("--")
        options, command = args[:cut], args[cut + 1 :]
        while options:
            name = options.pop(0)
            if name == "--uid":
                uid = int(options.pop(0))
            elif name == "--gid":
                gid = int(options.pop(0))
            elif name == "--bind":
                binds.append((options.pop(0), options.pop(0)))
            elif name == "--expose":
                exposed.append(options.pop(0))
            else:
                raise ValueError(f"unknown option {name}")
        if uid <= 0 or gid <= 0 or not command:
            raise ValueError("needs --uid and --gid (not root) and a command after --")
    except (ValueError, IndexError) as e:
        print(f"coadapt jobexec: {e}", file=sys.stderr)
        return 2
    try:
        _enter(uid, gid, binds, exposed)
    except OSError as e:
        print(f"coadapt jobexec: cannot run the job as uid {uid}: {e}", file=sys.stderr)
        return _EXIT_SETUP
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"coadapt jobexec: cannot run {command[0]}: {e}", file=sys.stderr)
    return _EXIT_SETUP


if __name__ == "__main__":
    sys.exit(main())
