"""Background fills of the whole-file cache (casfs.store.filecache): files too large to
be filled while their open waits (a VM's disk image, a large file of an image).

One worker thread fills one file at a time, in the order they were first asked for,
from blobs that `fetch` verifies, through FileCache.fill (written whole, hashed, fsync'd,
renamed). Meanwhile the daemon serves those files' reads, from what the fill has written
where it is ahead of the reader (progress()), as without passthrough elsewhere; an
open after the fill finds the file cached (casfs.fuse.passthrough switches then, when no
handle of the inode is served by the daemon: the kernel refuses mixing the two).

A file larger than the cache's bound is never filled (it would evict everything else
and still not fit): `status()` says how many were refused so. A fill that fails (a
damaged chunk, a full disk) is not tried again in this session: its reads stay the
daemon's, with their EIO for a damaged range.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from casfs.errors import CasfsError
from casfs.store.filecache import FileCache, FillProgress, Part
from casfs.store.ids import ZERO_ID, BlobId

# The store's verified read of a run (BlobStore.get_many): each blob's plaintext or error.
GetMany = Callable[[Sequence[BlobId]], Iterator[tuple[BlobId, bytes | Exception]]]
# Parts read as one run (fetch_many: one index query and one pread for chunks side by
# side). The daemon gives its chunk cache's, so that a first reader beside the fill and
# the fill decode each chunk once: the reader, when behind, reads the fill's file
# (FillProgress), and the fill, when behind, finds the reader's chunks in the cache.
_RUN_PARTS = 64

log = logging.getLogger("casfs.daemon")


class _Stopped(Exception):
    pass


@dataclass
class FillStats:
    """What the fills did, for status lines and metrics (one writer: the worker)."""

    queued: int = 0
    filling_bytes: int = 0  # the size of the file being filled (0: none)
    filled_bytes: int = 0  # of it, so far
    files: int = 0  # fills finished in this session
    bytes: int = 0  # their bytes
    seconds: float = 0.0  # their time
    failed: int = 0
    too_large: int = 0  # files larger than the cache's bound, not filled
    served_bytes: int = 0  # read by the daemon's readers from fills in flight (ended ones)

    def rate(self) -> float:
        """Bytes a second over the finished fills (0: none yet)."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


class BackgroundFills:
    def __init__(
        self, cache: FileCache, fetch: Callable[[BlobId], bytes], fetch_many: GetMany | None = None
    ) -> None:
        self.cache = cache
        self.fetch = fetch
        self.fetch_many = fetch_many
        self.stats = FillStats()
        self._todo: OrderedDict[str, Sequence[Part]] = OrderedDict()
        self._progress: dict[str, FillProgress] = {}  # of fills queued or in flight
        self._refused: set[str] = set()  # too large or failed: not asked again
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._current: str | None = None  # the key being filled

    def want(self, key: str, size: int, parts: Sequence[Part]) -> None:
        """Fill `key` (of `size` bytes, made of `parts`) once the fills before it are done;
        nothing if it is queued, in flight, refused, or too large for the cache."""
        with self._cv:
            # (in flight too: queued again, it would take the place of its progress)
            if key in self._progress or key in self._refused or self._stop.is_set():
                return
            if size > self.cache.limit:
                self._refused.add(key)
                self.stats.too_large += 1
                log.info(
                    "passthrough: a file of %d bytes is larger than the file cache (%d): not cached",
                    size,
                    self.cache.limit,
                )
                return
            self._todo[key] = parts
            self._progress[key] = FillProgress()
            self.stats.queued = len(self._todo)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="casfs-filefill", daemon=True)
                self._thread.start()
            self._cv.notify()

    def progress(self, key: str) -> FillProgress | None:
        """The fill of `key` while it is queued or in flight, for readers meanwhile
        (attach() it, detach() when done)."""
        with self._cv:
            got = self._progress.get(key)
            if got is not None:
                got.attach()
            return got

    def pending(self, key: str) -> bool:
        """Whether `key` is queued, being filled, or refused (nothing to ask then)."""
        with self._cv:
            return key in self._todo or key == self._current or key in self._refused

    def stop(self, wait: bool = True) -> None:
        """End the worker (`wait`: and wait for it); a fill in flight stops at its next
        chunk (its temporary file is removed)."""
        self._stop.set()
        with self._cv:
            self._cv.notify()
        if wait and self._thread is not None:
            self._thread.join()

    def status(self) -> str:
        s = self.stats
        line = f"{s.files} filled ({s.bytes >> 20} MiB, {s.rate() / 1e6:.0f} MB/s), {s.queued} queued"
        if s.filling_bytes:
            line += f", filling {s.filled_bytes >> 20} of {s.filling_bytes >> 20} MiB"
        if s.served_bytes:
            line += f", {s.served_bytes >> 20} MiB read from fills in flight"
        if s.failed:
            line += f", {s.failed} failed"
        if s.too_large:
            line += f", {s.too_large} larger than the cache"
        return line

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._todo and not self._stop.is_set():
                    self._cv.wait()
                if self._stop.is_set():
                    for progress in self._progress.values():
                        progress.end()
                    return
                key, parts = self._todo.popitem(last=False)
                self._current = key
                self.stats.queued = len(self._todo)
                self.stats.filling_bytes = sum(end - start for _, start, end in parts)
                self.stats.filled_bytes = 0
                progress = self._progress[key]
            try:
                self._fill(key, parts, progress)
            finally:
                with self._cv:
                    del self._progress[key]
                    self._current = None
                    self.stats.queued = len(self._todo)
                progress.end()
                self.stats.served_bytes += progress.served

    def _fill(self, key: str, parts: Sequence[Part], progress: FillProgress) -> None:
        s = self.stats
        if self.cache.lookup(key) is not None:
            s.filling_bytes = 0
            return
        t0 = time.monotonic()
        run: dict[BlobId, bytes] = {}
        fetch = self.fetch if self.fetch_many is None else lambda bid: run.pop(bid, None) or self.fetch(bid)
        try:
            self.cache.fill(key, self._counted(parts, run), fetch, progress)
        except _Stopped:
            return
        except (CasfsError, OSError) as e:
            with self._cv:
                self._refused.add(key)
            s.failed += 1
            log.warning(
                "passthrough: the background fill of a file of %d bytes failed: %s", s.filling_bytes, e
            )
            return
        finally:
            size, s.filling_bytes = s.filling_bytes, 0
        s.files += 1
        s.bytes += size
        s.seconds += time.monotonic() - t0

    def _counted(self, parts: Sequence[Part], run: dict[BlobId, bytes]) -> Iterator[Part]:
        """`parts` in order, counted; with fetch_many, each run of them read into `run`
        first (fetch then takes them from there)."""
        for i, part in enumerate(parts):
            if self._stop.is_set():
                raise _Stopped
            if self.fetch_many is not None and i % _RUN_PARTS == 0:
                run.clear()
                wanted = list(dict.fromkeys(b for b, _, _ in parts[i : i + _RUN_PARTS] if b != ZERO_ID))
                for bid, got in self.fetch_many(wanted):
                    if isinstance(got, Exception):
                        raise got
                    run[bid] = got
            yield part
            self.stats.filled_bytes += part[2] - part[1]
