"""One conformance suite for every BlobStore (containerd's content testsuite is the
model): the local pack store, the same over blob files of a store made before packs
(written and read in the old layout, read through the pack store), the file store
itself, the memory store, the S3 store (on a real SeaweedFS server), and the
fault-injecting wrapper with nothing armed all keep the promises written on
casfs.store.BlobStore and Staging. Then the wrapper's faults, over each real store: a
failure leaves nothing half visible, and a read never returns wrong bytes. Last, a
Repository given a memory store runs import, export, gc, fsck and recovery: nothing
above the interface reaches past it."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from casfs import images
from casfs.errors import Corruption, MissingBlob
from casfs.refcount.fsck import fsck
from casfs.refcount.gc import gc
from casfs.repo import Repository
from casfs.store import BlobStore, Domain, Staging, codec
from casfs.store.faulty import CORRUPT, Faults, FaultyBlobStore
from casfs.store.ids import BlobId, blob_id, meta_id
from casfs.store.local import FileBlobStore
from casfs.store.memory import MemoryBlobStore
from casfs.store.packstore import PackBlobStore
from casfs.store.s3 import packfmt
from casfs.store.s3.location import Location
from casfs.store.s3.store import connect
from casfs.upkeep.recovery import recover
from tests.helpers import blobs as blob_files
from tests.helpers.seaweed import BUCKET, Seaweed, fresh_prefix


@dataclass
class Subject:
    """A store under test, with the one thing the interface has no method for: damaging
    a published blob's stored bytes the way a disk would."""

    store: BlobStore
    overwrite: Callable[[BlobId, bytes], None]
    faults: Faults | None = None


def _file(request: pytest.FixtureRequest, tmp_path: Path) -> Subject:
    store = FileBlobStore(tmp_path / "store")
    store.create()

    def overwrite(bid: BlobId, stored: bytes) -> None:
        path = store.path(bid)
        path.chmod(0o644)
        path.write_bytes(stored)

    return Subject(store, overwrite)


def _packs(request: pytest.FixtureRequest, tmp_path: Path) -> Subject:
    # Small packs, so that a test's blobs span several and a pack fills mid-batch.
    store = PackBlobStore(tmp_path / "store", pack_target=32 << 10)
    store.create()
    return Subject(store, lambda bid, stored: blob_files.overwrite(store, bid, stored))


class _OldLayout(PackBlobStore):
    """The pack store over a store made before packs: its blobs written as files
    (store.local), read, listed and deleted through the pack store's fallback."""

    def staging(self) -> Staging:  # type: ignore[override]
        assert self.legacy is not None
        return self.legacy.staging()


def _old_layout(request: pytest.FixtureRequest, tmp_path: Path) -> Subject:
    FileBlobStore(tmp_path / "store").create()
    store = _OldLayout(tmp_path / "store")
    store.create()
    return Subject(store, lambda bid, stored: blob_files.overwrite(store, bid, stored))


def _memory(request: pytest.FixtureRequest, tmp_path: Path) -> Subject:
    store = MemoryBlobStore()

    def overwrite(bid: BlobId, stored: bytes) -> None:
        store.stored[bid] = stored

    return Subject(store, overwrite)


def _s3(request: pytest.FixtureRequest, tmp_path: Path) -> Subject:
    server: Seaweed = request.getfixturevalue("seaweed")
    with pytest.MonkeyPatch.context() as env:
        for k, v in server.env().items():
            env.setenv(k, v)
        store = connect(tmp_path / "store", Location(BUCKET, fresh_prefix()))
    store.create()

    def overwrite(bid: BlobId, stored: bytes) -> None:
        """Rewrite the pack holding `bid` with `stored` in its place, and its index to
        match (the damage a server could do; casfs itself never rewrites an object)."""
        import obstore

        for name, offset, length in store.table.locate(bid):
            pack = store.remote.get(packfmt.pack_key(name))
            pack = pack[:offset] + stored + pack[offset + length :]
            _, entries = packfmt.decode_index(store.remote.get(packfmt.index_key(name)), name)
            delta = len(stored) - length
            moved = [
                (b, o + delta if o > offset else o, len(stored) if b == bid else n) for b, o, n in entries
            ]
            obstore.put(store.remote.store, packfmt.pack_key(name), pack)
            obstore.put(store.remote.store, packfmt.index_key(name), packfmt.encode_index(len(pack), moved))
        store.reload()

    return Subject(store, overwrite)


