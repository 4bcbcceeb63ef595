"""A directory volume's changed files live in upper files, one per inode (files.py):
copied up at the first write, cut into a new generation, durable before the row that
names them commits, folded into blobs by a snapshot, and nothing left behind. Driven
through the view, without a mount (the mount tests cover the same through FUSE)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from casfs import images, volumes
from casfs.ids import ROOT_INO, InodeNo
from casfs.repo import Repository
from casfs.store.uppers import upper_dir
from casfs.vfs.api import assemble
from casfs.vfs.rw.dirkind import DirKind
from casfs.vfs.rw.volume import RwVolume
from casfs.vfs.volume import open_volume
from tests.helpers.volumes import names

CHUNK = 64 << 10


def read(v: RwVolume, ino: InodeNo) -> bytes:
    return assemble(v.read_plan(ino, 0, v.getattr(ino).size), v.repo.get)


def upper_files(repo: Repository, volume: str) -> list[str]:
    folder = upper_dir(repo.path, volume)
    return sorted(os.listdir(folder)) if folder.exists() else []


def dir_volume(repo: Repository, name: str) -> RwVolume:
    v = open_volume(repo, name)
    assert isinstance(v.kind, DirKind)
    return v


def image_volume(repo: Repository, tmp_path: Path) -> tuple[RwVolume, InodeNo, bytes]:
    """A volume of an image holding `big`: three chunks and a bit, a hole in the middle."""
    src = tmp_path / "src"
    src.mkdir()
    content = os.urandom(CHUNK) + bytes(CHUNK) + os.urandom(CHUNK + 100)
    (src / "big").write_bytes(content)
    images.import_image(repo, "img", src)
    volumes.create_volume(repo, "v", volumes.Source(image="img"))
    v = dir_volume(repo, "v")
    return v, v.lookup(ROOT_INO, b"big").ino, content


def test_a_first_write_copies_the_file_up_and_a_snapshot_folds_it(repo: Repository, tmp_path: Path) -> None:
    v, big, content = image_volume(repo, tmp_path)
    assert upper_files(repo, "v") == []
    v.write_sync(big, CHUNK + 10, b"new")  # into the hole
    want = content[: CHUNK + 10] + b"new" + content[CHUNK + 13 :]
    assert read(v, big) == want
    assert upper_files(repo, "v") == [f"i{big}.1"]
    # The copy keeps the hole: the upper file holds two chunks and a page, not three and a bit.
    blocks = v.getattr(big).blocks
    assert blocks is not None and blocks * 512 < len(content)
    v.flush_sync()
    again = dir_volume(repo, "v")  # a crash now: the committed row names the upper file
    assert read(again, again.lookup(ROOT_INO, b"big").ino) == want
    assert v.snapshot_sync() == 1
    assert upper_files(repo, "v") == []  # folded into blobs, then deleted
    v.close()
    fresh = dir_volume(repo, "v")
    assert read(fresh, fresh.lookup(ROOT_INO, b"big").ino) == want


def test_a_cut_of_a_committed_file_makes_a_new_generation(repo: Repository, tmp_path: Path) -> None:
    v, big, content = image_volume(repo, tmp_path)
    v.write_sync(big, 0, b"X")
    v.flush_sync()
    v.truncate_sync(big, 100)  # the committed row says the old size: not in place
    assert upper_files(repo, "v") == [f"i{big}.1", f"i{big}.2"]
    crashed = dir_volume(repo, "v")  # before the cut's flush: the old size and content
    big = crashed.lookup(ROOT_INO, b"big").ino
    assert read(crashed, big) == b"X" + content[1:]
    assert upper_files(repo, "v") == [f"i{big}.1"]  # (its load removed the new, unnamed one)
    crashed.truncate_sync(big, 50)
    crashed.write_sync(big, 50, b"tail")
    crashed.truncate_sync(big, 52)  # a cut of a generation no commit names yet: in place
    assert upper_files(repo, "v") == [f"i{big}.1", f"i{big}.3"]  # (above the left-over's 2)
    crashed.flush_sync()
    assert upper_files(repo, "v") == [f"i{big}.3"]  # the replaced one goes after the commit
    assert read(dir_volume(repo, "v"), big) == b"X" + content[1:50] + b"ta"


def test_writes_a_crash_cut_off_never_come_back_when_the_file_grows(repo: Repository) -> None:
    """A write into a committed upper file goes in place: after a crash, bytes within
    the committed size may show the new data (as on any file system), but what was
    written past that size is gone, even once the file grows over it again."""
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = dir_volume(repo, "v")
    f = names(v).mknod(ROOT_INO, b"f", stat.S_IFREG | 0o644, 0, 0, 0).ino
    v.write_sync(f, 0, b"committed")
    v.flush_sync()
    v.write_sync(f, 0, b"C")  # within the committed size: in place
    v.write_sync(f, 1000, b"past the end")
    crashed = dir_volume(repo, "v")
    assert read(crashed, f) in (b"committed", b"Committed")
    crashed.truncate_sync(f, 2000)
    assert read(crashed, f)[9:] == bytes(2000 - 9)


def test_an_emptied_file_starts_an_empty_generation_and_unlink_retires_it(
    repo: Repository, tmp_path: Path
) -> None:
    v, big, _ = image_volume(repo, tmp_path)
    v.truncate_sync(big, 0)  # no copy: nothing of it is kept
    v.write_sync(big, 0, b"short")
    v.flush_sync()
    assert read(dir_volume(repo, "v"), big) == b"short"
    new = names(v).mknod(ROOT_INO, b"new", stat.S_IFREG | 0o644, 0, 0, 0)
    v.write_sync(new.ino, 3 * CHUNK, b"far")  # a sparse new file: no copy-up
    v.flush_sync()
    assert len(upper_files(repo, "v")) == 2
    names(v).unlink(ROOT_INO, b"big")
    v.forget(big)
    assert len(upper_files(repo, "v")) == 2  # until the commit that drops its row
    v.flush_sync()
    assert upper_files(repo, "v") == [f"i{new.ino}.2"]
    assert read(v, new.ino) == bytes(3 * CHUNK) + b"far"


def test_left_overs_are_removed_and_never_read(repo: Repository, tmp_path: Path) -> None:
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    v = dir_volume(repo, "v")
    f = names(v).mknod(ROOT_INO, b"f", stat.S_IFREG | 0o644, 0, 0, 0)
    v.write_sync(f.ino, 0, b"committed")
    v.flush_sync()
    folder = upper_dir(repo.path, "v")
    (folder / f"i{f.ino}.7").write_bytes(b"a crash's left-over")
    (folder / "i999.1").write_bytes(b"of an inode never committed")
    again = dir_volume(repo, "v")
    assert read(again, f.ino) == b"committed"
    assert upper_files(repo, "v") == [f"i{f.ino}.1"]
    g = names(again).mknod(ROOT_INO, b"g", stat.S_IFREG | 0o644, 0, 0, 0)
    again.write_sync(g.ino, 0, b"g")
    assert f"i{g.ino}.8" in upper_files(repo, "v")  # numbered above any left-over
