"""Recent answers of the pack index's locate(), in memory. A random reader of a disk asks
for the same chunks again once they have left the chunk cache (a 16 MiB cache holds 1.5%
of a 1 GiB disk), and each SQL lookup is a read transaction (WAL read lock, its fcntl)
of about 6-9 us on the daemon's trio thread.

Why an answer from here is safe: a location names a pack file and a range of it, pack
files are never changed once published, and their names are never reused (a staging's
random tag), so a remembered location holds the blob's bytes for as long as the file is
there; and every read is verified as before. What this process changes in the index it
forgets here (PackIndex.publish, delete). What another process changes (its repack, its
gc) shows as a pack gone (the store forgets the entry and looks up again) or, while this
process still has the old pack's fd open, as the same bytes read from the old copy:
entries are dropped after at most 2 * TTL_S, so that fd is not kept in use (nor its disk
space held) for good. A blob that fails its check is forgotten (PackBlobStore): a copy
stored again elsewhere (healed) is found by the next read.

Bounds: two generations of at most MAX_ENTRIES each (the index's: 145 bytes an entry,
4.8 MiB in all at most; a 1 GiB disk has 16,384 chunks of 64 KiB); the
older is dropped when the newer is full or TTL_S old. An entry found in the older
generation is not moved up (so its age is bounded). Thread-safe without a lock: each
step is one dict operation, and a race can only leave an entry out or leave one that
is still a valid place of the blob's bytes (see above).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

MAX_ENTRIES = 1 << 14  # per generation
TTL_S = 30.0


class Located(Generic[K, V]):
    def __init__(self, max_entries: int = MAX_ENTRIES, ttl_s: float = TTL_S) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._new: dict[K, V] = {}
        self._old: dict[K, V] = {}
        self._born = time.monotonic()

    def get(self, key: K) -> V | None:
        if time.monotonic() - self._born > self.ttl_s:
            self._turn()
        found = self._new.get(key)
        return self._old.get(key) if found is None else found

    def put(self, key: K, value: V) -> None:
        if len(self._new) >= self.max_entries:
            self._turn()
        self._new[key] = value

    def forget(self, keys: Iterable[K]) -> None:
        if not (self._new or self._old):
            return
        for key in keys:
            self._new.pop(key, None)
            self._old.pop(key, None)

    def clear(self) -> None:
        self._new, self._old = {}, {}

    def __len__(self) -> int:
        return len(self._new) + len(self._old)

    def _turn(self) -> None:
        self._old, self._new = self._new, {}
        self._born = time.monotonic()
