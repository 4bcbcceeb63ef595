"""The read path's fast path, without a mount: a chunk whose blob file is wholly in the
page cache is read and verified on the trio thread (RWF_NOWAIT), anything else goes to
a worker thread as before."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import trio

from casfs.errors import Corruption
from casfs.repo import Repository
from casfs.store.ids import BlobId, blob_id
from casfs.vfs import chunks
from casfs.vfs.chunks import ChunkCache
from tests.helpers.fsck import file_store


def _evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
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
    _evict(file_store(repo).path_str(bid))
    if repo.get_if_cached(bid) is not None:
        pytest.skip("this file system keeps the page after POSIX_FADV_DONTNEED")
    assert repo.get(bid) == plain


@pytest.mark.no_fsck("a blob file is corrupted to check the fast path verifies")
def test_get_if_cached_verifies(repo: Repository) -> None:
    plain = b"x" * 70_000
    with repo.batch() as batch:
        bid = batch.put(plain)
        batch.commit()
    path = file_store(repo).path_str(bid)
    os.chmod(path, 0o644)
    data = bytearray(Path(path).read_bytes())
    data[-1] ^= 1
    Path(path).write_bytes(data)
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
    blobs = Blobs(chunks._INLINE_GIVE_UP + 4)
    ids = list(blobs.by_id)
    cache = ChunkCache(blobs.get, workers=0, get_nowait=blobs.get_nowait)
    for bid in ids[: chunks._INLINE_GIVE_UP]:
        await cache.fetch_async([bid])
    assert blobs.nowait_calls == chunks._INLINE_GIVE_UP
    blobs.warm.update(ids)
    await cache.fetch_async([ids[-1]])  # not even tried: backing off
    assert blobs.nowait_calls == chunks._INLINE_GIVE_UP and cache.inline == 0


def test_no_fast_path_without_get_nowait() -> None:
    blobs = Blobs(2)
    ids = list(blobs.by_id)
    cache = ChunkCache(blobs.get, workers=0)
    assert trio.run(cache.fetch_async, [ids[0]]) == {ids[0]: blobs.by_id[ids[0]]}
    assert len(blobs.threads) == 1 and cache.inline == 0
