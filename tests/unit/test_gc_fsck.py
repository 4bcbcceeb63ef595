"""gc and fsck against a real store: content built with the core (batches, chunk maps,
trees), damage done to the files and the catalog the way a disk or a bug would."""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Sequence

import pytest

from casfs import catalog
from casfs.catalog import blobs as blob_rows
from casfs.catalog import figures as kept
from casfs.errors import Busy, MissingBlob
from casfs.ids import FIRST_FREE_INO, ROOT_INO, InodeNo
from casfs.kinds import BlobKind
from casfs.refcount import ledger
from casfs.refcount.fsck import FsckReport, fsck
from casfs.refcount.gc import gc
from casfs.repo import Repository
from casfs.snapshots import chunkmap, tree
from casfs.snapshots.children import children
from casfs.store.ids import ZERO_ID, BlobId, blob_id, meta_id
from tests.helpers import blobs as blob_files

CS = 65536


# -- building content -----------------------------------------------------------


def _add_image_row(name: str, kind: str, root: BlobId, size: int) -> Callable[[sqlite3.Connection], None]:
    def then(c: sqlite3.Connection) -> None:
        c.execute(
            "INSERT INTO images (name, kind, phase, root, size, chunk_size, created) "
            "VALUES (?, ?, 'ready', ?, ?, ?, 0)",
            (name, kind, root, size, CS),
        )
        _unknown_change(c)

    return then


def _unknown_change(c: sqlite3.Connection) -> None:
    """Rows made by hand, not by casfs's operations: every kept figure pending (as the
    rules of refcount.figures would not know who shares what), so fsck counts them."""
    kept.mark_all(c, kept.ALL)


def block_image(repo: Repository, name: str, chunks: Sequence[bytes]) -> tuple[BlobId, list[BlobId]]:
    """A block image whose chunk n has the bytes chunks[n]; returns (root, chunk ids)."""
    with repo.batch() as b:
        ids = [b.put(c) for c in chunks]
        size = len(ids) * CS
        root = chunkmap.build_map(b.put_kind, ids, size, CS)
        b.commit({root: 1}, then=_add_image_row(name, "block", root, size))
    return root, ids


def dir_image(repo: Repository, name: str, files: dict[bytes, Sequence[bytes]]) -> BlobId:
    """A directory image: /sub/<name> for each file (one chunk: direct; more: a map)."""
    with repo.batch() as b:
        entries = []
        total = 0
        for ino, (fname, chunks) in enumerate(sorted(files.items()), start=10):
            ids = [b.put(c) for c in chunks]
            size = len(chunks[0]) if len(chunks) == 1 else len(chunks) * CS
            content = chunkmap.build_content(b.put_kind, ids, size, CS)
            attrs = tree.Attrs(mode=stat.S_IFREG | 0o644, size=size, ino=InodeNo(ino))
            entries.append(tree.Entry(fname, attrs, content))
            total += size
        sub = b.put(
            tree.Tree(tree.Attrs(mode=stat.S_IFDIR | 0o755, ino=FIRST_FREE_INO), CS, entries).encode(),
            BlobKind.TREE,
        )
        top = tree.Tree(
            tree.Attrs(mode=stat.S_IFDIR | 0o755, ino=ROOT_INO),
            CS,
            [tree.dir_entry(b"sub", 0o755, FIRST_FREE_INO, sub)],
        )
        root = b.put(top.encode(), BlobKind.TREE)
        b.commit({root: 1}, then=_add_image_row(name, "dir", root, total))
    return root


def delete_image(repo: Repository, name: str) -> None:
    with catalog.transaction(repo.conn) as c:
        (root,) = c.execute("SELECT root FROM images WHERE name = ?", (name,)).fetchone()
        ledger.release(c, [BlobId(root)])
        c.execute("DELETE FROM images WHERE name = ?", (name,))
        kept.delete(c, [kept.image(name)])
        _unknown_change(c)


def clone_image(conn: sqlite3.Connection, src: str, dst: str) -> None:
    with catalog.transaction(conn) as c:
        (root,) = c.execute("SELECT root FROM images WHERE name = ?", (src,)).fetchone()
        ledger.retain(c, [BlobId(root)])
        c.execute(
            "INSERT INTO images (name, kind, phase, root, size, chunk_size, created) "
            "SELECT ?, kind, phase, root, size, chunk_size, created FROM images WHERE name = ?",
            (dst, src),
        )
        _unknown_change(c)


