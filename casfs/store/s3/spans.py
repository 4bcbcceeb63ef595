"""Reading a pack by spans: a miss fetches the blobs around the one asked for, as one
ranged GET, and keeps them in the disk cache.

A pack's blobs are in the order they were written, which for an image is file order:
a sequential reader's next blobs are the ones after this one. So the pack is cut into
SPAN-sized cells (by blob start offset); a miss fetches every blob starting in its cell
(one request instead of one per 64 KiB chunk), and concurrent misses in one cell (the
mount's parallel read-ahead) wait for the same request instead of each making their
own. Neighbours go to the disk cache unverified: every read from the cache verifies.

A miss in the cell after the last one fetched from that pack is a sequential reader:
the next READ_AHEAD cells are fetched at once, in parallel, so its reads meet the
cache instead of one request's latency per span (one GET at a time capped a cold
sequential read near 85 MB/s on loopback).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from casfs.errors import transient
from casfs.store.ids import BlobId

if TYPE_CHECKING:
    from casfs.store.s3.diskcache import DiskCache
    from casfs.store.s3.remote import Remote
    from casfs.store.s3.table import Pack

SPAN = 1 << 20
READ_AHEAD = 3  # cells fetched ahead of a sequential reader
_AHEAD_THREADS = 4


class SpanReader:
    def __init__(self, cache: DiskCache) -> None:
        self.cache = cache
        self._lock = threading.Lock()
        self._inflight: dict[tuple[str, int], Future[dict[BlobId, bytes]]] = {}
        self._last: dict[str, int] = {}  # per pack: the furthest cell a miss fetched
        self._ahead: ThreadPoolExecutor | None = None

    def read(
        self, remote: Remote, name: str, pack: Pack | None, bid: BlobId, offset: int, length: int
    ) -> bytes:
        """The stored bytes of `bid` at `offset` in object `name` of `remote` (the pack,
        or the other store's pack an adopted one names: `pack` lists the blobs this
        store knows in it). FileNotFoundError if it is gone, RemoteError if it cannot
        be read."""
        if pack is None or self.cache.max_bytes <= 0:
            return remote.get(name, offset, length)
        blobs = self._cell(remote, name, pack, offset // SPAN)
        stored = blobs.get(bid)
        if stored is None or len(stored) != length:  # (not this copy's cell: read it alone)
            return remote.get(name, offset, length)
        return stored

    def _cell(self, remote: Remote, name: str, pack: Pack, cell: int) -> dict[BlobId, bytes]:
        """The cell's blobs: fetched here, or by the request another reader has in
        flight. If that one fails transiently (errors.transient: a read-ahead started in
        an outage, out of retries just after the store came back), this reader fetches
        the cell again, once (with any other reader doing the same); its maker fails."""
        future, owner = self._claim(name, cell)
        if owner:
            self._read_ahead(remote, name, pack, cell)
            self._run(future, remote, name, pack, cell)
        try:
            return future.result()
        except OSError as e:
            if owner or not transient(e):
                raise
        future, owner = self._claim(name, cell)
        if owner:
            self._run(future, remote, name, pack, cell)
        return future.result()

    def _claim(self, name: str, cell: int) -> tuple[Future[dict[BlobId, bytes]], bool]:
        """The cell's request, and whether the caller is to make it (no one else is)."""
        with self._lock:
            future = self._inflight.get((name, cell))
            if future is not None:
                return future, False
            future = self._inflight[(name, cell)] = Future()
            return future, True

    def _run(
        self, future: Future[dict[BlobId, bytes]], remote: Remote, name: str, pack: Pack, cell: int
    ) -> None:
        try:
            got: dict[BlobId, bytes] | BaseException = self._fetch(remote, name, pack, cell)
        except BaseException as e:
            got = e  # (a read-ahead's: dropped, the cell is asked again)
        # Out of the map before its outcome is known: a joiner that retries after a
        # failure (_cell) must make a new request, not join this one again.
        with self._lock:
            del self._inflight[(name, cell)]
        if isinstance(got, BaseException):
            future.set_exception(got)
        else:
            future.set_result(got)

    def _read_ahead(self, remote: Remote, name: str, pack: Pack, cell: int) -> None:
        """After a miss in the cell following the furthest fetched from this pack, fetch
        the next cells in worker threads (into the disk cache)."""
        with self._lock:
            ahead = range(0)
            if self._last.get(name) == cell - 1:  # (a sequential reader: only then the scan)
                last_cell = max(o for o, _ in pack.entries.values()) // SPAN
                ahead = range(cell + 1, min(cell + READ_AHEAD, last_cell) + 1)
            if len(self._last) > 4096:
                self._last.clear()  # (many packs read once: no stream to follow)
            self._last[name] = ahead[-1] if ahead else cell
            if ahead and self._ahead is None:
                self._ahead = ThreadPoolExecutor(_AHEAD_THREADS, thread_name_prefix="casfs-s3-ahead")
        for c in ahead:
            future, owner = self._claim(name, c)
            if owner and self._ahead is not None:
                self._ahead.submit(self._run, future, remote, name, pack, c)

    def _fetch(self, remote: Remote, name: str, pack: Pack, cell: int) -> dict[BlobId, bytes]:
        entries = [(b, o, n) for b, (o, n) in pack.entries.items() if o // SPAN == cell]
        if not entries:
            return {}  # (a read-ahead into a cell a blob larger than a span skips)
        start = min(o for _, o, _ in entries)
        end = max(o + n for _, o, n in entries)
        data = remote.get(name, start, end - start)
        blobs = {b: data[o - start : o - start + n] for b, o, n in entries}
        for b, stored in blobs.items():
            self.cache.put(b, stored)
        return blobs
