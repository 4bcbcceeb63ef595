"""The in-memory index of an S3 store: which packs hold which published blobs.

Built from the index objects (packfmt), the adopted ones (blobs of another store's
pack: Pack.foreign) and the dead records, kept current by the store as it publishes
and deletes. A blob may live in several packs (written again by a
writer that did not know it was there, or to heal a damaged copy): every live location
is kept, newest last, and a read tries the newest first.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from casfs.store.ids import BlobId
from casfs.store.s3.packfmt import Entry


@dataclass(frozen=True)
class Foreign:
    """A pack of another store on the same bucket, as an adopted object names it."""

    prefix: str  # the owner's prefix in the bucket
    store: str  # the owner's store id
    pack: str  # the pack's name there


@dataclass
class Pack:
    size: int
    entries: dict[BlobId, tuple[int, int]]  # id -> (offset, stored length)
    dead: set[BlobId] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)  # orders its dead records
    foreign: Foreign | None = None  # adopted: the bytes are in another store's pack

    @property
    def live(self) -> int:
        return len(self.entries) - len(self.dead)


Location = tuple[str, int, int]  # pack name, offset, stored length


class PackTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.packs: dict[str, Pack] = {}
        self._where: dict[BlobId, list[str]] = {}

    def add(
        self,
        name: str,
        size: int,
        entries: Iterable[Entry],
        dead: Iterable[BlobId] = (),
        foreign: Foreign | None = None,
    ) -> None:
        pack = Pack(size, {bid: (off, n) for bid, off, n in entries}, set(dead), foreign=foreign)
        with self._lock:
            old = self.packs.get(name)
            if old is not None:
                pack.dead |= old.dead
                self._unlink(name, old)
            self.packs[name] = pack
            for bid in pack.entries:
                if bid not in pack.dead:
                    self._where.setdefault(bid, []).append(name)

    def _unlink(self, name: str, pack: Pack) -> None:
        for bid in pack.entries:
            names = self._where.get(bid)
            if names and name in names:
                names.remove(name)
                if not names:
                    del self._where[bid]

    def drop(self, name: str) -> None:
        with self._lock:
            pack = self.packs.pop(name, None)
            if pack is not None:
                self._unlink(name, pack)

    def mark_dead(self, name: str, bid: BlobId) -> int:
        """Record `bid` of pack `name` deleted; the pack's live blobs left (-1: no such
        pack any more)."""
        with self._lock:
            pack = self.packs.get(name)
            if pack is None:
                return -1
            if bid in pack.entries and bid not in pack.dead:
                pack.dead.add(bid)
                names = self._where.get(bid, [])
                if name in names:
                    names.remove(name)
                if not names:
                    self._where.pop(bid, None)
            return pack.live

    def locate(self, bid: BlobId) -> list[Location]:
        """Every live copy of `bid`, newest first."""
        with self._lock:
            names = list(reversed(self._where.get(bid, ())))
            return [(n, *self.packs[n].entries[bid]) for n in names]

    def has(self, bid: BlobId) -> bool:
        with self._lock:
            return bid in self._where

    def live_ids(self) -> list[BlobId]:
        with self._lock:
            return list(self._where)

    def pack(self, name: str) -> Pack | None:
        with self._lock:
            return self.packs.get(name)

    def names(self) -> set[str]:
        with self._lock:
            return set(self.packs)
