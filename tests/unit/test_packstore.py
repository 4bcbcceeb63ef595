"""The local pack store beyond the conformance suite (tests/conformance): what becomes
of packs as their blobs die (delete, compact), what a crash leaves and who removes it,
blob files of a store made before packs, several processes writing at once, the
bound on open files, and the index's memory of where blobs are (store.located: never
the reason a read returns wrong bytes or misses a blob's current copy, across what
moves or removes blobs here and in another process, which a second store object on
the same directory stands for)."""

from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from casfs.errors import Corruption, MissingBlob
from casfs.refcount.fsck import fsck
from casfs.repo import Repository
from casfs.store import Staging, packcompact
from casfs.store.fdcache import FdCache
from casfs.store.ids import BlobId, blob_id
from casfs.store.local import FileBlobStore, libc
from casfs.store.located import Located
from casfs.store.packstore import PackBlobStore
from tests.helpers import blobs as blob_files


def _store(tmp_path: Path, target: int = 1 << 20) -> PackBlobStore:
    store = PackBlobStore(tmp_path / "store", pack_target=target)
    store.create()
    return store


def _stage(store: PackBlobStore, n: int, size: int = 4000) -> dict[BlobId, bytes]:
    """n random blobs published by one staging (one pack, at the default target)."""
    blobs = {}
    st = store.staging()
    for _ in range(n):
        plain = os.urandom(size)
        blobs[st_add(st, plain)] = plain
    st.publish()
    return blobs


def st_add(st: Staging, plain: bytes) -> BlobId:
    bid = blob_id(plain)
    st.add(bid, plain)
    return bid


def _packs(store: PackBlobStore) -> set[str]:
    return {p.name for p in store.pack_dir.glob("*.pack")}


def _dead(pid: int) -> bool:
    return False


def test_a_pack_goes_with_its_last_blob(tmp_path: Path) -> None:
    store = _store(tmp_path)
    first, second = _stage(store, 3), _stage(store, 2)
    assert len(_packs(store)) == 2
    for bid in first:
        store.delete(bid)
    assert len(_packs(store)) == 1 and store.index.pack_names() == {p[:-5] for p in _packs(store)}
    assert all(store.get(b) == plain for b, plain in second.items())


def test_compact_rewrites_mostly_dead_packs_and_keeps_the_rest(tmp_path: Path) -> None:
    store = _store(tmp_path)
    mostly_dead, kept = _stage(store, 10), _stage(store, 10)
    before = _packs(store)
    dying = list(mostly_dead)[:8]
    for bid in dying:
        store.delete(bid)
    assert store.compact(0.0) == (0, 0)
    packs, reclaimed = store.compact(0.5)
    assert packs == 1 and reclaimed >= 8 * 4000
    assert len(_packs(store) & before) == 1  # the other was rewritten
    survivors = {b: p for b, p in mostly_dead.items() if b not in dying} | kept
    assert all(store.get(b) == plain for b, plain in survivors.items())
    assert sorted(store.list()) == sorted(survivors)
    assert store.compact(0.5) == (0, 0)


def test_compact_publishes_in_rounds_so_its_room_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path, target=64 << 10)
    stagings = [_stage(store, 10) for _ in range(4)]  # four packs of ~40 KB
    survivors: dict[BlobId, bytes] = {}
    for blobs in stagings:
        ids = list(blobs)
        for bid in ids[:7]:
            store.delete(bid)
        survivors |= {b: blobs[b] for b in ids[7:]}  # ~12 KB live in each
    monkeypatch.setattr(packcompact, "ROUND_PACKS", 0.5)  # 32 KiB of live bytes a round
    rounds: list[object] = []
    real = store.staging

    def counted() -> object:
        rounds.append(None)
        return real()

    monkeypatch.setattr(store, "staging", counted)
    packs, reclaimed = store.compact(0.5)
    assert len(rounds) == 2 and packs == 4 and reclaimed > 0
    assert all(store.get(b) == plain for b, plain in survivors.items())
    assert sorted(store.list()) == sorted(survivors)


def test_rounds_split_by_live_bytes_and_keep_a_large_pack_alone() -> None:
    packs = [("a", 0, 10), ("b", 0, 10), ("c", 0, 50), ("d", 0, 5)]
    assert [[p[0] for p in r] for r in packcompact._rounds(packs, 20)] == [["a", "b"], ["c"], ["d"]]
    assert packcompact._rounds([], 20) == []


def test_compact_leaves_a_pack_whose_blob_fails_its_check(tmp_path: Path) -> None:
    store = _store(tmp_path)
    blobs = _stage(store, 4)
    bad, good, *dying = blobs
    for bid in dying:
        store.delete(bid)
    blob_files.corrupt(store, bad)
    before = _packs(store)
    assert store.compact(0.9) == (0, 0)
    assert _packs(store) == before and bad in store.damaged()
    assert store.get(good) == blobs[good]
    store.put(blobs[bad])  # a writer of the same content heals it: a fresh copy
    assert store.get(bad) == blobs[bad]


