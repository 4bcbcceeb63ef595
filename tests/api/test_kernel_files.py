"""A directory volume's files the kernel reads and writes itself (passthrough,
casfs.vfs.rw.kernelfiles), driven through the view without a mount: the kernel's
writes are pwrites into the upper file the view handed out, which the view never sees."""

from __future__ import annotations

import os
from pathlib import Path

from casfs.ids import ROOT_INO, InodeNo
from casfs.repo import Repository
from casfs.vfs.api import NeedWork
from casfs.vfs.rw.dirkind import DirKind
from casfs.vfs.rw.volume import RwVolume
from casfs.vfs.volume import open_volume
from tests.api.test_dir_uppers import image_volume, read, upper_files

CHUNK = 64 << 10


def kind(v: RwVolume) -> DirKind:
    assert isinstance(v.kind, DirKind)
    return v.kind


def kernel_open(v: RwVolume, ino: InodeNo, writer: bool) -> str | None:
    """kind.kernel_open, its copy-up done in this thread (as the session's retry does)."""
    while True:
        try:
            return kind(v).kernel_open(ino, writer)
        except NeedWork as e:
            e.run()
            e.apply()


def test_a_writer_copies_up_and_its_writes_show_in_stat_flush_and_snapshot(
    repo: Repository, tmp_path: Path
) -> None:
    v, big, content = image_volume(repo, tmp_path)
    assert kernel_open(v, big, writer=False) is None  # no upper file: the daemon serves it
    path = kernel_open(v, big, writer=True)
    assert path is not None and upper_files(repo, "v") == [os.path.basename(path)]
    with open(path, "r+b") as f:  # the kernel's writes
        f.seek(len(content))
        f.write(b"tail")
    assert v.getattr(big).size == len(content) + 4  # found by fstat
    v.flush_sync()
    assert read(v, big) == content + b"tail"
    snap = v.snapshot_sync()  # the kernel holds the file open: the fold keeps it
    assert os.path.exists(path)
    with open(path, "r+b") as f:
        f.write(b"HEAD")
    kind(v).kernel_release(big, writer=True)
    v.close()
    again = open_volume(repo, "v")
    assert read(again, again.lookup(ROOT_INO, b"big").ino) == b"HEAD" + content[4:] + b"tail"
    again.close()
    assert snap >= 1


def test_a_cut_of_a_file_the_kernel_holds_stays_in_its_file(repo: Repository, tmp_path: Path) -> None:
    v, big, content = image_volume(repo, tmp_path)
    v.write_sync(big, 0, b"x")
    v.flush_sync()  # committed: a cut would otherwise make a new generation
    before = upper_files(repo, "v")
    path = kernel_open(v, big, writer=True)
    v.truncate_sync(big, CHUNK)
    assert upper_files(repo, "v") == before and os.path.getsize(str(path)) == CHUNK
    kind(v).kernel_release(big, writer=True)
    v.truncate_sync(big, 10)  # released: a new generation again
    assert upper_files(repo, "v") != before
    assert read(v, big) == b"x" + content[1:10]
    v.close()


def test_the_session_ending_takes_a_writers_last_bytes(repo: Repository, tmp_path: Path) -> None:
    v, big, content = image_volume(repo, tmp_path)
    path = kernel_open(v, big, writer=True)
    with open(str(path), "ab") as f:
        f.write(b"!")
    v.close()  # (no release: the unmount came first)
    again = open_volume(repo, "v")
    assert read(again, again.lookup(ROOT_INO, b"big").ino) == content + b"!"
    again.close()
