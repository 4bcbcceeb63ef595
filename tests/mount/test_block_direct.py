"""A block volume mounted on its file, opened with O_DIRECT (as a hypervisor opens its
disk) and without, at once and in turn: an O_DIRECT opener gets direct I/O (one FUSE
request per write, no security.capability lookup before it), and the kernel's page cache
of the file never shows a reader bytes older than the last write."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from casfs.repo import Repository
from tests.helpers.cli import ok
from tests.helpers.mount import mounted

MIB = 1 << 20
PAGE = 4096


def direct_write(fd: int, data: bytes, offset: int) -> None:
    buf = mmap.mmap(-1, len(data))  # page-aligned, as O_DIRECT wants
    buf[:] = data
    assert os.pwritev(fd, [buf], offset) == len(data)


def direct_read(fd: int, size: int, offset: int) -> bytes:
    buf = mmap.mmap(-1, size)
    assert os.preadv(fd, [buf], offset) == size
    return bytes(buf)


def test_direct_and_cached_openers_see_each_others_writes(repo: Repository, tmp_path: Path) -> None:
    ok(repo.path, "volume", "create", "d", "--blank-block", "4M")
    disk = tmp_path / "d.raw"
    disk.touch()
    with mounted(repo.path, disk, volume="d"):
        # A cached reader first: its pages of the file are in the kernel's cache.
        cached = os.open(disk, os.O_RDWR)
        try:
            assert os.pread(cached, PAGE, 0) == bytes(PAGE)
            # An O_DIRECT opener among cached ones: its writes drop the pages they cover.
            direct = os.open(disk, os.O_RDWR | os.O_DIRECT)
            try:
                direct_write(direct, b"a" * PAGE, 0)
                assert os.pread(cached, PAGE, 0) == b"a" * PAGE
                os.pwrite(cached, b"b" * PAGE, PAGE)
                os.fsync(cached)
                assert direct_read(direct, PAGE, PAGE) == b"b" * PAGE
            finally:
                os.close(direct)
        finally:
            os.close(cached)

        # A direct opener alone, then a cached one beside it: both see every write.
        direct = os.open(disk, os.O_RDWR | os.O_DIRECT)
        try:
            direct_write(direct, b"c" * PAGE, 0)
            cached = os.open(disk, os.O_RDWR)
            try:
                assert os.pread(cached, PAGE, 0) == b"c" * PAGE
                direct_write(direct, b"d" * PAGE, 0)
                assert os.pread(cached, PAGE, 0) == b"d" * PAGE
                os.pwrite(cached, b"e" * 100, 2 * PAGE + 5)  # not aligned: direct I/O takes it too
                assert direct_read(direct, PAGE, 2 * PAGE)[5:105] == b"e" * 100
            finally:
                os.close(cached)
            direct_write(direct, b"f" * PAGE, PAGE)
        finally:
            os.close(direct)

        # The first cached opener after direct writes reads them, not older cached pages.
        assert disk.read_bytes()[: 2 * PAGE] == b"d" * PAGE + b"f" * PAGE
        fd = os.open(disk, os.O_RDWR | os.O_DIRECT)
        try:
            direct_write(fd, b"g" * PAGE, 0)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        assert disk.read_bytes()[:PAGE] == b"g" * PAGE
    with mounted(repo.path, disk, volume="d"):
        data = disk.read_bytes()
    assert data[: 2 * PAGE] == b"g" * PAGE + b"f" * PAGE
    assert data[2 * PAGE + 5 : 2 * PAGE + 105] == b"e" * 100
    assert data[3 * PAGE :] == bytes(4 * MIB - 3 * PAGE)
