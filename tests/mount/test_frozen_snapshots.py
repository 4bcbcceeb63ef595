"""A snapshot of a block volume taken while mounted is frozen at once and folded into
blobs later (issue 8, design point 2). Until its fold commits it is listed and read in
a whole-store mount from its frozen epoch over its base, and a reader holding it open
sees the same bytes across the commit and the deletion of the epoch's files.

The fold is held with the store's own job queue: the test takes every slot, as other
processes' imports would, so the fold waits for one (casfs.lifecycle.queue)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from casfs.catalog import overlay
from casfs.repo import Repository
from casfs.store.uppers import upper_dir
from tests.helpers.cli import must, ok
from tests.helpers.disks import write_spots
from tests.helpers.mount import mounted
from tests.helpers.snapshots import folds_held, snapshots, wait_until

MIB = 1 << 20
SIZE = 16 * MIB


def frozen_epoch(store: Path, volume: str, n: int) -> int:
    with contextlib.closing(Repository.open(store)) as repo:
        (epoch,) = [u.epoch for u in overlay.uppers(repo.conn, volume) if u.snapshot == n]
    return epoch


def open_files(pid: int) -> set[str]:
    """What a process's descriptors name ("... (deleted)" once unlinked: the prefix stays)."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}").removesuffix(" (deleted)"))
    return found


def read_uncached(fd: int) -> bytes:
    """The whole file from the daemon, not from the page cache the last read filled."""
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return os.pread(fd, SIZE + 1, 0)


def check_frozen_then_folded(
    store: Path, volume: str, whole: Path, daemon: int, write: Path, tmp_path: Path, n: int
) -> None:
    """Snapshot n taken with its fold held (the ones before it folded): listed and read
    at once, and still read the same, through an open descriptor and by a new open,
    after its fold committed and its files went. `write` is the volume's disk in some
    mount; `daemon` the whole-store mount's pid."""
    ref = bytearray(SIZE)
    if n > 1:
        for seed in range(1, n):
            write_spots(write, ref, seed)
            must("setfattr", "-n", "user.casfs.snapshot", "-v", f"s{seed}", write)
        wait_until("the first folds", lambda: snapshots(store, volume) == dict.fromkeys(range(1, n), True))
    with folds_held(store):
        write_spots(write, ref, n)
        expected = tmp_path / f"at-{n}.raw"
        expected.write_bytes(ref)
        must("setfattr", "-n", "user.casfs.snapshot", "-v", "frozen", write)  # frozen: no slot needed
        assert snapshots(store, volume) == {**dict.fromkeys(range(1, n), True), n: False}
        epoch = frozen_epoch(store, volume, n)
        write_spots(write, ref, 100)  # after the snapshot: not in it

        snapdir = whole / "snapshots" / volume
        assert sorted(os.listdir(snapdir), key=int) == [str(i) for i in range(1, n + 1)]
        frozen = snapdir / str(n)
        assert frozen.stat().st_size == SIZE
        must("cmp", frozen, expected)
        held = os.open(frozen, os.O_RDONLY)
    try:
        # The fold runs now: it commits, then deletes the frozen epoch's files.
        data = upper_dir(store, volume) / f"{epoch}.data"
        wait_until("the fold", lambda: snapshots(store, volume) == dict.fromkeys(range(1, n + 1), True))
        wait_until("the frozen files' deletion", lambda: not data.exists())
        # The whole-store mount lets the deleted files go (their space comes back) while
        # the reader keeps the snapshot open, and reads the stored snapshot for it.
        wait_until("the deleted files' close", lambda: str(data) not in open_files(daemon))
        assert read_uncached(held) == expected.read_bytes()
    finally:
        os.close(held)
    must("cmp", frozen, expected)  # a new open: the stored snapshot
    ok(store, "snapshot", "export", f"{volume}@{n}", tmp_path / "exported.raw")
    must("cmp", tmp_path / "exported.raw", expected)


def test_a_frozen_snapshot_of_a_volume_another_daemon_writes(store: Path, tmp_path: Path) -> None:
    """The volume mounted by one daemon, the whole store by another: the whole-store
    mount reads the other daemon's frozen epoch."""
    ok(store, "volume", "create", "b", "--blank-block", "16M")
    disk = tmp_path / "b.raw"
    disk.touch()
    with mounted(store, tmp_path / "whole") as whole, mounted(store, disk, volume="b"):
        check_frozen_then_folded(store, "b", whole.path, whole.pid, disk, tmp_path, n=2)


def test_a_frozen_snapshot_of_a_volume_the_same_mount_writes(store: Path, tmp_path: Path) -> None:
    """The whole-store mount writes the volume (claims it) and reads its snapshot (its
    second: the kernel's write-back of the file's times after the first one's setxattr
    does not make it a fold; tests/mount/test_whole_store_freeze.py)."""
    ok(store, "volume", "create", "b", "--blank-block", "16M")
    with mounted(store, tmp_path / "whole") as whole:
        check_frozen_then_folded(
            store, "b", whole.path, whole.pid, whole.path / "volumes" / "b", tmp_path, n=2
        )


def test_frozen_snapshots_one_over_another(store: Path, tmp_path: Path) -> None:
    """Two snapshots frozen before either folds: each reads its own epoch over the one
    below it and the base, before the folds, and after them through the same open files."""
    ok(store, "volume", "create", "b", "--blank-block", "16M")
    disk = tmp_path / "b.raw"
    disk.touch()
    ref = bytearray(SIZE)
    expected: dict[int, bytes] = {}
    with mounted(store, tmp_path / "whole") as whole, mounted(store, disk, volume="b"):
        snapdir = whole.path / "snapshots" / "b"
        with folds_held(store):
            for n in (1, 2):
                write_spots(disk, ref, n)
                expected[n] = bytes(ref)
                (tmp_path / f"at-{n}.raw").write_bytes(ref)
                must("setfattr", "-n", "user.casfs.snapshot", "-v", "", disk)
            write_spots(disk, ref, 3)
            assert snapshots(store, "b") == {1: False, 2: False}
            assert sorted(os.listdir(snapdir)) == ["1", "2"]
            for n in (1, 2):
                must("cmp", snapdir / str(n), tmp_path / f"at-{n}.raw")
            held = {n: os.open(snapdir / str(n), os.O_RDONLY) for n in (1, 2)}
        try:
            wait_until("the folds", lambda: snapshots(store, "b") == {1: True, 2: True})
            for n, fd in held.items():
                assert read_uncached(fd) == expected[n]
        finally:
            for fd in held.values():
                os.close(fd)
        for n in (1, 2):
            must("cmp", snapdir / str(n), tmp_path / f"at-{n}.raw")
