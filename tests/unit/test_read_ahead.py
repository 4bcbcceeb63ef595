"""The chunk cache's read-ahead, without a mount: what a sequential reader's window asks
the store for."""

from __future__ import annotations

import threading

from casfs.store.ids import BlobId
from casfs.vfs.api import ReadPiece
from casfs.vfs.chunks import DEFAULT_READAHEAD_BYTES, ChunkCache
from casfs.vfs.plan import Planner, plan_pieces


def _disk(n: int, cs: int) -> tuple[list[BlobId], Planner]:
    """A disk of n chunks of cs bytes, each distinct: their ids, and its read plan."""
    ids = [BlobId(i.to_bytes(32, "big")) for i in range(1, n + 1)]

    def plan(offset: int, size: int) -> list[ReadPiece]:
        return plan_pieces(lambda first, count: ids[first : first + count], n * cs, cs, offset, size)

    return ids, plan


def test_a_window_of_small_chunks_is_asked_for_whole() -> None:
    """An 8 MiB window of 16 KiB chunks is 512 chunks, and every one is loading after
    the reader's first top-up: loads in flight are bounded in bytes, not in chunks (256
    chunks left half of each top-up to the reader's own misses)."""
    cs = 16 << 10
    ids, plan = _disk(1024, cs)
    gate = threading.Event()

    def get(bid: BlobId) -> bytes:
        gate.wait(10)
        return bytes(cs)

    cache = ChunkCache(get, workers=2)
    try:
        for n in range(3):  # sequential from the third read on: the window is asked for
            cache.readahead("f", n * cs, cs, plan)
        window = ids[3 : 3 + DEFAULT_READAHEAD_BYTES // cs]
        loading, rest = cache.loading(window)
        assert rest == [] and len(loading) == len(window) == 512
    finally:
        gate.set()
        cache.close()
