"""One ssh connection and one source-side server for the pulls that follow each other:
what a repeated pull over ssh does not pay again (the handshake, a shell and a Python
starting on the source).

    master   the first pull's ssh becomes a master (ssh's ControlMaster), which stays in
             the background for $CASFS_SSH_PERSIST seconds (default 60) after the last
             session or forwarded connection through it ended; later sessions open
             through it, without a handshake.
    server   `casfs serve-replica --listen NAME --idle S` on the source (replica.listen),
             bound to a socket in the source user's private directory; it exits S
             seconds (the same $CASFS_SSH_PERSIST) after its last session. The master
             forwards a socket here to it (`ssh -O forward`), so a pull connects to a
             local socket and a session starts at once.

A pull that finds no server up runs `serve-replica --listen NAME --idle S --stdio` in
one ssh session (`session`): it starts the server (or finds it up), says where it
listens on its first line, and then serves that pull on its stdin and stdout, while
the master is told to forward (`forward`). So a cold pull pays one ssh session and one
Python start on the source, not a session to start the server and a connection to it.

NAME is a hash of SOURCE and the remote command, so servers of other stores, or run
by another casfs, are never mixed up. Sockets live in a directory only this user can
reach ($XDG_RUNTIME_DIR/casfs-ssh, else /tmp/casfs-ssh-UID; if it is not private,
nothing is shared); CASFS_SSH_PERSIST=0 turns sharing off. Options in $CASFS_SSH come
first, so a ControlPath or ControlMaster given there wins. Against a casfs there
without --stdio (usage: exit 2) the server is started by a session of its own and
forwarded to first (`connect`); without --listen either, or where forwarding is
refused, a pull runs `serve-replica` in a session as without sharing. When the server
is gone (idle, killed), the next pull starts it again. `master_pid` and `server_pid`
find both, to end them sooner.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from casfs.errors import CasfsError, UsageError

ENV_SSH = "CASFS_SSH"
ENV_REMOTE = "CASFS_REMOTE"
ENV_PERSIST = "CASFS_SSH_PERSIST"
PERSIST_S = 60  # how long a master and a server outlive their last session, by default
START_S = 120  # the longest a server's start (an ssh session) may take
# A socket's path is at most 107 bytes; ssh binds a master's as DIR/%C (40) plus a
# temporary suffix of 17 first.
MAX_DIR = 107 - 1 - 40 - 17


def control_dir() -> Path | None:
    """The private directory of shared sockets (made if absent); None if it is not a
    directory of this user's that no one else may enter, or too long a path."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        d = Path(runtime) / "casfs-ssh"
    else:
        import tempfile  # (here: a server's start, on the source, needs none where there is a runtime dir)

        d = Path(tempfile.gettempdir()) / f"casfs-ssh-{os.getuid()}"
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        st = d.lstat()
    except OSError:
        return None
    private = stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077
    return d if private and len(os.fsencode(d)) <= MAX_DIR else None


def persist_s() -> int:
    value = os.environ.get(ENV_PERSIST, "").strip()
    if not value:
        return PERSIST_S
    if not value.isdigit():
        raise UsageError(f"${ENV_PERSIST} must be a number of seconds, not {value!r}")
    return int(value)


def _options() -> list[str]:
    persist = persist_s()
    d = control_dir() if persist else None
    if d is None:
        return []
    return [
        *("-o", "ControlMaster=auto", "-o", f"ControlPath={d}/%C", "-o", f"ControlPersist={persist}"),
        *("-o", "StreamLocalBindUnlink=yes"),  # (the master binds forwarded sockets: replaces stale ones)
    ]


def ssh_command(source: str) -> tuple[list[str], str, str]:
    """For an ssh:// SOURCE: the ssh command (with sharing), [USER@]HOST and the store."""
    url = urlsplit(source)
    if not url.hostname or not url.path or url.path == "/":
        raise UsageError(f"invalid source {source!r}: expected ssh://[USER@]HOST[:PORT]/STORE")
    try:
        port = url.port
    except ValueError:
        raise UsageError(f"invalid port in {source!r}") from None
    ssh = shlex.split(os.environ.get(ENV_SSH) or "ssh")
    where = f"{url.username}@{url.hostname}" if url.username else url.hostname
    return [*ssh, *_options(), *(["-p", str(port)] if port else [])], where, url.path


def far_command(remote: str | None) -> list[str]:
    return shlex.split(remote or os.environ.get(ENV_REMOTE) or "casfs")


def master_pid(source: str) -> int | None:
    """The pid of the shared ssh connection to an ssh:// SOURCE's host, if one is up
    (`ssh -O check` asks the master through its socket, and starts nothing)."""
    ssh, where, _ = ssh_command(source)
    try:
        done = subprocess.run(
            [*ssh, "-O", "check", where], capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"\(pid=(\d+)\)", done.stderr)
    return int(found.group(1)) if done.returncode == 0 and found else None


def _key(source: str, remote: str | None) -> str:
    return hashlib.sha256(json.dumps([source, far_command(remote)]).encode()).hexdigest()[:24]


