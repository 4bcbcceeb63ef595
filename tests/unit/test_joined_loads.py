"""A reader that joins a chunk load another started (read-ahead's, another reader's)
and sees it fail with a transient error (an S3 outage that ended while the load
retried) loads the chunk again, once, on its own; the load's originator still fails
with the error. Corruption and a missing blob fail every reader at once, counted once.
The store is a real one (in memory) behind FaultyBlobStore's injected errors."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator, Sequence

import pytest
import trio
import trio.testing

from casfs.errors import Corruption, MissingBlob
from casfs.store.faulty import Faults, FaultyBlobStore
from casfs.store.ids import BlobId, blob_id
from casfs.store.memory import MemoryBlobStore
from casfs.vfs.chunks import ChunkCache


class Held:
    """A store whose first get is held until `release` (the load others join), then
    fails as `plan` says (FaultyBlobStore's "get:1:…")."""

    def __init__(self, plan: str, n: int = 2) -> None:
        self.plains = [os.urandom(3000) for _ in range(n)]
        self.ids = [blob_id(p) for p in self.plains]
        inner = MemoryBlobStore()
        stage = inner.staging()
        for bid, plain in zip(self.ids, self.plains, strict=True):
            stage.add(bid, plain)
        stage.publish()
        self.store = FaultyBlobStore(inner, Faults.parse(plan))
        self.entered = threading.Event()
        self.release = threading.Event()
        self.before: Callable[[BlobId], None] = lambda bid: None  # (each later get's first step)
        self._first = True
        self._lock = threading.Lock()

    def get(self, bid: BlobId) -> bytes:
        with self._lock:
            first, self._first = self._first, False
        if first:
            self.entered.set()
            assert self.release.wait(10)
        else:
            self.before(bid)
        return self.store.get(bid)

    @property
    def gets(self) -> int:
        return self.store.faults.calls["get"]


async def test_a_reader_joining_read_ahead_that_failed_transiently_loads_again() -> None:
    """fetch_async joins read-ahead's load in flight; that load fails with EIO (its
    originator's error stays), the reader gets the chunk from its own load in a worker."""
    held = Held("get:1:EIO")
    x = held.ids[0]
    cache = ChunkCache(held.get, workers=1)
    try:
        cache.prefetch([x], 4096)
        assert await trio.to_thread.run_sync(held.entered.wait, 10)
        load = cache.loading([x])[0][0][1]
        got: dict[BlobId, bytes] = {}

        async def reader() -> None:
            got.update(await cache.fetch_async([x]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()  # (the reader waits for the load)
            held.release.set()
        with pytest.raises(OSError) as e:
            load.result(0)
        assert e.value.errno == errno.EIO
        assert got == {x: held.plains[0]} and held.gets == 2
        assert cache.cached(x) == held.plains[0] and cache.corrupt_reads == 0
    finally:
        cache.close()


def test_a_worker_joining_a_load_that_failed_transiently_loads_again() -> None:
    """fetch_many (a miss read in a worker) joins the chunk another worker is loading;
    that one's fetch fails with EIO, this one reads the chunk itself."""
    held = Held("get:1:EIO")
    x, y = held.ids
    cache = ChunkCache(held.get, workers=0)
    failed: list[BaseException] = []

    def originator() -> None:
        try:
            cache.fetch(x)
        except OSError as e:
            failed.append(e)

    first = threading.Thread(target=originator)
    first.start()
    try:
        assert held.entered.wait(10)
        load = cache.loading([x])[0][0][1]
        # The joiner reads y itself, after joining x (fetch_many joins under its lock
        # first): its read of y lets x's load go on and waits until that failed.

        def before(bid: BlobId) -> None:
            if bid == y:
                held.release.set()
                with pytest.raises(OSError):
                    load.result(10)

        held.before = before
        assert cache.fetch_many([x, y]) == dict(zip(held.ids, held.plains, strict=True))
    finally:
        held.release.set()
        first.join(10)
        cache.close()
    assert [getattr(e, "errno", None) for e in failed] == [errno.EIO]
    assert held.gets == 3  # x failed, y, x again


@pytest.mark.parametrize(
    ("plan", "absent", "error", "counted"),
    [
        ("get:1:corrupt", False, Corruption, 1),
        ("", True, MissingBlob, 1),
        ("get:1:ENOENT", False, FileNotFoundError, 0),
    ],
)
async def test_an_answer_about_the_blob_fails_the_joiner_at_once(
    plan: str, absent: bool, error: type[Exception], counted: int
) -> None:
    """No second load for a corrupt blob, one the store does not have, or a not-found:
    the joiner fails with the load (a corrupt one counted once)."""
    held = Held(plan)
    x = blob_id(b"not stored") if absent else held.ids[0]
    cache = ChunkCache(held.get, workers=1)
    try:
        cache.prefetch([x], 4096)
        assert await trio.to_thread.run_sync(held.entered.wait, 10)
        loading, rest = cache.loading([x])
        assert rest == []
        held.release.set()
        with pytest.raises(error):
            await cache.loaded(loading)
        assert held.gets == 1 and cache.corrupt_reads == counted
    finally:
        cache.close()


async def test_a_retry_starts_a_new_load_while_the_failed_ones_run_goes_on() -> None:
    """Read-ahead loads x and y as one run (get_many): x fails with EIO while the run
    still waits for y. A reader that joined x's load retries with a load of its own,
    not by joining the failed one again (it stays in flight until the run ends)."""
    plains = [os.urandom(3000) for _ in range(2)]
    x, y = (blob_id(p) for p in plains)
    by_id = dict(zip((x, y), plains, strict=True))
    entered, go, hold = threading.Event(), threading.Event(), threading.Event()

    def get_many(bids: Sequence[BlobId]) -> Iterator[tuple[BlobId, bytes | Exception]]:
        assert list(bids) == [x, y]
        entered.set()
        assert go.wait(10)
        yield x, OSError(errno.EIO, "the store went away")
        hold.wait(10)  # (the rest of the run: still in flight while the reader retries)
        yield y, by_id[y]

    cache = ChunkCache(by_id.__getitem__, workers=1, get_many=get_many)
    try:
        cache.prefetch([x, y], 4096)
        assert await trio.to_thread.run_sync(entered.wait, 10)
        got: dict[BlobId, bytes] = {}

        async def reader() -> None:
            got.update(await cache.fetch_async([x]))

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                await trio.testing.wait_all_tasks_blocked()  # (the reader waits for x's load)
                go.set()
        finally:
            hold.set()
        assert got == {x: by_id[x]}
    finally:
        cache.close()
