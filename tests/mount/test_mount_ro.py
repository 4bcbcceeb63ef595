"""Read-only mounts for real: the whole store, images, snapshots, a block volume on a
file; the xattr control plane; corruption; and how mounts start and end."""

from __future__ import annotations

import errno
import mmap
import os
import signal
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import blake3
import pytest

from casfs import images, volumes
from casfs.ids import ChunkNo
from casfs.repo import Repository
from casfs.snapshots.chunkmap import Content
from casfs.snapshots.tree import Tree
from casfs.store.ids import ZERO_ID, BlobId
from tests.helpers import blobs as blob_files
from tests.helpers import trees
from tests.helpers.cli import casfs, run
from tests.helpers.mount import (
    as_nobody,
    casfs_mounts,
    cleanup,
    is_mounted,
    mounted,
    public_dir,
    start_daemon,
    unmount,
    wait_gone,
)

CHUNK = 64 << 10
DISK_SIZE = 3 * (1 << 20) + 1000


def make_tree(top: Path) -> None:
    (top / "sub" / "deeper").mkdir(parents=True)
    (top / "empty").mkdir()
    (top / "hello.txt").write_text("hello, world\n")
    (top / "empty.txt").write_bytes(b"")
    (top / "one_chunk.bin").write_bytes(os.urandom(CHUNK))
    (top / "sub" / "big.bin").write_bytes(os.urandom(5 * CHUNK + 123))
    (top / "sub" / "deeper" / "zeros_and_data").write_bytes(bytes(3 * CHUNK) + b"tail")
    with open(top / "sparse", "wb") as f:
        f.write(b"start")
        f.truncate(10 * CHUNK + 7)
    os.link(top / "hello.txt", top / "sub" / "hello_link")
    os.symlink("../hello.txt", top / "sub" / "rel_link")
    os.symlink("/nowhere/at/all", top / "dangling")
    os.mkfifo(top / "fifo")
    os.setxattr(top / "hello.txt", "user.note", b"a note")
    os.setxattr(top / "sub", "user.dir", b"d")
    os.chmod(top / "one_chunk.bin", 0o600)
    os.chown(top / "sub" / "big.bin", 1234, 5678)
    os.utime(top / "hello.txt", ns=(1_500_000_000_000_000_001, 1_600_000_000_123_456_789))


