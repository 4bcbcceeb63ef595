"""Every FUSE handler of casfs.fuse.operations.Operations driven without a mount (as
S3QL's t3_fs_api drives its file system): a read/write directory volume behind the
adapter, each handler called as pyfuse3 would, its answer checked against the view.

Two things only the kernel has are stood in for: a setattr's SetattrFields (pyfuse3's
are read-only from Python) is a record with the same attributes, and readdir's reply
(pyfuse3.readdir_reply needs the kernel's request token) is collected in a list."""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyfuse3
import pytest
import trio

from casfs import volumes
from casfs.fuse.inodes import InodeTable
from casfs.fuse.operations import MountOptions, Operations
from casfs.ids import ROOT_INO, InodeNo
from casfs.repo import Repository
from casfs.vfs.chunks import ChunkCache
from casfs.vfs.rw.volume import RwVolume
from casfs.vfs.volume import open_volume

T = TypeVar("T")
CTX = pyfuse3.RequestContext()  # (uid 0, gid 0: root, as the daemon's tests run)


@dataclass
class Fields:
    """The SetattrFields a kernel's setattr carries (pyfuse3's cannot be set here)."""

    update_mode: bool = False
    update_uid: bool = False
    update_gid: bool = False
    update_size: bool = False
    update_atime: bool = False
    update_mtime: bool = False
    update_ctime: bool = False


@pytest.fixture
def mounted(store: Path, repo: Repository) -> Iterator[tuple[Operations, RwVolume]]:
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = open_volume(repo, "v")
    chunks = ChunkCache(repo.get)
    options = MountOptions("/nonexistent", str(store))
    no_control: Any = None  # (no control plane: these tests set no control xattr)
    ops = Operations(InodeTable(v), chunks, no_control, options, lambda _: None)
    try:
        yield ops, v
    finally:
        chunks.close()
        v.close()


def run(call: Callable[[], Awaitable[T]]) -> T:
    return trio.run(call)


def fails(call: Callable[[], Awaitable[Any]]) -> int:
    """The errno a handler answers with (only FUSEError leaves a handler)."""
    with pytest.raises(pyfuse3.FUSEError) as e:
        trio.run(call)
    return e.value.errno


def test_entries_are_made_looked_up_and_removed(mounted: tuple[Operations, RwVolume]) -> None:
    ops, v = mounted
    root = pyfuse3.ROOT_INODE

    async def make() -> dict[str, pyfuse3.EntryAttributes]:
        return {
            "dir": await ops.mkdir(root, b"d", 0o755, CTX),
            "node": await ops.mknod(root, b"n", stat.S_IFREG | 0o640, 0, CTX),
            "link": await ops.symlink(root, b"s", b"n", CTX),
        }

    made = run(make)
    assert stat.S_ISDIR(made["dir"].st_mode) and stat.S_ISREG(made["node"].st_mode)
    assert run(lambda: ops.readlink(made["link"].st_ino, CTX)) == b"n"
    looked = run(lambda: ops.lookup(root, b"n", CTX))
    assert looked.st_ino == made["node"].st_ino and looked.st_mode == made["node"].st_mode
    missing = run(lambda: ops.lookup(root, b"absent", CTX))
    assert missing.st_ino == 0 and missing.entry_timeout > 0  # (a negative entry the kernel keeps)
    hard = run(lambda: ops.link(made["node"].st_ino, made["dir"].st_ino, b"n2", CTX))
    assert hard.st_nlink == 2
    run(lambda: ops.rename(root, b"n", made["dir"].st_ino, b"n3", 0, CTX))
    assert run(lambda: ops.lookup(root, b"n", CTX)).st_ino == 0
    assert run(lambda: ops.lookup(made["dir"].st_ino, b"n3", CTX)).st_ino == made["node"].st_ino
    assert fails(lambda: ops.rmdir(root, b"d", CTX)) == errno.ENOTEMPTY
    run(lambda: ops.unlink(made["dir"].st_ino, b"n2", CTX))
    run(lambda: ops.unlink(made["dir"].st_ino, b"n3", CTX))
    run(lambda: ops.rmdir(root, b"d", CTX))
    assert run(lambda: ops.lookup(root, b"d", CTX)).st_ino == 0
    run(lambda: ops.forget([(made["node"].st_ino, 1), (looked.st_ino, 1)]))
    assert [e[0] for e in v.readdir(ROOT_INO, 0)] == [b"s"]


def test_a_file_is_created_written_read_synced_and_released(mounted: tuple[Operations, RwVolume]) -> None:
    ops, v = mounted
    data = os.urandom(200_000)

    async def cycle() -> bytes:
        fi, attrs = await ops.create(pyfuse3.ROOT_INODE, b"f", 0o644, os.O_RDWR, CTX)
        assert await ops.write(fi.fh, 0, data) == len(data)
        got = await ops.read(fi.fh, 0, len(data))
        with pytest.raises(pyfuse3.FUSEError) as e:  # (close makes nothing durable: ENOSYS)
            await ops.flush(fi.fh)
        assert e.value.errno == errno.ENOSYS
        await ops.fsync(fi.fh, False)
        assert v.unsaved() == []  # (the fsync flushed it)
        await ops.release(fi.fh)
        again = await ops.open(attrs.st_ino, os.O_RDONLY, CTX)
        tail = await ops.read(again.fh, len(data) - 10, 100)
        await ops.release(again.fh)
        assert tail == data[-10:]
        return bytes(got)

    assert run(cycle) == data
    assert v.getattr(v.lookup(ROOT_INO, b"f").ino).size == len(data)