def test_healing_the_only_blob_of_a_pack_drops_the_old_pack(tmp_path: Path) -> None:
    store = _store(tmp_path)
    plain = b"precious" * 1000
    bid = store.put(plain)
    old = _packs(store)
    blob_files.corrupt(store, bid)
    with pytest.raises(Corruption):
        store.get(bid)
    store.put(plain)
    assert store.get(bid) == plain and not _packs(store) & old


def test_a_blob_stored_again_beside_new_ones_moves_and_its_old_pack_stays(tmp_path: Path) -> None:
    """publish() inserts new blobs' rows without looking them up first; one published
    already is found by the insert it skips and moved to the new pack."""
    store = _store(tmp_path)
    first = _stage(store, 2)
    again, kept = list(first)
    old = _pack_of(store, again)
    st = store.staging()
    st.add(again, first[again])
    fresh = os.urandom(4000)
    new = st_add(st, fresh)
    st.publish()
    assert _pack_of(store, again) == _pack_of(store, new) != old == _pack_of(store, kept)
    assert old + ".pack" in _packs(store) and len(store.index.live(old)) == 1
    assert store.get(again) == first[again] and store.get(kept) == first[kept] and store.get(new) == fresh


def test_a_crash_between_rename_and_commit_leaves_a_pack_recover_staging_removes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path)
    kept = _stage(store, 2)
    st = store.staging()
    for _ in range(3):
        st_add(st, os.urandom(3000))

    def crash(*args: object) -> list[str]:
        raise KeyboardInterrupt  # as the process dying there: nothing after it runs

    monkeypatch.setattr(store.index, "publish", crash)
    with pytest.raises(KeyboardInterrupt):
        st.publish()
    monkeypatch.undo()
    assert len(_packs(store)) == 2  # the renamed pack, without rows
    assert sorted(store.list()) == sorted(kept)
    assert store.recover_staging(lambda pid: True) == 0 and len(_packs(store)) == 2
    assert store.recover_staging(_dead) == 3
    assert len(_packs(store)) == 1 and all(store.get(b) == p for b, p in kept.items())


def test_compact_removes_pack_files_no_row_names(tmp_path: Path) -> None:
    store = _store(tmp_path)
    kept = _stage(store, 2)
    (store.pack_dir / "0123456789abcdef-0.pack").write_bytes(b"casfspk1" + bytes(5000))
    st = store.staging()  # a live batch's pack, renamed in, rows not yet committed
    st_add(st, b"in flight" * 100)
    # Sealed as _seal_last does, no longer open: else discard() closes its fds a second
    # time, racing the sync thread's close (EBADF, or another file's fd, under load).
    full, st._open = st._open, None
    assert full is not None
    st._seal_full(full)
    in_flight = store.pack_path(st._sealed[0].name)
    os.rename(st._path(st._sealed[0], "pack"), in_flight)
    st._sealed[0].renamed = True
    packs, reclaimed = store.compact(0.5)
    assert (packs, reclaimed) == (1, 5008) and os.path.exists(in_flight)
    assert all(store.get(b) == p for b, p in kept.items())
    st.discard()
    assert not os.path.exists(in_flight)


def test_blob_files_of_an_older_store_are_read_where_they_are(tmp_path: Path) -> None:
    old = FileBlobStore(tmp_path / "store")
    old.create()
    before = {old.put(os.urandom(2000)) for _ in range(3)}
    store = PackBlobStore(tmp_path / "store")
    store.create()
    assert all(store.has(b) and store.get(b) == old.get(b) for b in before)
    new = store.put(b"new content" * 50)
    assert not old.has(new) and store.index.has(new)
    assert sorted(store.list()) == sorted({*before, new})
    gone = next(iter(before))
    store.delete(gone)
    assert not old.has(gone) and not store.has(gone)
    assert store.stored_size(new) == blob_files.location(store, new)[2]


_WRITER = """
import os, sys
from pathlib import Path
from casfs.store.ids import blob_id
from casfs.store.packstore import PackBlobStore
store = PackBlobStore(Path(sys.argv[1]), pack_target=64 << 10)
seed = int(sys.argv[2])
for batch in range(10):
    st = store.staging()
    for i in range(30):
        plain = f"{seed}-{batch}-{i}".encode() * 200
        st.add(blob_id(plain), plain)
    st.publish()
"""


def test_processes_publish_into_one_store_at_once(tmp_path: Path) -> None:
    store = _store(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(store.root), str(seed)], env=env)
        for seed in range(3)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    expect = {f"{s}-{b}-{i}".encode() * 200 for s in range(3) for b in range(10) for i in range(30)}
    assert sorted(store.list()) == sorted(blob_id(p) for p in expect)
    assert all(store.get(blob_id(p)) == p for p in expect)
    assert store.recover_staging(_dead) == 0 and store.compact(0.01) == (0, 0)


