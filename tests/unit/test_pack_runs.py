"""Reading runs of blobs (PackBlobStore.get_many, store.packspans): one index query and
one pread per span of blobs side by side in a pack, each blob still checked on its own;
the outcome is exactly get()'s, blob by blob."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casfs.errors import Corruption, MissingBlob
from casfs.store import packindex
from casfs.store.fdcache import FdCache
from casfs.store.ids import BlobId, blob_id
from casfs.store.packspans import spans
from casfs.store.packstore import PackBlobStore
from casfs.vfs.chunks import ChunkCache
from tests.helpers import blobs as blob_files


def _store(root: Path, target: int) -> PackBlobStore:
    store = PackBlobStore(root, pack_target=target)
    store.create()
    return store


def _publish(store: PackBlobStore, plains: list[bytes]) -> list[BlobId]:
    """One staging, blobs added in this order (a pack holds them side by side)."""
    ids = []
    stage = store.staging()
    for plain in plains:
        bid = blob_id(plain)
        stage.add(bid, plain)
        ids.append(bid)
    stage.publish()
    return ids


def _outcome(store: PackBlobStore, bid: BlobId) -> bytes | type[Exception]:
    try:
        return store.get(bid)
    except Exception as e:
        return type(e)


def _runs(store: PackBlobStore, bids: list[BlobId]) -> dict[BlobId, bytes | type[Exception]]:
    got: dict[BlobId, bytes | type[Exception]] = {}
    for bid, result in store.get_many(bids):
        assert bid not in got, "a blob reported twice"
        got[bid] = type(result) if isinstance(result, Exception) else result
    return got


# A blob: its size (compressible text or random bytes) and what becomes of it.
_blob = st.tuples(
    st.integers(1, 9000), st.booleans(), st.sampled_from(["keep", "keep", "keep", "delete", "corrupt"])
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(st.lists(_blob, min_size=1, max_size=12), min_size=1, max_size=4),
    target=st.sampled_from([4 << 10, 16 << 10, 1 << 20]),
    gap=st.sampled_from([0, 100, 16 << 10]),
    most=st.sampled_from([1, 8 << 10, 4 << 20]),
    picks=st.lists(st.integers(0, 60), max_size=40),
    absent=st.integers(0, 2),
)
def test_a_run_reads_what_blob_by_blob_reads(
    batches: list[list[tuple[int, bool, str]]],
    target: int,
    gap: int,
    most: int,
    picks: list[int],
    absent: int,
) -> None:
    """Over layouts: blobs side by side, gaps of deleted blobs, several packs (small
    targets) and stagings, corrupt blobs among good ones, ids never stored, repeats;
    spans of any gap and size limit."""
    with tempfile.TemporaryDirectory() as tmp:
        store = _store(Path(tmp) / "store", target)
        store.span_gap, store.span_max = gap, most
        try:
            ids: list[BlobId] = []
            fates: list[str] = []
            for n, batch in enumerate(batches):
                plains = [  # (each unique: a fate is the blob's own)
                    f"{n}-{i}:".encode() + (b"text " * size if text else os.urandom(size))
                    for i, (size, text, _) in enumerate(batch)
                ]
                ids += _publish(store, plains)
                fates += [fate for _, _, fate in batch]
            for bid, fate in zip(ids, fates, strict=True):
                if fate == "delete":
                    store.delete(bid)
                elif fate == "corrupt" and store.has(bid):
                    blob_files.corrupt(store, bid)
            ids += [BlobId(os.urandom(32)) for _ in range(absent)]
            wanted = [ids[i % len(ids)] for i in picks] or ids
            got = _runs(store, wanted)
            assert got == {bid: _outcome(store, bid) for bid in wanted}
            corrupt = {b for b, f in zip(ids, fates, strict=False) if f == "corrupt" and store.has(b)}
            assert store.damaged() == corrupt & set(wanted)
        finally:
            store.close()


def test_locate_many_places_each_id_found_as_locate_does(tmp_path: Path) -> None:
    """One query per _IN ids, each answered in one row: every id found is where locate()
    says, whichever query it fell in; ids not stored are left out, repeats are one."""
    store = _store(tmp_path / "store", 1 << 20)
    ids = _publish(store, [os.urandom(100) for _ in range(packindex._IN + 20)])
    absent = [BlobId(os.urandom(32)) for _ in range(3)]
    got = store.index.locate_many([absent[0], *ids, *absent[1:], *ids[:5]])
    assert got == {bid: store.index.locate(bid) for bid in ids}
    store.close()


def test_spans_cover_each_blob_once_within_their_limits() -> None:
    ids = [BlobId(bytes([i]) * 32) for i in range(8)]
    where = {
        ids[0]: ("a", 24, 100),
        ids[1]: ("a", 124, 100),  # right after 0
        ids[2]: ("a", 300, 50),  # 76 bytes after 1
        ids[3]: ("b", 24, 10),
        ids[4]: ("a", 10_000, 10),  # far
        ids[5]: ("b", 34, 5000),
    }
    order = [ids[4], ids[3], ids[0], ids[1], ids[2], ids[5]]
    got = spans(where, order, gap=100, most=1000)
    assert got == [
        ("a", [(ids[4], 10_000, 10)]),
        ("b", [(ids[3], 24, 10)]),  # 5 would make the span longer than 1000
        ("a", [(ids[0], 24, 100), (ids[1], 124, 100), (ids[2], 300, 50)]),
        ("b", [(ids[5], 34, 5000)]),  # alone, longer than the limit
    ]
    assert [name for name, _ in spans(where, order, gap=0, most=1 << 20)] == ["a", "b", "a", "a"]


def test_a_corrupt_blob_fails_alone_and_its_neighbours_read(tmp_path: Path) -> None:
    store = _store(tmp_path / "store", 1 << 20)
    plains = [os.urandom(5000) for _ in range(6)]
    ids = _publish(store, plains)
    blob_files.corrupt(store, ids[2])
    got = dict(store.get_many(ids))
    assert isinstance(got.pop(ids[2]), Corruption)
    assert got == {bid: p for bid, p in zip(ids, plains, strict=True) if bid != ids[2]}
    assert store.damaged() == {ids[2]}


def test_a_span_whose_pack_went_is_read_blob_by_blob(tmp_path: Path) -> None:
    """The pack file of a located span is gone (compacted by another process since, or
    lost): get() per blob, whose errors are its own (here MissingBlob)."""
    store = _store(tmp_path / "store", 1 << 20)
    kept = _publish(store, [os.urandom(3000) for _ in range(3)])
    lost = _publish(store, [os.urandom(3000) for _ in range(3)])
    os.unlink(blob_files.location(store, lost[0])[0])
    got = dict(store.get_many(kept + lost))
    assert all(isinstance(got[b], MissingBlob) for b in lost)
    assert all(got[b] == store.get(b) for b in kept)


def test_runs_keep_no_file_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs read through the store's bounded fd cache, also when abandoned half-way or
    failing: no descriptor is left behind."""
    store = _store(tmp_path / "store", 8 << 10)
    monkeypatch.setattr(store, "fds", FdCache(2))
    ids = _publish(store, [os.urandom(3000) for _ in range(30)])  # about 12 packs
    blob_files.corrupt(store, ids[7])
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        assert len(dict(store.get_many(ids))) == len(ids)
        run = store.get_many(ids)
        next(run)
        run.close()  # (a reader that stops half-way)
    assert len(os.listdir("/proc/self/fd")) <= before + 2
    store.close()
    assert len(os.listdir("/proc/self/fd")) <= before


