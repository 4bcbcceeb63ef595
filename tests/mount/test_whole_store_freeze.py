"""Snapshots of a block volume written in a whole-store mount (volumes/NAME, under the
kernel's writeback cache) are freezes too, whatever the kernel does with the file's
times: it owns them there, never moves them for direct writes, and sends them back in a
SETATTR whenever the inode is dirtied (a snapshot's setxattr does). Explicit attributes
of the disk file outlive snapshots and remounts; its mtime follows the writes.

Folds are held with the store's job slots (tests/mount/test_frozen_snapshots.py): a
snapshot listed `folded: false` right after it was taken was a freeze."""

from __future__ import annotations

import contextlib
import mmap
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from casfs.repo import Repository
from tests.helpers.cli import must, ok
from tests.helpers.disks import write_spots
from tests.helpers.mount import mounted, running, wait_gone
from tests.helpers.snapshots import folds_held, snapshots, wait_until

MIB = 1 << 20
SIZE = 16 * MIB


def write_direct(path: Path, ref: bytearray, seed: int) -> None:
    """Aligned O_DIRECT writes (a hypervisor's), then fdatasync; `ref` follows them."""
    rnd = random.Random(seed)
    buf = mmap.mmap(-1, 256 << 10)
    fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    try:
        for _ in range(10):
            length = rnd.choice([4096, 65536, 256 << 10])
            offset = rnd.randrange(0, (SIZE - length) // 4096) * 4096
            data = rnd.randbytes(length)
            buf[:length] = data
            assert os.pwritev(fd, [memoryview(buf)[:length]], offset) == length
            ref[offset : offset + length] = data
        os.fdatasync(fd)
    finally:
        os.close(fd)
        buf.close()


def snapshot(disk: Path) -> None:
    must("setfattr", "-n", "user.casfs.snapshot", "-v", "", disk)


def root_row(store: Path, volume: str) -> tuple[int, int] | None:
    """(mode, mtime_ns) of the disk file's catalog row, if any."""
    with contextlib.closing(Repository.open(store)) as repo:
        query = "SELECT mode, mtime_ns FROM overlay_inodes WHERE volume = ? AND ino = 1"
        row = repo.conn.execute(query, (volume,)).fetchone()
    return None if row is None else (row[0], row[1])


@pytest.mark.parametrize("write", [write_spots, write_direct], ids=["buffered", "o_direct"])
def test_snapshots_in_a_whole_store_mount_are_freezes(
    store: Path, tmp_path: Path, write: Callable[[Path, bytearray, int], None]
) -> None:
    """Several snapshots in a row, writes between them: each frozen at once (no slot
    needed), each reading what it froze; the kernel's time write-backs leave no row;
    after a remount the file's mtime is not older than the last write."""
    ok(store, "volume", "create", "b", "--blank-block", "16M")
    ref = bytearray(SIZE)
    expected = {}
    with mounted(store, tmp_path / "whole") as whole:
        disk = whole.path / "volumes" / "b"
        with folds_held(store):
            for n in (1, 2, 3):
                before = time.time_ns()
                write(disk, ref, n)
                snapshot(disk)
                assert snapshots(store, "b") == dict.fromkeys(range(1, n + 1), False)
                expected[n] = tmp_path / f"at-{n}.raw"
                expected[n].write_bytes(ref)
            for n, path in expected.items():
                must("cmp", whole.path / "snapshots" / "b" / str(n), path)
            assert root_row(store, "b") is None  # the kernel's times were not taken as a change
        wait_until("the folds", lambda: snapshots(store, "b") == {1: True, 2: True, 3: True})
        for n, path in expected.items():
            must("cmp", whole.path / "snapshots" / "b" / str(n), path)
    with mounted(store, tmp_path / "whole") as whole:
        disk = whole.path / "volumes" / "b"
        assert os.stat(disk).st_mtime_ns >= before  # (the last snapshot's time: after the writes)
        must("cmp", disk, expected[3])


def test_explicit_attributes_outlive_freezes_and_remounts(store: Path, tmp_path: Path) -> None:
    """chmod, chown and touch -m -d of the disk file: the next snapshot is still a freeze,
    the file keeps them through it, its fold and remounts; writes after them move the
    mtime on (and keep it on across a remount), the mode and owner stay."""
    ok(store, "volume", "create", "b", "--blank-block", "16M")
    ref = bytearray(SIZE)
    old = 1577934245 * 10**9
    with mounted(store, tmp_path / "whole") as whole:
        disk = whole.path / "volumes" / "b"
        write_spots(disk, ref, 1)
        os.chmod(disk, 0o600)
        os.chown(disk, 65534, 65534)
        os.utime(disk, ns=(old, old))
        with folds_held(store):
            snapshot(disk)
            assert snapshots(store, "b") == {1: False}
            write_spots(disk, ref, 2)  # after the snapshot, not in it
            (tmp_path / "now.raw").write_bytes(ref)
        wait_until("the fold", lambda: snapshots(store, "b") == {1: True})
        st = os.stat(disk)
        assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o600, 65534, 65534)
    for _ in range(2):  # (the second: a mount that changed nothing takes no snapshot)
        with mounted(store, tmp_path / "whole") as whole:
            st = os.stat(whole.path / "volumes" / "b")
            assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o600, 65534, 65534)
            assert st.st_mtime_ns > old  # the writes after the explicit time
            must("cmp", whole.path / "volumes" / "b", tmp_path / "now.raw")
        assert sorted(snapshots(store, "b")) == [1, 2]  # 2: the first unmount's
    with mounted(store, tmp_path / "whole") as whole:
        disk = whole.path / "volumes" / "b"
        os.utime(disk, ns=(old, old))
        snapshot(disk)
    with mounted(store, tmp_path / "whole") as whole:
        st = os.stat(whole.path / "volumes" / "b")
        assert (st.st_mode & 0o7777, st.st_mtime_ns) == (0o600, old)
    assert sorted(snapshots(store, "b")) == [1, 2, 3]
    ok(store, "volume", "resize", "b", "32M")  # (at rest: the row's size is not the disk's)
    assert sorted(snapshots(store, "b")) == [1, 2, 3]  # the row alone is nothing to settle
    with mounted(store, tmp_path / "whole") as whole:
        st = os.stat(whole.path / "volumes" / "b")
        assert (st.st_mode & 0o7777, st.st_size) == (0o600, 32 * MIB)