def test_attributes_are_read_and_set(mounted: tuple[Operations, RwVolume]) -> None:
    ops, v = mounted
    node = run(lambda: ops.mknod(pyfuse3.ROOT_INODE, b"f", stat.S_IFREG | 0o600, 0, CTX))
    attr = pyfuse3.EntryAttributes()
    attr.st_mode, attr.st_size, attr.st_mtime_ns = 0o751, 12_345, 10**18
    fields = Fields(update_mode=True, update_size=True, update_mtime=True)
    changed = run(lambda: ops.setattr(node.st_ino, attr, fields, None, CTX))  # type: ignore[arg-type]
    assert stat.S_IMODE(changed.st_mode) == 0o751 and changed.st_size == 12_345
    got = run(lambda: ops.getattr(node.st_ino, CTX))
    assert (got.st_mode, got.st_size, got.st_mtime_ns) == (changed.st_mode, 12_345, 10**18)
    assert v.getattr(InodeNo(node.st_ino)).size == 12_345


def test_extended_attributes_are_set_listed_read_and_removed(mounted: tuple[Operations, RwVolume]) -> None:
    ops, _ = mounted
    node = run(lambda: ops.mknod(pyfuse3.ROOT_INODE, b"f", stat.S_IFREG | 0o600, 0, CTX))
    run(lambda: ops.setxattr(node.st_ino, b"user.k", b"value", CTX))
    assert run(lambda: ops.getxattr(node.st_ino, b"user.k", CTX)) == b"value"
    assert run(lambda: ops.listxattr(node.st_ino, CTX)) == [b"user.k"]
    run(lambda: ops.removexattr(node.st_ino, b"user.k", CTX))
    assert fails(lambda: ops.getxattr(node.st_ino, b"user.k", CTX)) == errno.ENODATA
    assert fails(lambda: ops.setxattr(node.st_ino, b"bogus.k", b"v", CTX)) == errno.EOPNOTSUPP


def test_a_directory_is_listed(mounted: tuple[Operations, RwVolume], monkeypatch: pytest.MonkeyPatch) -> None:
    ops, _ = mounted
    for name in (b"a", b"b", b"c"):
        run(
            functools.partial(
                ops.mknod, pyfuse3.ROOT_INODE, pyfuse3.FileNameT(name), stat.S_IFREG | 0o644, 0, CTX
            )
        )
    replies: list[tuple[bytes, int]] = []

    def reply(token: object, name: bytes, attrs: pyfuse3.EntryAttributes, nxt: int) -> bool:
        replies.append((name, nxt))
        return len(replies) != 2  # the kernel's buffer is full at the second: b not taken

    monkeypatch.setattr(pyfuse3, "readdir_reply", reply)

    async def listing() -> None:
        fh = await ops.opendir(pyfuse3.ROOT_INODE, CTX)
        no_token: Any = None
        await ops.readdir(fh, 0, no_token)
        await ops.readdir(fh, replies[0][1], no_token)  # (from where the kernel stopped)
        await ops.fsyncdir(fh, False)
        await ops.releasedir(fh)

    run(listing)
    assert [n for n, _ in replies] == [b"a", b"b", b"b", b"c"]  # (the second call resumes at b)


def test_statfs_answers_the_store_s_file_system(mounted: tuple[Operations, RwVolume], store: Path) -> None:
    ops, _ = mounted
    s = run(lambda: ops.statfs(CTX))
    assert s.f_namemax == 255 and s.f_bsize == os.statvfs(store).f_frsize and s.f_blocks > 0


def test_a_read_only_mount_refuses_changes(store: Path, repo: Repository) -> None:
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = open_volume(repo, "v")
    options = MountOptions("/nonexistent", str(store), read_only=True)
    no_control: Any = None
    ops = Operations(InodeTable(v), ChunkCache(repo.get), no_control, options, lambda _: None)
    assert fails(lambda: ops.mkdir(pyfuse3.ROOT_INODE, b"d", 0o755, CTX)) == errno.EROFS
    assert v.unsaved() == []
    v.close()


def test_an_unexpected_error_is_logged_without_the_data_written(
    mounted: tuple[Operations, RwVolume], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ops, v = mounted
    secret = b"do not log me " * 100

    def broken(*args: object, **kwargs: object) -> int:
        raise RuntimeError("a bug")

    async def write() -> None:
        fi, _ = await ops.create(pyfuse3.ROOT_INODE, b"f", 0o644, os.O_RDWR, CTX)
        monkeypatch.setattr(v, "write", broken)
        await ops.write(fi.fh, 0, secret)

    with caplog.at_level(logging.ERROR, logger="casfs.fuse.operations"):
        assert fails(write) == errno.EIO
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "unexpected error in write" in logged and f"<{len(secret)} bytes>" in logged
    assert "do not log me" not in logged
