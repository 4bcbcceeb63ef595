"""The read path's fast path, without a mount: a chunk whose stored bytes are wholly in
the page cache is read and verified on the trio thread (RWF_NOWAIT), so is any small miss
when no other request waits (a blocking read); anything else goes to a worker thread."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest
import trio

from casfs.errors import Corruption
from casfs.repo import Repository
from casfs.store.ids import BlobId, blob_id
from casfs.vfs import readpolicy
from casfs.vfs.chunks import ChunkCache
from tests.helpers import blobs as blob_files


def _evict(repo: Repository, bid: BlobId) -> None:
    path, offset, length = blob_files.location(repo, bid)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_get_if_cached_reads_only_what_is_in_memory(repo: Repository) -> None:
    plain = os.urandom(64 << 10)
    with repo.batch() as batch:
        bid = batch.put(plain)
        batch.commit()
    assert repo.get(bid) == plain  # now in the page cache
    assert repo.get_if_cached(bid) == plain
    assert repo.get_if_cached(bid, max_stored=1000) is None  # too big to decode inline
    _evict(repo, bid)
    if repo.get_if_cached(bid) is not None:
        pytest.skip("this file system keeps the page after POSIX_FADV_DONTNEED")
    assert repo.get(bid) == plain


@pytest.mark.no_fsck("a blob is corrupted to check the fast path verifies")
def test_get_if_cached_verifies(repo: Repository) -> None:
    plain = b"x" * 70_000
    with repo.batch() as batch:
        bid = batch.put(plain)
        batch.commit()
    assert repo.get(bid) == plain  # (its pack open, its bytes in the page cache)
    blob_files.corrupt(repo, bid)
    with pytest.raises(Corruption):
        repo.get_if_cached(bid)


class Blobs:
    """A store stand-in: `get` records the thread it ran on; `warm` blobs are also
    served by `get_nowait`."""

    def __init__(self, n: int) -> None:
        self.by_id = {}
        for i in range(n):
            plain = bytes([i]) * 1000 + os.urandom(8)
            self.by_id[blob_id(plain)] = plain
        self.warm: set[BlobId] = set()
        self.bad: set[BlobId] = set()
        self.threads: list[str] = []
        self.nowait_calls = 0

    def get(self, bid: BlobId) -> bytes:
        self.threads.append(threading.current_thread().name)
        return self.by_id[bid]

    def get_nowait(self, bid: BlobId) -> bytes | None:
        self.nowait_calls += 1
        if bid in self.bad:
            raise Corruption(f"blob {bid.hex()} is corrupt")
        return self.by_id[bid] if bid in self.warm else None


async def test_fetch_async_serves_cached_blobs_inline() -> None:
    blobs = Blobs(40)
    ids = list(blobs.by_id)
    cache = ChunkCache(blobs.get, workers=0, get_nowait=blobs.get_nowait)
    blobs.warm.update(ids[:3])
    assert await cache.fetch_async([ids[0]]) == {ids[0]: blobs.by_id[ids[0]]}
    assert blobs.threads == [] and cache.inline == 1
    assert cache.cached(ids[0]) == blobs.by_id[ids[0]]
    # a cold blob goes to a worker thread; a big miss always does
    assert await cache.fetch_async([ids[5]]) == {ids[5]: blobs.by_id[ids[5]]}
    assert len(blobs.threads) == 1 and blobs.threads[0] != threading.current_thread().name
    got = await cache.fetch_async(ids[1:3] + ids[6:7])
    assert set(got) == {ids[1], ids[2], ids[6]} and cache.inline == 1
    # corruption found inline is counted and raised
    blobs.bad.add(ids[7])
    with pytest.raises(Corruption):
        await cache.fetch_async([ids[7]])
    assert cache.corrupt_reads == 1 and list(cache.last_corrupt) == [ids[7]]


async def test_fetch_async_backs_off_when_the_store_is_cold() -> None:
    blobs = Blobs(readpolicy._INLINE_GIVE_UP + 4)
    ids = list(blobs.by_id)
    cache = ChunkCache(blobs.get, workers=0, get_nowait=blobs.get_nowait)
    for bid in ids[: readpolicy._INLINE_GIVE_UP]:
        await cache.fetch_async([bid])
    assert blobs.nowait_calls == readpolicy._INLINE_GIVE_UP
    blobs.warm.update(ids)
    await cache.fetch_async([ids[-1]])  # not even tried: backing off
    assert blobs.nowait_calls == readpolicy._INLINE_GIVE_UP and cache.inline == 0


def test_no_fast_path_without_get_nowait() -> None:
    blobs = Blobs(2)
    ids = list(blobs.by_id)
    cache = ChunkCache(blobs.get, workers=0)
    assert trio.run(cache.fetch_async, [ids[0]]) == {ids[0]: blobs.by_id[ids[0]]}
    assert len(blobs.threads) == 1 and cache.inline == 0


async def test_a_miss_is_read_here_when_nothing_waits() -> None:
    """With no request queued (idle) and no fetch in a worker, a cold miss is read by a
    blocking read on the trio thread: no hand-off to a worker and back."""
    blobs = Blobs(4)
    ids = list(blobs.by_id)
    queued = False
    cache = ChunkCache(blobs.get, workers=0, get_nowait=blobs.get_nowait, idle=lambda: not queued)
    try:
        assert await cache.fetch_async([ids[0]]) == {ids[0]: blobs.by_id[ids[0]]}
        assert blobs.threads == [threading.current_thread().name] and cache.blocking == 1
        assert blobs.nowait_calls == 1  # (tried first: a cold try starts the disk read)
        queued = True  # a request waits: the miss goes to a worker
        assert await cache.fetch_async([ids[1]]) == {ids[1]: blobs.by_id[ids[1]]}
        assert blobs.threads[-1] != threading.current_thread().name and cache.blocking == 1
    finally:
        cache.close()


async def test_a_small_miss_from_a_local_store_is_read_here_when_nothing_waits() -> None:
    """From a local store, a small miss is first read without waiting (get_nowait: the
    page cache), then, if that would wait for the disk and no other request waits, by
    a blocking read here; a bigger miss still goes to workers (read in parallel)."""
    blobs = Blobs(8)
    ids = list(blobs.by_id)
    cache = ChunkCache(blobs.get, workers=0, get_nowait=blobs.get_nowait, idle=lambda: True, local=True)
    here = threading.current_thread().name
    try:
        blobs.warm.add(ids[0])
        assert await cache.fetch_async(ids[:2]) == {bid: blobs.by_id[bid] for bid in ids[:2]}
        assert blobs.threads == [here] and cache.inline == 1 and cache.blocking == 1
        assert await cache.fetch_async([ids[2]]) == {ids[2]: blobs.by_id[ids[2]]}
        assert blobs.threads == [here] * 2 and cache.blocking == 2 and blobs.nowait_calls == 3
        assert await cache.fetch_async(ids[3:6]) == {bid: blobs.by_id[bid] for bid in ids[3:6]}
        assert here not in blobs.threads[2:] and cache.blocking == 2
        # Cold tries do not back off for a local store: a failed try starts the disk read
        # (and the store's read-around), and the blocking read then waits for it.
        n = blobs.nowait_calls
        for bid in ids[6:] * readpolicy._INLINE_GIVE_UP:
            cache._lru.discard(bid)
            await cache.fetch_async([bid])
        assert blobs.nowait_calls == n + 2 * readpolicy._INLINE_GIVE_UP
    finally:
        cache.close()


async def test_a_cold_miss_goes_to_a_worker_when_others_wait() -> None:
    """From a local store, with other requests queued, a small miss that nowait found
    out of the page cache is read in a worker (the disk reads of queued requests
    overlap), while a blob nowait reads (warm) is still served here, without a hand-off."""
    blobs = Blobs(4)
    ids = list(blobs.by_id)
    queued = True
    cache = ChunkCache(blobs.get, workers=0, get_nowait=blobs.get_nowait, idle=lambda: not queued, local=True)
    here = threading.current_thread().name
    try:
        blobs.warm.add(ids[0])
        assert await cache.fetch_async([ids[0]]) == {ids[0]: blobs.by_id[ids[0]]}
        assert blobs.threads == [] and cache.inline == 1
        assert await cache.fetch_async([ids[1]]) == {ids[1]: blobs.by_id[ids[1]]}
        assert len(blobs.threads) == 1 and blobs.threads[0] != here and cache.blocking == 0
        queued = False  # nothing waits: the next cold miss is read here
        assert await cache.fetch_async([ids[2]]) == {ids[2]: blobs.by_id[ids[2]]}
        assert blobs.threads[-1] == here and cache.blocking == 1
    finally:
        cache.close()


def test_the_policy_hands_off_cold_misses_only_when_others_wait() -> None:
    """ReadPolicy.hand_off, without a cache: a local store's cold miss goes to a worker
    when a request is queued in the kernel or a miss is already in a worker; never
    without an idle check (no FUSE session) or for a remote store (may_block decides)."""
    queued = False
    policy = readpolicy.ReadPolicy(local=True, nowait=True)
    assert not policy.hand_off(0) and not policy.hand_off(3)  # (no session: never)
    policy.idle = lambda: not queued
    assert not policy.hand_off(0)  # qd1: the blocking read here is the cheaper
    assert policy.hand_off(1)  # a miss already in a worker: do not wait behind this one
    queued = True
    assert policy.hand_off(0)
    remote = readpolicy.ReadPolicy(local=False, nowait=True)
    remote.idle = lambda: False
    assert not remote.hand_off(0)


@pytest.mark.no_fsck("a blob is corrupted to check the page-cache path verifies")
async def test_a_corrupt_chunk_read_without_waiting_is_refused_and_counted(repo: Repository) -> None:
    """The page-cache path of a real store (RWF_NOWAIT into a buffer, decoded from it)
    verifies as the blocking read does: the chunk is refused, counted, marked damaged,
    and not cached; its sound neighbour is served."""
    good, bad = os.urandom(64 << 10), b"y" * 70_000
    with repo.batch() as batch:
        gid, bid = batch.put(good), batch.put(bad)
        batch.commit()
    blob_files.corrupt(repo, bid)
    assert repo.get_if_cached(gid) in (None, good)
    cache = ChunkCache(repo.get, workers=0, get_nowait=repo.get_if_cached, idle=lambda: True, local=True)
    try:
        with pytest.raises(Corruption):
            await cache.fetch_async([bid])
        assert cache.corrupt_reads == 1 and list(cache.last_corrupt) == [bid]
        assert cache.cached(bid) is None and bid in repo.blobs.damaged()
        assert await cache.fetch_async([gid]) == {gid: good}
        assert cache.cached(gid) == good
    finally:
        cache.close()


@pytest.mark.no_fsck("a blob is corrupted to check what read-around brings in is verified")
def test_a_cold_read_brings_in_the_pack_around_it(repo: Repository) -> None:
    """A read that finds its blob out of the page cache asks for the window of the pack
    around it: once that is in, the neighbours are read without waiting, and verified."""
    plains = [os.urandom(64 << 10) for _ in range(6)]
    with repo.batch() as batch:
        ids = [batch.put(p) for p in plains]
        batch.commit()
    store = blob_files.local_store(repo)
    assert {blob_files.location(repo, bid)[0] for bid in ids} == {blob_files.location(repo, ids[0])[0]}
    assert repo.get(ids[0]) == plains[0]  # (its pack open)
    for bid in ids:
        _evict(repo, bid)
    if repo.get_if_cached(ids[0]) is not None:
        pytest.skip("this file system keeps the page after POSIX_FADV_DONTNEED")
    store.around.wait_idle()
    assert store.around.asked == 1
    deadline = time.monotonic() + 30  # (the kernel reads the window asynchronously)
    while None in (got := [repo.get_if_cached(bid) for bid in ids[1:]]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got == plains[1:]
    blob_files.corrupt(repo, ids[5])
    with pytest.raises(Corruption):
        repo.get_if_cached(ids[5])


async def test_a_slow_blocking_read_pauses_them(monkeypatch: pytest.MonkeyPatch) -> None:
    blobs = Blobs(readpolicy._BLOCKING_SLOW_RUN + 1)
    ids = list(blobs.by_id)
    cache = ChunkCache(blobs.get, workers=0, idle=lambda: True)
    monkeypatch.setattr(readpolicy, "_BLOCKING_SLOW_S", -1.0)  # every read is slow
    try:
        for bid in ids:
            await cache.fetch_async([bid])
        assert cache.blocking == readpolicy._BLOCKING_SLOW_RUN  # a run of slow reads, then a pause
        here = threading.current_thread().name
        assert blobs.threads[:-1] == [here] * readpolicy._BLOCKING_SLOW_RUN and blobs.threads[-1] != here
    finally:
        cache.close()


async def test_a_worker_read_raises_what_the_store_raises() -> None:
    """Errors cross the worker hand-off: corruption is counted and raised, a missing blob
    raised; concurrent misses each get their own chunk."""
    blobs = Blobs(20)
    ids = list(blobs.by_id)
    bad = ids[0]

    def get(bid: BlobId) -> bytes:
        if bid == bad:
            raise Corruption(f"blob {bid.hex()} is corrupt")
        return blobs.get(bid)

    cache = ChunkCache(get, workers=0, miss_workers=3)
    try:
        with pytest.raises(Corruption):
            await cache.fetch_async([bad])
        assert cache.corrupt_reads == 1
        got: dict[BlobId, bytes] = {}

        async def one(bid: BlobId) -> None:
            got.update(await cache.fetch_async([bid]))

        async with trio.open_nursery() as nursery:
            for bid in ids[1:]:
                nursery.start_soon(one, bid)
        assert got == {bid: blobs.by_id[bid] for bid in ids[1:]}
    finally:
        cache.close()


def test_blob_reads_fall_back_without_noatime(repo: Repository, monkeypatch: pytest.MonkeyPatch) -> None:
    """O_NOATIME is refused (EPERM) on files the reader does not own: reads go on without it."""
    plain = os.urandom(5000)
    with repo.batch() as batch:
        bid = batch.put(plain)
        batch.commit()
    real_open = os.open
    flags_seen: list[int] = []

    def no_noatime(path: str, flags: int, *args: int) -> int:
        flags_seen.append(flags)
        if flags & os.O_NOATIME:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real_open(path, flags, *args)

    store = blob_files.local_store(repo)
    monkeypatch.setattr(os, "open", no_noatime)
    assert store.get(bid) == plain and store.get(bid) == plain
    assert [bool(f & os.O_NOATIME) for f in flags_seen] == [True, False]  # (then its fd is kept)
    store.fds.forget(blob_files.location(repo, bid)[0])
    assert store.get(bid) == plain
    assert [bool(f & os.O_NOATIME) for f in flags_seen] == [True, False, False]


async def test_a_big_miss_is_read_by_several_workers_at_once() -> None:
    """A read of many chunks (a 1 MiB request is 16) is split into runs read in parallel:
    three runs here, each waiting at a barrier only the three together can pass."""
    blobs = Blobs(3 * readpolicy.PREFETCH_RUN)
    ids = list(blobs.by_id)
    firsts = set(ids[:: readpolicy.PREFETCH_RUN])
    barrier = threading.Barrier(len(firsts), timeout=10)

    def get(bid: BlobId) -> bytes:
        if bid in firsts:
            barrier.wait()  # (BrokenBarrierError if the runs were read one after another)
        return blobs.get(bid)

    cache = ChunkCache(get, workers=0)
    try:
        assert await cache.fetch_async(ids) == blobs.by_id
        assert len(set(blobs.threads)) == len(firsts)
    finally:
        cache.close()