Factory = Callable[[pytest.FixtureRequest, Path], Subject]


def _faulty(inner: Factory) -> Factory:
    def make(request: pytest.FixtureRequest, tmp_path: Path) -> Subject:
        sub = inner(request, tmp_path)
        faults = Faults()
        return Subject(FaultyBlobStore(sub.store, faults), sub.overwrite, faults)

    return make


STORES = {
    "packs": _packs,
    "old-layout": _old_layout,
    "file": _file,
    "memory": _memory,
    "s3": _s3,
    "faulty-packs": _faulty(_packs),
}


@pytest.fixture(params=list(STORES))
def sub(request: pytest.FixtureRequest, tmp_path: Path) -> Subject:
    return STORES[request.param](request, tmp_path)


def _blobs(n: int, size: int = 3000) -> dict[BlobId, bytes]:
    """n distinct data blobs, half compressible (stored zstd), half random (stored raw)."""
    out = {}
    for i in range(n):
        plain = bytes([i]) * size if i % 2 else os.urandom(size)
        out[blob_id(plain)] = plain
    return out


def _dead(pid: int) -> bool:
    return False


def _alive(pid: int) -> bool:
    return True


# -- put, get, has, list, stored_size -----------------------------------------------


def test_a_put_blob_reads_back_and_is_listed(sub: Subject) -> None:
    s = sub.store
    for plain in (b"x", os.urandom(70_000), b"z" * (2 << 20)):
        bid = s.put(plain)
        assert bid == blob_id(plain)
        assert s.get(bid) == plain and s.get(bid, "data") == plain
        assert s.has(bid) and bid in set(s.list())
        assert s.stored_size(bid) == len(codec.encode(plain))


def test_an_absent_blob_is_missing_everywhere(sub: Subject) -> None:
    bid = blob_id(b"never stored")
    assert not sub.store.has(bid) and list(sub.store.list()) == []
    with pytest.raises(MissingBlob):
        sub.store.get(bid)
    with pytest.raises(MissingBlob):
        sub.store.stored_size(bid)


def test_put_is_idempotent(sub: Subject) -> None:
    s = sub.store
    first, second = s.put(b"same" * 100), s.put(b"same" * 100)
    assert first == second and list(s.list()) == [first] and s.get(first) == b"same" * 100


def test_list_names_every_published_blob_once(sub: Subject) -> None:
    blobs = _blobs(40)
    st = sub.store.staging()
    for bid, plain in blobs.items():
        st.add(bid, plain)
    st.publish()
    sub.store.staging().add(blob_id(b"staged only"), b"staged only")
    listed = list(sub.store.list())
    assert sorted(listed) == sorted(blobs)


def test_get_if_cached_gives_the_blob_or_nothing(sub: Subject) -> None:
    bid = sub.store.put(b"cached?" * 100)
    assert sub.store.get_if_cached(bid, 1 << 20) in (None, b"cached?" * 100)
    assert sub.store.get_if_cached(bid, 0) is None
    try:
        absent = sub.store.get_if_cached(blob_id(b"absent"), 1 << 20)
    except MissingBlob:
        absent = None
    assert absent is None


def test_create_is_idempotent(sub: Subject) -> None:
    bid = sub.store.put(b"kept")
    sub.store.create()
    assert sub.store.get(bid) == b"kept"


# -- staging and publishing ---------------------------------------------------------


def test_staged_blobs_are_invisible_until_published(sub: Subject) -> None:
    blobs = _blobs(20)  # above the file store's fsync-each threshold (one syncfs); several packs
    st = sub.store.staging()
    sizes = {bid: st.add(bid, plain) for bid, plain in blobs.items()}
    assert not any(sub.store.has(b) for b in blobs) and list(sub.store.list()) == []
    st.publish()
    for bid, plain in blobs.items():
        assert sub.store.get(bid) == plain and sub.store.stored_size(bid) == sizes[bid]
    st.publish()  # idempotent
    st.discard()  # and a discard after publish keeps what was published
    assert sorted(sub.store.list()) == sorted(blobs)


