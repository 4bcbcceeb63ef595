"""A mounted block volume's upper file under failure: a daemon killed in the middle of
the fold that turns the upper into blobs loses nothing, leaves nothing half visible,
and leaves no stray files once the volume is settled; a stream of large writes that an
fsync acknowledged (write-behind) survives kill -9;
a deleted volume's files go."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from casfs.lifecycle.faults import ENV_FAULT
from casfs.repo import Repository
from casfs.store.uppers import upper_dir
from tests.helpers.cli import js, must, ok
from tests.helpers.disks import write_spots
from tests.helpers.mount import cleanup, mounted, start_daemon, wait_gone

MIB = 1 << 20
SIZE = 16 * MIB


@pytest.mark.parametrize("point", ["fold:before-publish", "fold:after-publish"])
def test_a_background_fold_killed_midway_loses_nothing(
    repo: Repository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    """The snapshot returns once its epoch is frozen; the fold that follows in the
    background dies (before or after its commit); the next mount finishes it: snapshot
    1 holds what was written before it, the volume what came after."""
    ok(repo.path, "volume", "create", "b", "--blank-block", "16M")
    disk = tmp_path / "b.raw"
    disk.touch()
    ref = bytearray(SIZE)
    monkeypatch.setenv(ENV_FAULT, point)
    m = start_daemon(repo.path, disk, volume="b")
    try:
        write_spots(disk, ref, 1)
        must("setfattr", "-n", "user.casfs.snapshot", "-v", "first", disk)  # frozen: returns at once
        assert wait_gone(m.pid, m.proc, 30)  # the background fold killed the daemon
    finally:
        cleanup(m.path, m.pid, m.proc)
    monkeypatch.delenv(ENV_FAULT)
    at_snapshot = bytes(ref)

    with mounted(repo.path, disk, volume="b"):
        assert disk.read_bytes() == at_snapshot  # recovered: frozen epoch over the base
        write_spots(disk, ref, 2)
    snaps = js(repo.path, "snapshot", "ls", "b")
    assert [(s["n"], s["label"]) for s in snaps] == [(1, "first"), (2, None)]
    ok(repo.path, "snapshot", "export", "b@1", str(tmp_path / "one.raw"))
    assert (tmp_path / "one.raw").read_bytes() == at_snapshot
    ok(repo.path, "volume", "export", "b", str(tmp_path / "out.raw"))
    assert (tmp_path / "out.raw").read_bytes() == bytes(ref)
    assert os.listdir(upper_dir(repo.path, "b")) == []  # folded: no upper file left


def test_large_writes_an_fsync_acknowledged_survive_kill_9(repo: Repository, tmp_path: Path) -> None:
    """Small writes first, then 1 MiB writes over the whole disk (each handed to
    write-behind), fsync, one more write never synced, kill -9: every acknowledged
    byte is there, and each block of the last write reads back old or new."""
    ok(repo.path, "volume", "create", "b", "--blank-block", "16M")
    disk = tmp_path / "b.raw"
    disk.touch()
    rnd = random.Random(7)
    ref = bytearray(SIZE)
    m = start_daemon(repo.path, disk, volume="b")
    try:
        write_spots(disk, ref, 4)
        fd = os.open(disk, os.O_RDWR)
        try:
            for offset in range(0, SIZE, MIB):
                data = rnd.randbytes(MIB)
                assert os.pwrite(fd, data, offset) == MIB
                ref[offset : offset + MIB] = data
            os.fsync(fd)
            unsynced = rnd.randbytes(MIB)
            os.pwrite(fd, unsynced, 3 * MIB)
        finally:
            os.close(fd)
        os.kill(m.pid, 9)
        assert wait_gone(m.pid, m.proc, 30)
    finally:
        cleanup(m.path, m.pid, m.proc)
    with mounted(repo.path, disk, volume="b"):
        got = disk.read_bytes()
    assert got[: 3 * MIB] == ref[: 3 * MIB] and got[4 * MIB :] == ref[4 * MIB :]
    for b in range(3 * MIB, 4 * MIB, 4096):
        assert got[b : b + 4096] in (ref[b : b + 4096], unsynced[b - 3 * MIB : b - 3 * MIB + 4096])


def test_removing_a_volume_removes_its_upper_files(repo: Repository, tmp_path: Path) -> None:
    ok(repo.path, "volume", "create", "b", "--blank-block", "16M")
    disk = tmp_path / "b.raw"
    disk.touch()
    m = start_daemon(repo.path, disk, volume="b")
    try:
        write_spots(disk, bytearray(SIZE), 3)
        os.kill(m.pid, 9)  # the upper stays, unfolded
    finally:
        cleanup(m.path, m.pid, m.proc)
    assert len(os.listdir(upper_dir(repo.path, "b"))) == 2
    ok(repo.path, "volume", "rm", "b")
    assert not upper_dir(repo.path, "b").exists()
    # Files of a volume the catalog no longer has (a crash between its delete and theirs): gc.
    stray = upper_dir(repo.path, "gone")
    stray.mkdir(parents=True)
    (stray / "1.data").write_bytes(b"x")
    ok(repo.path, "gc")
    assert not stray.exists()
