"""Background fills of the whole-file cache, without a mount: one at a time, verified
blobs only, a file larger than the bound refused, a failed fill not retried, stop."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import blake3
import pytest

from casfs.errors import Corruption
from casfs.store.filecache import FileCache, Part
from casfs.store.filefill import BackgroundFills
from casfs.store.ids import BlobId

CHUNK = 1 << 16


def blobs(n: int, seed: int = 0) -> tuple[list[Part], dict[BlobId, bytes]]:
    got: dict[BlobId, bytes] = {}
    parts: list[Part] = []
    for i in range(n):
        data = bytes([(seed + i) % 251 + 1]) * CHUNK
        bid = BlobId(blake3.blake3(data).digest())
        got[bid] = data
        parts.append((bid, 0, CHUNK))
    return parts, got


def drain(fills: BackgroundFills, n: int) -> None:
    """Until `n` fills have ended (finished or failed); the worker is a thread."""
    done = threading.Event()
    while not done.wait(0.01):
        s = fills.stats
        if s.files + s.failed >= n and not s.queued and not s.filling_bytes:
            done.set()


@pytest.mark.parametrize("runs", [False, True], ids=["one by one", "in runs"])
def test_a_fill_writes_the_file_its_parts_make_once(tmp_path: Path, runs: bool) -> None:
    parts, got = blobs(4)
    fetched: list[BlobId] = []

    def fetch(bid: BlobId) -> bytes:
        fetched.append(bid)
        return got[bid]

    def fetch_many(bids: Sequence[BlobId]) -> Iterator[tuple[BlobId, bytes | Exception]]:
        for bid in bids:
            yield bid, fetch(bid)

    cache = FileCache(tmp_path / "files", limit=1 << 20)
    fills = BackgroundFills(cache, fetch, fetch_many if runs else None)
    try:
        fills.want("a", 4 * CHUNK, parts)
        fills.want("a", 4 * CHUNK, parts)  # queued or filled already: nothing more
        drain(fills, 1)
        path = cache.lookup("a")
        assert path is not None and path.read_bytes() == b"".join(got[b] for b, _, _ in parts)
        assert fetched == [b for b, _, _ in parts]
        assert fills.status().startswith("1 filled (0 MiB"), fills.status()
    finally:
        fills.stop()


def test_a_file_larger_than_the_bound_and_a_failed_fill_are_not_retried(tmp_path: Path) -> None:
    parts, _ = blobs(4)
    calls = 0

    def fetch(bid: BlobId) -> bytes:
        nonlocal calls
        calls += 1
        raise Corruption("a damaged chunk")

    cache = FileCache(tmp_path / "files", limit=3 * CHUNK)
    fills = BackgroundFills(cache, fetch)
    try:
        fills.want("big", 4 * CHUNK, parts)
        assert fills.stats.too_large == 1 and fills.pending("big")
        fills.want("bad", 2 * CHUNK, parts[:2])
        drain(fills, 1)
        fills.want("bad", 2 * CHUNK, parts[:2])
        assert fills.stats.failed == 1 and calls == 1
        assert cache.lookup("bad") is None and list((tmp_path / "files").iterdir()) == []
        assert "1 failed, 1 larger than the cache" in fills.status()
    finally:
        fills.stop()


def held_fill(
    tmp_path: Path, key: str, n: int, at: int
) -> tuple[BackgroundFills, FileCache, bytes, threading.Event, threading.Event]:
    """A fill of `n` chunks under `key` whose read of chunk `at` waits for `release`
    (`reached`: it is waiting): (fills, cache, the file's bytes, reached, release)."""
    parts, got = blobs(n)
    reached, release = threading.Event(), threading.Event()

    def fetch(bid: BlobId) -> bytes:
        if bid == parts[at][0]:
            reached.set()
            release.wait()
        return got[bid]

    cache = FileCache(tmp_path / "files", limit=1 << 20)
    fills = BackgroundFills(cache, fetch)
    fills.want(key, n * CHUNK, parts)
    return fills, cache, b"".join(got[b] for b, _, _ in parts), reached, release


def test_stop_ends_a_fill_in_flight_and_leaves_no_file(tmp_path: Path) -> None:
    fills, cache, _, started, release = held_fill(tmp_path, "slow", 8, 0)
    parts, _ = blobs(8)
    started.wait()
    fills.stop(wait=False)
    release.set()
    fills.stop()
    assert cache.lookup("slow") is None
    assert list((tmp_path / "files").iterdir()) == []
    fills.want("slow", 8 * CHUNK, parts)  # stopped: nothing starts again
    assert fills.stats.queued == 0


def test_a_reader_beside_a_fill_reads_what_it_has_written(tmp_path: Path) -> None:
    fills, _, whole, second, release = held_fill(tmp_path, "f", 4, 2)  # (two chunks written)
    progress = fills.progress("f")
    assert progress is not None and fills.progress("other") is None
    try:
        second.wait()
        assert progress.read(CHUNK - 10, 20) == whole[CHUNK - 10 : CHUNK + 10]
        assert progress.read(2 * CHUNK - 10, 20) is None  # not written yet: the packs' turn
        release.set()
        drain(fills, 1)
        assert progress.read(3 * CHUNK, CHUNK) == whole[3 * CHUNK :]  # (its reader still holds it)
        assert fills.progress("f") is None  # done: the next open finds the cache file
    finally:
        release.set()
        progress.detach()
        fills.stop()
    assert progress.read(0, 10) is None  # closed with its last reader


def test_a_file_asked_for_again_while_it_is_filled_is_not_queued_twice(tmp_path: Path) -> None:
    # (queued again, it took its own progress's place: the worker then died on the
    # second, leaving `filling_bytes` set, and a wait for the fills' end waited for ever)
    fills, cache, whole, reached, release = held_fill(tmp_path, "f", 4, 1)
    parts, _ = blobs(4)
    try:
        reached.wait()
        fills.want("f", 4 * CHUNK, parts)
        assert fills.stats.queued == 0 and fills.pending("f")
        release.set()
        drain(fills, 1)
        path = cache.lookup("f")
        assert path is not None and path.read_bytes() == whole
        assert fills.status().startswith("1 filled"), fills.status()
    finally:
        release.set()
        fills.stop()
