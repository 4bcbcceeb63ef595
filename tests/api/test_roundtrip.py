"""Import a directory or a tar, export it again, and check that nothing changed."""

from __future__ import annotations

import gzip
import io
import os
import stat
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from casfs.errors import Corruption
from casfs.exporters import export_dir, export_raw, export_tar
from casfs.ids import ChunkNo
from casfs.importers import Built
from casfs.importers.dirtree import import_dir
from casfs.importers.tarball import import_tar
from casfs.repo import Repository
from casfs.snapshots import chunkmap
from casfs.snapshots.tree import Tree
from casfs.store.ids import ZERO_ID, BlobId
from tests.helpers.blobs import blob_ids
from tests.helpers.trees import compare

pytestmark = pytest.mark.no_fsck(
    "content is imported through the importers alone: its roots are in no image row, "
    "so fsck finds every reference one too many"
)

CHUNK = 65536
MiB = 1 << 20
BIG_SIZE = 5 * MiB + 123
SPARSE_SIZE = 16 * MiB
# Far enough in the future that relatime never updates them: reading the tree (to
# import or compare it) must not change the atimes being compared.
FUTURE_ATIME = time.time_ns() + 86400 * 10**9


def make_tree(top: Path) -> None:
    """Every kind of entry and attribute an image must keep."""
    t = os.fsencode(top)
    os.mkdir(t)
    for d in (b"a", b"a/b", b"sticky", b"links", b"odd", b"emptydir"):
        os.mkdir(t + b"/" + d)
    write = {
        b"hello.txt": b"hello\n",
        b"empty": b"",
        b"setuid": b"#!/bin/sh\n",
        b"hl0": b"linked content\n" * 1000,
        b"a/b/deep.bin": os.urandom(200_000),
        b"ro": b"read only",
        b"none": b"mode 000",
        b"odd/new\nline": b"n",
        b"odd/\xff\xfe": b"not utf-8",
        b"odd/ with  spaces ": b"s",
        b"odd/" + b"x" * 255: b"long name",
    }
    for name, data in write.items():
        with open(t + b"/" + name, "wb") as f:
            f.write(data)
    with open(t + b"/big.bin", "wb") as f:  # > 1024 chunks of 4 KiB: a paged chunk map
        for i in range(BIG_SIZE // 65536 + 1):
            n = min(65536, BIG_SIZE - i * 65536)
            f.write(bytes(n) if i % 5 == 3 else os.urandom(n))
    with open(t + b"/sparse", "wb") as f:
        f.write(os.urandom(4096))
        f.seek(8 * MiB + 100)
        f.write(b"in the middle")
        f.truncate(SPARSE_SIZE)
    os.link(t + b"/hl0", t + b"/a/hl1")
    os.link(t + b"/hl0", t + b"/a/b/hl2")
    os.symlink(b"/etc/passwd", t + b"/links/abs")
    os.symlink(b"../hello.txt", t + b"/links/rel")
    os.symlink(b"does/not/exist", t + b"/links/dangling")
    os.link(t + b"/links/rel", t + b"/links/rel_hardlink", follow_symlinks=False)
    os.mkfifo(t + b"/fifo")
    os.mknod(t + b"/null", stat.S_IFCHR | 0o620, os.makedev(1, 3))
    os.mknod(t + b"/loop", stat.S_IFBLK | 0o660, os.makedev(7, 0))

    os.chown(t + b"/setuid", 1234, 5678)
    os.chown(t + b"/a", 1000, 1001)
    os.chown(t + b"/links/abs", 42, 43, follow_symlinks=False)
    os.chown(t + b"/null", 0, 5)
    modes = {b"setuid": 0o4755, b"a": 0o2775, b"sticky": 0o1777, b"ro": 0o400, b"none": 0o000, b"hl0": 0o640}
    for name, mode in modes.items():
        os.chmod(t + b"/" + name, mode)
    os.setxattr(t + b"/hello.txt", b"user.note", b"hi")
    os.setxattr(t + b"/hello.txt", b"user.bin", b"\x00\xff\x01")
    os.setxattr(t + b"/hello.txt", b"trusted.secret", b"t")
    os.setxattr(t + b"/a", b"user.dir", b"d")
    os.setxattr(t + b"/hl0", b"user.shared", b"by all links")
    for i, path in enumerate(sorted(_all_paths(t))):  # utime does not touch the parent: any order
        mtime = 1_600_000_000_123_456_789 + i * 1_000_001
        os.utime(path, ns=(FUTURE_ATIME + i, mtime), follow_symlinks=False)


def _all_paths(top: bytes) -> Iterator[bytes]:
    yield top
    for dirpath, dirnames, filenames in os.walk(top):
        for n in dirnames + filenames:
            yield os.path.join(dirpath, n)


def import_tree(repo: Repository, src: Path, chunk_size: int = CHUNK) -> Built:
    with repo.batch() as b:
        built = import_dir(b, src, chunk_size)
        b.commit({built.root: 1})
    return built


def import_tarball(repo: Repository, data: bytes, chunk_size: int = CHUNK) -> Built:
    with repo.batch() as b:
        built = import_tar(b, io.BytesIO(data), chunk_size, allow_devices=True)
        b.commit({built.root: 1})
    return built


def stored_blobs(repo: Repository) -> int:
    return len(blob_ids(repo.path))


def trees(repo: Repository, root: BlobId) -> Iterator[tuple[bytes, Tree]]:
    stack = [(b"", root)]
    while stack:
        path, tid = stack.pop()
        t = Tree.decode(repo.get(tid))
        yield path, t
        stack += [(path + b"/" + e.name, e.blob) for e in t.entries if e.is_dir]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    make_tree(tmp_path / "src")
    return tmp_path / "src"


# -- directories -------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [CHUNK, 4096])
def test_dir_round_trip_keeps_everything(
    repo: Repository, src: Path, tmp_path: Path, chunk_size: int
) -> None:
    built = import_tree(repo, src, chunk_size)
    out = tmp_path / "out"
    export_dir(repo.get, built.root, chunk_size, out)

    assert compare(src, out) == []
    sparse = (out / "sparse").stat()
    assert sparse.st_size == SPARSE_SIZE
    assert sparse.st_blocks * 512 <= 4 * max(chunk_size, 16384)  # two data chunks, not 16 MiB
    # Same tree in, same blobs out: re-importing the export gives the very same root.
    assert import_tree(repo, out, chunk_size).root == built.root


def test_dir_import_reports_sizes_inodes_and_hardlinks(repo: Repository, src: Path) -> None:
    built = import_tree(repo, src)
    regular = [p for p in _all_paths(os.fsencode(src)) if stat.S_ISREG(os.lstat(p).st_mode)]
    inodes = {os.lstat(p).st_ino: os.lstat(p).st_size for p in regular}
    assert built.size == sum(inodes.values())  # hardlinked content once

    root = Tree.decode(repo.get(built.root))
    assert root.attrs.ino == 1
    assert root.attrs.nlink == 2 + sum(e.is_dir for e in root.entries)
    entries = {path + b"/" + e.name: e for path, t in trees(repo, built.root) for e in t.entries}
    links = [entries[p] for p in (b"/hl0", b"/a/hl1", b"/a/b/hl2")]
    assert {e.attrs for e in links} == {links[0].attrs}  # same ino, nlink, xattrs, times
    assert {e.data for e in links} == {links[0].data}
    assert links[0].attrs.nlink == 3
    assert links[0].attrs.xattrs == ((b"user.shared", b"by all links"),)
    assert entries[b"/links/rel"].attrs.ino == entries[b"/links/rel_hardlink"].attrs.ino
    inos = {e.attrs.ino for e in entries.values()} | {1}
    assert len(inos) == len(entries) + 1 - 3  # three extra links share inodes
    assert built.next_ino == max(inos) + 1 == len(inos) + 1


def test_large_file_uses_a_paged_chunk_map(repo: Repository, src: Path) -> None:
    built = import_tree(repo, src, 4096)
    big = Tree.decode(repo.get(built.root)).find(b"big.bin")
    assert big is not None and big.attrs.size == BIG_SIZE
    assert chunkmap.MapRoot.decode(repo.get(big.blob)).depth == 1
    content = chunkmap.Content(repo.get, big.blob, BIG_SIZE, 4096)
    assert content.chunk(ChunkNo(3 * 16)) == ZERO_ID  # the zero stretches became holes


def test_importing_the_same_tree_twice_adds_no_blobs(repo: Repository, src: Path) -> None:
    first = import_tree(repo, src)
    count = stored_blobs(repo)
    assert count > 0
    assert import_tree(repo, src).root == first.root
    assert stored_blobs(repo) == count


def test_dir_import_reports_progress(repo: Repository, src: Path) -> None:
    seen: list[int] = []
    with repo.batch() as b:
        import_dir(b, src, CHUNK, progress=seen.append)
        b.abort()
    # every data chunk is read once; hole chunks of the sparse file are not read at all
    assert sum(seen) < BIG_SIZE + 200_000 + 2 * CHUNK + 100_000
    assert sum(seen) >= BIG_SIZE


def test_export_dir_refuses_a_non_empty_destination(repo: Repository, src: Path, tmp_path: Path) -> None:
    built = import_tree(repo, src)
    dest = tmp_path / "full"
    dest.mkdir()
    (dest / "x").write_text("x")
    with pytest.raises(Exception, match="not an empty directory"):
        export_dir(repo.get, built.root, CHUNK, dest)
    empty = tmp_path / "empty"
    empty.mkdir()
    export_dir(repo.get, built.root, CHUNK, empty)
    assert compare(src, empty) == []


# -- tar -----------------------------------------------------------------------------


def gnu_tar(src: Path, dest: Path) -> bytes:
    cmd = ["tar", "--xattrs", "--xattrs-include=*", "--format=posix", "-C", str(src), "-cf", str(dest), "."]
    subprocess.run(cmd, check=True)
    return dest.read_bytes()


def python_tar(src: Path) -> bytes:
    """tarfile's own recursive add, with the exact times and xattrs it leaves out."""

    def exact(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        path = os.path.join(os.fsencode(src), os.fsencode(ti.name))
        st = os.lstat(path)
        pax = {"mtime": _pax_time(st.st_mtime_ns), "atime": _pax_time(st.st_atime_ns)}
        for name in os.listxattr(path, follow_symlinks=False):
            value = os.getxattr(path, name, follow_symlinks=False)
            pax["SCHILY.xattr." + name] = value.decode("utf-8", "surrogateescape")
        ti.pax_headers = pax
        return ti

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, errors="surrogateescape") as tf:
        tf.add(src, arcname=".", filter=exact)
    return buf.getvalue()


def _pax_time(ns: int) -> str:
    return f"{ns // 10**9}.{ns % 10**9:09d}"


def test_gnu_tar_imports_as_the_same_image(repo: Repository, src: Path, tmp_path: Path) -> None:
    data = gnu_tar(src, tmp_path / "src.tar")
    from_dir = import_tree(repo, src)
    from_tar = import_tarball(repo, data)
    out = tmp_path / "out"
    export_dir(repo.get, from_tar.root, CHUNK, out)
    assert compare(src, out) == []
    assert from_tar == from_dir


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_compressed_tar_imports_as_the_same_image(
    repo: Repository, src: Path, tmp_path: Path, compress: str
) -> None:
    data = gnu_tar(src, tmp_path / "src.tar")
    if compress == "gzip":
        packed = gzip.compress(data)
    else:  # two frames: a stream may hold several
        c = zstandard.ZstdCompressor()
        packed = c.compress(data[: len(data) // 2]) + c.compress(data[len(data) // 2 :])
    seen: list[int] = []
    stream = io.BytesIO(packed + (b"\0" * 4096 if compress == "gzip" else b""))
    with repo.batch() as b:
        built = import_tar(b, stream, CHUNK, allow_devices=True, progress=seen.append)
        b.commit({built.root: 1})
    assert built == import_tree(repo, src)
    assert stream.read() == b""  # read to the very end, padding included
    assert sum(seen) == stream.tell()


def test_python_tarfile_tar_imports_as_the_same_image(repo: Repository, src: Path) -> None:
    os.unlink(src / "links/rel_hardlink")  # tarfile.add only spots hardlinks between regular files
    os.utime(src / "links", ns=(FUTURE_ATIME, 1_700_000_000_000_000_001))
    assert import_tarball(repo, python_tar(src)) == import_tree(repo, src)


def test_tar_export_round_trips(repo: Repository, src: Path, tmp_path: Path) -> None:
    built = import_tree(repo, src)
    exported = tmp_path / "export.tar"
    export_tar(repo.get, built.root, CHUNK, exported)
    again = import_tarball(repo, exported.read_bytes())
    assert again == built
    stream = io.BytesIO()
    export_tar(repo.get, built.root, CHUNK, stream)
    assert stream.getvalue() == exported.read_bytes()  # deterministic

    # GNU tar reads it back into the same tree.
    out = tmp_path / "gnu-extracted"
    out.mkdir()
    cmd = ["tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "-xpf", str(exported), "-C", str(out)]
    subprocess.run(cmd, check=True)
    # GNU tar sets atimes to the time of extraction; everything else must match
    assert compare(src, out, ignore={"atime"}) == []


@pytest.mark.parametrize("name", ["image.tar.gz", "image.tgz", "image.tar.zst"])
def test_tar_export_compresses_by_file_name(repo: Repository, src: Path, tmp_path: Path, name: str) -> None:
    built = import_tree(repo, src)
    dest = tmp_path / name
    export_tar(repo.get, built.root, CHUNK, dest)
    magic = b"\x28\xb5\x2f\xfd" if name.endswith(".zst") else b"\x1f\x8b"
    assert dest.read_bytes().startswith(magic)
    assert import_tarball(repo, dest.read_bytes()) == built


def test_tar_round_trip_with_a_small_chunk_size(repo: Repository, src: Path, tmp_path: Path) -> None:
    built = import_tree(repo, src, 4096)
    stream = io.BytesIO()
    export_tar(repo.get, built.root, 4096, stream)
    assert import_tarball(repo, stream.getvalue(), 4096) == built


def test_tar_trailing_bytes_are_drained(repo: Repository, src: Path, tmp_path: Path) -> None:
    data = gnu_tar(src, tmp_path / "src.tar") + b"trailing junk after the end-of-archive marker"
    stream = io.BytesIO(data)
    with repo.batch() as b:
        import_tar(b, stream, CHUNK, allow_devices=True)
    assert stream.tell() == len(data)


def test_tar_later_members_replace_earlier_ones(repo: Repository, tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        _add(tf, "./x/y/file", b"first")
        _add(tf, "x/y/file", b"second")
        _add(tf, "x/link", b"", tarfile.LNKTYPE, "x/y/file")
        d = tarfile.TarInfo("x")
        d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o700, 12345
        tf.addfile(d)
    built = import_tarball(repo, buf.getvalue())
    out = tmp_path / "out"
    export_dir(repo.get, built.root, CHUNK, out)
    assert (out / "x/y/file").read_bytes() == b"second"
    assert (out / "x/link").stat().st_ino == (out / "x/y/file").stat().st_ino
    x, y = (out / "x").stat(), (out / "x/y").stat()
    assert (stat.S_IMODE(x.st_mode), x.st_mtime_ns) == (0o700, 12345 * 10**9)
    # implied directories: 0755, root-owned, mtime 0
    assert (stat.S_IMODE(y.st_mode), y.st_uid, y.st_gid, y.st_mtime_ns) == (0o755, 0, 0, 0)


def _add(tf: tarfile.TarFile, name: str, data: bytes, kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
    ti = tarfile.TarInfo(name)
    ti.type, ti.size, ti.linkname = kind, len(data), link
    tf.addfile(ti, io.BytesIO(data) if data else None)


def test_a_short_chunk_fails_the_export_and_leaves_no_half_tar(
    repo: Repository, src: Path, tmp_path: Path
) -> None:
    built = import_tree(repo, src)
    hello = Tree.decode(repo.get(built.root)).find(b"hello.txt")
    assert hello is not None

    def short(bid: BlobId) -> bytes:  # a store that lost the end of one chunk
        data = repo.get(bid)
        return data[:-1] if bid == hello.blob else data

    dest = tmp_path / "out.tar"
    with pytest.raises(Corruption, match="holds 5 bytes where 6 are expected"):
        export_tar(short, built.root, CHUNK, dest)
    assert not dest.exists()
    with pytest.raises(Corruption):
        export_dir(short, built.root, CHUNK, tmp_path / "out")


# -- raw -----------------------------------------------------------------------------


def test_raw_export_is_sparse_and_identical(repo: Repository, tmp_path: Path) -> None:
    cs = 4096
    image = bytearray(3 * MiB + 5)
    image[:cs] = os.urandom(cs)
    image[2 * MiB : 2 * MiB + 10] = b"0123456789"
    image[-5:] = b"tail!"
    with repo.batch() as b:
        ids = [b.put(bytes(image[o : o + cs])) for o in range(0, len(image), cs)]
        root = chunkmap.build_map(b.put_kind, ids, len(image), cs)
        b.commit({root: 1})
    dest = tmp_path / "disk.img"
    dest.write_bytes(b"old contents that must go")
    export_raw(repo.get, root, dest)
    assert dest.read_bytes() == bytes(image)
    assert dest.stat().st_blocks * 512 <= 4 * 16384