def test_a_kill_after_frozen_snapshots_loses_none(store: Path, tmp_path: Path) -> None:
    """kill -9 of the whole-store daemon with two snapshots frozen (folds held): the next
    mount lists and reads both, and the volume reads what was written after them."""
    ok(store, "volume", "create", "b", "--blank-block", "16M")
    ref = bytearray(SIZE)
    mnt = tmp_path / "whole"
    with running(store, mnt) as m, folds_held(store):
        disk = mnt / "volumes" / "b"
        for n in (1, 2):
            write_direct(disk, ref, n)
            os.chmod(disk, 0o640 - 0o40 * (n - 1))
            snapshot(disk)
            (tmp_path / f"at-{n}.raw").write_bytes(ref)
        assert snapshots(store, "b") == {1: False, 2: False}
        write_spots(disk, ref, 3)  # fdatasync'd: acknowledged
        os.kill(m.pid, signal.SIGKILL)
        assert wait_gone(m.pid, m.proc, 30)
    with mounted(store, mnt):
        for n in (1, 2):
            must("cmp", mnt / "snapshots" / "b" / str(n), tmp_path / f"at-{n}.raw")
        assert os.stat(mnt / "volumes" / "b").st_mode & 0o7777 == 0o600
        assert (mnt / "volumes" / "b").read_bytes() == bytes(ref)
    wait_until("the folds", lambda: all(snapshots(store, "b").values()))
