"""Read/write volumes through casfs.vfs.volume.open_volume, without a mount."""

from __future__ import annotations

import errno
import os
import random
import stat
import time
from pathlib import Path

import pytest

from casfs import images, volumes
from casfs.ids import InodeNo
from casfs.repo import Repository
from casfs.vfs.api import ROOT_INO, assemble
from casfs.vfs.rw.names import RENAME_EXCHANGE, RENAME_NOREPLACE
from casfs.vfs.rw.volume import now_ns
from casfs.vfs.volume import Volume, open_volume
from tests.helpers.volumes import names

CHUNK = 64 << 10


def read(v: Volume, ino: InodeNo, offset: int = 0, size: int | None = None) -> bytes:
    if size is None:
        size = v.getattr(ino).size - offset
    return assemble(v.read_plan(ino, offset, size), v.repo.get)


def blob_rows(repo: Repository) -> int:
    return int(repo.conn.execute("SELECT count(*) FROM blobs WHERE refs > 0").fetchone()[0])


def block_volume(repo: Repository, tmp_path: Path, size: int) -> tuple[Volume, bytearray]:
    data = bytearray(os.urandom(size // 2) + bytes(size - size // 2))
    src = tmp_path / "disk.img"
    src.write_bytes(data)
    images.import_image(repo, "disk", src)
    volumes.create_volume(repo, "vm", volumes.Source(image="disk"))
    return open_volume(repo, "vm"), data


def test_block_random_writes_match_a_reference(repo: Repository, tmp_path: Path) -> None:
    size = 40 * CHUNK + 512
    v, ref = block_volume(repo, tmp_path, size)
    rnd = random.Random(7)
    for i in range(300):
        off = rnd.randrange(size)
        n = rnd.choice([1, 512, 4096, CHUNK, 3 * CHUNK])
        payload = os.urandom(n) if i % 3 else bytes(n)
        written = v.write_sync(ROOT_INO, off, payload)
        ref[off : off + written] = payload[:written]
        if i % 50 == 0:
            v.flush_sync()
        if i % 120 == 0:
            v.snapshot_sync()
    assert read(v, ROOT_INO) == bytes(ref)
    assert v.getattr(ROOT_INO).size == size  # writes never resize a block volume
    with pytest.raises(OSError) as e:
        v.write_sync(ROOT_INO, size, b"x")
    assert e.value.errno == errno.ENOSPC
    with pytest.raises(OSError) as e:
        v.setattr(ROOT_INO, size=size * 2)
    assert e.value.errno == errno.EPERM
    snap = v.close()
    assert snap is not None
    row = repo.conn.execute("SELECT root FROM snapshots WHERE volume='vm' AND n=?", (snap,)).fetchone()
    snap_root = row[0]
    out = tmp_path / "out.img"
    from casfs.exporters import export_raw

    export_raw(repo.get, snap_root, out)
    assert out.read_bytes() == bytes(ref)
    # The image never changed: copy-on-write.
    images.export_image(repo, "disk", tmp_path / "disk-again.img")
    assert (tmp_path / "disk-again.img").read_bytes() == (tmp_path / "disk.img").read_bytes()


def test_zero_writes_free_chunks(repo: Repository, tmp_path: Path) -> None:
    size = 16 * CHUNK
    v, _ = block_volume(repo, tmp_path, size)
    before = blob_rows(repo)
    v.write_sync(ROOT_INO, 0, bytes(8 * CHUNK))  # the random half becomes zeros
    v.close()
    images_row = repo.conn.execute("SELECT root FROM images WHERE name='disk'").fetchone()[0]
    base = repo.conn.execute("SELECT base FROM volumes WHERE name='vm'").fetchone()[0]
    assert base != images_row
    # Only the volume's new map references nothing but holes: no new data blobs.
    assert blob_rows(repo) <= before + 2


def test_clones_diverge_independently(repo: Repository, tmp_path: Path) -> None:
    src = tmp_path / "tree"
    src.mkdir()
    (src / "f").write_bytes(b"original" * 1000)
    images.import_image(repo, "base", src)
    volumes.create_volume(repo, "a", volumes.Source(image="base"))
    volumes.create_volume(repo, "b", volumes.Source(image="base"))
    va, vb = open_volume(repo, "a"), open_volume(repo, "b")
    fa = va.lookup(ROOT_INO, b"f").ino
    fb = vb.lookup(ROOT_INO, b"f").ino
    va.write_sync(fa, 0, b"AAAA")
    vb.truncate_sync(fb, 3)
    assert read(va, fa, 0, 8) == b"AAAAinal"
    assert read(vb, fb) == b"ori"
    assert va.close() == 1 and vb.close() == 1
    fresh = open_volume(repo, "a")
    assert read(fresh, fresh.lookup(ROOT_INO, b"f").ino, 0, 8) == b"AAAAinal"
    volumes.create_volume(repo, "c", volumes.Source(image="base"))
    vc = open_volume(repo, "c")
    assert read(vc, vc.lookup(ROOT_INO, b"f").ino) == b"original" * 1000
    assert vc.close() is None  # unchanged: no snapshot


def test_posix_names_and_links(repo: Repository) -> None:
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = open_volume(repo, "v")
    with pytest.raises(OSError) as e:
        names(v).mknod(ROOT_INO, b"x" * 256, stat.S_IFREG | 0o644, 0, 0, 0)
    assert e.value.errno == errno.ENAMETOOLONG
    d = names(v).mkdir(ROOT_INO, b"d", 0o2775, 0, 50)  # setgid directory
    f = names(v).mknod(d.ino, b"f", stat.S_IFREG | 0o644, 0, 1000, 1000)
    sub = names(v).mkdir(d.ino, b"sub", 0o755, 1000, 1000)
    assert f.gid == 50 and sub.gid == 50 and sub.mode & stat.S_ISGID
    assert v.getattr(d.ino).nlink == 3
    names(v).link(f.ino, ROOT_INO, b"hard")
    assert v.getattr(f.ino).nlink == 2
    g = names(v).mknod(ROOT_INO, b"g", stat.S_IFREG | 0o644, 0, 0, 0)
    with pytest.raises(OSError) as e:
        names(v).rename(ROOT_INO, b"g", ROOT_INO, b"hard", RENAME_NOREPLACE)
    assert e.value.errno == errno.EEXIST
    names(v).rename(ROOT_INO, b"g", d.ino, b"f", RENAME_EXCHANGE)
    assert v.lookup(d.ino, b"f").ino == g.ino and v.lookup(ROOT_INO, b"g").ino == f.ino
    with pytest.raises(OSError) as e:
        names(v).rename(ROOT_INO, b"d", sub.ino, b"loop")
    assert e.value.errno == errno.EINVAL
    with pytest.raises(OSError) as e:
        names(v).rmdir(ROOT_INO, b"d")
    assert e.value.errno == errno.ENOTEMPTY
    # chown clears setuid
    v.setattr(f.ino, mode=0o4755)
    assert v.setattr(f.ino, uid=5).mode & stat.S_ISUID == 0
    v.close()


def test_unlinked_open_file_stays_usable(repo: Repository) -> None:
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = open_volume(repo, "v")
    f = names(v).mknod(ROOT_INO, b"tmp", stat.S_IFREG | 0o600, 0, 0, 0)
    v.write_sync(f.ino, 0, b"still here")
    v.flush_sync()
    names(v).unlink(ROOT_INO, b"tmp")
    v.write_sync(f.ino, 10, b"!")
    assert read(v, f.ino) == b"still here!"
    v.snapshot_sync()
    assert read(v, f.ino) == b"still here!"
    v.forget(f.ino)  # the last handle closed: now it dies
    v.flush_sync()
    assert repo.conn.execute("SELECT count(*) FROM overlay_inodes WHERE ino = ?", (f.ino,)).fetchone()[0] == 0
    v.close()


def test_crash_keeps_flushed_data_and_drops_the_rest(repo: Repository) -> None:
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = open_volume(repo, "v")
    f = names(v).mknod(ROOT_INO, b"f", stat.S_IFREG | 0o644, 0, 0, 0)
    v.write_sync(f.ino, 0, b"durable")
    v.flush_sync()
    v.write_sync(f.ino, 0, b"maybe!!")  # an overwrite in place: a crash keeps old or new
    v.write_sync(f.ino, 7, b" and longer")  # never flushed: the committed size hides it
    v.setattr(f.ino, mode=stat.S_IFREG | 0o600)
    g = names(v).mknod(ROOT_INO, b"g", stat.S_IFREG | 0o644, 0, 0, 0)
    v.write_sync(g.ino, 0, b"never flushed")
    again = open_volume(repo, "v")  # the daemon died; a new one opens the overlay
    found = again.lookup(ROOT_INO, b"f")
    assert read(again, found.ino) in (b"durable", b"maybe!!") and found.mode & 0o777 == 0o644
    with pytest.raises(OSError) as gone:
        again.lookup(ROOT_INO, b"g")
    assert gone.value.errno == errno.ENOENT
    assert volumes.create_snapshot(repo, "v") == 1  # at rest, the overlay is folded, not lost


def test_snapshot_cost_is_independent_of_volume_size(repo: Repository) -> None:
    volumes.create_volume(repo, "big", volumes.Source(blank_block=64 << 30))
    v = open_volume(repo, "big")
    v.write_sync(ROOT_INO, 10 << 30, b"x" * 4096)
    n = v.snapshot_sync()
    new = repo.conn.execute("SELECT count(*) FROM blobs").fetchone()[0]
    # one data chunk, one map page, one root (+ the blank map's root and its page-less start)
    assert n == 1 and new <= 4


def test_relatime_for_changed_inodes_only(repo: Repository, tmp_path: Path) -> None:
    src = tmp_path / "tree"
    src.mkdir()
    (src / "old").write_bytes(b"base")
    os.utime(src / "old", ns=(10**18, 10**18))  # atime == mtime: relatime would update it
    images.import_image(repo, "img", src)
    volumes.create_volume(repo, "v", volumes.Source(image="img"))
    v = open_volume(repo, "v")
    old = v.lookup(ROOT_INO, b"old")
    read(v, old.ino)
    v.accessed(old.ino)  # (the adapter's call, for a read through a reading handle)
    assert v.getattr(old.ino).atime_ns == 10**18  # a base inode is not copied up by a read
    new = names(v).mknod(ROOT_INO, b"new", stat.S_IFREG | 0o644, 0, 0, 0)
    v.write_sync(new.ino, 0, b"x")
    v.setattr(new.ino, atime_ns=1, mtime_ns=2)
    read(v, new.ino)
    assert v.getattr(new.ino).atime_ns == 1  # planning a read is no access (digest, read-ahead)
    # File times come from the kernel's coarse clock: until it ticks past the setattr's
    # ctime, a read's atime would equal that ctime, which relatime (as Linux's) updates.
    ctime = v.getattr(new.ino).ctime_ns
    while now_ns() <= ctime:
        time.sleep(0.001)
    v.accessed(new.ino)
    assert v.getattr(new.ino).atime_ns > 2  # atime <= mtime: moves on read
    t = v.getattr(new.ino).atime_ns
    v.accessed(new.ino)
    assert v.getattr(new.ino).atime_ns == t  # newer than mtime and ctime: stays


def test_a_truncate_folded_into_a_snapshot_stays_cut(repo: Repository) -> None:
    """Shrink, snapshot, grow: the grown part reads as zeros, not as the old bytes
    (the fold once kept the old content id of a cut file with no chunk changes)."""
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = open_volume(repo, "v")
    for size, cut in ((60_000, 0), (3 * CHUNK + 5, 2 * CHUNK)):
        st = names(v).mknod(ROOT_INO, f"f{size}".encode(), stat.S_IFREG | 0o644, 0, 0, 0)
        data = os.urandom(size)
        v.write_sync(st.ino, 0, data)
        v.snapshot_sync()
        v.truncate_sync(st.ino, cut)
        v.snapshot_sync()
        v.truncate_sync(st.ino, 4 * CHUNK)
        assert read(v, st.ino) == data[:cut] + bytes(4 * CHUNK - cut)


def test_a_hardlink_changed_under_one_name_is_folded_under_all(repo: Repository, tmp_path: Path) -> None:
    """A fold rewrites only materialized directories: every directory that holds a name
    of a changed hardlinked file must be one (found by ino in the base)."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "b" / "deep").mkdir(parents=True)
    (src / "a" / "f").write_bytes(b"old")
    os.link(src / "a" / "f", src / "b" / "deep" / "g")
    os.link(src / "a" / "f", src / "h")
    images.import_image(repo, "img", src)
    volumes.create_volume(repo, "v", volumes.Source(image="img"))
    v = open_volume(repo, "v")
    a = v.lookup(ROOT_INO, b"a")
    names(v).mknod(a.ino, b"first", stat.S_IFREG | 0o644, 0, 0, 0)  # copies a/f up, unchanged
    f = v.lookup(a.ino, b"f")
    v.write_sync(f.ino, 0, b"new!")
    names(v).unlink(ROOT_INO, b"h")
    v.close()
    v = open_volume(repo, "v")  # looked up from the other name first this time
    deep = v.lookup(v.lookup(ROOT_INO, b"b").ino, b"deep")
    g = v.lookup(deep.ino, b"g")
    assert read(v, g.ino) == b"new!" and g.nlink == 2
    f = v.lookup(v.lookup(ROOT_INO, b"a").ino, b"f")
    assert f.ino == g.ino and read(v, f.ino) == b"new!"


def test_a_file_moved_then_changed_after_a_fold_is_folded_where_it_is(repo: Repository) -> None:
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = open_volume(repo, "v")
    a = names(v).mkdir(ROOT_INO, b"a", 0o755, 0, 0)
    b = names(v).mkdir(ROOT_INO, b"b", 0o755, 0, 0)
    f = names(v).mknod(a.ino, b"f", stat.S_IFREG | 0o644, 0, 0, 0)
    v.snapshot_sync()
    names(v).rename(a.ino, b"f", b.ino, b"f")
    v.snapshot_sync()
    v.write_sync(f.ino, 70_000, b"!")  # (the node's parent still said `a`)
    v.close()
    v = open_volume(repo, "v")
    g = v.lookup(v.lookup(ROOT_INO, b"b").ino, b"f")
    assert g.size == 70_001 and read(v, g.ino) == bytes(70_000) + b"!"
