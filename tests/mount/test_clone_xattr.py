"""Cloning by xattr in a whole-store mount: `setfattr -n user.casfs.clone -v NAME` on
an image or a snapshot makes the volume `casfs volume create NAME --from ...` would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from casfs import images, volumes
from casfs.repo import Repository
from tests.helpers.cli import run
from tests.helpers.mount import mounted

MIB = 1 << 20


def setfattr(path: Path, name: str, value: str) -> str:
    """setfattr's stderr, empty when it succeeded."""
    done = run(["setfattr", "-n", name, "-v", value, path])
    assert (done.returncode == 0) == (done.stderr == ""), done
    return done.stderr


@pytest.fixture
def disk(repo: Repository, tmp_path: Path) -> bytes:
    """A block image `disk` (3 MiB and a bit, not a whole chunk) and a directory image `tree`."""
    raw = os.urandom(3 * MIB + 1000)
    (tmp_path / "disk.raw").write_bytes(raw)
    images.import_image(repo, "disk", tmp_path / "disk.raw")
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "f").write_text("in the tree")
    images.import_image(repo, "tree", tmp_path / "tree")
    return raw


def test_a_clone_of_an_image_is_a_volume_with_its_content(
    repo: Repository, disk: bytes, tmp_path: Path
) -> None:
    with mounted(repo.path, tmp_path / "mnt") as m:
        assert setfattr(m.path / "images/disk", "user.casfs.clone", "vm1") == ""
        assert "vm1" in os.listdir(m.path / "volumes")
        assert (m.path / "volumes/vm1").read_bytes() == disk
        info = volumes.get_volume(repo, "vm1")
        assert (info.origin, info.mode, info.kind) == ("image:disk", "rw", "block")
        # as the CLI's create: the same again changes nothing, another spec is refused
        assert setfattr(m.path / "images/disk", "user.casfs.clone", "vm1") == ""
        assert "File exists" in setfattr(m.path / "images/tree", "user.casfs.clone", "vm1")
        assert setfattr(m.path / "images/tree", "user.casfs.clone", "root1") == ""
        assert (m.path / "volumes/root1/f").read_text() == "in the tree"


def test_a_clone_of_a_snapshot_taken_while_mounted_has_what_was_written(
    repo: Repository, disk: bytes, tmp_path: Path
) -> None:
    volumes.create_volume(repo, "vm", volumes.Source(image="disk"))
    written = os.urandom(MIB)
    with mounted(repo.path, tmp_path / "mnt") as m:
        vm = m.path / "volumes/vm"
        fd = os.open(vm, os.O_WRONLY)
        try:
            os.pwrite(fd, written, MIB)
            os.fsync(fd)
        finally:
            os.close(fd)
        assert setfattr(vm, "user.casfs.snapshot", "") == ""
        (n,) = [s.n for s in volumes.list_snapshots(repo, "vm")]
        snapshot = m.path / f"snapshots/vm/{n}"
        assert snapshot.exists()  # listed at once, folded or not
        # A clone of a snapshot not folded yet waits for the fold, which this daemon runs.
        assert setfattr(snapshot, "user.casfs.clone", "from-snap") == ""
        want = disk[:MIB] + written + disk[2 * MIB :]
        assert (m.path / "volumes/from-snap").read_bytes() == want
        assert volumes.get_volume(repo, "from-snap").origin == f"snapshot:vm@{n}"
        os.pwrite(fd := os.open(vm, os.O_WRONLY), b"later" * 1000, 0)
        os.close(fd)
        assert (m.path / "volumes/from-snap").read_bytes() == want  # a clone, not a view


def test_bad_clones_are_refused_and_make_nothing(repo: Repository, disk: bytes, tmp_path: Path) -> None:
    volumes.create_volume(repo, "vm", volumes.Source(image="disk"))
    with mounted(repo.path, tmp_path / "mnt") as m:
        image = m.path / "images/disk"
        for bad in ("-dash", "a/b", "x" * 129, "0xff"):  # setfattr reads 0x.. as bytes: not UTF-8
            assert "Invalid argument" in setfattr(image, "user.casfs.clone", bad), bad
        assert "Invalid argument" in setfattr(m.path / "volumes/vm", "user.casfs.clone", "c")
        assert "Invalid argument" in setfattr(m.path, "user.casfs.clone", "c")
        assert "Invalid argument" in setfattr(m.path / "images/tree/f", "user.casfs.clone", "c")
        assert "File exists" in setfattr(m.path / "images/tree", "user.casfs.clone", "vm")
    assert [v.name for v in volumes.list_volumes(repo)] == ["vm"]
