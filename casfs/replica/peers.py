"""Reaching another store: a SOURCE names it, a Connection talks to its
`casfs serve-replica` (replica.serve) over the child's stdin and stdout, or over a
socket to one kept up between pulls (replica.sharing).

    /path/to/store                      this machine: `python -m casfs serve-replica PATH`
    ssh://[USER@]HOST[:PORT]/STORE      `ssh [-p PORT] [USER@]HOST REMOTE serve-replica /STORE`

REMOTE is the casfs command on the far side (`--remote-casfs`, else $CASFS_REMOTE, else
`casfs`), and the ssh command is $CASFS_SSH (default `ssh`), split as a shell would:
`CASFS_SSH="ssh -i KEY -o UserKnownHostsFile=FILE"`, as rsync's RSYNC_RSH.

A repeated pull over ssh reuses one ssh connection and a server kept up on the source
(replica.sharing), and then talks to it over a socket; $CASFS_SSH_PERSIST bounds both.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, cast

from casfs.errors import CasfsError, Corruption, UsageError
from casfs.kinds import BlobKind
from casfs.replica import sharing
from casfs.replica.protocol import ERRORS, FRAME, WANT, error_of, frame, read_frame
from casfs.replica.wire import Reader, Record, Writer, widen
from casfs.store.ids import BlobId


def normalize(source: str) -> str:
    """The form a peer is recorded under: an ssh:// URL as given, a path made absolute."""
    return source if source.startswith("ssh://") else str(Path(source).absolute())


def command(source: str, remote: str | None = None) -> list[str]:
    """The argv that serves SOURCE on our stdin and stdout."""
    if not source.startswith("ssh://"):
        return [sys.executable, "-m", "casfs", "serve-replica", normalize(source)]
    ssh, where, store = sharing.ssh_command(source)
    return [*ssh, where, shlex.join([*sharing.far_command(remote), "serve-replica", store])]


