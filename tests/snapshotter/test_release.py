"""`user.casfs.release` on volumes/NAME of a whole-store mount: the mount lets go of a
volume without an unmount (the snapshotter's Commit and Remove, one mount serving every
container). Its changes are kept, its claim released; a later change claims it anew."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import pytest

from casfs import volumes
from casfs.repo import Repository
from tests.helpers.mount import mounted

RELEASE = "user.casfs.release"


def phase(store: Path, name: str) -> str:
    with contextlib.closing(Repository.open(store)) as repo:
        return str(volumes.get_volume(repo, name).phase)


def test_a_released_volume_is_at_rest_with_its_changes_and_claimed_again_by_a_change(
    store: Path, tmp_path: Path
) -> None:
    with contextlib.closing(Repository.open(store)) as repo:
        volumes.create_volume(repo, "a", volumes.Source(blank_dir=True))
        volumes.create_volume(repo, "idle", volumes.Source(blank_dir=True))
    with mounted(store, tmp_path / "whole") as m:
        vol = m.path / "volumes" / "a"
        (vol / "f").write_text("before the release")
        assert phase(store, "a") == "mounted"
        os.setxattr(vol, RELEASE, b"")
        assert phase(store, "a") == "ready"
        os.setxattr(m.path / "volumes" / "idle", RELEASE, b"")  # (not held: nothing to do)
        # at rest: another process snapshots it, and the snapshot has what was written
        with contextlib.closing(Repository.open(store)) as repo:
            n = volumes.create_snapshot(repo, "a")
        assert (m.path / "snapshots" / "a" / str(n) / "f").read_text() == "before the release"
        # a new lookup gets a new view: the next change claims the volume again
        (vol / "g").write_text("after")
        assert phase(store, "a") == "mounted"
        assert sorted(os.listdir(vol)) == ["f", "g"]
        for wrong in (m.path, m.path / "snapshots" / "a" / str(n)):
            with pytest.raises(OSError) as refused:
                os.setxattr(wrong, RELEASE, b"")
            assert refused.value.errno == errno.EINVAL
    assert phase(store, "a") == "ready"


def test_release_is_refused_by_a_single_volume_mount(store: Path, tmp_path: Path) -> None:
    with contextlib.closing(Repository.open(store)) as repo:
        volumes.create_volume(repo, "one", volumes.Source(blank_dir=True))
    with mounted(store, tmp_path / "one", volume="one") as m:
        with pytest.raises(OSError) as refused:
            os.setxattr(m.path, RELEASE, b"")
        assert refused.value.errno == errno.EINVAL
        assert phase(store, "one") == "mounted"