def test_adding_an_id_twice_stages_it_once(sub: Subject) -> None:
    st = sub.store.staging()
    bid = blob_id(b"twice" * 50)
    assert st.add(bid, b"twice" * 50) == st.add(bid, memoryview(b"twice" * 50))
    st.publish()
    assert list(sub.store.list()) == [bid]


def test_a_discarded_staging_leaves_nothing(sub: Subject) -> None:
    st = sub.store.staging()
    for bid, plain in _blobs(5).items():
        st.add(bid, plain)
    st.discard()
    st.discard()  # idempotent
    st.publish()  # nothing left to publish
    assert list(sub.store.list()) == [] and sub.store.recover_staging(_dead) == 0


def test_adds_from_several_threads_publish_together(sub: Subject) -> None:
    blobs = _blobs(64, size=500)
    st = sub.store.staging()
    items = list(blobs.items())
    threads = [
        threading.Thread(target=lambda part=items[i::4]: [st.add(b, p) for b, p in part]) for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    st.publish()
    assert sorted(sub.store.list()) == sorted(blobs)


def test_publishing_again_replaces_the_stored_copy(sub: Subject) -> None:
    bid = sub.store.put(b"original" * 64)
    sub.overwrite(bid, b"\x00garbage")
    sub.store.put(b"original" * 64)
    assert sub.store.get(bid) == b"original" * 64


# -- staging leftovers of dead writers ----------------------------------------------


def test_staging_left_by_a_dead_writer_is_recovered(sub: Subject) -> None:
    kept = sub.store.put(b"published")
    abandoned = sub.store.staging()  # as a process that died between add and publish
    for bid, plain in _blobs(3).items():
        abandoned.add(bid, plain)
    assert sub.store.recover_staging(_alive) == 0
    assert sub.store.recover_staging(lambda pid: pid == os.getpid()) == 0
    assert sub.store.recover_staging(_dead) == 3
    assert sub.store.recover_staging(_dead) == 0  # idempotent
    assert list(sub.store.list()) == [kept] and sub.store.get(kept) == b"published"
    with pytest.raises(OSError):  # its staging is gone: it cannot publish half of it
        abandoned.publish()
    assert list(sub.store.list()) == [kept]


# -- delete -------------------------------------------------------------------------


def test_delete_is_idempotent_and_leaves_the_others(sub: Subject) -> None:
    blobs = _blobs(4)
    for plain in blobs.values():
        sub.store.put(plain)
    gone, *rest = blobs
    sub.store.delete(gone)
    sub.store.delete(gone)
    sub.store.delete(blob_id(b"never stored"))
    assert not sub.store.has(gone) and sorted(sub.store.list()) == sorted(rest)
    with pytest.raises(MissingBlob):
        sub.store.get(gone)
    assert all(sub.store.get(b) == blobs[b] for b in rest)


def test_delete_many_removes_just_those_and_takes_absent_ids(sub: Subject) -> None:
    blobs = _blobs(6)
    for plain in blobs.values():
        sub.store.put(plain)
    ids = list(blobs)
    gone, kept = ids[:4], ids[4:]
    sub.store.delete_many([*gone, gone[0], blob_id(b"never stored")])
    sub.store.delete_many([])
    assert sorted(sub.store.list()) == sorted(kept)
    assert not any(sub.store.has(b) for b in gone)
    with pytest.raises(MissingBlob):
        sub.store.get(gone[1])
    assert all(sub.store.get(b) == blobs[b] for b in kept)


# -- verification -------------------------------------------------------------------


def _damages(plain: bytes) -> dict[str, bytes]:
    good = codec.encode(plain)
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x10
    return {
        "flipped": bytes(flipped),
        "truncated": good[: len(good) // 2],
        "empty": b"",
        "other content": codec.encode(b"something else"),
        "unknown codec": b"\x07" + good[1:],
        "trailing data": good + b"\x00",
    }


@pytest.mark.parametrize("damage", list(_damages(b"")))
def test_a_damaged_blob_is_an_error_never_wrong_bytes(sub: Subject, damage: str) -> None:
    plain = b"precious " * 500
    bid = sub.store.put(plain)
    sub.overwrite(bid, _damages(plain)[damage])
    with pytest.raises(Corruption, match=bid.hex()):
        sub.store.get(bid)
    got = None
    with contextlib.suppress(Corruption):
        got = sub.store.get_if_cached(bid, 1 << 20)
    assert got is None
    assert bid in sub.store.damaged()
    sub.store.put(plain)  # a writer of the same content heals it
    assert sub.store.get(bid) == plain
    sub.store.clear_damaged(bid)
    sub.store.clear_damaged(bid)  # idempotent
    assert sub.store.damaged() == set()


@pytest.mark.parametrize("damage", ["flipped", "truncated", "trailing data"])
def test_a_run_of_blobs_reads_as_each_blob_does(sub: Subject, damage: str) -> None:
    """get_many: every id once, each with get()'s outcome; a damaged blob among good
    ones fails alone (and is marked damaged), an absent one is missing."""
    plains = [f"blob {i} ".encode() * 300 for i in range(6)]
    ids = [sub.store.put(p) for p in plains]
    sub.overwrite(ids[2], _damages(plains[2])[damage])
    absent = blob_id(b"never stored")
    got = dict(sub.store.get_many([*ids, absent, ids[0]], "data"))
    assert sorted(got) == sorted([*ids, absent])
    assert isinstance(got.pop(ids[2]), Corruption) and isinstance(got.pop(absent), MissingBlob)
    assert got == {bid: p for bid, p in zip(ids, plains, strict=True) if bid != ids[2]}
    assert ids[2] in sub.store.damaged()


def test_a_read_tries_the_asked_domain_first_and_accepts_either(sub: Subject) -> None:
    """The domain is a hint for one hash instead of two: a blob hashing to its id in
    the other domain is still the content written under that id (a format-1 store
    named its trees by the data hash), and bytes matching neither are refused."""
    tree = b"a tree's bytes" * 20
    mid = meta_id(tree)
    st = sub.store.staging()
    st.add(mid, tree)
    st.publish()
    assert sub.store.get(mid, "meta") == tree and sub.store.get(mid) == tree
    assert sub.store.get(mid, "data") == tree
    did = sub.store.put(tree)
    assert did != mid
    assert sub.store.get(did, "meta") == tree
    other = blob_id(b"other bytes")
    st = sub.store.staging()
    st.add(other, tree)  # staged under an id its bytes do not have
    st.publish()
    domains: tuple[Domain | None, ...] = ("data", "meta", None)
    for domain in domains:
        with pytest.raises(Corruption):
            sub.store.get(other, domain)


def test_damaged_marks_are_kept_until_cleared(sub: Subject) -> None:
    a, b = blob_id(b"a"), blob_id(b"b")
    sub.store.mark_damaged(a)
    sub.store.mark_damaged(a)
    sub.store.mark_damaged(b)
    assert sub.store.damaged() == {a, b}
    sub.store.clear_damaged(a)
    assert sub.store.damaged() == {b}


# -- faults: FaultyBlobStore over each real store -----------------------------------


@pytest.fixture(params=["packs", "file", "memory", "s3"])
def faulty(request: pytest.FixtureRequest, tmp_path: Path) -> Subject:
    return _faulty(STORES[request.param])(request, tmp_path)


def _plan(sub: Subject, plan: str) -> None:
    assert sub.faults is not None
    sub.faults.planned.update(Faults.parse(plan).planned)


@pytest.mark.parametrize("code", ["ENOSPC", "EIO"])
def test_a_failed_add_stages_nothing_of_that_blob(faulty: Subject, code: str) -> None:
    _plan(faulty, f"stage:2:{code}")
    blobs = list(_blobs(3).items())
    st = faulty.store.staging()
    st.add(*blobs[0])
    with pytest.raises(OSError) as e:
        st.add(*blobs[1])
    assert e.value.errno == getattr(errno, code)
    st.add(*blobs[2])
    st.publish()
    assert sorted(faulty.store.list()) == sorted([blobs[0][0], blobs[2][0]])
    assert faulty.store.recover_staging(_dead) == 0


@pytest.mark.parametrize("code", ["ENOSPC", "EIO"])
def test_a_failed_publish_publishes_nothing(faulty: Subject, code: str) -> None:
    _plan(faulty, f"publish:1:{code}")
    blobs = _blobs(6)
    st = faulty.store.staging()
    for bid, plain in blobs.items():
        st.add(bid, plain)
    with pytest.raises(OSError) as e:
        st.publish()
    assert e.value.errno == getattr(errno, code)
    assert list(faulty.store.list()) == []
    st.discard()
    assert list(faulty.store.list()) == [] and faulty.store.recover_staging(_dead) == 0


def test_a_publish_stopped_half_way_leaves_whole_blobs_or_none(faulty: Subject) -> None:
    _plan(faulty, "publish-half:1:EIO")
    blobs = _blobs(8)
    st = faulty.store.staging()
    for bid, plain in blobs.items():
        st.add(bid, plain)
    with pytest.raises(OSError):
        st.publish()
    st.discard()
    published = set(faulty.store.list())
    assert len(published) == 4 and published < set(blobs)
    assert all(faulty.store.get(b) == blobs[b] for b in published)
    assert faulty.store.recover_staging(_dead) == 0
    st = faulty.store.staging()  # a retry publishes them all
    for bid, plain in blobs.items():
        st.add(bid, plain)
    st.publish()
    assert sorted(faulty.store.list()) == sorted(blobs)


@pytest.mark.parametrize("code", ["EIO", "corrupt"])
def test_a_failed_get_is_an_error_and_the_next_reads(faulty: Subject, code: str) -> None:
    bid = faulty.store.put(b"read me" * 10)
    _plan(faulty, f"get:1:{code}")
    with pytest.raises(Corruption if code == "corrupt" else OSError) as e:
        faulty.store.get(bid)
    if code == "corrupt":
        assert faulty.store.damaged() == {bid}
    else:
        assert isinstance(e.value, OSError) and e.value.errno == errno.EIO
    assert faulty.store.get(bid) == b"read me" * 10


def test_an_armed_fault_fires_once(faulty: Subject) -> None:
    assert faulty.faults is not None
    bid = faulty.store.put(b"armed")
    faulty.faults.arm("get", CORRUPT)
    with pytest.raises(Corruption):
        faulty.store.get(bid)
    assert faulty.store.get(bid) == b"armed" and faulty.faults.fired == 1


# -- the interface is all the repository uses ---------------------------------------


@pytest.fixture
def memory_repo(tmp_path: Path) -> Iterator[Repository]:
    repo = Repository.init(tmp_path / "store", MemoryBlobStore())
    yield repo
    repo.close()


def test_a_repository_runs_on_a_memory_store(memory_repo: Repository, tmp_path: Path) -> None:
    repo = memory_repo
    assert isinstance(repo.blobs, MemoryBlobStore)
    src = tmp_path / "disk.raw"
    src.write_bytes(os.urandom(300_000) + bytes(200_000) + b"tail" * 1000)
    images.import_image(repo, "one", src)
    assert not (tmp_path / "store" / "blobs").exists()
    out = tmp_path / "out.raw"
    images.export_image(repo, "one", out)
    assert out.read_bytes() == src.read_bytes()
    assert fsck(repo, timeout=0).clean
    abandoned = repo.blobs.staging()
    abandoned.add(blob_id(b"left"), b"left")
    orphan = repo.blobs.put(b"published, never committed")
    report = fsck(repo, timeout=0)
    assert [p.kind for p in report.problems] == ["orphan"]
    assert not recover(repo)  # the staging's owner (this process) is alive
    images.remove_image(repo, "one")
    freed = gc(repo, timeout=0)
    assert freed.blobs_freed > 0 and freed.orphan_files_removed == 1
    assert not repo.blobs.has(orphan) and list(repo.blobs.list()) == []
    assert repo.blobs.recover_staging(_dead) == 1 and fsck(repo, timeout=0).clean
