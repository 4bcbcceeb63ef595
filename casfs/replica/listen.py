"""`casfs serve-replica --listen NAME --idle S STORE`: the source's server kept up
between pulls, so that a pull reaches it without starting a process on the source
(replica.sharing: through ssh's shared connection, which forwards a socket here).

Started by a pull's ssh session, it binds NAME.sock in this user's private directory
(sharing.control_dir), prints `listening PATH`, and leaves the session: a child in a
session of its own, its stdio on /dev/null, its pid in NAME.pid. Each connection is a
session of the protocol (replica.serve) with the store opened afresh, after recovery,
as one `casfs serve-replica STORE` would be. It exits S seconds after its last session
ended (or, with none, after it started), or at SIGTERM, removing its socket and pid
file: its lifetime is bounded by the pulls that use it. A second start while it is up prints the same line
and starts nothing (NAME.pid is locked while it checks and binds, and while a server ends).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import IO

from casfs.errors import CasfsError, NotFound, UsageError
from casfs.replica.sharing import control_dir

WARM_AFTER_S = 1.0  # a server with no session yet imports the sessions' modules after this


def _up(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def listen(store: Path, name: str, idle: float) -> None:
    """Serve STORE on NAME.sock in the background (see the module); print where."""
    if not name.replace("-", "").isalnum() or len(name) > 64:
        raise UsageError(f"invalid server name {name!r}")
    if not (store / "catalog.db").exists():  # (the error is the pull's, now; opened in sessions only:
        # a store's open may start threads, which neither a fork nor this exit should meet)
        raise NotFound(f"no casfs store at {store} (create one with `casfs init`)")
    d = control_dir()
    if d is None:
        raise CasfsError("no private directory for the server's socket ($XDG_RUNTIME_DIR or /tmp)")
    path, pid_path = d / f"{name}.sock", d / f"{name}.pid"
    with open(pid_path, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _up(path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # (a server killed: its socket stays behind)
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(str(path))
            listener.listen(8)
            if os.fork() == 0:
                try:
                    _detach(lock)
                    signal.signal(signal.SIGTERM, _terminated)  # (ended by pid: cleans up too)
                    _serve_forever(listener, store, idle, path, pid_path)
                finally:
                    os._exit(0)
            listener.close()
    print(f"listening {path}", flush=True)


def _terminated(signo: int, frame: object) -> None:
    raise SystemExit(0)


def _detach(lock: IO[str]) -> None:
    """In the child: out of the ssh session, its pid written (the lock still held)."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    fcntl.flock(lock, fcntl.LOCK_UN)  # (the lock is the parent's too: a next start waits on it)
    lock.close()


def _warm() -> None:
    """Import what a session runs, once the pull that started this server (served by
    its parent, on this machine's CPUs) is likely done: the next pull's session, this
    server's first, then starts without them."""
    import casfs.replica.adopt  # (hello's)
    import casfs.replica.serve
    import casfs.repo
    import casfs.store.packstore  # (a store's blobs, opened at its first read)
    import casfs.upkeep.recovery  # noqa: F401


def _serve_forever(listener: socket.socket, store: Path, idle: float, path: Path, pid_path: Path) -> None:
    """Accept sessions until none has run for `idle` seconds."""
    mutex = threading.Lock()
    active = 0
    last = time.monotonic()  # when the last session ended (or the server started)

    def session(conn: socket.socket) -> None:
        nonlocal active, last
        try:
            _session(conn, store)
        except BaseException:  # (one session's failure is its client's: it saw the end)
            pass
        finally:
            conn.close()
            with mutex:
                active -= 1
                last = time.monotonic()

    warm = False
    try:
        while True:
            with mutex:
                left = idle if active else idle - (time.monotonic() - last)
            if left <= 0:
                return
            listener.settimeout(left if warm else min(left, WARM_AFTER_S))
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                if not warm:
                    warm = True
                    _warm()
                continue
            conn.settimeout(None)
            with mutex:
                active += 1
            threading.Thread(target=session, args=(conn,), daemon=True).start()
    finally:
        with contextlib.suppress(OSError), open(pid_path, "r+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # (a start now waits, then finds nothing up)
            listener.close()
            if lock.read().strip() == str(os.getpid()):
                path.unlink()
                pid_path.unlink()
        listener.close()


def _session(conn: socket.socket, store: Path) -> None:
    from casfs.replica.serve import serve
    from casfs.repo import Repository
    from casfs.upkeep.recovery import recover

    repo = Repository.open(store)
    try:
        for _ in recover(repo):
            pass  # (its messages have nowhere to go: stdio is /dev/null)
        with conn.makefile("rb") as inp, conn.makefile("wb") as out:
            serve(repo, inp, out)
    finally:
        repo.close()