def test_the_chunk_cache_loads_a_run_and_fails_only_its_corrupt_chunk(tmp_path: Path) -> None:
    """Read-ahead's runs through get_many: each chunk's future gets its own outcome (the
    store's read is held until every chunk is seen in flight); the corrupt one raises
    Corruption to its reader, counted; the others are cached."""
    store = _store(tmp_path / "store", 1 << 20)
    plains = [os.urandom(4000) for _ in range(8)]
    ids = _publish(store, plains)
    blob_files.corrupt(store, ids[5])
    gate = threading.Event()

    def held(bids: Sequence[BlobId]) -> Iterator[tuple[BlobId, bytes | Exception]]:
        gate.wait(10)
        yield from store.get_many(bids)

    cache = ChunkCache(store.get, workers=2, get_many=held)
    try:
        cache.prefetch(ids, 4096)
        loading, rest = cache.loading(ids)
        assert rest == [] and [bid for bid, _ in loading] == ids
        gate.set()
        for (bid, fut), plain in zip(loading, plains, strict=True):
            if bid == ids[5]:
                with pytest.raises(Corruption):
                    fut.result(10)
            else:
                assert fut.result(10) == plain
        with pytest.raises(Corruption):
            cache.fetch(ids[5])
        assert cache.corrupt_reads == 1 and list(cache.last_corrupt) == [ids[5]]
        assert cache.fetch_many(ids[:5]) == dict(zip(ids[:5], plains[:5], strict=True))
        assert all(cache.cached(b) is not None for b in ids if b != ids[5])
        assert cache.cached(ids[5]) is None
    finally:
        cache.close()
        store.close()
