"""A preload (fork) server for torchrun's workers: imports once, forks each worker.

A worker's start is dominated by imports: ``import torch`` (~2 s) and ``torch._dynamo``, which
the first optimizer constructor imports (another ~2 s), per process. On a restart every worker
pays them again, after torchrun's agent has paid its own ``import torch``. With preloading:

* the launcher starts ``python -m trainer.preload serve SOCKET`` *at the same time* as torchrun;
  it binds a Unix socket first, then imports torch, torch.distributed, torch._dynamo and
  trainer.api (plus any ``--preload-module``), then serves;
* torchrun itself runs as ``python -m trainer.preload run -m torch.distributed.run ...``, so its
  agent does not import torch a second time at each launch (restarts and rescales included),
  and its worker command is ``python -m trainer.preload run SCRIPT ARGS``. Either is
  a client that imports only the standard library. It connects, sends its argv, environment and
  working directory, and passes its stdin/stdout/stderr (``SCM_RIGHTS``);
* the server forks; the child adopts that environment, working directory and stdio, reseeds
  Python's and NumPy's global RNGs (as a fresh process would), resets signal handlers and runs the
  script as ``__main__``. The server tells the client the child's pid and later its exit status;
* the client forwards the signals torchrun sends (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1/2) to
  the child and exits with the child's status (re-raising a fatal signal on itself), so torchrun
  sees exactly what it would have seen. If the client disappears (torchrun killed it), the server
  kills its child.

Fork safety: the server forks from its single thread, before anything has initialised CUDA or an
OpenMP pool (imports do neither); it logs a warning if other native threads exist (an OpenBLAS
pool, when ``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS`` is not 1). If the server is not reachable
within ``connect_timeout_s``, the client runs the script in a fresh interpreter instead.

Standard library only at import time (the server imports the stdlib-only
``coadapt_common.procfs`` when it forks).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import random
import runpy
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger("trainer.preload")

SOCKET_ENV = "COADAPT_PRELOAD_SOCKET"
DEFAULT_MODULES = ("torch", "torch.distributed", "torch._dynamo", "trainer.api")
FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
_HEADER = struct.Struct("!I")


# ---------------------------------------------------------------------------- framing


def _send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    body = json.dumps(message).encode()
    data = _HEADER.pack(len(body)) + body
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("peer closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket, with_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    fds: list[int] = []
    if with_fds:
        data, fds, _, _ = socket.recv_fds(sock, _HEADER.size, with_fds)
        if not data:
            raise ConnectionError("peer closed the connection")
        if len(data) < _HEADER.size:
            data += _recv_exact(sock, _HEADER.size - len(data))
    else:
        data = _recv_exact(sock, _HEADER.size)
    (length,) = _HEADER.unpack(data)
    return json.loads(_recv_exact(sock, length)), list(fds)


# ---------------------------------------------------------------------------- server


def serve(path: str, modules: Sequence[str] = DEFAULT_MODULES) -> int:
    """Run the server until stdin closes (the launcher went away) or SIGTERM.

    Binds first (clients that connect early wait in the backlog), imports, then forks one
    child per request.
    """
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener.bind(path)
    listener.listen(64)
    start = time.monotonic()
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            logger.warning("preload: cannot import %s (%s); workers will import it", name, e)
    logger.info("preload: imported %s in %.2f s", ", ".join(modules), time.monotonic() - start)

    server_pid = os.getpid()
    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    children: dict[int, socket.socket] = {}  # child pid -> client connection
    watch_stdin = not os.isatty(0)
    try:
        while not (stopping and not children):
            readable: list[Any] = [listener, *children.values()]
            if watch_stdin:
                readable.append(sys.stdin)
            try:
                ready, _, _ = select.select(readable, [], [], 0.05)
            except InterruptedError:
                ready = []
            for item in ready:
                if item is listener and not stopping:
                    _accept(listener, children, server_pid)
                elif item is sys.stdin:
                    if not os.read(0, 4096):  # EOF: the launcher is gone
                        stopping = True
                        watch_stdin = False
                elif isinstance(item, socket.socket) and item is not listener:
                    _client_gone(item, children)
            _reap(children)
            if stopping:
                for pid in list(children):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
    finally:
        if os.getpid() == server_pid:  # not in a forked worker unwinding with SystemExit
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return 0


def _accept(listener: socket.socket, children: dict[int, socket.socket], server_pid: int) -> None:
    conn, _ = listener.accept()
    try:
        request, fds = _recv(conn, with_fds=3)
    except (ConnectionError, ValueError, OSError) as e:
        logger.warning("preload: bad request (%s)", e)
        conn.close()
        return
    from coadapt_common.procfs import native_thread_count  # server side only: the client stays lean

    threads = native_thread_count() or 1
    if threads > 1:
        logger.warning("preload: forking with %d native threads (set OMP_NUM_THREADS=1)", threads)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    # Signals stay blocked across the fork until the child has dropped the server's handlers:
    # a SIGTERM forwarded the moment the client learns the pid must reach the script, not
    # the server's on_term copied into the child.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
    pid = os.fork()
    if pid == 0:  # the worker
        try:
            for inherited in (listener, conn, *children.values()):
                inherited.close()
            code = _become_worker(request, fds)
        except BaseException as e:  # the worker must never return into the server's loop
            code = e.code if isinstance(e, SystemExit) and isinstance(e.code, int) else 1
            if not isinstance(e, SystemExit):
                # As Python would for an uncaught exception: sys.excepthook, which the trainer
                # replaces (trainer.init) to leave its exit marker before the traceback is
                # printed. A plain print_exc() here left none, and a script that raised in its
                # training loop was reported as failing before trainer.init.
                with contextlib.suppress(BaseException):
                    sys.excepthook(type(e), e, e.__traceback__)
        raise SystemExit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    with contextlib.suppress(OSError):
        _send(conn, {"pid": pid})


def _become_worker(request: dict[str, Any], fds: list[int]) -> int:
    """In the forked child: take over the client's identity and run its script."""
    for sig in (*FORWARDED_SIGNALS, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)  # blocked by _accept
    logger.handlers.clear()  # the server's own handler; the script configures its logging
    logger.setLevel(logging.NOTSET)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = list(request["argv"])
    module = argv[1] if len(argv) >= 2 and argv[0] == "-m" else None
    if module is not None:  # ``-m MODULE ARGS``, as ``python -m`` runs it (torchrun itself)
        sys.argv = argv[1:]  # run_module puts the module's file in argv[0]
        sys.path[0] = os.getcwd()
    else:
        sys.argv = argv
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    threads = os.environ.get("OMP_NUM_THREADS")
    torch = sys.modules.get("torch")
    if threads and threads.isdigit() and torch is not None:
        torch.set_num_threads(int(threads))
    try:
        if module is not None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    return 0


