"""Block images, volumes and snapshots report what they hold, not their size: holes
allocate nothing (`du`, `qemu-img info`), as directory volumes' sparse files already
did; and a block volume's mtime is when it last changed, not when it was mounted."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

from casfs import images, volumes
from casfs.repo import Repository
from tests.helpers.mount import mounted

MIB = 1 << 20


def du(path: Path) -> int:
    done = subprocess.run(["du", "-B1", "--", str(path)], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[0])


def qemu_disk_size(path: Path) -> int:
    cmd = ["qemu-img", "info", "--output=json", "-f", "raw", str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return int(json.loads(out)["actual-size"])


def test_holes_allocate_nothing(store: Path, tmp_path: Path) -> None:
    src = tmp_path / "disk.raw"
    with open(src, "wb") as f:
        f.truncate(64 * MIB)
        f.seek(10 * MIB)
        f.write(os.urandom(3 * MIB + 100))
    with contextlib.closing(Repository.open(store)) as repo:
        images.import_image(repo, "disk", src)
        volumes.create_volume(repo, "blank", volumes.Source(blank_block=1 << 30))
        volumes.create_volume(repo, "vm", volumes.Source(image="disk"))
    with mounted(store, tmp_path / "whole") as m:
        image = m.path / "images" / "disk"
        assert image.stat().st_size == 64 * MIB
        assert 3 * MIB <= du(image) <= 4 * MIB
        assert 3 * MIB <= qemu_disk_size(image) <= 4 * MIB
    disk = tmp_path / "blank.raw"
    disk.touch()
    with mounted(store, disk, volume="blank") as m:
        assert du(m.path) == 0 and qemu_disk_size(m.path) == 0
        with open(m.path, "r+b") as f:
            f.seek(500 * MIB)
            f.write(os.urandom(MIB))
        assert MIB <= du(m.path) <= 2 * MIB
    with mounted(store, tmp_path / "whole") as m:
        assert MIB <= du(m.path / "snapshots" / "blank" / "1") <= 2 * MIB
        assert MIB <= du(m.path / "volumes" / "blank") <= 2 * MIB


def test_a_block_volume_keeps_its_mtime_across_mounts(store: Path, tmp_path: Path) -> None:
    with contextlib.closing(Repository.open(store)) as repo:
        volumes.create_volume(repo, "vm", volumes.Source(blank_block=8 * MIB))
    disk = tmp_path / "vm.raw"
    disk.touch()
    with mounted(store, disk, volume="vm") as m:
        created = m.path.stat().st_mtime_ns
        with open(m.path, "r+b") as f:
            f.write(b"x" * 4096)
        written = m.path.stat().st_mtime_ns
        assert written > created
    before_mount = time.time_ns()
    with mounted(store, disk, volume="vm") as m:
        mounted_at = m.path.stat().st_mtime_ns
    assert written <= mounted_at < before_mount  # the fold after the write, not the mount
    with mounted(store, disk, volume="vm") as m:
        assert m.path.stat().st_mtime_ns == mounted_at  # unchanged: nothing was written