class Connection:
    """A session with a store's `serve-replica`. Close it (a context manager).

    It is started at once and waited for at the first request, so that the caller's own
    start (imports, opening its store) runs while ssh connects and the source starts.
    `bwlimit`: at most that many bytes per second read from the source (replica.bwlimit)."""

    def __init__(self, source: str, remote: str | None = None, bwlimit: int | None = None) -> None:
        self.source, self.remote, self.bwlimit = source, remote, bwlimit
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.said: deque[str] = deque(maxlen=20)  # the last lines of its stderr
        self._stderr: threading.Thread | None = None
        self._forward: subprocess.Popen[bytes] | None = None
        self.greeting: dict[str, Any] | None = None  # the server's hello, when asked already
        self._pending: Callable[[], None] | None = None  # what the first request waits for
        self.local = sharing.forwarded(source, remote) if source.startswith("ssh://") else None
        if self.local is None:
            self._start(command(source, remote))
        elif (s := sharing.dial(self.local)) is not None:
            self._use(s)  # (the server kept up: its hello is read at the first request)
            self._pending = self._greeted
        else:
            self._start(sharing.session(source, remote))
            self._pending = self._listening

    def _use(self, s: socket.socket) -> None:
        self.sock = s
        self._streams(s.makefile("rb"), s.makefile("wb"))

    def _start(self, argv: list[str]) -> None:
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except OSError as e:
            raise CasfsError(f"cannot start {argv[0]} for {self.source}: {e.strerror}") from None
        self._stderr = threading.Thread(target=self._drain, args=(self.proc,), daemon=True)
        self._stderr.start()
        assert self.proc.stdout is not None
        widen(self.proc.stdout.fileno())
        self._streams(cast(BinaryIO, self.proc.stdout), cast(BinaryIO, self.proc.stdin))

    def _streams(self, out: BinaryIO, inp: BinaryIO) -> None:
        self.r = Reader(out, f"the connection to {self.source}", role="receiver", ended=self._ended)
        self.w = Writer(inp)
        if self.bwlimit is not None:  # (`--bwlimit`: what this side reads, paced)
            from casfs.replica.bwlimit import Limit

            self.r.meter.limit = Limit(self.bwlimit)

    def _ready(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending()

    def _greeted(self) -> None:
        """The kept-up server's hello; it gone (idle, killed), a session starts it again."""
        assert self.sock is not None
        self.greeting = sharing.answer(self.sock)
        if self.greeting is None:
            self._close_streams()
            self.sock = None
            self._start(sharing.session(self.source, self.remote))
            self._listening()

    def _listening(self) -> None:
        """The session's first line: where its server listens (the master is then told to
        forward a socket here to it, meanwhile), or why not. Without it (an older casfs
        on the source, or an error), the server is started as such a casfs allows."""
        assert self.proc is not None and self.proc.stdout is not None and self.local is not None
        line = self.proc.stdout.readline(4096).decode(errors="replace").rstrip("\n")
        if line.startswith("listening "):
            self._forward = sharing.forward(self.source, self.local, line.removeprefix("listening "))
            return
        if line.startswith("not listening"):
            return
        error = self._ended("")
        self._close_process()
        if not isinstance(error, UsageError):
            raise error  # the source's own error (no such store, ...), or ssh's
        shared = sharing.connect(self.source, self.remote)
        if shared is not None:
            self._use(shared[0])
            self.greeting = shared[1]
        else:
            self._start(command(self.source, self.remote))

    def hello(self) -> dict[str, Any]:
        """The server's hello (its store id, its bucket)."""
        self._ready()
        if self.greeting is None:
            self.greeting = cast(dict[str, Any], self.request("hello"))
        return self.greeting

    def _drain(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.said.append(line.decode(errors="replace").rstrip())

    def _ended(self, message: str) -> CasfsError:
        """The error of a server gone: its own if it said one (`casfs: error: …`)."""
        code: int | None = None
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.proc.wait(timeout=10)
        if self._stderr is not None:
            self._stderr.join(timeout=5)
        errors = [
            line.removeprefix("casfs: error: ") for line in self.said if line.startswith("casfs: error: ")
        ]
        if errors and code in ERRORS:
            return ERRORS[code](f"{self.source}: {errors[-1]}")
        last = f": {self.said[-1]}" if self.said else ""
        why = f" (status {code}{last})" if code is not None else ""
        return CasfsError(f"{self.source} closed the connection{why}; rerun to go on where it stopped")

    def _send(self, data: bytes, flush: bool = False) -> None:
        try:
            self.w.write(data)
            if flush:
                self.w.f.flush()
        except (BrokenPipeError, ConnectionResetError):  # (not the CLI's quiet exit for a reader gone)
            raise self._ended("") from None

    def request(self, op: str, **args: Any) -> Any:
        self._ready()
        self._send(frame(b"Q", json.dumps({"op": op, **args}).encode()), flush=True)
        tag, payload = read_frame(self.r)
        if tag == b"E":
            raise error_of(payload)
        if tag != b"R":
            raise Corruption(f"{self.source} answered with a {tag!r} frame")
        return json.loads(payload)

    def ask(self, wants: Sequence[tuple[BlobId, BlobKind]]) -> None:
        """Ask for blobs (the answer is read by `blobs`, in the order asked)."""
        self._send(frame(b"G", b"".join(WANT.pack(b, k) for b, k in wants)))

    def flush(self) -> None:
        self._send(b"", flush=True)

    def blobs(self, wants: Sequence[tuple[BlobId, BlobKind]]) -> list[Record]:
        """The answer to one `ask`: each record checked to be the one asked for next."""
        out: list[Record] = []
        while True:
            tag, length = FRAME.unpack(self.r.exact(FRAME.size))
            if tag == b".":
                break
            if tag == b"E":
                raise error_of(self.r.exact(length))
            if tag != b"b" or len(out) >= len(wants):
                raise Corruption(f"{self.source} sent a {tag!r} frame among blobs")
            rec = self.r.record()
            if (rec.bid, rec.kind) != wants[len(out)]:
                raise Corruption(f"{self.source} sent blob {rec.bid.hex()} for {wants[len(out)][0].hex()}")
            out.append(rec)
        if len(out) != len(wants):
            raise Corruption(f"{self.source} sent {len(out)} of {len(wants)} blobs asked for")
        return out

    def end(self) -> None:
        """No more requests: the server ends the session once it has answered (while we
        commit)."""
        with contextlib.suppress(OSError):
            if self.sock is not None:
                self.w.f.flush()
                self.sock.shutdown(socket.SHUT_WR)
            elif self.proc is not None and self.proc.stdin is not None:
                self.proc.stdin.close()

    def close(self) -> None:
        """End the session: the server sees the end of its requests (and, if it is still
        writing answers no one will read, a broken pipe) and ends it."""
        self._close_streams()
        if self.sock is not None:
            self.sock.close()
        self._close_process()
        if self._forward is not None:  # (the next pull finds the server through it)
            try:
                self._forward.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._forward.kill()
                self._forward.wait()

    def _close_streams(self) -> None:
        for f in (self.w.f, self.r.f):
            with contextlib.suppress(OSError):
                f.close()

    def _close_process(self) -> None:
        if self.proc is None:
            return
        self._close_streams()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._stderr is not None:
            self._stderr.join(timeout=5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def blob_fetcher(source: str) -> Iterator[Callable[[BlobId, BlobKind], bytes]]:
    """One blob at a time from `source` by its id, verified against it (Corruption if
    other bytes came; the source's own error if it lacks it): scrub's and fsck's heal."""
    from casfs.replica.wire import verify

    with Connection(source) as conn:
        conn.hello()

        def fetch(bid: BlobId, kind: BlobKind) -> bytes:
            conn.ask([(bid, kind)])
            conn.flush()
            (record,) = conn.blobs([(bid, kind)])
            return verify(record)

        yield fetch