def _client_gone(conn: socket.socket, children: dict[int, socket.socket]) -> None:
    """The client closed its end: torchrun ended it, so end its worker too."""
    with contextlib.suppress(OSError):
        if conn.recv(1):
            return  # unexpected data; ignore
    for pid, c in list(children.items()):
        if c is conn:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        if os.WIFSIGNALED(status):
            message = {"signal": os.WTERMSIG(status)}
        else:
            message = {"exit": os.waitstatus_to_exitcode(status)}
        with contextlib.suppress(OSError):
            _send(conn, message)
        conn.close()


# ---------------------------------------------------------------------------- client


def run_client(argv: Sequence[str], *, connect_timeout_s: float = 10.0) -> int:
    """Have the server fork a worker running ``argv`` (script and arguments) and mirror it.

    The server binds its socket before importing anything, so a missing socket after
    ``connect_timeout_s`` means no server: the script then runs in a fresh interpreter, as it
    also does if the server closes the connection before forking.
    """
    path = os.environ.get(SOCKET_ENV)
    sock = _connect(path, connect_timeout_s) if path else None
    if sock is None:
        os.execv(sys.executable, [sys.executable, "-u", *argv])
    # From the request on, a signal torchrun sends is held (not lost, not fatal to the client
    # alone) until the worker's pid is known, then forwarded to it.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
    try:
        _send(
            sock,
            {"argv": list(argv), "env": dict(os.environ), "cwd": os.getcwd()},
            fds=(0, 1, 2),
        )
        reply, _ = _recv(sock)
    except (OSError, ConnectionError, ValueError):
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a mask survives exec
        os.execv(sys.executable, [sys.executable, "-u", *argv])
    child = int(reply["pid"])

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # held signals are forwarded now
    try:
        while True:
            try:
                status, _ = _recv(sock)
                break
            except InterruptedError:
                continue
    except (ConnectionError, OSError, ValueError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        return 1
    if "signal" in status:
        number = int(status["signal"])
        # Die by the worker's signal, as torchrun expects. SIGKILL and SIGSTOP take no
        # handler (setting one raised EINVAL: a traceback in the job's log on every kill).
        with contextlib.suppress(OSError, ValueError):
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        return 128 + number
    return int(status["exit"])


def _connect(path: str, timeout_s: float) -> socket.socket | None:
    deadline = time.monotonic() + timeout_s
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) >= 2 and args[0] == "serve":
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        code = serve(args[1], tuple(args[2:]) or DEFAULT_MODULES)
        # Nothing to tear down in the server: skip the interpreter's ~1 s torch teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if len(args) >= 2 and args[0] == "run":
        return run_client(args[1:])
    print(
        "usage: python -m trainer.preload serve SOCKET [MODULE...]"
        " | run SCRIPT [ARG...] | run -m MODULE [ARG...]"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
