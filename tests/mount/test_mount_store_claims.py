"""Browsing a whole-store mount claims nothing; the first change to a volume does.

Issue 7, defect 12: `ls volumes/` on a read/write store mount marked every volume
mounted by that daemon, so `casfs mount --volume`, `snapshot create` and `volume rm`
of any of them exited 4 until the store mount went away.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import pytest

from casfs import volumes
from casfs.repo import Repository
from tests.helpers.cli import casfs, run
from tests.helpers.mount import mounted


def phase(store: Path, name: str) -> str:
    with contextlib.closing(Repository.open(store)) as repo:
        return volumes.get_volume(repo, name).phase


def xattr(path: Path, name: str) -> str:
    done = run(["getfattr", "--only-values", "-n", name, path])
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def store(store: Path) -> Path:
    """The store, with directory volumes a, b, c and a block volume `disk`."""
    with contextlib.closing(Repository.open(store)) as repo:
        for name in ("a", "b", "c"):
            volumes.create_volume(repo, name, volumes.Source(blank_dir=True))
        volumes.create_volume(repo, "disk", volumes.Source(blank_block=4 << 20))
    return store


def test_browsing_claims_nothing_and_the_first_write_claims_one(store: Path, tmp_path: Path) -> None:
    with mounted(store, tmp_path / "whole") as m:
        vols = m.path / "volumes"
        assert sorted(os.listdir(vols)) == ["a", "b", "c", "disk"]
        assert run(["ls", "-lR", vols]).returncode == 0
        assert (vols / "disk").stat().st_size == 4 << 20
        assert [phase(store, v) for v in ("a", "b", "c", "disk")] == ["ready"] * 4
        # others may use them meanwhile
        assert casfs(store, "snapshot", "create", "b").returncode == 0
        assert casfs(store, "volume", "rm", "c").returncode == 0
        with mounted(store, tmp_path / "single", volume="b") as single:
            (single.path / "from-single").write_text("b's own mount")
            # held by that daemon: shown read-only from its base, and the phase says who
            assert xattr(vols / "b", "user.casfs.phase") == f"mounted by pid {single.pid}"
            with pytest.raises(OSError) as refused:
                (vols / "b" / "x").write_text("no")
            assert refused.value.errno == errno.EROFS
        # the first change claims
        (vols / "a" / "f").write_text("written through the store mount")
        assert phase(store, "a") == "mounted"
        assert xattr(vols / "a", "user.casfs.phase") == "mounted"
        (tmp_path / "other").mkdir()
        assert casfs(store, "mount", tmp_path / "other", "--volume", "a").returncode == 4
        # b, released by its own mount, is writable here now, with what that mount wrote
        assert (vols / "b" / "from-single").read_text() == "b's own mount"
        (vols / "b" / "more").write_text("now here")
        assert phase(store, "b") == "mounted"
    assert [phase(store, v) for v in ("a", "b", "disk")] == ["ready"] * 3
    with mounted(store, tmp_path / "whole") as m:
        assert (m.path / "volumes" / "a" / "f").read_text() == "written through the store mount"
        assert sorted(os.listdir(m.path / "volumes" / "b")) == ["from-single", "more"]
