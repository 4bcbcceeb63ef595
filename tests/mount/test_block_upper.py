"""A mounted block volume's upper file under failure: a daemon killed in the middle of
the fold that turns the upper into blobs loses nothing, leaves nothing half visible,
and leaves no stray files once the volume is settled; a deleted volume's files go."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from casfs.lifecycle.faults import ENV_FAULT
from casfs.repo import Repository
from casfs.store.uppers import upper_dir
from tests.helpers.cli import js, ok, run
from tests.helpers.mount import cleanup, mounted, start_daemon

MIB = 1 << 20
SIZE = 16 * MIB


def write_spots(path: Path, ref: bytearray, seed: int) -> None:
    rnd = random.Random(seed)
    fd = os.open(path, os.O_RDWR)
    try:
        for _ in range(20):
            length = rnd.choice([1, 4096, 65536 + 3, 200_000])
            offset = rnd.randrange(0, SIZE - length)
            data = rnd.randbytes(length)
            assert os.pwrite(fd, data, offset) == length
            ref[offset : offset + length] = data
        os.fdatasync(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("point", ["fold:before-publish", "fold:after-publish"])
def test_a_fold_killed_midway_loses_nothing(
    repo: Repository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    ok(repo.path, "volume", "create", "b", "--blank-block", "16M")
    disk = tmp_path / "b.raw"
    disk.touch()
    ref = bytearray(SIZE)
    monkeypatch.setenv(ENV_FAULT, point)
    m = start_daemon(repo.path, disk, volume="b")
    try:
        write_spots(disk, ref, 1)
        done = run(["setfattr", "-n", "user.casfs.snapshot", "-v", "x", str(disk)])
        assert done.returncode != 0  # the daemon killed itself in the fold
    finally:
        cleanup(m.path, m.pid, m.proc)
    monkeypatch.delenv(ENV_FAULT)
    published = point == "fold:after-publish"
    assert len(js(repo.path, "snapshot", "ls", "b")) == (1 if published else 0)

    with mounted(repo.path, disk, volume="b"):
        assert disk.read_bytes() == bytes(ref)  # recovered: the same bytes, once
        write_spots(disk, ref, 2)
    numbers = [s["n"] for s in js(repo.path, "snapshot", "ls", "b")]
    # The killed fold's snapshot was published once, or its work was redone (settled
    # by itself, or folded with the next mount's writes).
    assert numbers == [1, 2] if published else numbers in ([1], [1, 2])
    ok(repo.path, "volume", "export", "b", str(tmp_path / "out.raw"))
    assert (tmp_path / "out.raw").read_bytes() == bytes(ref)
    assert os.listdir(upper_dir(repo.path, "b")) == []  # folded: no upper file left


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
