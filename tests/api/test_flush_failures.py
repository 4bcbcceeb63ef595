"""A flush that fails loses nothing, without a mount (casfs.vfs.volume.open_volume).

The store is made to fail for real: `chattr +i STORE/tmp` refuses every new staging
directory, as a full or read-only disk would, until it is lifted. A "crash" is a new
view opened over the same catalog while the old one is dropped unflushed, which is what
a daemon killed with -9 leaves behind.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs import images, volumes
from casfs.ids import ChunkNo, InodeNo
from casfs.refcount.fsck import fsck
from casfs.repo import Repository
from casfs.snapshots.chunkmap import ChunkMap
from casfs.store.ids import BlobId
from casfs.vfs.api import ROOT_INO, assemble
from casfs.vfs.volume import Volume, open_volume
from tests.helpers import blobs as blob_files
from tests.helpers.volumes import names as ns

CHUNK = 64 << 10


@contextlib.contextmanager
def store_refuses_writes(repo: Repository) -> Iterator[None]:
    """The store's disk refuses new bytes: blob staging, and the upper files (new ones
    and writes into those there), as a full disk would; the catalog still commits."""
    (repo.path / "upper").mkdir(exist_ok=True)
    where = [str(repo.path / "tmp"), str(repo.path / "upper")]
    subprocess.run(["chattr", "-R", "+i", *where], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-R", "-i", *where], check=True)


def read(v: Volume, ino: InodeNo) -> bytes:
    return assemble(v.read_plan(ino, 0, v.getattr(ino).size), v.repo.get)


def names(v: Volume) -> dict[bytes, bytes]:
    return {name: read(v, st.ino) for name, st, _ in v.readdir(ROOT_INO, 0) if stat.S_ISREG(st.mode)}


def test_a_failed_flush_keeps_every_change_for_the_next_one(repo: Repository) -> None:
    """Issue 7, defect 1: the rename, the new file and the append survive a failed
    flush, are committed by the next one, and are there after a crash."""
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = open_volume(repo, "v")
    a = ns(v).mknod(ROOT_INO, b"a", stat.S_IFREG | 0o644, 0, 0, 0)
    v.write_sync(a.ino, 0, b"first")
    v.flush_sync()
    with store_refuses_writes(repo):
        ns(v).rename(ROOT_INO, b"a", ROOT_INO, b"b")
        ns(v).mknod(ROOT_INO, b"marker", stat.S_IFREG | 0o644, 0, 0, 0)
        v.write_sync(a.ino, 5, b" and more")
        with pytest.raises(OSError):
            v.flush_sync()
        with pytest.raises(OSError):
            v.flush_sync()  # still failing: still nothing lost
    v.flush_sync()
    again = open_volume(repo, "v")  # kill -9 of the daemon, then a new mount
    assert names(again) == {b"b": b"first and more", b"marker": b""}
    assert volumes.create_snapshot(repo, "v") == 1


def test_a_failed_flush_keeps_deletions_and_truncations(repo: Repository) -> None:
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = open_volume(repo, "v")
    keep = ns(v).mknod(ROOT_INO, b"keep", stat.S_IFREG | 0o644, 0, 0, 0)
    gone = ns(v).mknod(ROOT_INO, b"gone", stat.S_IFREG | 0o644, 0, 0, 0)
    data = os.urandom(3 * CHUNK)
    v.write_sync(keep.ino, 0, data)
    v.write_sync(gone.ino, 0, b"x" * 100)
    v.flush_sync()
    v.truncate_sync(keep.ino, CHUNK + 7)  # (a cut needs a new upper file: not while refused)
    with store_refuses_writes(repo):
        with pytest.raises(OSError):
            v.truncate_sync(keep.ino, CHUNK)  # refused in its own call, nothing changed
        v.write_sync(keep.ino, CHUNK + 7, b"!")  # kept in memory, for the next flush
        ns(v).unlink(ROOT_INO, b"gone")
        v.forget(gone.ino)
        with pytest.raises(OSError):
            v.flush_sync()
        assert names(v) == {b"keep": data[: CHUNK + 7] + b"!"}
    v.flush_sync()
    again = open_volume(repo, "v")
    assert names(again) == {b"keep": data[: CHUNK + 7] + b"!"}
    assert again.logical == CHUNK + 8
    rows = repo.conn.execute("SELECT count(*) FROM overlay_inodes WHERE ino = ?", (gone.ino,)).fetchone()
    assert rows[0] == 0


def test_a_failed_snapshot_changes_nothing(repo: Repository) -> None:
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = open_volume(repo, "v")
    f = ns(v).mknod(ROOT_INO, b"f", stat.S_IFREG | 0o644, 0, 0, 0)
    v.write_sync(f.ino, 0, b"data")
    v.flush_sync()
    with store_refuses_writes(repo), pytest.raises(OSError):
        v.snapshot_sync()
    v.write_sync(f.ino, 4, b"+more")  # the view is usable: not left frozen
    assert v.snapshot_sync() == 1
    assert names(open_volume(repo, "v")) == {b"f": b"data+more"}


def test_truncate_that_needs_a_chunk_counts_the_size_once(repo: Repository) -> None:
    """Issue 7, defect 5: write 4,608 bytes, flush, ftruncate(126): the size went
    negative because the retry after NeedChunks subtracted the shrink again."""
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = open_volume(repo, "v")
    f = ns(v).mknod(ROOT_INO, b"f", stat.S_IFREG | 0o644, 0, 0, 0)
    v.write_sync(f.ino, 0, b"y" * 4608)
    v.flush_sync()
    v.truncate_sync(f.ino, 126)
    assert v.logical == 126
    v.flush_sync()
    row = repo.conn.execute("SELECT size FROM volumes WHERE name = 'v'").fetchone()
    assert row[0] == 126
    v.snapshot_sync()
    assert repo.conn.execute("SELECT size FROM snapshots WHERE volume = 'v'").fetchone()[0] == 126


def test_a_read_during_a_fold_loses_no_later_write(repo: Repository, tmp_path: Path) -> None:
    """Issue 7, defect 9: a read (relatime) of an overlay file while a fold runs must
    not leave the file marked dirty past the fold, where the next flush would write a
    row for an inode whose directory is no longer copied up."""
    src = tmp_path / "tree"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_bytes(b"base")
    (src / "g").write_bytes(b"other")
    images.import_image(repo, "img", src)
    volumes.create_volume(repo, "v", volumes.Source(image="img"))
    v = open_volume(repo, "v")
    d = v.lookup(ROOT_INO, b"d")
    f = v.lookup(d.ino, b"f")
    v.write_sync(f.ino, 0, b"BASE")
    v.setattr(f.ino, atime_ns=1, mtime_ns=2)  # atime <= mtime: a read moves it
    v.flush_sync()
    job = v.prepare_snapshot(None)
    v.accessed(f.ino)  # the read arrives while the fold runs (the adapter takes no lock)
    job.run()
    job.apply()
    g = v.lookup(ROOT_INO, b"g")
    v.write_sync(g.ino, 0, b"OTHER")
    v.flush_sync()
    again = open_volume(repo, "v")  # remount; then a write to the file that was read
    f2 = again.lookup(again.lookup(ROOT_INO, b"d").ino, b"f")
    again.write_sync(f2.ino, 0, b"NEW!")
    again.snapshot_sync()
    final = open_volume(repo, "v")
    d3 = final.lookup(ROOT_INO, b"d")
    assert read(final, final.lookup(d3.ino, b"f").ino) == b"NEW!"
    assert read(final, final.lookup(ROOT_INO, b"g").ino) == b"OTHER"


def test_mutating_a_frozen_view_is_refused(repo: Repository) -> None:
    """The protocol is asserted: nothing changes the view between prepare and apply."""
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = open_volume(repo, "v")
    ns(v).mknod(ROOT_INO, b"f", stat.S_IFREG | 0o644, 0, 0, 0)
    job = v.prepare_flush()
    assert job is not None
    with pytest.raises(AssertionError):
        ns(v).mknod(ROOT_INO, b"g", stat.S_IFREG | 0o644, 0, 0, 0)
    job.abort()
    v.flush_sync()


def test_fsck_recomputes_logical_sizes(repo: Repository) -> None:
    """Counters are checked, not trusted: a volume or snapshot size that disagrees with
    its root is reported, and repaired."""
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = open_volume(repo, "v")
    for name, size in ((b"a", 4608), (b"b", 70_000)):
        f = ns(v).mknod(ROOT_INO, name, stat.S_IFREG | 0o644, 0, 0, 0)
        v.write_sync(f.ino, 0, os.urandom(size))
    ns(v).link(v.lookup(ROOT_INO, b"a").ino, ROOT_INO, b"a2")  # a hardlink counts once
    assert v.snapshot_sync() == 1
    assert fsck(repo).clean
    db = str(repo.catalog_path)
    subprocess.run(["sqlite3", db, "UPDATE volumes SET size = -4356 WHERE name = 'v'"], check=True)
    subprocess.run(["sqlite3", db, "UPDATE snapshots SET size = 1 WHERE volume = 'v'"], check=True)
    found = sorted(p.message for p in fsck(repo).problems)
    assert found == [
        "snapshot v@1: size 1 recorded, its root holds 74608 bytes",
        "volume v: size -4356 recorded, its root holds 74608 bytes",
    ]
    assert all(p.repaired for p in fsck(repo, repair=True).problems)
    assert repo.conn.execute("SELECT size FROM volumes WHERE name = 'v'").fetchone()[0] == 74608


def test_importing_the_same_content_again_heals_a_damaged_blob(repo: Repository, tmp_path: Path) -> None:
    """Issue 7, defect 6: dedup trusted the damaged file. A blob found damaged (by a
    read, or by fsck) is stored again by the next import of the same content."""
    src = tmp_path / "disk.raw"
    src.write_bytes(os.urandom(5 * CHUNK))
    images.import_image(repo, "one", src)
    victim = images.get_image(repo, "one")
    chunk = ChunkMap(repo.get_meta, BlobId(bytes.fromhex(victim.root or ""))).chunk(ChunkNo(2))
    blob_files.corrupt(repo, chunk)
    report = fsck(repo)
    [problem] = report.problems
    assert problem.kind == "corrupt" and "importing the same content again heals it" in problem.message
    images.import_image(repo, "two", src)  # the same bytes, under another name
    out = tmp_path / "out.raw"
    images.export_image(repo, "one", out)
    assert out.read_bytes() == src.read_bytes()
    assert repo.blobs.damaged() == set()


def test_a_failed_flush_of_a_big_directory_keeps_its_entry_changes(repo: Repository) -> None:
    """Entries are flushed by name (overlay_entries): creates, renames and unlinks in a
    big directory that a failed flush carried are written by the next one."""
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = open_volume(repo, "v")
    d = ns(v).mkdir(ROOT_INO, b"d", 0o755, 0, 0)
    for i in range(500):
        ns(v).mknod(d.ino, b"f%d" % i, stat.S_IFREG | 0o644, 0, 0, 0)
    v.flush_sync()
    with store_refuses_writes(repo):
        v.write_sync(v.lookup(d.ino, b"f1").ino, 0, b"x")  # (a chunk: the flush must stage a blob)
        ns(v).rename(d.ino, b"f0", d.ino, b"renamed")
        ns(v).unlink(d.ino, b"f2")
        ns(v).mknod(d.ino, b"new", stat.S_IFREG | 0o644, 0, 0, 0)
        ns(v).rename(d.ino, b"f3", ROOT_INO, b"moved-up")
        with pytest.raises(OSError):
            v.flush_sync()
    v.flush_sync()
    want = sorted({b"f%d" % i for i in range(4, 500)} | {b"f1", b"renamed", b"new"})
    cookies = {name: cookie for name, _, cookie in v.readdir(d.ino, 0)}
    again = open_volume(repo, "v")
    d2 = again.lookup(ROOT_INO, b"d").ino
    assert sorted(name for name, _, _ in again.readdir(d2, 0)) == want
    assert {name: cookie for name, _, cookie in again.readdir(d2, 0)} == cookies  # cookies kept
    assert sorted(name for name, _, _ in again.readdir(ROOT_INO, 0)) == [b"d", b"moved-up"]
    rows = repo.conn.execute("SELECT count(*) FROM overlay_entries WHERE dir = ?", (d.ino,)).fetchone()
    assert rows[0] == len(want)
