"""Bytes on the wire: exact reads that count (and may hash) what they read, and the one
blob record both the stream and the pull protocol carry.

A blob record is `id (32) | kind (u8) | length (u32) | encoded`, where `encoded` is the
store's on-disk form (casfs.store.codec: a codec byte, then zstd or raw bytes), so the
wire carries compressed bytes. Nothing is trusted: the receiver decodes (bounded) and
re-hashes every blob in its kind's domain before it stores it (`verify`).

`CASFS_KILL_AFTER_BYTES=ROLE:N` (tests) makes the process playing ROLE (`sender`: what
writes blobs, `receiver`: what reads them) SIGKILL itself once it has moved N bytes: a
crash at a chosen point of a transfer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
from collections.abc import Callable
from typing import BinaryIO, NamedTuple

import blake3

from casfs.errors import CasfsError, Corruption
from casfs.kinds import BlobKind
from casfs.store import codec
from casfs.store.ids import ID_SIZE, BlobId, blob_id, meta_id

RECORD = struct.Struct(f"<{ID_SIZE}sBI")
ENV_KILL_AFTER = "CASFS_KILL_AFTER_BYTES"
_KINDS = {int(k) for k in BlobKind}


class Record(NamedTuple):
    """A blob as it travels: its id, kind and encoded bytes (not yet verified)."""

    bid: BlobId
    kind: BlobKind
    encoded: bytes


def _kill_after(role: str | None) -> int | None:
    value = os.environ.get(ENV_KILL_AFTER, "")
    who, _, n = value.partition(":")
    return int(n) if role is not None and who == role and n else None


class Meter:
    """Counts bytes moved (and paces them, given a limit); kills the process at
    CASFS_KILL_AFTER_BYTES (tests)."""

    def __init__(self, role: str | None = None) -> None:
        self.bytes = 0
        self.kill_at = _kill_after(role)
        self.limit: Callable[[int], None] | None = None  # (a pull's --bwlimit: replica.bwlimit)

    def add(self, n: int) -> None:
        self.bytes += n
        if self.limit is not None:
            self.limit(n)
        if self.kill_at is not None and self.bytes >= self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


class Reader:
    """Exact reads from a binary stream; an early end is a Corruption (`what` says of
    what). With hashing, every byte read goes into `hasher`."""

    def __init__(
        self,
        f: BinaryIO,
        what: str,
        hashing: bool = False,
        role: str | None = None,
        ended: Callable[[str], CasfsError] = Corruption,
    ) -> None:
        self.f, self.what, self.ended = f, what, ended
        self.hasher = blake3.blake3() if hashing else None
        self.meter = Meter(role)

    def exact(self, n: int) -> bytes:
        parts: list[bytes] = []
        left = n
        while left:
            part = self.f.read(left)
            if not part:
                raise self.ended(f"{self.what} is truncated: it ended {left} bytes short of a {n}-byte read")
            parts.append(part)
            left -= len(part)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if self.hasher is not None:
            self.hasher.update(data)
        self.meter.add(n)
        return data

    def record(self) -> Record:
        bid, kind, length = RECORD.unpack(self.exact(RECORD.size))
        if kind not in _KINDS:
            raise Corruption(f"{self.what}: blob {bid.hex()} has an unknown kind {kind}")
        if length > codec.MAX_PLAIN_SIZE + 1:
            raise Corruption(f"{self.what}: blob {bid.hex()} declares {length} bytes, over the limit")
        return Record(BlobId(bid), BlobKind(kind), self.exact(length))


class Writer:
    """Writes to a binary stream, counting (and optionally hashing) every byte."""

    def __init__(self, f: BinaryIO, hashing: bool = False, role: str | None = None) -> None:
        self.f = f
        self.hasher = blake3.blake3() if hashing else None
        self.meter = Meter(role)

    def write(self, data: bytes) -> None:
        self.f.write(data)
        if self.hasher is not None:
            self.hasher.update(data)
        self.meter.add(len(data))

    def record(self, r: Record) -> None:
        self.write(RECORD.pack(r.bid, r.kind, len(r.encoded)) + r.encoded)


PIPE_BYTES = 1 << 20  # the default pipe's 64 KiB make a 10 MiB transfer many hand-offs


def widen(fd: int) -> None:
    """Enlarge a pipe's buffer (a no-op for anything else, or where refused): blobs
    cross ssh's pipes in fewer, larger writes and reads."""
    import fcntl

    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def encode(bid: BlobId, kind: BlobKind, plain: bytes) -> Record:
    return Record(bid, kind, codec.encode(plain))


def verify(r: Record) -> bytes:
    """The plaintext of a record, decoded and re-hashed in its kind's domain; Corruption
    (exit 5) if it is not the blob its id names."""
    plain = codec.decode(r.encoded, f"blob {r.bid.hex()}")
    actual = blob_id(plain) if r.kind == BlobKind.DATA else meta_id(plain)
    if actual != r.bid:
        raise Corruption(f"blob {r.bid.hex()} arrived with other bytes (they hash to {actual.hex()})")
    return plain
