"""Writes a directory volume could not put into an upper file (the store's disk full,
failing, or refusing), kept in memory until a flush manages to.

Why: with the kernel's writeback cache, a write reaches the daemon after write(2)
returned; if the daemon fails it, the kernel drops those pages and a later fsync may
succeed without them. So such a write is accepted into memory instead, and an fsync
succeeds only once a flush has put it into the upper file and made it durable (until
then fsync fails, and the data stays here, readable). Once a file has spilled writes,
every later write to it spills too, until a flush drains them: they apply in order,
over what the upper file held. Bounded like any dirty data (the session's dirty limit
makes writers wait for a flush, which fails while the disk does).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from casfs.ids import InodeNo
from casfs.store.local import fsync_dir
from casfs.vfs.overlay.files import copy_in, pwrite_all

Writes = list[tuple[int, bytes]]  # (offset, data), oldest first


@dataclass
class Spill:
    writes: dict[InodeNo, Writes] = field(default_factory=dict)
    size: int = 0  # bytes held

    def __contains__(self, ino: InodeNo) -> bool:
        return ino in self.writes

    def add(self, ino: InodeNo, offset: int, data: bytes) -> None:
        self.writes.setdefault(ino, []).append((offset, bytes(data)))
        self.size += len(data)

    def apply(self, ino: InodeNo, offset: int, buf: bytearray) -> None:
        """Lay the inode's spilled writes, in order, over `buf` (its bytes from offset)."""
        end = offset + len(buf)
        for at, data in self.writes.get(ino, ()):
            lo, hi = max(at, offset), min(at + len(data), end)
            if lo < hi:
                buf[lo - offset : hi - offset] = data[lo - at : hi - at]

    def cut(self, ino: InodeNo, size: int) -> None:
        """A truncate: what spilled past `size` is gone."""
        if ino not in self.writes:
            return
        before = self.writes[ino]
        kept = [(at, data[: size - at]) for at, data in before if at < size]
        self.size -= sum(len(d) for _, d in before) - sum(len(d) for _, d in kept)
        self.writes[ino] = kept  # (even empty: later writes still go after the cut)

    def drop(self, ino: InodeNo) -> None:
        self.size -= sum(len(d) for _, d in self.writes.pop(ino, []))

    def capture(self) -> dict[InodeNo, Writes]:
        return {ino: list(w) for ino, w in self.writes.items()}

    def drained(self, captured: dict[InodeNo, Writes]) -> None:
        """A flush put `captured` into the upper files: forget those writes (later
        ones stay, in order)."""
        for ino, done in captured.items():
            left = self.writes.get(ino, [])
            n = len(done)
            self.size -= sum(len(d) for _, d in left[:n])
            if left[n:]:
                self.writes[ino] = left[n:]
            else:
                self.writes.pop(ino, None)


@dataclass
class SpillJob:
    """One flush's share of the spilled writes (captured on the view's thread, run in
    the flush's worker before its commit): each file's writes into its upper file,
    made first where the file had none (a copy of its base content)."""

    folder: str
    captured: dict[InodeNo, Writes]
    targets: dict[InodeNo, tuple[str, int, int | None]]  # ino -> (upper path, size, new generation)
    copies: dict[InodeNo, list[tuple[int, Callable[[], bytes]]]]  # a new upper's base pieces

    def run(self) -> None:
        made = False
        for ino, writes in self.captured.items():
            path, size, new = self.targets[ino]
            if new is not None:
                os.makedirs(self.folder, exist_ok=True)
                copy_in(path, self.copies.get(ino, []), size)
                made = True
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            try:
                for offset, data in writes:
                    pwrite_all(fd, data, offset)
                os.ftruncate(fd, size)
                os.fdatasync(fd)
            finally:
                os.close(fd)
        if made:
            fsync_dir(self.folder)
