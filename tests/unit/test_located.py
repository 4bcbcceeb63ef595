"""The pack index's memory of where blobs are (store.located): bounded, and never the
reason a read returns wrong bytes or misses a blob's current copy, across what moves or
removes blobs in this process (publish, delete, compaction, healing) and in another one
(a second store object on the same directory stands for another process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from casfs.errors import Corruption, MissingBlob
from casfs.store.ids import BlobId, blob_id
from casfs.store.located import Located
from casfs.store.packstore import PackBlobStore
from tests.helpers import blobs as blob_files


def _store(path: Path) -> PackBlobStore:
    store = PackBlobStore(path, pack_target=1 << 20)
    store.create()
    return store


def _stage(store: PackBlobStore, n: int) -> dict[BlobId, bytes]:
    blobs = {}
    st = store.staging()
    for _ in range(n):
        plain = os.urandom(4000)
        bid = blob_id(plain)
        st.add(bid, plain)
        blobs[bid] = plain
    st.publish()
    return blobs


def _pack_of(store: PackBlobStore, bid: BlobId) -> str:
    where = store.index.locate(bid)
    assert where is not None
    return where[0]


def test_bounded_by_two_generations() -> None:
    memo: Located[int, str] = Located(max_entries=3)
    for i in range(10):
        memo.put(i, str(i))
    assert len(memo) <= 6
    assert memo.get(9) == "9" and memo.get(0) is None
    memo.forget([9])
    assert memo.get(9) is None


def test_entries_expire() -> None:
    memo: Located[int, str] = Located(ttl_s=-1.0)  # (every look-up finds the newer generation old)
    memo.put(1, "a")
    assert memo.get(1) == "a"  # (now in the older generation)
    assert memo.get(1) is None and len(memo) == 0


def test_remembered_places_are_used_and_forgotten_on_delete(tmp_path: Path) -> None:
    store = _store(tmp_path / "s")
    blobs = _stage(store, 3)
    bid, plain = next(iter(blobs.items()))
    assert store.get(bid) == plain
    assert store.index.located.get(bid) is not None
    store.delete(bid)
    assert store.index.located.get(bid) is None
    with pytest.raises(MissingBlob):
        store.get(bid)


def test_compaction_here_moves_what_is_remembered(tmp_path: Path) -> None:
    store = _store(tmp_path / "s")
    blobs = _stage(store, 10)
    ids = list(blobs)
    survivors = ids[:2]
    assert all(store.get(b) == blobs[b] for b in ids)  # (all remembered)
    old = _pack_of(store, survivors[0])
    for bid in ids[2:]:
        store.delete(bid)
    assert store.compact(0.5)[0] == 1
    assert not os.path.exists(store.pack_path(old))
    for bid in survivors:
        assert _pack_of(store, bid) != old and store.get(bid) == blobs[bid]


def test_compaction_by_another_process_is_found(tmp_path: Path) -> None:
    reader, other = _store(tmp_path / "s"), PackBlobStore(tmp_path / "s")
    blobs = _stage(reader, 10)
    ids = list(blobs)
    survivors = ids[:2]
    assert all(reader.get(b) == blobs[b] for b in ids)
    old = _pack_of(reader, survivors[0])
    for bid in ids[2:]:
        other.delete(bid)
    assert other.compact(0.5)[0] == 1 and not os.path.exists(other.pack_path(old))
    # The reader's fd of the removed pack still reads the same bytes, verified.
    assert all(reader.get(b) == blobs[b] for b in survivors)
    # Without it, the pack is gone: the reader looks the blobs up again.
    reader.fds.close()
    assert all(reader.get(b) == blobs[b] for b in survivors)
    assert all(_pack_of(reader, b) == _pack_of(other, b) != old for b in survivors)


@pytest.mark.parametrize("healer", ["here", "another process"])
def test_a_copy_that_fails_its_check_is_looked_up_again(tmp_path: Path, healer: str) -> None:
    reader = _store(tmp_path / "s")
    writer = reader if healer == "here" else PackBlobStore(tmp_path / "s")
    plain = b"precious " * 1000
    bid = reader.put(plain)
    assert reader.get(bid) == plain
    blob_files.corrupt(reader, bid)  # (in place: its place stays remembered)
    for read in (reader.get, lambda b: reader.get_if_cached(b, 1 << 20)):
        with pytest.raises(Corruption):
            read(bid)
    assert bid in reader.damaged()
    writer.put(plain)  # stored again (healed): a new copy in a new pack
    assert reader.get(bid) == plain
    assert reader.get_if_cached(bid, 1 << 20) == plain
