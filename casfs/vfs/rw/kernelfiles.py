"""A directory volume's upper files that the kernel reads and writes itself (FUSE
passthrough, casfs.fuse.upperpass): which inodes have such opens, and what the daemon
must learn from the file, since none of those writes reaches it.

While an inode has a passthrough open its upper file is the kernel's to change:
  - its generation stays (a cut is made in place, a snapshot's fold keeps the file
    instead of deleting it: the kernel holds that file, a new one it would not see);
  - a writer's changes are found by fstat of the upper file (size, mtime) whenever
    the daemon is asked for the inode's attributes or flushes, and at its release;
  - while a writer is open, every flush makes the upper file durable (the kernel's
    writes leave no other trace).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from casfs.ids import InodeNo
from casfs.vfs.overlay.files import Key


@dataclass
class KernelOpen:
    key: Key  # the upper file the kernel was given
    opens: int = 0
    writers: int = 0
    seen: tuple[int, int] = (-1, -1)  # (st_size, st_mtime_ns) of the file, last looked at
    changed: bool = False  # seen moved since the inode was last marked changed (touch)


class KernelOpens:
    """The inodes of one directory volume open by passthrough, counted per handle."""

    def __init__(self) -> None:
        self.opens: dict[InodeNo, KernelOpen] = {}

    def held(self, ino: InodeNo) -> bool:
        return ino in self.opens

    def keys(self) -> set[Key]:
        return {o.key for o in self.opens.values()}

    def writers(self) -> list[tuple[InodeNo, KernelOpen]]:
        return [(ino, o) for ino, o in self.opens.items() if o.writers]

    def add(self, ino: InodeNo, key: Key, writer: bool, fd: int) -> None:
        held = self.opens.get(ino)
        if held is None:
            held = self.opens[ino] = KernelOpen(key, seen=_seen(fd))
        assert held.key == key, "an inode open by passthrough keeps its upper file"
        held.opens += 1
        held.writers += writer

    def remove(self, ino: InodeNo, writer: bool) -> KernelOpen:
        held = self.opens[ino]
        held.opens -= 1
        held.writers -= writer
        if not held.opens:
            del self.opens[ino]
        return held

    @staticmethod
    def look(held: KernelOpen, fd: int) -> tuple[int, int] | None:
        """The file's (size, mtime_ns) if it moved since last looked at, else None."""
        seen = _seen(fd)
        if seen == held.seen:
            return None
        held.seen = seen
        held.changed = True
        return seen


def _seen(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_size, st.st_mtime_ns
