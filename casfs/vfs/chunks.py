"""The read path's chunk cache: decompressed, verified chunks in a bounded LRU, with
read-ahead for sequential readers. Where a miss is read and when to read ahead is one
policy (casfs.vfs.readpolicy); this module does the reads it decides, and is the one
module of casfs.vfs that imports trio.

`cached()` and `readahead()` run on the trio thread and never block; `fetch()` blocks
(disk, zstd, BLAKE3): worker threads; `fetch_async()` is the trio thread's. Two fetches
of one blob share one read (an in-flight map of futures); read-ahead loads run in a
pool of their own, misses in the cache's workers (_Workers, cheaper than
trio.to_thread), both as runs (`get_many`: one index query and one pread for chunks
side by side). A blob that fails verification raises Corruption to its reader and is
counted (`corrupt_reads`, `last_corrupt`: the mount shows the count as an xattr).
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import outcome
import trio

from casfs.errors import Corruption, MissingBlob, transient
from casfs.store.cache import LRU
from casfs.store.ids import ZERO_ID, BlobId
from casfs.vfs.api import ReadPiece
from casfs.vfs.loading import Load
from casfs.vfs.plan import Planner
from casfs.vfs.readpolicy import PREFETCH_RUN, Idle, ReadPolicy

# The daemon's own cache is small: the kernel's page cache keeps the blob files (and,
# for immutable content, the files read through the mount), and a hit there costs one
# decode and hash. 16 MiB holds a sequential reader's read-ahead window (8 MiB) twice:
# a cold 1 GiB `dd` of an image read as fast as with 32 MiB (128-227 MB/s against
# 134-216, same hour), and the daemon's peak RSS fell by the 16 MiB. (Random reads of a
# disk bigger than the cache hit it seldom either way: 1.5% against 3% for 1 GiB.)
DEFAULT_CACHE_BYTES = 16 << 20
# Read-ahead window for a sequential reader (casfs.vfs.readpolicy: when it starts).
DEFAULT_READAHEAD_BYTES = 8 << 20
# Chunks read-ahead may have loading at once, in bytes (two windows: the cache's size;
# counted in chunks, 256, it left half of a window of 16 KiB chunks unloaded).
_MAX_INFLIGHT_BYTES = 16 << 20
_MIN_CHUNK_BYTES = 4 << 10  # (the unit counted for smaller pieces: a small file's)
# Read-ahead threads: one per core, at most 4 (decoding and hashing release the GIL to a
# waiting thread: more threads than cores take turns; a cold 1 GiB read on 2 cores spent
# 0.33 s per GiB in futex calls with 4 threads at 32 KiB chunks, 0.06 s with 2).
_PREFETCH_WORKERS = max(1, min(4, len(os.sched_getaffinity(0))))
# Threads for misses read in workers: a hypervisor's queue depth (16) kept busy, few enough for the GIL.
_MISS_WORKERS = 8

Get = Callable[[BlobId], bytes]
# The store's read of a run (BlobStore.get_many): each blob's plaintext or error, as ready.
GetMany = Callable[[Sequence[BlobId]], Iterator[tuple[BlobId, bytes | Exception]]]
GetNowait = Callable[[BlobId], bytes | None]
T = TypeVar("T")


class ChunkCache:
    """Verified chunk plaintext by blob id. `get` is the store's verified read
    (Repository.get): it raises Corruption, never returns wrong bytes."""

    def __init__(
        self,
        get: Get,
        max_bytes: int = DEFAULT_CACHE_BYTES,
        readahead_bytes: int = DEFAULT_READAHEAD_BYTES,
        workers: int = _PREFETCH_WORKERS,
        get_nowait: GetNowait | None = None,
        idle: Idle | None = None,
        local: bool = False,
        miss_workers: int = _MISS_WORKERS,
        get_many: GetMany | None = None,
    ) -> None:
        self._get = get
        self._get_many = get_many
        self._get_nowait = get_nowait
        self.policy = ReadPolicy(local, get_nowait is not None)
        self.policy.idle = idle
        self.inline = 0  # misses read on the trio thread without waiting (nowait)
        self.blocking = 0  # misses read by a blocking read on the trio thread
        self._waiting = 0  # fetch_async calls waiting for a worker
        self._misses = _Workers(miss_workers, "casfs-read")
        self._lru: LRU[BlobId, bytes] = LRU(max_bytes)
        self._lock = threading.Lock()
        self._inflight: dict[BlobId, Load] = {}
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="casfs-readahead") if workers else None
        self._pool_size = workers
        self.readahead_bytes = readahead_bytes
        self.corrupt_reads = 0
        self.last_corrupt: deque[BlobId] = deque(maxlen=8)
        self.prefetched = 0

    @property
    def idle(self) -> Idle | None:
        return self.policy.idle

    @idle.setter
    def idle(self, idle: Idle | None) -> None:
        self.policy.idle = idle

    def close(self) -> None:
        self._misses.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    # -- reads -------------------------------------------------------------------

    def cached(self, bid: BlobId) -> bytes | None:
        """The chunk if it is in memory; never blocks."""
        return self._lru.get(bid)

    def fetch(self, bid: BlobId) -> bytes:
        """The chunk, read and verified if it is not in memory. Blocks: call it from a
        worker thread. Raises Corruption (counted) for a blob that fails verification."""
        data = self._lru.get(bid)
        if data is not None:
            return data
        with self._lock:
            fut = self._inflight.get(bid)
            mine = fut is None
            if fut is None:
                fut = self._inflight[bid] = Load()
        if mine:
            self._load(bid, fut)
        return self._results([(bid, fut)], {fut} if mine else ())[bid]

    def split(self, pieces: Iterable[ReadPiece]) -> tuple[dict[BlobId, bytes], list[BlobId]]:
        """The chunks a read needs: those in memory, and the ids still to fetch."""
        have: dict[BlobId, bytes] = {}
        missing: list[BlobId] = []
        for p in pieces:
            bid = p.blob
            if p.data is not None or bid == ZERO_ID or bid in have:
                continue
            data = self._lru.get(bid)
            if data is not None:
                have[bid] = data
            elif bid not in missing:
                missing.append(bid)
        return have, missing

    def fetch_many(self, bids: Iterable[BlobId], retry: bool = True) -> dict[BlobId, bytes]:
        """fetch() of each chunk; those no other thread is loading are read as one run
        (one read of the store for chunks side by side: _load_many). `retry`: read again
        the chunks whose joined load failed transiently (_outcomes); False: this is that."""
        out: dict[BlobId, bytes] = {}
        waits: list[tuple[BlobId, Load]] = []
        mine: list[tuple[BlobId, Load]] = []
        bids = list(bids)
        for bid in bids:
            data = self._lru.get(bid)
            if data is not None:
                out[bid] = data
        with self._lock:
            for bid in bids:
                if bid in out:
                    continue
                fut = self._inflight.get(bid)
                if fut is None:
                    fut = self._inflight[bid] = Load()
                    mine.append((bid, fut))
                waits.append((bid, fut))
        if mine:
            self._load_many(mine)
        out.update(self._results(waits, {fut for _, fut in mine} if retry else None))
        return out

    def _results(self, loads: list[tuple[BlobId, Load]], own: Collection[Load] | None) -> dict[BlobId, bytes]:
        """The loads' chunks, waiting for each (_outcomes), and those of joined loads
        that failed transiently read again, once (blocks: a worker's call)."""
        got, again = self._outcomes(loads, own)
        if again:
            got.update(self.fetch_many(again, retry=False))
        return got

    def _outcomes(
        self, loads: list[tuple[BlobId, Load]], own: Collection[Load] | None = ()
    ) -> tuple[dict[BlobId, bytes], list[BlobId]]:
        """The loads' chunks, waiting for each; Corruption (counted) for one that failed
        its check. And the ids to load again: those whose load this reader joined (not
        in `own`; None: none) and that failed with a transient error. Such a load may
        have been started in an S3 outage and have run out of retries just after the
        store came back (errors.transient); its originator fails, as its own read did."""
        got: dict[BlobId, bytes] = {}
        again: list[BlobId] = []
        for bid, fut in loads:
            try:
                got[bid] = fut.result()
            except Corruption:
                self.count_corrupt(bid)
                raise
            except OSError as e:
                if own is None or fut in own or not transient(e):
                    raise
                again.append(bid)
        return got, again

    async def fetch_async(self, bids: Iterable[BlobId]) -> dict[BlobId, bytes]:
        """fetch_many() for the trio thread: chunks that read-ahead is already loading
        are awaited where they are (no worker thread just to wait); a small miss is read
        here where the policy says so (casfs.vfs.readpolicy); the rest in worker threads."""
        todo = list(bids)
        # Nothing in flight (a random reader's case): no pass under the lock. (Read
        # without it: a load started just now is at worst read here a second time.)
        waits, todo = self.loading(todo) if self._inflight else ([], todo)
        out: dict[BlobId, bytes] = {}
        policy = self.policy
        if policy.small(len(todo)):
            if tried := policy.try_nowait():  # (what it leaves is out of the page cache)
                todo = [bid for bid in todo if not self._fetch_inline(bid, out)]
            if todo and policy.may_block(self._waiting) and not (tried and policy.hand_off(self._waiting)):
                self._read_here(todo, out)
                todo = []
        if todo:
            await self._fetch_in_workers(todo, out)
        if waits:
            out.update(await self.loaded(waits))
        return out

    async def _fetch_in_workers(
        self, todo: list[BlobId], out: dict[BlobId, bytes], retry: bool = True
    ) -> None:
        self._waiting += 1
        try:
            await self._fetch_runs(todo, out, retry)
        finally:
            self._waiting -= 1

    async def _fetch_runs(self, todo: list[BlobId], out: dict[BlobId, bytes], retry: bool) -> None:
        runs = [todo[i : i + PREFETCH_RUN] for i in self.policy.worker_runs(len(todo))]
        if len(runs) == 1:
            out.update(await self._misses.run(functools.partial(self.fetch_many, todo, retry)))
            return

        errors: list[Exception] = []

        async def one(run: list[BlobId]) -> None:
            try:
                out.update(await self._misses.run(functools.partial(self.fetch_many, run, retry)))
            except Exception as e:  # (the first is raised as it is, not in an ExceptionGroup)
                errors.append(e)

        async with trio.open_nursery() as nursery:
            for run in runs:
                nursery.start_soon(one, run)
        if errors:
            raise errors[0]

    def _read_here(self, todo: list[BlobId], out: dict[BlobId, bytes]) -> None:
        for bid in todo:
            start = time.monotonic()
            try:
                data = self._get(bid)
            except Corruption:
                self.count_corrupt(bid)
                raise
            finally:
                self.policy.blocked(time.monotonic() - start)
            self.blocking += 1
            self._lru.put(bid, data, len(data))
            out[bid] = data

    def _fetch_inline(self, bid: BlobId, out: dict[BlobId, bytes]) -> bool:
        """The chunk into `out` without leaving the trio thread, if it can be had
        without waiting for the disk; False if not (fetch it in a worker)."""
        assert self._get_nowait is not None
        data = self._lru.peek(bid)
        if data is None:
            try:
                data = self._get_nowait(bid)
            except Corruption:
                self.count_corrupt(bid)
                raise
            self.policy.nowait_tried(data is not None)
            if data is None:
                return False
            self.inline += 1
            self._lru.put(bid, data, len(data))
        out[bid] = data
        return True

    def fetch_uncached(self, bid: BlobId) -> bytes:
        """For one-pass readers (digests): use the cache if it has the chunk, but do
        not fill it, so a whole-file scan does not evict the working set."""
        data = self._lru.get(bid)
        if data is not None:
            return data
        try:
            return self._get(bid)
        except Corruption:
            self.count_corrupt(bid)
            raise

    def _load(self, bid: BlobId, fut: Load) -> None:
        try:
            data: bytes | BaseException = self._get(bid)
        except BaseException as e:
            data = e
        self._settle(bid, fut, data)
        self._forget([(bid, fut)])

    def _settle(self, bid: BlobId, load: Load, got: bytes | BaseException) -> None:
        """Give a load its outcome (a plaintext goes to the cache first). A failed one
        leaves the in-flight map before: a reader that retries it (_outcomes) must
        start a new load, not join the failed one again, which the rest of its run would
        keep in the map a while longer. A done one leaves with its run (_forget)."""
        if isinstance(got, BaseException):
            self._forget([(bid, load)])
            load.set_exception(got)
        else:
            self._lru.put(bid, got, len(got))
            load.set_result(got)

    def _forget(self, loads: Iterable[tuple[BlobId, Load]]) -> None:
        """Take loads out of the in-flight map, each only if it is still the one there."""
        with self._lock:
            for bid, load in loads:
                if self._inflight.get(bid) is load:
                    del self._inflight[bid]

    def count_corrupt(self, bid: BlobId) -> None:
        """Count a blob that failed its check (data here; metadata via repo.on_corrupt)."""
        with self._lock:
            self.corrupt_reads += 1
            self.last_corrupt.append(bid)

    # -- read-ahead --------------------------------------------------------------

    def readahead(self, key: Hashable, offset: int, size: int, plan: Planner) -> None:
        """Note a read of [offset, offset+size) by stream `key` (a file of a view); once
        reads are sequential, keep `readahead_bytes` beyond them loading in the
        background (the policy says when). `plan(offset, size)` describes bytes ahead
        (a view's read_plan). Trio thread; never blocks."""
        if self._pool is None or self.readahead_bytes <= 0:
            return
        ahead = self.policy.read_ahead(key, offset, size, self.readahead_bytes)
        if ahead is None:
            return
        start, stop = ahead
        pieces = [p for p in plan(start, stop - start) if p.data is None and p.blob != ZERO_ID]
        self.prefetch([p.blob for p in pieces], max((p.end - p.start for p in pieces), default=0))

    def loading(self, bids: list[BlobId]) -> tuple[list[tuple[BlobId, Load]], list[BlobId]]:
        """Of chunks missing from the cache: those already being loaded (by read-ahead,
        or for another reader), and the rest. Trio thread; never blocks."""
        with self._lock:
            loading = [(bid, fut) for bid in bids if (fut := self._inflight.get(bid)) is not None]
        if not loading:
            return [], bids
        found = {bid for bid, _ in loading}
        return loading, [bid for bid in bids if bid not in found]

    async def loaded(self, loading: list[tuple[BlobId, Load]]) -> dict[BlobId, bytes]:
        """The chunks loading() found in flight, awaited together: one wake-up of the
        waiting task for all of them, where one per chunk cost a sequential reader that
        caught up with read-ahead 16 rounds of the trio thread's scheduler for each 1 MiB
        request. Raises Corruption (counted) for a blob that failed its check; a chunk
        whose load failed transiently is read again, once, in a worker (_outcomes)."""
        await _wait_all([fut for _, fut in loading if not fut.done()])
        got, again = self._outcomes(loading)  # (all done: no wait)
        if again:
            await self._fetch_in_workers(again, got, retry=False)
        return got

    def forget_stream(self, key: Hashable) -> None:
        self.policy.forget_stream(key)

    def prefetch(self, bids: Iterable[BlobId], chunk_bytes: int) -> None:
        """Start loading chunks of at most `chunk_bytes` each in the background (skipping
        those cached or loading), as long as at most _MAX_INFLIGHT_BYTES are loading.
        Chunks go to the pool in runs, one per worker: fewer hand-offs between threads
        means less contention for the GIL, which the trio thread needs to serve. (One
        pass under the lock: a sequential reader's window asks for 64 chunks at a time.)"""
        if self._pool is None:
            return
        wanted = list(bids)  # (planned before the lock: a plan may read a map page)
        todo: list[tuple[BlobId, Load]] = []
        with self._lock:
            room = _MAX_INFLIGHT_BYTES // max(chunk_bytes, _MIN_CHUNK_BYTES) - len(self._inflight)
            for bid in wanted:
                if len(todo) >= room:
                    break
                if bid in self._inflight or self._lru.peek(bid) is not None:
                    continue
                fut: Load = Load()
                self._inflight[bid] = fut
                todo.append((bid, fut))
        # One run per worker (of at least PREFETCH_RUN): the store reads a run with one
        # index query, and chunks side by side in a pack with one pread (get_many). A
        # window's half of 4 MiB on 2 workers: runs of 2 MiB (32 chunks of 64 KiB).
        step = max(PREFETCH_RUN, -(-len(todo) // self._pool_size))
        for i in range(0, len(todo), step):
            self._pool.submit(self._load_run, todo[i : i + step])

    def _load_run(self, run: list[tuple[BlobId, Load]]) -> None:
        self._load_many(run)
        self.prefetched += len(run)

    def _load_many(self, run: list[tuple[BlobId, Load]]) -> None:
        """_load() of each chunk, as one run when the store reads runs (get_many): each
        future gets its own blob's plaintext or error as soon as that is known (a
        corrupt blob fails only its own readers); an error of the run itself (the
        store's index) goes to every future it left without an outcome."""
        if self._get_many is None or len(run) == 1:
            for bid, fut in run:
                self._load(bid, fut)
            return
        left = dict(run)
        try:
            for bid, got in self._get_many(list(left)):
                load = left.get(bid)
                if load is None:
                    continue
                self._settle(bid, load, got)
                del left[bid]  # (after its outcome: one that failed to get it gets the error)
        except Exception as e:  # (the run's own: every chunk it did not report fails with it)
            for bid, fut in left.items():
                self._settle(bid, fut, e)
            left.clear()
        finally:
            for bid, fut in left.items():  # (interrupted, or a store that skipped one)
                self._settle(bid, fut, MissingBlob(f"blob {bid.hex()} was not read"))
            self._forget(run)


class _Workers:
    """Threads that run blocking calls for tasks of the trio thread: jobs go in through a
    SimpleQueue, and a finished job reschedules its task through run_sync_soon (one
    wake-up of the trio thread for every result then ready). Cheaper per call than
    trio.to_thread.run_sync (no limiter, no thread cache hand-shake). Like it, a waiting
    task is not cancelled until its job is done. The threads start at the first job."""

    def __init__(self, n: int, name: str) -> None:
        self._n = n
        self._name = name
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    async def run(self, fn: Callable[[], T]) -> T:
        token = trio.lowlevel.current_trio_token()
        task = trio.lowlevel.current_task()

        def job() -> None:
            result = outcome.capture(fn)
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(trio.lowlevel.reschedule, task, result)

        if not self._threads:
            self._start()
        self._jobs.put(job)
        got: T = await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        return got

    def _start(self) -> None:
        for i in range(self._n):
            t = threading.Thread(target=self._work, name=f"{self._name}-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()
        self._threads.clear()


async def _wait_all(futs: list[Load]) -> None:
    """Until every future is done, woken once (by the last)."""
    if not futs:
        return
    done = trio.Event()
    token = trio.lowlevel.current_trio_token()
    left = [len(futs)]
    lock = threading.Lock()

    def one(_: Load) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    for fut in futs:
        fut.add_done_callback(one)
    await done.wait()