def reachable(repo: Repository, root: BlobId, kind: int) -> set[BlobId]:
    seen: set[BlobId] = set()
    todo = [(root, kind)]
    while todo:
        bid, k = todo.pop()
        if bid == ZERO_ID or bid in seen:
            continue
        seen.add(bid)
        if k != BlobKind.DATA:
            todo.extend(children(k, repo.get(bid)))
    return seen


def files_on_disk(repo: Repository) -> dict[str, int]:
    return blob_files.stored_sizes(repo)


def refs(repo: Repository, bid: BlobId) -> int:
    row = repo.conn.execute("SELECT refs FROM blobs WHERE id = ?", (bid,)).fetchone()
    assert row is not None, f"no row for {bid.hex()}"
    return int(row[0])


def flip_byte(repo: Repository, bid: BlobId) -> None:
    blob_files.corrupt(repo, bid)


def sql(repo: Repository, statement: str, *args: object) -> None:
    """Change the catalog behind casfs's back, as a bug or a hand edit would."""
    with sqlite3.connect(repo.catalog_path) as c:
        c.execute(statement, args)
    c.close()


def kinds_of(report: FsckReport) -> set[str]:
    return {p.kind for p in report.problems}


def rand_chunks(n: int, size: int = 1000) -> list[bytes]:
    return [os.urandom(size) for _ in range(n)]


# -- a clean store --------------------------------------------------------------


def test_fresh_store_is_clean(repo: Repository) -> None:
    report = fsck(repo)
    assert report.clean and report.rows == 0 and report.files == 0
    assert gc(repo).blobs_freed == 0


def test_clean_after_imports(repo: Repository) -> None:
    block_image(repo, "disk", rand_chunks(50))
    dir_image(repo, "tree", {b"small": [b"hello"], b"big": rand_chunks(3)})
    report = fsck(repo)
    assert report.clean, report.problems
    # 50 chunks + map root; 1 direct chunk + 3 chunks + map + 2 trees
    assert report.rows == report.files == report.blobs_checked == 58
    assert report.bytes_checked > 53 * 1000 and report.garbage == 0
    assert report.root_refs == 2
    freed = gc(repo)
    assert (freed.blobs_freed, freed.orphan_files_removed) == (0, 0)
    assert fsck(repo).clean


# -- corruption -------------------------------------------------------------------


@pytest.mark.no_fsck("a flipped byte in a data blob, which fsck reports and cannot repair")
def test_flipped_byte_in_data_blob_is_corrupt(repo: Repository) -> None:
    _, ids = block_image(repo, "disk", rand_chunks(10))
    flip_byte(repo, ids[3])
    report = fsck(repo)
    assert not report.clean
    assert [p.blob for p in report.of_kind("corrupt")] == [ids[3].hex()]
    assert kinds_of(report) == {"corrupt"}  # data has no children: every count still checks
    assert not report.incomplete
    repaired = fsck(repo, repair=True)
    assert [p.kind for p in repaired.remaining] == ["corrupt"]  # a referenced blob cannot be mended
    assert not fsck(repo).clean


