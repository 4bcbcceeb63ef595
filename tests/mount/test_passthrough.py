"""FUSE passthrough on read-only mounts: which mode the daemon is in, and what the kernel
reads when it is on (the whole-file cache of images and snapshots)."""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import pytest

from casfs import images
from casfs.ids import ChunkNo
from casfs.refcount.fsck import fsck
from casfs.repo import Repository
from casfs.snapshots.chunkmap import Content
from casfs.snapshots.tree import Tree
from casfs.store.filecache import MAX_FILE_BYTES
from casfs.store.ids import ZERO_ID, BlobId
from tests.helpers import blobs as blob_files
from tests.helpers.cli import needs_passthrough, run
from tests.helpers.filecache import wait_filled
from tests.helpers.mount import mounted
from tests.mount.test_metrics import free_port, scrape, value

pytestmark = needs_passthrough()

CHUNK = 64 << 10


def passthrough_mode(mnt: Path) -> str:
    return os.getxattr(mnt, "user.casfs.passthrough").decode()


def cached_files(store: Path) -> list[Path]:
    root = store / "cache" / "files"
    return sorted(root.iterdir()) if root.exists() else []


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3")


@pytest.fixture
def tree(repo: Repository, tmp_path: Path) -> dict[str, bytes]:
    """An image `tree` of a few files, and `copy`: another image holding `big.bin` too."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {
        "hello.txt": b"hello, world\n",
        "sub/big.bin": os.urandom(5 * CHUNK + 123),
        "holes": bytes(3 * CHUNK) + b"tail",
    }
    for name, data in files.items():
        (src / name).write_bytes(data)
    images.import_image(repo, "tree", src, chunk_size=CHUNK)
    other = tmp_path / "other"
    other.mkdir()
    (other / "same.bin").write_bytes(files["sub/big.bin"])
    images.import_image(repo, "copy", other, chunk_size=CHUNK)
    return files


def test_a_read_only_mount_reads_through_the_kernel(
    repo: Repository, tree: dict[str, bytes], tmp_path: Path
) -> None:
    with mounted(repo.path, tmp_path / "mnt", ro=True, passthrough=True) as m:
        assert passthrough_mode(m.path) == "on", m.log()
        for name, data in tree.items():
            assert (m.path / "images/tree" / name).read_bytes() == data
        # one verified copy per file, shared by both images holding big.bin
        assert (m.path / "images/copy/same.bin").read_bytes() == tree["sub/big.bin"]
        cached = cached_files(repo.path)
        assert sorted(p.stat().st_size for p in cached) == sorted(len(d) for d in tree.values())
        assert all(p.stat().st_mode & 0o777 == 0o400 for p in cached)
        # The kernel reads the cache file itself: what it holds is what a reader gets (so
        # only verified bytes enter it, and --no-passthrough keeps the re-hash per read).
        (big,) = (p for p in cached if p.stat().st_size == len(tree["sub/big.bin"]))
        with open(big, "r+b") as f:
            f.write(b"X")
        drop_caches()
        assert (m.path / "images/tree/sub/big.bin").read_bytes()[:1] == b"X"
        # fsck re-hashes the cache: the changed file goes, and the next open fills it again
        report = fsck(repo)
        assert [(p.kind, p.blob, p.repaired) for p in report.problems] == [("cache", big.name, True)]
        assert not big.exists()
        assert (m.path / "images/tree/sub/big.bin").read_bytes() == tree["sub/big.bin"]
        assert big.exists()


def test_the_metrics_count_passthrough_opens_and_the_cache(
    repo: Repository, tree: dict[str, bytes], tmp_path: Path
) -> None:
    port = free_port()
    extra = ["--metrics", f"127.0.0.1:{port}"]
    with mounted(repo.path, tmp_path / "mnt", ro=True, passthrough=True, extra=extra) as m:
        for name, data in tree.items():
            assert (m.path / "images/tree" / name).read_bytes() == data
        assert (m.path / "images/copy/same.bin").read_bytes() == tree["sub/big.bin"]  # (cached)
        got = scrape(port)
        assert value(got, "casfs_passthrough_opens_total", backing="cache") == 4
        assert value(got, "casfs_passthrough_opens_total", backing="upper") == 0
        assert value(got, "casfs_read_bytes_total") == 0  # (the kernel's reads, not the daemon's)
        sizes = sorted(len(d) for d in tree.values())
        assert value(got, "casfs_file_cache_files") == 3
        assert value(got, "casfs_file_cache_fills_total", when="open") == 3
        assert value(got, "casfs_file_cache_fill_bytes_total", when="open") == sum(sizes)
        assert value(got, "casfs_file_cache_fills_total", when="background") == 0
        disk = sum(p.stat().st_blocks * 512 for p in cached_files(repo.path))
        assert value(got, "casfs_file_cache_bytes") == disk
        assert value(got, "casfs_file_cache_limit_bytes") > disk


def test_two_readers_of_one_file_share_its_backing_file(
    repo: Repository, tree: dict[str, bytes], tmp_path: Path
) -> None:
    with mounted(repo.path, tmp_path / "mnt", ro=True, passthrough=True) as m:
        path = m.path / "images/tree/sub/big.bin"
        with open(path, "rb") as a, open(path, "rb") as b:
            assert a.read() == b.read() == tree["sub/big.bin"]
        with open(path, "rb") as c:  # after the last release, registered anew
            assert c.read(10) == tree["sub/big.bin"][:10]
        assert "passthrough:" not in m.log()  # no open fell back


def test_mmap_and_pread_of_a_passthrough_file(
    repo: Repository, tree: dict[str, bytes], tmp_path: Path
) -> None:
    with mounted(repo.path, tmp_path / "mnt", ro=True, passthrough=True) as m:
        data = tree["sub/big.bin"]
        fd = os.open(m.path / "images/tree/sub/big.bin", os.O_RDONLY)
        try:
            assert os.pread(fd, 100, 2 * CHUNK - 50) == data[2 * CHUNK - 50 : 2 * CHUNK + 50]
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mm:
                assert mm[CHUNK : CHUNK + 10] == data[CHUNK : CHUNK + 10]
        finally:
            os.close(fd)


def test_files_over_the_open_limit_are_filled_in_the_background(repo: Repository, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "large", "wb") as f:  # mostly a hole: cheap to import and to fill
        f.write(b"head")
        f.truncate(MAX_FILE_BYTES + CHUNK)
    images.import_image(repo, "large", src, chunk_size=CHUNK)
    port = free_port()
    extra = ["--metrics", f"127.0.0.1:{port}"]
    with mounted(repo.path, tmp_path / "mnt", ro=True, passthrough=True, extra=extra) as m:
        assert passthrough_mode(m.path) == "on"
        with open(m.path / "images/large/large", "rb") as f:  # served; its fill queued
            assert f.read(8) == b"head" + bytes(4)
        wait_filled(m, 1)
        got = scrape(port)
        assert value(got, "casfs_file_cache_fills_total", when="background") == 1
        assert value(got, "casfs_file_cache_fill_bytes_total", when="background") == MAX_FILE_BYTES + CHUNK
        assert value(got, "casfs_passthrough_opens_total") == 0  # (served by the daemon)
        (cached,) = cached_files(repo.path)
        assert cached.stat().st_size == MAX_FILE_BYTES + CHUNK
        assert cached.stat().st_blocks * 512 <= 2 * CHUNK  # the holes stay holes


def test_a_refused_mount_says_why_passthrough_is_off_and_a_writable_one_has_it(
    repo: Repository, tree: dict[str, bytes], tmp_path: Path
) -> None:
    with mounted(repo.path, tmp_path / "a", ro=True, extra=["--no-passthrough"]) as m:
        assert passthrough_mode(m.path) == "off: turned off (--no-passthrough)"
        assert (m.path / "images/tree/hello.txt").read_bytes() == tree["hello.txt"]
        assert "passthrough off: turned off (--no-passthrough)" in m.log()
    assert cached_files(repo.path) == []
    with mounted(repo.path, tmp_path / "b", passthrough=True) as m:  # writable: without the writeback cache
        assert passthrough_mode(m.path) == "on"
        assert (m.path / "images/tree/hello.txt").read_bytes() == tree["hello.txt"]
    assert len(cached_files(repo.path)) == 1  # (an image's file, in a writable mount too)
    done = run(["getfattr", "-n", "user.casfs.passthrough", tmp_path])  # not a casfs mount
    assert done.returncode != 0


def _first_data_chunk(repo: Repository, image: str, name: str) -> BlobId:
    root = BlobId(bytes.fromhex(images.get_image(repo, image).root or ""))
    entry = Tree.decode(repo.get(root)).find(name.encode())
    assert entry is not None
    victim = Content(repo.get, entry.blob, entry.attrs.size, CHUNK).chunk(ChunkNo(0))
    assert victim != ZERO_ID
    return victim


@pytest.mark.no_fsck("a data blob is corrupted on purpose")
def test_a_damaged_chunk_is_an_eio_read_not_wrong_bytes(
    repo: Repository, tree: dict[str, bytes], tmp_path: Path
) -> None:
    blob_files.corrupt(repo, _first_data_chunk(repo, "copy", "same.bin"))
    with mounted(repo.path, tmp_path / "mnt", ro=True, passthrough=True) as m:
        with pytest.raises(OSError) as err:
            (m.path / "images/copy/same.bin").read_bytes()
        assert err.value.errno == errno.EIO
        assert cached_files(repo.path) == []  # nothing unverified entered the cache
        assert "served by the daemon" in m.log()
        assert (m.path / "images/tree/hello.txt").read_bytes() == tree["hello.txt"]
