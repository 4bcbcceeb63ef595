"""MemoryBlobStore: a blob store in a dict, the second implementation of BlobStore.

For tests: the conformance suite runs over it as over the disk stores, and a Repository
given one keeps its blobs in memory (its catalog stays on disk). It stores the encoded
form and checks it on every read, as a disk store does, so a test can corrupt a blob
(`stored[bid] = ...`) and see the same errors. "Durable" means: until the object goes.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator

from casfs.errors import MissingBlob
from casfs.store import BlobStore, Domain, Staging, codec
from casfs.store.ids import BlobId
from casfs.store.verified import checked


class MemoryBlobStore(BlobStore):
    def __init__(self) -> None:
        self.stored: dict[BlobId, bytes] = {}  # published blobs, encoded
        # Stagings not yet published or discarded: token -> (owner pid, blobs).
        self.stagings: dict[int, tuple[int, dict[BlobId, bytes]]] = {}
        self._damaged: set[BlobId] = set()
        self._lock = threading.Lock()
        self._tokens = itertools.count()

    def create(self) -> None:
        pass

    def staging(self) -> MemoryStaging:
        with self._lock:
            token = next(self._tokens)
            self.stagings[token] = (os.getpid(), {})
        return MemoryStaging(self, token)

    def get(self, bid: BlobId, domain: Domain | None = None) -> bytes:
        with self._lock:
            stored = self.stored.get(bid)
        if stored is None:
            raise MissingBlob(f"blob {bid.hex()} is missing")
        return checked(self, bid, stored, domain)

    def get_if_cached(self, bid: BlobId, max_stored: int, domain: Domain | None = None) -> bytes | None:
        """Memory never waits: get(), for blobs up to `max_stored` stored bytes."""
        if self.stored_size(bid) > max_stored:
            return None
        return self.get(bid, domain)

    def has(self, bid: BlobId) -> bool:
        with self._lock:
            return bid in self.stored

    def stored_size(self, bid: BlobId) -> int:
        with self._lock:
            stored = self.stored.get(bid)
        if stored is None:
            raise MissingBlob(f"blob {bid.hex()} is missing")
        return len(stored)

    def delete(self, bid: BlobId) -> None:
        with self._lock:
            self.stored.pop(bid, None)

    def list(self) -> Iterator[BlobId]:
        with self._lock:
            ids = list(self.stored)
        return iter(ids)

    def recover_staging(self, owner_alive: Callable[[int], bool]) -> int:
        with self._lock:
            dead = [t for t, (pid, _) in self.stagings.items() if not owner_alive(pid)]
            return sum(len(self.stagings.pop(t)[1]) for t in dead)

    def mark_damaged(self, bid: BlobId) -> None:
        with self._lock:
            self._damaged.add(bid)

    def damaged(self) -> set[BlobId]:
        with self._lock:
            return set(self._damaged)

    def clear_damaged(self, bid: BlobId) -> None:
        with self._lock:
            self._damaged.discard(bid)


class MemoryStaging(Staging):
    """Blobs staged in the store's `stagings` (so recover_staging finds those of a
    "dead" owner), moved to `stored` on publish."""

    def __init__(self, store: MemoryBlobStore, token: int) -> None:
        self.store = store
        self.token = token
        self.done = False  # published or discarded

    def _pending(self) -> dict[BlobId, bytes]:
        """(Under the store's lock.) As a file store's staging directory, one removed
        by recover_staging is gone: adding to it or publishing it fails."""
        entry = self.store.stagings.get(self.token)
        if entry is None:
            raise FileNotFoundError(f"staging {self.token} was removed by recover_staging")
        return entry[1]

    def add(self, bid: BlobId, plain: bytes | memoryview) -> int:
        with self.store._lock:
            known = self._pending().get(bid)
        if known is not None:
            return len(known)
        stored = codec.encode(plain)
        with self.store._lock:
            return len(self._pending().setdefault(bid, stored))

    def publish(self) -> None:
        with self.store._lock:
            if self.done:
                return
            self.store.stored.update(self._pending())
            del self.store.stagings[self.token]
            self.done = True

    def discard(self) -> None:
        with self.store._lock:
            self.store.stagings.pop(self.token, None)
            self.done = True