def test_open_pack_files_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(tmp_path)
    monkeypatch.setattr(store, "fds", FdCache(4))
    blobs: dict[BlobId, bytes] = {}
    for _ in range(12):
        blobs |= _stage(store, 1)
    fds_before = len(os.listdir("/proc/self/fd"))
    for bid, plain in blobs.items():
        assert store.get(bid) == plain
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 4


@pytest.mark.no_fsck("a pack file is lost on purpose")
def test_a_lost_pack_is_missing_blobs_for_fsck(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "repo")
    try:
        with repo.batch() as batch:
            ids = [batch.put(os.urandom(3000)) for _ in range(3)]
            batch.commit()
        os.unlink(blob_files.location(repo, ids[0])[0])
        with pytest.raises(MissingBlob):
            repo.blobs.get(ids[1])
        report = fsck(repo, timeout=0)
        missing = sorted(p.blob for p in report.problems if p.kind == "missing")
        assert missing == sorted(b.hex() for b in ids)
    finally:
        repo.close()


# -- remembered locations (store.located) ----------------------------------------------


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
    store = _store(tmp_path)
    blobs = _stage(store, 3)
    bid, plain = next(iter(blobs.items()))
    assert store.get(bid) == plain
    assert store.index.located.get(bid) is not None
    store.delete(bid)
    assert store.index.located.get(bid) is None
    with pytest.raises(MissingBlob):
        store.get(bid)


def test_delete_many_unlinks_the_packs_it_empties_only(tmp_path: Path) -> None:
    store = _store(tmp_path)
    first, second = _stage(store, 3), _stage(store, 3)
    emptied = _pack_of(store, next(iter(first)))
    kept_pack = _pack_of(store, next(iter(second)))
    doomed = [*first, *list(second)[:2]]
    store.delete_many(doomed)
    assert not os.path.exists(store.pack_path(emptied)) and not store.index.has_pack(emptied)
    assert os.path.exists(store.pack_path(kept_pack))
    assert sorted(store.list()) == sorted(list(second)[2:])
    last = list(second)[2]
    assert store.get(last) == second[last]
    # A reopened index agrees (the emptied pack's row was dropped durably).
    again = PackBlobStore(tmp_path / "store")
    assert not again.index.has_pack(emptied) and again.index.has_pack(kept_pack)


def test_compaction_here_moves_what_is_remembered(tmp_path: Path) -> None:
    store = _store(tmp_path)
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
    reader, other = _store(tmp_path), PackBlobStore(tmp_path / "store")
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
    reader = _store(tmp_path)
    writer = reader if healer == "here" else PackBlobStore(tmp_path / "store")
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


def _resident(path: Path) -> int:
    """How many of the file's pages are in the page cache (mincore of a private map of
    it: reading it to find out would bring them in)."""
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    with path.open("rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        vec = (ctypes.c_ubyte * pages)()
        address = ctypes.addressof(ctypes.c_char.from_buffer(m))
        if libc().mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(b & 1 for b in vec)


def test_warm_brings_the_index_into_the_page_cache(tmp_path: Path) -> None:
    """warm() asks the kernel for the index file (a mount's first lookups then find its
    pages in memory), and is no error for a store with no index file yet."""
    PackBlobStore(tmp_path / "none").warm()
    store = _store(tmp_path)
    _stage(store, 300)
    store.close()  # (the WAL checkpointed into the file)
    path = store.index.path
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # (clean pages, which DONTNEED drops)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if _resident(path):
        pytest.skip("this filesystem keeps the file's pages (DONTNEED does nothing here)")
    store.warm()
    whole = -(-path.stat().st_size // mmap.PAGESIZE)
    for _ in range(600):  # (the kernel's read-ahead completes in the background)
        if _resident(path) == whole:
            break
        time.sleep(0.05)
    assert _resident(path) == whole
    assert store.get(next(iter(store.list()))) is not None  # (still a working store)


def test_a_cold_miss_asks_the_index_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trio thread's nowait try finds a blob out of the page cache (RWF_NOWAIT
    fails, as the kernel answers for pages not in memory); the blocking read that
    follows (casfs.vfs.readpolicy) reads where the try found it, without a second
    look-up."""
    store = _store(tmp_path)
    first, second = _stage(store, 2)
    blobs = {first: store.get(first)}  # (opens the pack: a nowait read needs it open)
    store.index.located.clear()
    real_preadv, real_locate = os.preadv, store.index.locate
    asked: list[BlobId] = []

    def preadv(fd: int, buffers: list[bytearray], offset: int, flags: int = 0) -> int:
        if flags:
            raise BlockingIOError(11, "would block")
        return real_preadv(fd, buffers, offset)

    def locate(bid: BlobId) -> object:
        asked.append(bid)
        return real_locate(bid)

    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(store.index, "locate", locate)
    assert store.get_if_cached(second, 1 << 20) is None
    got = store.get(second)
    assert blob_id(got) == second and asked == [second]
    assert store.get(first) == blobs[first] and asked == [second, first]  # (others ask as before)