@pytest.mark.no_fsck("a map root written wrong (its hash right), which fsck reports and cannot repair")
def test_a_map_root_short_of_ids_is_corrupt_and_its_chunks_are_kept(
    repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two chunk ids for a size of three chunks: read, the third was a hole (and a one-chunk
    # read of it an IndexError). No encoder writes one, and a batch refuses to store one:
    # it is stored here as a writer with that bug would have (decode counting 2 chunks).
    _, good = block_image(repo, "good", rand_chunks(3))
    with repo.batch() as b, monkeypatch.context() as bug:
        bug.setattr(chunkmap, "n_chunks", lambda size, chunk_size: 2)
        ids = [b.put(c) for c in rand_chunks(2)]
        plain = chunkmap.MapRoot(0, CS, 3 * CS, ids).encode()
        root = b.put_kind(plain, BlobKind.MAP_ROOT)
        b.commit({root: 1}, then=_add_image_row("short", "block", root, 3 * CS))
    report = fsck(repo)
    [bad] = report.of_kind("corrupt")
    assert bad.blob == root.hex() and "2 chunk ids for 3 chunks" in bad.message
    fsck(repo, repair=True)
    assert repo.get(root) == plain  # nothing is dropped: the root, its chunks, the other image
    assert all(refs(repo, c) == 1 for c in [*ids, *good])
    assert [p.blob for p in fsck(repo).of_kind("corrupt")] == [root.hex()]


@pytest.mark.no_fsck("a flipped byte in a map page, which fsck reports and cannot repair")
def test_flipped_byte_in_map_page_is_corrupt_and_counts_are_not_lowered(repo: Repository) -> None:
    # > PAGE_ENTRIES chunks: a two-level map. Distinct chunks make the page incompressible,
    # stored raw, so the flipped byte is in the ids themselves.
    root, ids = block_image(repo, "disk", rand_chunks(chunkmap.PAGE_ENTRIES + 50, size=64))
    pages = chunkmap.MapRoot.decode(repo.get(root)).ids
    assert len(pages) == 2
    flip_byte(repo, pages[0])
    report = fsck(repo)
    assert [p.blob for p in report.of_kind("corrupt")] == [pages[0].hex()]
    assert report.incomplete
    # The page's chunks now look over-counted; fsck says so, flagged as uncertain...
    over = report.of_kind("miscounted")
    assert len(over) == chunkmap.PAGE_ENTRIES
    assert all(p.stored == 1 and p.expected == 0 and "unreadable" in p.message for p in over)
    # ...and repair refuses to lower them: restoring the page must still find its data.
    fsck(repo, repair=True)
    assert all(refs(repo, c) == 1 for c in ids)
    assert len(fsck(repo).of_kind("miscounted")) == chunkmap.PAGE_ENTRIES


@pytest.mark.no_fsck("a referenced blob file is deleted: missing, which fsck cannot repair")
def test_deleted_blob_file_is_missing(repo: Repository) -> None:
    _, ids = block_image(repo, "disk", rand_chunks(10))
    repo.blobs.delete(ids[0])
    report = fsck(repo, sample=0.0)  # existence is checked for every blob, sampled or not
    assert [(p.kind, p.blob) for p in report.problems] == [("missing", ids[0].hex())]
    fsck(repo, repair=True)
    assert [p.kind for p in fsck(repo).problems] == ["missing"]  # still referenced: kept


def test_missing_file_of_unreferenced_row_is_repaired(repo: Repository) -> None:
    root, _ = block_image(repo, "disk", rand_chunks(5))
    delete_image(repo, "disk")
    repo.blobs.delete(root)  # garbage whose file vanished before gc
    report = fsck(repo)
    assert kinds_of(report) == {"missing", "miscounted"}  # its chunks: stored 1, expected 0
    assert report.garbage == 1 and not report.incomplete
    report = fsck(repo, repair=True)
    assert report.problems and not report.remaining
    assert fsck(repo).clean
    assert gc(repo).blobs_freed == 5
    assert files_on_disk(repo) == {} and fsck(repo).rows == 0


@pytest.mark.no_fsck("a referenced blob row is deleted: dangling, which fsck cannot repair")
def test_dangling_reference_keeps_its_file(repo: Repository) -> None:
    _, ids = block_image(repo, "disk", rand_chunks(3))
    sql(repo, "DELETE FROM blobs WHERE id = ?", ids[1])
    report = fsck(repo)
    assert [(p.kind, p.blob) for p in report.problems] == [("dangling", ids[1].hex())]
    fsck(repo, repair=True)  # inserts nothing; the file is evidence, not an orphan
    assert repo.blobs.has(ids[1])
    assert [p.kind for p in fsck(repo).problems] == ["dangling"]


# -- counts -----------------------------------------------------------------------


@pytest.mark.parametrize("stored", [0, 6, -1])
def test_hand_altered_refcount_is_reported_and_repaired(repo: Repository, stored: int) -> None:
    _, ids = block_image(repo, "disk", rand_chunks(5))
    sql(repo, "UPDATE blobs SET refs = ? WHERE id = ?", stored, ids[2])
    report = fsck(repo)
    (p,) = report.problems
    assert (p.kind, p.blob, p.stored, p.expected) == ("miscounted", ids[2].hex(), stored, 1)
    assert f"refs {stored}, expected 1" in p.message
    report = fsck(repo, repair=True)
    assert not report.clean and not report.remaining and report.problems[0].repaired
    assert refs(repo, ids[2]) == 1
    assert fsck(repo).clean


def test_multiplicity_within_one_map(repo: Repository) -> None:
    x, y = rand_chunks(2)
    _, ids = block_image(repo, "disk", [x, y, x, x, bytes(1000), y])
    assert ids[4] == ZERO_ID  # a hole: no blob
    assert (refs(repo, ids[0]), refs(repo, ids[1])) == (3, 2)
    block_image(repo, "disk2", [x, x])
    assert refs(repo, ids[0]) == 5
    assert fsck(repo).clean
    sql(repo, "UPDATE blobs SET refs = 1 WHERE id = ?", ids[0])
    (p,) = fsck(repo).problems
    assert (p.stored, p.expected) == (1, 5)
    fsck(repo, repair=True)
    delete_image(repo, "disk")
    report = gc(repo)
    assert report.blobs_freed == 2  # disk's root and y; x is still named twice by disk2
    assert refs(repo, ids[0]) == 2
    assert fsck(repo).clean


def test_reference_to_a_blob_without_a_row_is_refused_and_counts_nothing(repo: Repository) -> None:
    _, ids = block_image(repo, "disk", rand_chunks(3))
    ghost = blob_id(b"never stored")
    with pytest.raises(MissingBlob, match=ghost.hex()), catalog.transaction(repo.conn):
        blob_rows.add_refs(repo.conn, {ids[0]: 2, ghost: 1, ids[2]: -1})
    assert [refs(repo, b) for b in ids] == [1, 1, 1]
    assert fsck(repo).clean


# -- gc -----------------------------------------------------------------------------


def test_orphan_file_reported_and_removed_by_gc(repo: Repository) -> None:
    block_image(repo, "disk", rand_chunks(3))
    orphan = repo.blobs.put(os.urandom(500))  # published, never committed
    report = fsck(repo)
    assert [(p.kind, p.blob) for p in report.problems] == [("orphan", orphan.hex())]
    size = repo.blobs.stored_size(orphan)
    freed = gc(repo)
    assert (freed.orphan_files_removed, freed.blobs_freed, freed.bytes_freed) == (1, 0, size)
    assert not repo.blobs.has(orphan)
    assert fsck(repo).clean


def test_orphan_file_removed_by_repair(repo: Repository) -> None:
    orphan = repo.blobs.put(os.urandom(500))
    assert not fsck(repo, repair=True).remaining
    assert not repo.blobs.has(orphan) and fsck(repo).clean


def test_two_roots_sharing_blobs(repo: Repository) -> None:
    shared, only_a, only_b = rand_chunks(20), rand_chunks(5), rand_chunks(7)
    root_a, _ = block_image(repo, "a", shared + only_a)
    block_image(repo, "b", only_b + shared)
    before = files_on_disk(repo)
    assert len(before) == 20 + 5 + 7 + 2

    delete_image(repo, "b")
    assert fsck(repo).clean  # refs-0 rows still hold their children: nothing is off
    report = gc(repo)
    assert report.blobs_freed == 7 + 1
    assert report.problems == []

    need = reachable(repo, root_a, BlobKind.MAP_ROOT)
    after = files_on_disk(repo)
    assert set(after) == {b.hex() for b in need}
    assert report.bytes_freed == sum(before.values()) - sum(after.values())
    assert sum(after.values()) == sum(repo.blobs.stored_size(b) for b in need)
    stored_rows = repo.conn.execute("SELECT sum(stored) FROM blobs").fetchone()[0]
    assert stored_rows == sum(after.values())
    assert fsck(repo).clean


def test_gc_cascades_root_pages_chunks(repo: Repository) -> None:
    chunks = rand_chunks(40, size=64)
    n = chunkmap.PAGE_ENTRIES * 2 + 10
    root, _ = block_image(repo, "disk", [chunks[i % 40] for i in range(n)])
    assert len(chunkmap.MapRoot.decode(repo.get(root)).ids) == 3
    delete_image(repo, "disk")
    report = gc(repo)
    assert report.blobs_freed == 1 + 3 + 40
    assert report.rounds == 3  # root, then its pages, then their chunks
    assert files_on_disk(repo) == {}
    assert blob_files.pack_files(repo.path) == set()  # plain gc drops packs wholly dead
    assert repo.conn.execute("SELECT count(*) FROM blobs").fetchone() == (0,)
    assert fsck(repo).clean


def gc_rounds_by_default(repo: Repository, chunks: Sequence[bytes]) -> int:
    block_image(repo, "again", chunks)
    delete_image(repo, "again")
    return gc(repo).rounds


def test_gc_in_small_rounds_frees_the_same_in_smaller_transactions(repo: Repository) -> None:
    """On a disk short of room (cli: casfs.store.reserve) gc keeps each transaction to
    SMALL_ROUND_CHILDREN decrements and SMALL_ROUND_ROWS rows: more of them, same result."""
    chunks = rand_chunks(1200, size=64)
    block_image(repo, "disk", chunks)
    delete_image(repo, "disk")
    report = gc(repo, small_rounds=True)
    assert report.blobs_freed == 1 + 2 + 1200
    # the root; its 2 pages (1024 and 176 decrements: one part, or two if the larger
    # comes first, parts being split between rows); then the 1200 chunks 250 at a time
    assert report.rounds in (1 + 1 + 5, 1 + 2 + 5)
    assert gc_rounds_by_default(repo, chunks) == 1 + 1 + 2  # (chunks 1000 at a time)
    assert repo.conn.execute("SELECT count(*) FROM blobs").fetchone() == (0,)
    assert fsck(repo).clean


def test_gc_frees_directory_trees(repo: Repository) -> None:
    dir_image(repo, "keep", {b"f": [b"shared-bytes"]})
    dir_image(repo, "drop", {b"f": [b"shared-bytes"], b"g": rand_chunks(2)})
    delete_image(repo, "drop")
    report = gc(repo)
    assert report.blobs_freed == 2 + 1 + 2  # two trees, a map, two chunks; "f" is shared
    (root,) = repo.conn.execute("SELECT root FROM images").fetchone()
    assert set(files_on_disk(repo)) == {b.hex() for b in reachable(repo, BlobId(root), BlobKind.TREE)}
    assert fsck(repo).clean


def test_gc_deletes_unreadable_garbage_and_fsck_recounts(repo: Repository) -> None:
    root, ids = block_image(repo, "disk", rand_chunks(4))
    delete_image(repo, "disk")
    flip_byte(repo, root)
    report = gc(repo)
    assert report.blobs_freed == 1
    assert len(report.problems) == 1 and root.hex() in report.problems[0]
    # Its chunks could not be decremented: leaked, not lost. fsck finds and fixes that.
    assert all(refs(repo, c) == 1 for c in ids)
    assert {p.kind for p in fsck(repo, repair=True).problems} == {"miscounted"}
    assert gc(repo).blobs_freed == 4
    assert files_on_disk(repo) == {} and fsck(repo).clean


def test_gc_refuses_while_a_batch_is_in_flight(repo: Repository) -> None:
    block_image(repo, "disk", rand_chunks(2))
    delete_image(repo, "disk")
    with repo.batch() as b:
        b.put(os.urandom(100))
        with pytest.raises(Busy):
            gc(repo, timeout=0.2)
        with pytest.raises(Busy):
            fsck(repo, timeout=0.2)
    report = gc(repo)
    assert report.blobs_freed == 3 and report.tmp_files_removed == 0
    assert fsck(repo).clean


def test_gc_sweeps_staging_of_dead_processes(repo: Repository) -> None:
    dead = blob_files.local_store(repo).tmp_dir / "999999999-deadbeef"
    dead.mkdir()
    (dead / ("ab" * 32)).write_bytes(b"half a blob")
    assert gc(repo).tmp_files_removed == 1
    assert not dead.exists()


def test_resurrected_garbage_is_counted_once(repo: Repository) -> None:
    chunks = rand_chunks(6)
    root, _ = block_image(repo, "disk", chunks)
    delete_image(repo, "disk")
    # Same content again before gc: the zero rows come back to life, children not recounted.
    root2, ids = block_image(repo, "disk", chunks)
    assert root2 == root and all(refs(repo, c) == 1 for c in ids)
    assert fsck(repo).clean
    assert gc(repo).blobs_freed == 0


# -- fsck options and concurrency ---------------------------------------------------


@pytest.mark.no_fsck("a corrupt blob that a sampled fsck must skip")
def test_sample_zero_walks_metadata_only(repo: Repository) -> None:
    _, ids = block_image(repo, "disk", rand_chunks(30))
    dir_image(repo, "tree", {b"big": rand_chunks(3)})
    flip_byte(repo, ids[7])
    report = fsck(repo, sample=0.0)
    assert report.blobs_checked == 2 + 2  # the two map roots and the two trees
    assert report.data_skipped == 33
    assert report.clean  # the flipped chunk was not read
    assert fsck(repo, sample=1.0).of_kind("corrupt")
    half = fsck(repo, sample=0.5)
    assert half.blobs_checked + half.data_skipped == report.rows
    with pytest.raises(ValueError):
        fsck(repo, sample=1.5)


def test_data_equal_to_a_map_root_is_not_confused_with_it(repo: Repository) -> None:
    # A disk chunk whose bytes happen to be a valid map root is stored as data. Metadata
    # ids are derived in another BLAKE3 mode, so a file that needs that very map gets a
    # blob (and a row holding its chunks) of its own: nothing goes uncounted.
    target = os.urandom(1000)
    as_map = chunkmap.MapRoot(0, CS, 2 * CS, [blob_id(target), ZERO_ID]).encode()
    block_image(repo, "disk", [as_map])
    dir_image(repo, "tree", {b"f": [target, bytes(1000)]})
    kind_of = "SELECT kind FROM blobs WHERE id = ?"
    assert repo.conn.execute(kind_of, (blob_id(as_map),)).fetchone()[0] == BlobKind.DATA
    assert repo.conn.execute(kind_of, (meta_id(as_map),)).fetchone()[0] == BlobKind.MAP_ROOT
    assert fsck(repo).clean


def test_concurrent_writers_do_not_cause_false_reports(repo: Repository) -> None:
    block_image(repo, "base", rand_chunks(20))
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        conn = catalog.connect(repo.catalog_path)
        try:
            i = 0
            while not stop.is_set():
                clone_image(conn, "base", f"clone{i}")
                if i % 2:
                    block_image(repo, f"new{i}", rand_chunks(3))
                i += 1
        except BaseException as e:
            errors.append(e)
        finally:
            conn.close()

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(5):
            report = fsck(repo)
            assert report.clean, report.problems
    finally:
        stop.set()
        t.join()
    assert not errors
    assert fsck(repo).clean


def test_gc_lets_writers_in_between_rounds(repo: Repository) -> None:
    chunks = rand_chunks(3000, size=64)
    block_image(repo, "old", chunks)
    delete_image(repo, "old")
    other = Repository.open(repo.path)  # another process's view: its own connection and lock fd
    stop = threading.Event()
    commits: list[float] = []
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            i = 0
            while not stop.is_set():
                # Re-puts garbage content too: a zero row that comes back to life mid-gc.
                block_image(other, f"new{i}", [chunks[i], os.urandom(64)])
                commits.append(time.monotonic())
                i += 1
                time.sleep(0.03)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=writer)
    start = time.monotonic()
    t.start()
    try:
        report = gc(repo, lock_slice=0.0)
        end = time.monotonic()
    finally:
        stop.set()
        t.join()
        other.close()
    assert not errors and report.problems == []
    assert report.rounds >= 5  # map root, pages, chunks in rounds of ROUND_ROWS
    assert any(start < c < end for c in commits), "no writer got in while gc ran"
    gc(repo)
    need: set[BlobId] = set()
    for (root,) in repo.conn.execute("SELECT root FROM images"):
        need |= reachable(repo, BlobId(root), BlobKind.MAP_ROOT)
    assert set(repo.blobs.list()) == need and len(need) == 3 * len(commits)
    assert fsck(repo).clean