def server_name(source: str, remote: str | None) -> str:
    """The name of SOURCE's server: serve-KEY.sock, serve-KEY.pid there, and the socket
    forwarded to it here is fwd-KEY.sock (apart: the source may be this machine)."""
    return f"serve-{_key(source, remote)}"


def server_pid(source: str, remote: str | None, far_dir: Path) -> int | None:
    """The pid of the server of SOURCE, from its pid file in `far_dir` (the source
    user's private directory: a test's, on this machine)."""
    try:
        return int((far_dir / f"{server_name(source, remote)}.pid").read_text())
    except (OSError, ValueError):
        return None


def dial(path: Path) -> socket.socket | None:
    """A session with the server through the local socket, `hello` asked (its answer:
    `answer`); None where no one listens. A socket no one listens on (its master gone)
    is removed: the next forward binds there."""
    from casfs.replica.protocol import frame

    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(str(path))
    except ConnectionRefusedError:
        path.unlink(missing_ok=True)
        s.close()
        return None
    except OSError:
        s.close()
        return None
    try:
        s.settimeout(START_S)
        s.sendall(frame(b"Q", b'{"op": "hello"}'))
        return s
    except OSError:
        s.close()
        return None


def answer(s: socket.socket) -> dict[str, Any] | None:
    """The server's answer to dial's `hello` (ssh closes the connection when the server
    on the far side is gone: then None, and the socket closed)."""
    try:
        with s.makefile("rb") as f:
            head = f.read(5)
            if len(head) == 5 and head[:1] == b"R":
                body = f.read(int.from_bytes(head[1:], "little"))
                if body:
                    s.settimeout(None)
                    hello: dict[str, Any] = json.loads(body)
                    return hello
    except (OSError, ValueError):
        pass
    s.close()
    return None


def forwarded(source: str, remote: str | None) -> Path | None:
    """The local socket forwarded to SOURCE's server; None where sharing is off."""
    d = control_dir() if persist_s() else None
    return None if d is None else d / f"fwd-{_key(source, remote)}.sock"


def session(source: str, remote: str | None) -> list[str]:
    """The argv of a session that starts SOURCE's server (or finds it up), prints
    `listening PATH` (or `not listening: WHY`), then serves this pull on its stdin and
    stdout: one ssh session and one Python on the source for a pull that finds no
    server up, instead of a session to start it and a connection to it."""
    return _listen_session(source, remote, "--stdio")


def _listen_session(source: str, remote: str | None, *more: str) -> list[str]:
    """The argv of an ssh session running `serve-replica --listen` on SOURCE."""
    ssh, where, store = ssh_command(source)
    name, idle = server_name(source, remote), str(persist_s())
    far = [*far_command(remote), "serve-replica", "--listen", name, "--idle", idle, *more, store]
    return [*ssh, where, shlex.join(far)]


def _forward_argv(source: str, local: Path, far: str) -> list[str]:
    """The argv that has the master forward `local` to the server's socket `far`."""
    ssh, where, _ = ssh_command(source)
    return [*ssh, "-O", "forward", "-L", f"{local}:{far}", where]


def forward(source: str, local: Path, far: str) -> subprocess.Popen[bytes]:
    """Have the master forward `local` to the server's socket `far` (in the background:
    the caller waits for it when its pull ends)."""
    return subprocess.Popen(
        _forward_argv(source, local, far),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def connect(source: str, remote: str | None) -> tuple[socket.socket, dict[str, Any]] | None:
    """A connected socket to SOURCE's server, started and forwarded by a session of its
    own, and the server's hello; None where sharing is off or cannot be had (the caller
    runs a session instead). For a casfs on the source without `--stdio` (`session`)."""
    local = forwarded(source, remote)
    if local is None:
        return None
    start = _listen_session(source, remote)
    try:
        done = subprocess.run(start, capture_output=True, timeout=START_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise CasfsError(f"{source}: the server did not start in {START_S} s") from None
    except OSError as e:
        raise CasfsError(f"cannot start {start[0]} for {source}: {e.strerror}") from None
    said = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not said or not said[-1].startswith("listening "):
        _raise_error_of(source, done)
        return None  # (a casfs there without --listen, say: a session, as before)
    far = said[-1].removeprefix("listening ")
    forwarding = subprocess.run(
        _forward_argv(source, local, far), capture_output=True, timeout=30, stdin=subprocess.DEVNULL
    )
    s = dial(local) if forwarding.returncode == 0 else None
    hello = None if s is None else answer(s)
    return None if s is None or hello is None else (s, hello)


def _raise_error_of(source: str, done: subprocess.CompletedProcess[bytes]) -> None:
    """The source's own error (no such store, …), if casfs there said one; an exit 2
    (usage: an older casfs) or anything else is left to the session that follows."""
    from casfs.replica.protocol import ERRORS

    errors = [
        line.removeprefix("casfs: error: ")
        for line in done.stderr.decode(errors="replace").splitlines()
        if line.startswith("casfs: error: ")
    ]
    if errors and done.returncode in ERRORS and done.returncode != 2:
        raise ERRORS[done.returncode](f"{source}: {errors[-1]}")
