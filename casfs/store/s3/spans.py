"""Reading a pack by spans: a miss fetches the blobs around the one asked for, as one
ranged GET, and keeps them in the disk cache.

A pack's blobs are in the order they were written, which for an image is file order:
a sequential reader's next blobs are the ones after this one. So the pack is cut into
SPAN-sized cells (by blob start offset); a miss fetches every blob starting in its cell
(one request instead of one per 64 KiB chunk), and concurrent misses in one cell (the
mount's parallel read-ahead) wait for the same request instead of each making their
own. Neighbours go to the disk cache unverified: every read from the cache verifies.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

from casfs.store.ids import BlobId

if TYPE_CHECKING:
    from casfs.store.s3.diskcache import DiskCache
    from casfs.store.s3.remote import Remote
    from casfs.store.s3.table import Pack

SPAN = 1 << 20


class SpanReader:
    def __init__(self, cache: DiskCache) -> None:
        self.cache = cache
        self._lock = threading.Lock()
        self._inflight: dict[tuple[str, int], Future[dict[BlobId, bytes]]] = {}

    def read(
        self, remote: Remote, name: str, pack: Pack | None, bid: BlobId, offset: int, length: int
    ) -> bytes:
        """The stored bytes of `bid` at `offset` in object `name` of `remote` (the pack,
        or the other store's pack an adopted one names: `pack` lists the blobs this
        store knows in it). FileNotFoundError if it is gone, RemoteError if it cannot
        be read."""
        if pack is None or self.cache.max_bytes <= 0:
            return remote.get(name, offset, length)
        key = (name, offset // SPAN)
        with self._lock:
            future = self._inflight.get(key)
            owner = future is None
            if future is None:
                future = self._inflight[key] = Future()
        if owner:
            try:
                future.set_result(self._fetch(remote, name, pack, key[1]))
            except BaseException as e:
                future.set_exception(e)
            finally:
                with self._lock:
                    del self._inflight[key]
        blobs = future.result()
        stored = blobs.get(bid)
        if stored is None or len(stored) != length:  # (not this copy's cell: read it alone)
            return remote.get(name, offset, length)
        return stored

    def _fetch(self, remote: Remote, name: str, pack: Pack, cell: int) -> dict[BlobId, bytes]:
        entries = [(b, o, n) for b, (o, n) in pack.entries.items() if o // SPAN == cell]
        start = min(o for _, o, _ in entries)
        end = max(o + n for _, o, n in entries)
        data = remote.get(name, start, end - start)
        blobs = {b: data[o - start : o - start + n] for b, o, n in entries}
        for b, stored in blobs.items():
            self.cache.put(b, stored)
        return blobs