def disk_bytes() -> bytes:
    parts = []
    for i in range(DISK_SIZE // CHUNK + 1):
        parts.append(bytes(CHUNK) if i % 4 == 1 else os.urandom(CHUNK))
    return b"".join(parts)[:DISK_SIZE]


Populated = tuple[Repository, Path, bytes]


@pytest.fixture
def populated(repo: Repository, tmp_path: Path) -> Populated:
    """A store with a directory image `tree`, a block image `disk`, read-only volumes
    of each (`rov`, `blk`), a read/write one (`rwv`) and snapshot rov@1."""
    src = tmp_path / "src"
    src.mkdir()
    make_tree(src)
    raw = disk_bytes()
    (tmp_path / "disk.raw").write_bytes(raw)
    images.import_image(repo, "tree", src)
    images.import_image(repo, "disk", tmp_path / "disk.raw", chunk_size=CHUNK)  # (the geometry above)
    volumes.create_volume(repo, "rov", volumes.Source(image="tree"), read_only=True)
    volumes.create_volume(repo, "blk", volumes.Source(image="disk"), read_only=True)
    volumes.create_volume(repo, "rwv", volumes.Source(blank_dir=True))
    volumes.create_snapshot(repo, "rov", "first")
    return repo, src, raw


def touch_open(path: Path, mode: str) -> None:
    with open(path, mode):
        pass


def getfattr(path: Path, name: str) -> subprocess.CompletedProcess[str]:
    return run(["getfattr", "--only-values", "-n", name, path])


def xattr_value(path: Path, name: str) -> str:
    done = getfattr(path, name)
    assert done.returncode == 0, done.stderr
    return done.stdout


# -- the whole store -------------------------------------------------------------------


def test_whole_store_layout(populated: Populated, tmp_path: Path) -> None:
    repo, _, raw = populated
    with mounted(repo.path, tmp_path / "mnt") as m:
        assert sorted(os.listdir(m.path)) == ["images", "snapshots", "volumes"]
        assert sorted(os.listdir(m.path / "images")) == ["disk", "tree"]
        assert sorted(os.listdir(m.path / "volumes")) == ["blk", "rov", "rwv"]
        assert sorted(os.listdir(m.path / "snapshots")) == ["blk", "rov", "rwv"]
        assert os.listdir(m.path / "snapshots" / "rov") == ["1"]
        listing = run(["ls", "-l", m.path / "images", m.path / "volumes", m.path / "snapshots/rov"])
        assert listing.returncode == 0, listing.stderr
        assert "hello" not in listing.stdout
        st = os.stat(m.path / "images" / "disk")
        assert stat.S_ISREG(st.st_mode) and st.st_size == DISK_SIZE and stat.S_IMODE(st.st_mode) == 0o444
        assert stat.S_ISDIR(os.stat(m.path / "images" / "tree").st_mode)
        assert stat.S_IMODE(os.stat(m.path / "images").st_mode) == 0o555
        # nlink of a directory: 2 + its subdirectories (find relies on it)
        assert os.stat(m.path).st_nlink == 5
        assert os.stat(m.path / "images").st_nlink == 3
        assert (m.path / "snapshots/rov/1/hello.txt").read_text() == "hello, world\n"
        assert (m.path / "volumes/blk").read_bytes() == raw
        # inode numbers are unique across the views of one mount
        inos = {os.stat(m.path / p).st_ino for p in ("images/tree", "volumes/rov", "snapshots/rov/1", "")}
        assert len(inos) == 4
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
        assert [f"casfs:{repo.path}", str(m.path), "fuse.casfs"] in [x[:3] for x in mounts]


def test_the_store_view_follows_the_catalog(populated: Populated, tmp_path: Path) -> None:
    repo, src, _ = populated
    with mounted(repo.path, tmp_path / "mnt") as m:
        assert "again" not in os.listdir(m.path / "images")
        images.import_image(repo, "again", src)
        volumes.create_snapshot(repo, "rov")
        # listings are re-read at most once a second
        deadline = 50
        while "again" not in os.listdir(m.path / "images") and deadline:
            deadline -= 1
            subprocess.run(["sleep", "0.1"], timeout=5)
        assert "again" in os.listdir(m.path / "images")
        assert sorted(os.listdir(m.path / "snapshots/rov")) == ["1", "2"]
        assert (m.path / "images/again/hello.txt").read_text() == "hello, world\n"


def test_cp_a_out_of_a_directory_image(populated: Populated, tmp_path: Path) -> None:
    repo, src, _ = populated
    out = tmp_path / "out"
    with mounted(repo.path, tmp_path / "mnt") as m:
        image = m.path / "images" / "tree"
        assert trees.compare(src, image, ignore=("atime",)) == []
        run(["cp", "-a", image, out], check=True, timeout=120)
        assert (image / "sub" / "rel_link").read_text() == "hello, world\n"
        assert os.stat(image / "hello.txt").st_ino == os.stat(image / "sub" / "hello_link").st_ino
        assert os.stat(image / "hello.txt").st_nlink == 2
        assert trees.compare(image, out) == []  # atimes too: reading an image changes none
    # (the source's own atimes moved when it was imported and compared)
    assert trees.compare(src, out, ignore=("atime",)) == []


def test_find_and_du_over_an_image(populated: Populated, tmp_path: Path) -> None:
    repo, src, _ = populated
    with mounted(repo.path, tmp_path / "mnt") as m:
        image = m.path / "images" / "tree"

        def find(top: Path) -> list[str]:
            done = subprocess.run(
                ["find", ".", "-printf", "%y %n %s %p\n"],
                cwd=top,
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            return sorted(line for line in done.stdout.splitlines() if not line.startswith("d"))

        assert find(image) == find(src)
        du = run(["du", "-s", "--apparent-size", "-B1", image], check=True).stdout.split()[0]
        assert int(du) > 5 * CHUNK


def test_block_image_reads_like_the_source(populated: Populated, tmp_path: Path) -> None:
    repo, _, raw = populated
    out = tmp_path / "copy.raw"
    with mounted(repo.path, tmp_path / "mnt") as m:
        disk = m.path / "images" / "disk"
        run(["dd", f"if={disk}", f"of={out}", "bs=1M", "status=none"], check=True)
        assert out.read_bytes() == raw
        run(["dd", f"if={disk}", f"of={out}", "bs=4096", "iflag=direct", "status=none"], check=True)
        assert out.read_bytes() == raw
        cases = ((0, 1), (CHUNK - 10, 20), (DISK_SIZE - 5, 100), (DISK_SIZE + 10, 10), (12345, 3 * CHUNK))
        with open(disk, "rb", buffering=0) as f:
            for offset, size in cases:
                f.seek(offset)
                assert f.read(size) == raw[offset : offset + size]


def test_o_direct_reads(populated: Populated, tmp_path: Path) -> None:
    repo, _, raw = populated
    with mounted(repo.path, tmp_path / "mnt") as m:
        fd = os.open(m.path / "images" / "disk", os.O_RDONLY | os.O_DIRECT)
        try:
            buf = mmap.mmap(-1, 8192)  # page-aligned, as O_DIRECT wants
            for offset in (0, 4096 * 17, CHUNK - 4096, DISK_SIZE // 4096 * 4096 - 4096):
                n = os.preadv(fd, [buf], offset)
                assert n == min(8192, DISK_SIZE - offset) and buf[:n] == raw[offset : offset + n]
        finally:
            os.close(fd)


# -- xattrs ------------------------------------------------------------------------------


def test_digest_and_listing_hides_control_names(populated: Populated, tmp_path: Path) -> None:
    repo, src, raw = populated
    with mounted(repo.path, tmp_path / "mnt") as m:
        tree = m.path / "images" / "tree"
        for rel in ("hello.txt", "sub/big.bin", "sparse", "empty.txt"):
            want = "blake3:" + blake3.blake3((src / rel).read_bytes()).hexdigest()
            assert xattr_value(tree / rel, "user.casfs.digest") == want
        want = "blake3:" + blake3.blake3(raw).hexdigest()
        assert xattr_value(m.path / "images/disk", "user.casfs.digest") == want
        dump = run(["getfattr", "-d", "-m", "-", tree / "hello.txt"], check=True).stdout
        assert 'user.note="a note"' in dump and "casfs" not in dump
        for p in (m.path, m.path / "volumes/rov", m.path / "volumes/blk", tree / "sub"):
            assert "casfs" not in run(["getfattr", "-d", "-m", "-", p]).stdout
        assert getfattr(tree / "hello.txt", "user.casfs.nonsense").returncode == 1
        assert "No such attribute" in getfattr(tree / "hello.txt", "user.casfs.nonsense").stderr
        assert "No such attribute" in getfattr(tree / "hello.txt", "user.missing").stderr
        assert "No such attribute" in getfattr(tree / "hello.txt", "security.capability").stderr
        assert "No such attribute" in getfattr(tree / "sub", "user.casfs.digest").stderr


def test_volume_control_names(populated: Populated, tmp_path: Path) -> None:
    repo, _, _ = populated
    with mounted(repo.path, tmp_path / "mnt") as m:
        rov = m.path / "volumes" / "rov"
        assert xattr_value(rov, "user.casfs.phase") == "ready"
        assert xattr_value(rov, "user.casfs.origin") == "image:tree"
        assert xattr_value(rov, "user.casfs.snapshots") == "1"
        assert int(xattr_value(rov, "user.casfs.size")) == volumes.get_volume(repo, "rov").size
        assert int(xattr_value(rov, "user.casfs.unique")) == 0  # everything is shared with the image
        assert int(xattr_value(m.path / "images/disk", "user.casfs.unique")) == 0  # and blk shares it all
        assert xattr_value(m.path, "user.casfs.corrupt_reads") == "0"
        # take a snapshot of a volume at rest, with a label
        done = run(["setfattr", "-n", "user.casfs.snapshot", "-v", "by xattr", rov])
        assert done.returncode == 0, done.stderr
        assert xattr_value(rov, "user.casfs.snapshots") == "1 2"
        assert [s.label for s in volumes.list_snapshots(repo, "rov")] == ["first", "by xattr"]
        assert "Invalid argument" in run(["setfattr", "-n", "user.casfs.bogus", "-v", "1", rov]).stderr
        bad_label = run(["setfattr", "-n", "user.casfs.snapshot", "-v", "0x610a62", rov])  # "a\nb"
        assert "Invalid argument" in bad_label.stderr
        # snapshots are taken of volumes only
        not_a_volume = run(["setfattr", "-n", "user.casfs.snapshot", m.path / "images/tree"])
        assert "Invalid argument" in not_a_volume.stderr
        assert xattr_value(m.path / "snapshots/rov/2/hello.txt", "user.casfs.digest").startswith("blake3:")


def test_control_needs_root_or_the_owner(populated: Populated) -> None:
    repo, _, _ = populated
    with public_dir() as pub, mounted(repo.path, pub / "mnt", extra=["--allow-other"]) as m:
        rov = m.path / "volumes" / "rov"
        assert "Operation not permitted" in as_nobody("getfattr", "-n", "user.casfs.phase", rov).stderr
        # (the kernel itself refuses user.* xattrs on a directory the caller may not write)
        refused = as_nobody("setfattr", "-n", "user.casfs.snapshot", rov).stderr
        assert "Operation not permitted" in refused or "Permission denied" in refused
        # a file's digest is no secret from whoever may read the file
        digest = as_nobody("getfattr", "--only-values", "-n", "user.casfs.digest", rov / "hello.txt")
        assert digest.stdout.startswith("blake3:"), digest.stderr
        assert xattr_value(rov, "user.casfs.snapshots") == "1"


def test_trusted_xattrs_are_for_root_only(repo: Repository, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("x")
    os.setxattr(src / "f", "trusted.secret", b"t")
    os.setxattr(src / "f", "user.open", b"o")
    src.chmod(0o755)
    images.import_image(repo, "t", src)
    with public_dir() as pub, mounted(repo.path, pub / "mnt", extra=["--allow-other"]) as m:
        f = m.path / "images/t/f"
        assert "trusted.secret" in run(["getfattr", "-d", "-m", "-", f]).stdout
        seen = as_nobody("getfattr", "-d", "-m", "-", f)
        assert "user.open" in seen.stdout and "trusted" not in seen.stdout, seen.stderr
        assert "No such attribute" in as_nobody("getfattr", "-n", "trusted.secret", f).stderr


# -- read-only ------------------------------------------------------------------------------


def test_writes_are_refused_with_erofs(populated: Populated, tmp_path: Path) -> None:
    repo, _, _ = populated
    with mounted(repo.path, tmp_path / "mnt") as m:
        tree = m.path / "images" / "tree"
        attempts: list[Callable[[], object]] = [
            lambda: touch_open(tree / "new", "w"),
            lambda: touch_open(tree / "hello.txt", "a"),
            lambda: touch_open(tree / "hello.txt", "r+"),
            lambda: os.mkdir(tree / "d"),
            lambda: os.unlink(tree / "hello.txt"),
            lambda: os.rmdir(tree / "empty"),
            lambda: os.rename(tree / "hello.txt", tree / "moved"),
            lambda: os.chmod(tree / "hello.txt", 0o777),
            lambda: os.truncate(tree / "hello.txt", 0),
            lambda: os.setxattr(tree / "hello.txt", "user.x", b"1"),
            lambda: os.removexattr(tree / "hello.txt", "user.note"),
            lambda: os.symlink("x", tree / "s"),
            lambda: os.link(tree / "hello.txt", tree / "h2"),
            lambda: touch_open(m.path / "images/disk", "r+b"),
            lambda: touch_open(m.path / "volumes/blk", "r+b"),
            lambda: touch_open(m.path / "snapshots/rov/1/hello.txt", "w"),
            lambda: os.mkdir(m.path / "images" / "new"),
        ]
        for attempt in attempts:
            with pytest.raises(OSError) as e:
                attempt()
            assert e.value.errno == errno.EROFS, e.value
        assert (tree / "hello.txt").read_text() == "hello, world\n"


def test_ro_mount_option(populated: Populated, tmp_path: Path) -> None:
    repo, _, _ = populated
    with mounted(repo.path, tmp_path / "mnt", ro=True) as m:
        line = next(x for x in Path("/proc/mounts").read_text().splitlines() if f" {m.path} " in x)
        assert " ro," in line
        with pytest.raises(OSError) as e:
            os.mkdir(m.path / "volumes/rwv/d")
        assert e.value.errno == errno.EROFS
        assert os.listdir(m.path / "volumes/rwv") == []


# -- corruption -------------------------------------------------------------------------------


@pytest.mark.no_fsck("a blob is corrupted on purpose: fsck reports it, and cannot repair it")
def test_a_corrupt_blob_fails_that_read_only(populated: Populated, tmp_path: Path) -> None:
    repo, src, _ = populated
    root = BlobId(bytes.fromhex(images.get_image(repo, "tree").root or ""))
    sub = Tree.decode(repo.get(root)).find(b"sub")
    assert sub is not None
    big = Tree.decode(repo.get(sub.blob)).find(b"big.bin")
    assert big is not None
    victim = Content(repo.get, big.blob, big.attrs.size, CHUNK).chunk(ChunkNo(2))
    assert victim != ZERO_ID
    blob_files.corrupt(repo, victim)
    with mounted(repo.path, tmp_path / "mnt") as m:
        tree = m.path / "images" / "tree"
        with pytest.raises(OSError) as e:
            (tree / "sub" / "big.bin").read_bytes()
        assert e.value.errno == errno.EIO
        # the chunks before it still read, and every other file does
        with open(tree / "sub" / "big.bin", "rb") as f:
            assert f.read(2 * CHUNK) == (src / "sub" / "big.bin").read_bytes()[: 2 * CHUNK]
        assert (tree / "hello.txt").read_text() == "hello, world\n"
        assert trees.compare(src / "sub" / "deeper", tree / "sub" / "deeper", ignore=("atime",)) == []
        assert int(xattr_value(m.path, "user.casfs.corrupt_reads")) >= 1
        assert victim.hex() in xattr_value(m.path, "user.casfs.corrupt_ids")
        assert "Input/output error" in getfattr(tree / "sub/big.bin", "user.casfs.digest").stderr
        assert victim.hex() in m.log()  # logged with its id
    assert victim in repo.blobs.damaged()  # remembered: the next import of it heals it


@pytest.mark.no_fsck("a blob is corrupted on purpose: fsck reports it, and cannot repair it")
def test_a_corrupt_blob_found_by_read_ahead_fails_its_read(populated: Populated, tmp_path: Path) -> None:
    """A sequential reader has the chunks ahead of it loaded in the background (the
    daemon's read-ahead, in runs of chunks read together) and waits for them there: a
    corrupt one is still refused (EIO), counted and marked damaged, and the bytes before
    it and after it (its neighbours in the run) read right, chunk after chunk."""
    repo, _, raw = populated
    info = images.get_image(repo, "disk")
    n = 42  # (far enough for read-ahead to have started; every fourth chunk is a hole)
    victim = Content(repo.get, BlobId(bytes.fromhex(info.root or "")), DISK_SIZE, CHUNK).chunk(ChunkNo(n))
    assert victim != ZERO_ID
    blob_files.corrupt(repo, victim)
    with mounted(repo.path, tmp_path / "mnt") as m:
        fd = os.open(m.path / "images" / "disk", os.O_RDONLY | os.O_DIRECT)  # (one request a read)
        try:
            buf = mmap.mmap(-1, CHUNK)
            for i in range(n):
                assert os.preadv(fd, [buf], i * CHUNK) == CHUNK and buf[:] == raw[i * CHUNK : (i + 1) * CHUNK]
            with pytest.raises(OSError) as e:
                os.preadv(fd, [buf], n * CHUNK)
            assert e.value.errno == errno.EIO
            for i in range(n + 1, DISK_SIZE // CHUNK):
                assert os.preadv(fd, [buf], i * CHUNK) == CHUNK and buf[:] == raw[i * CHUNK : (i + 1) * CHUNK]
        finally:
            os.close(fd)
        assert int(xattr_value(m.path, "user.casfs.corrupt_reads")) >= 1
        assert victim.hex() in xattr_value(m.path, "user.casfs.corrupt_ids")
    assert victim in repo.blobs.damaged()


@pytest.mark.no_fsck("a tree blob is corrupted on purpose: fsck reports it, and cannot repair it")
def test_a_corrupt_tree_blob_is_counted_too(populated: Populated, tmp_path: Path) -> None:
    """Issue 7, defect 7: metadata (trees, maps) failing its check counts in
    user.casfs.corrupt_reads and corrupt_ids, as data chunks do."""
    repo, _, _ = populated
    root = BlobId(bytes.fromhex(images.get_image(repo, "tree").root or ""))
    sub = Tree.decode(repo.get(root)).find(b"sub")
    assert sub is not None
    blob_files.corrupt(repo, sub.blob)
    with mounted(repo.path, tmp_path / "mnt") as m:
        assert xattr_value(m.path, "user.casfs.corrupt_reads") == "0"
        with pytest.raises(OSError) as e:
            os.listdir(m.path / "images" / "tree" / "sub")
        assert e.value.errno == errno.EIO
        assert int(xattr_value(m.path, "user.casfs.corrupt_reads")) >= 1
        assert sub.blob.hex() in xattr_value(m.path, "user.casfs.corrupt_ids")
        assert (m.path / "images" / "tree" / "hello.txt").read_text() == "hello, world\n"


# -- single-volume mounts -------------------------------------------------------------------


def test_block_volume_on_a_regular_file(populated: Populated, tmp_path: Path) -> None:
    repo, _, raw = populated
    target = tmp_path / "blk.img"
    target.touch()
    with mounted(repo.path, target, volume="blk") as m:
        st = os.stat(target)
        assert stat.S_ISREG(st.st_mode) and st.st_size == DISK_SIZE
        assert target.read_bytes() == raw
        assert any(x.mountpoint == str(target) for x in casfs_mounts())
        with pytest.raises(OSError) as e:
            touch_open(target, "r+b")
        assert e.value.errno == errno.EROFS
        assert xattr_value(target, "user.casfs.origin") == "image:disk"
        assert xattr_value(target, "user.casfs.digest") == "blake3:" + blake3.blake3(raw).hexdigest()
        assert run(["qemu-img", "info", "-f", "raw", target], check=True).returncode == 0
        assert m.pid


def test_directory_volume_mount(populated: Populated, tmp_path: Path) -> None:
    repo, src, _ = populated
    with mounted(repo.path, tmp_path / "mnt", volume="rov") as m:
        assert trees.compare(src, m.path, ignore=("atime",)) == []
        # a single-volume mount shows the volume's own inode numbers
        tree = Tree.decode(repo.get(BlobId(bytes.fromhex(volumes.get_volume(repo, "rov").base))))
        hello = tree.find(b"hello.txt")
        assert hello is not None and os.stat(m.path / "hello.txt").st_ino == hello.attrs.ino
        assert os.stat(m.path).st_ino == 1
        assert xattr_value(m.path, "user.casfs.phase") == "ready"


def test_mountpoint_kind_must_match_the_volume(populated: Populated, tmp_path: Path) -> None:
    repo, _, _ = populated
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").touch()
    wrong = casfs(repo.path, "mount", tmp_path / "dir", "--volume", "blk")
    assert wrong.returncode == 2 and "regular file" in wrong.stderr
    wrong = casfs(repo.path, "mount", tmp_path / "file", "--volume", "rov")
    assert wrong.returncode == 2 and "directory" in wrong.stderr
    missing = casfs(repo.path, "mount", tmp_path / "dir", "--volume", "nope")
    assert missing.returncode == 3 and "nope" in missing.stderr


# -- starting and ending --------------------------------------------------------------------


def test_background_mount_and_umount(populated: Populated, tmp_path: Path) -> None:
    repo, _, _ = populated
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = casfs(repo.path, "mount", mnt)
    try:
        assert done.returncode == 0, done.stderr
        assert is_mounted(mnt)  # returned only once the mount answers
        assert (mnt / "images/tree/hello.txt").read_text() == "hello, world\n"
        again = casfs(repo.path, "mount", mnt)
        assert again.returncode == 4 and "already a casfs mount" in again.stderr
        assert (mnt / "images/tree/hello.txt").read_text() == "hello, world\n"
        bye = casfs(repo.path, "umount", mnt)
        assert bye.returncode == 0, bye.stderr
        assert not is_mounted(mnt)
    finally:
        cleanup(mnt, None)
    assert casfs(repo.path, "umount", mnt).returncode == 3


def test_mounting_twice_is_reported_not_stacked(populated: Populated, tmp_path: Path) -> None:
    repo, _, _ = populated
    with mounted(repo.path, tmp_path / "mnt") as m:
        second = casfs(repo.path, "mount", m.path, "--foreground")
        assert second.returncode == 4 and "already a casfs mount" in second.stderr
        assert len([x for x in casfs_mounts() if x.mountpoint == str(m.path)]) == 1


def test_sigterm_unmounts_cleanly(populated: Populated, tmp_path: Path) -> None:
    repo, _, _ = populated
    (tmp_path / "mnt").mkdir()
    m = start_daemon(repo.path, tmp_path / "mnt")
    try:
        assert (m.path / "images/tree/hello.txt").read_text() == "hello, world\n"
        os.kill(m.pid, signal.SIGTERM)
        assert wait_gone(m.pid, m.proc, 60)
        assert m.proc is not None and m.proc.returncode == 0, m.log()
        assert not is_mounted(m.path)
    finally:
        cleanup(m.path, m.pid, m.proc)


def test_a_failed_mount_says_why(tmp_path: Path) -> None:
    nowhere = casfs(tmp_path / "nostore", "mount", tmp_path)
    assert nowhere.returncode == 3 and "no casfs store" in nowhere.stderr


def test_clean_unmount_helper_reports_the_exit(populated: Populated, tmp_path: Path) -> None:
    repo, _, _ = populated
    (tmp_path / "mnt").mkdir()
    m = start_daemon(repo.path, tmp_path / "mnt")
    unmount(m)
    assert not is_mounted(m.path)
