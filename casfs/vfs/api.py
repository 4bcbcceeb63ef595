"""What every view offers the FUSE adapter.

A view is one inode-number space: an image, a snapshot, a volume, or the synthetic
store root. Its root directory (or, for a block view, its one file) is ROOT_INO.

View methods run on the trio thread and never block for long: anything slow is
described, not done (read_plan() returns the chunk ids to fetch, which the adapter
fetches in worker threads). The whole protocol, read/write views included, is stated
once in docs/developer-notes.md, "Concurrency protocol of the daemon".

Errors are CasfsError subclasses (or OSError with an errno); the adapter maps both.
"""

from __future__ import annotations

import errno
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Protocol

from casfs.store.ids import ZERO_ID, BlobId

ROOT_INO = 1


@dataclass(frozen=True)
class Stat:
    ino: int
    mode: int
    nlink: int = 1
    uid: int = 0
    gid: int = 0
    rdev: int = 0
    size: int = 0
    atime_ns: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0
    # 512-byte blocks allocated, for views that know (a sparse file's holes count
    # none, so `du` and cp's sparse detection work); None: the size rounded up.
    blocks: int | None = None

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    def with_(self, **changes: int) -> Stat:
        return replace(self, **changes)


@dataclass(frozen=True)
class Piece:
    """One chunk's part of a read: bytes [start, end) of the chunk, whose content is
    `data` (already in memory; shorter than the chunk means zeros follow) or `blob`
    (fetch it; ZERO_ID is a hole)."""

    start: int
    end: int
    blob: BlobId = ZERO_ID
    data: bytes | bytearray | None = None


def assemble(pieces: list[Piece], fetch: Callable[[BlobId], bytes]) -> bytes:
    out = bytearray()
    for p in pieces:
        if p.data is not None:
            src: bytes | bytearray = p.data
        elif p.blob == ZERO_ID:
            out += bytes(p.end - p.start)
            continue
        else:
            src = fetch(p.blob)
        part = src[p.start : p.end]
        out += part
        if len(part) < p.end - p.start:
            out += bytes(p.end - p.start - len(part))
    return bytes(out)


class View(Protocol):
    read_only: bool
    # True for immutable content: the adapter keeps the kernel page cache and long timeouts.
    immutable: bool

    def getattr(self, ino: int) -> Stat: ...

    def lookup(self, parent: int, name: bytes) -> Stat: ...

    def readdir(self, ino: int, offset: int) -> Iterator[tuple[bytes, Stat, int]]:
        """(name, stat, next offset) from `offset` on; offsets are stable while the
        directory changes (an entry added or removed does not shift the others)."""
        ...

    def readlink(self, ino: int) -> bytes: ...

    def read_plan(self, ino: int, offset: int, size: int) -> list[Piece]: ...

    def getxattr(self, ino: int, name: bytes) -> bytes: ...

    def listxattr(self, ino: int) -> list[bytes]: ...

    def forget(self, ino: int) -> None: ...


def enoent(what: str) -> OSError:
    return OSError(errno.ENOENT, what)
