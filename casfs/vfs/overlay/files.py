"""A directory volume's upper files: the whole content of each file changed since the
base, one local file per inode, as overlayfs's upper directory and S3QL's cache keep
them (a block volume's upper is casfs.vfs.overlay.upper).

    STORE/upper/<volume>/i<ino>.<generation>   the file's bytes at their offsets

A write is one pwrite into the page cache: no hashing, no compression, no memory of
its own. A file changed for the first time is copied up whole (its base chunks written
into a new upper file, in a worker thread); a new or emptied file starts empty.

Which file counts is the overlay row's `upper` column (the generation), and a row is
only ever committed after its upper file was made durable (FileSync, before the flush's
transaction). So after a crash an inode reads the file its committed row names: every
byte an fsync acknowledged is there, a byte written since reads old or new. Where an
in-place change could show neither (a cut: the committed size still covers the bytes
cut off), the content moves to a new generation instead (empty, or a copy of what is
kept), and the old file is deleted after the commit that stops naming it. Files no row
names are left-overs of a crash, deleted when a claimed view loads the volume.

The snapshot's fold turns each upper file into chunk blobs; the files go after the
transaction that publishes the snapshot.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from casfs.ids import InodeNo
from casfs.store.local import fsync_dir, remove_quietly, syncfs
from casfs.store.uppers import upper_dir

Key = tuple[InodeNo, int]  # (ino, generation)


_OPEN_FILES = 256  # descriptors kept open (a cp -a writes tens of thousands of files)
_FDATASYNC_UP_TO = 32  # more dirty files than this: one syncfs instead


class UpperFile:
    """One upper file, open. Its descriptor closes when nothing holds the object, so a
    read planned before the file was retired still reads what it planned."""

    def __init__(self, key: Key, path: str, fd: int) -> None:
        self.key = key
        self.path = path
        self.fd = fd
        weakref.finalize(self, os.close, fd)

    def pread(self, offset: int, size: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def pwrite(self, offset: int, data: bytes | memoryview) -> None:
        pwrite_all(self.fd, data, offset)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)

    def allocated_blocks(self) -> int:
        """512-byte blocks the file occupies (holes take none)."""
        return os.fstat(self.fd).st_blocks


@dataclass
class FileUppers:
    """The upper files of one directory volume, and which are not yet durable."""

    folder: Path
    dirty: set[Key] = field(default_factory=set)  # written since the last sync
    # Made since the last sync: no committed row names them yet (so they may be cut in
    # place), and their names are not durable (the directory needs an fsync).
    fresh: set[Key] = field(default_factory=set)
    retired: list[Key] = field(default_factory=list)  # to delete once a commit stopped naming them
    folder_durable: bool = False  # its name in upper/ fsynced by this view
    _open: OrderedDict[Key, UpperFile] = field(default_factory=OrderedDict)

    @staticmethod
    def of(store: Path, volume: str) -> FileUppers:
        return FileUppers(upper_dir(store, volume))

    def path(self, key: Key) -> str:
        return f"{self.folder}/i{key[0]}.{key[1]}"

    def open(self, key: Key) -> UpperFile:
        """The file of a generation a row or this view named (it exists)."""
        f = self._open.get(key)
        if f is None:
            path = self.path(key)
            f = self._remember(key, UpperFile(key, path, os.open(path, os.O_RDWR | os.O_CLOEXEC)))
        else:
            self._open.move_to_end(key)
        return f

    def allocated_blocks(self, key: Key) -> int:
        """512-byte blocks a generation occupies: from the open file, or by its name (a
        listing's attributes: opening each file would push the open ones out)."""
        f = self._open.get(key)
        return f.allocated_blocks() if f is not None else os.stat(self.path(key)).st_blocks

    def create(self, key: Key) -> UpperFile:
        """A new, empty generation. A file of that name can only be a crash's left-over
        (no row names a generation this view has not made): it is emptied."""
        path = self.path(key)
        try:
            fd = os.open(path, _CREATE, 0o600)
        except FileNotFoundError:  # the volume's first upper file (a mkdir per file costs)
            self.make_folder()
            fd = os.open(path, _CREATE, 0o600)
        self.adopt(key)
        return self._remember(key, UpperFile(key, path, fd))

    def make_folder(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    def adopt(self, key: Key) -> None:
        """A generation made by create(), copy_in() or copy_prefix(): not durable yet."""
        self.fresh.add(key)
        self.dirty.add(key)

    def _remember(self, key: Key, f: UpperFile) -> UpperFile:
        self._open[key] = f
        while len(self._open) > _OPEN_FILES:
            self._open.popitem(last=False)  # (closed once no read holds it)
        return f

    def written(self, key: Key) -> None:
        self.dirty.add(key)

    def retire(self, key: Key) -> None:
        """The generation is replaced or its inode gone: delete it after the next commit."""
        self.retired.append(key)
        self.dirty.discard(key)
        self.fresh.discard(key)
        self.forget([key])

    def capture(self) -> FileSync | None:
        """What the next flush must make durable before its commit, and delete after."""
        if not (self.dirty or self.fresh or self.retired):
            return None
        parent = bool(self.fresh) and not self.folder_durable
        return FileSync(self, sorted(self.dirty), set(self.fresh), list(self.retired), parent)

    def synced(self, job: FileSync) -> None:
        """The flush that carried `job` committed (the view was frozen meanwhile)."""
        self.dirty.difference_update(job.keys)
        self.folder_durable = self.folder_durable or job.parent
        self.fresh -= job.fresh
        done = set(job.retired)
        self.retired = [k for k in self.retired if k not in done]

    def named(self) -> set[Key]:
        """Every generation on disk (for the left-over sweep)."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return set()
        found = set()
        for name in names:
            ino, dot, gen = name[1:].partition(".")
            if name.startswith("i") and dot and ino.isdigit() and gen.isdigit():
                found.add((InodeNo(int(ino)), int(gen)))
        return found

    def remove_unnamed(self, keep: Iterable[Key]) -> None:
        """Delete the generations no committed row names (a crash's left-overs)."""
        for key in self.named() - set(keep):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(key))

    def trim(self, sizes: dict[Key, int]) -> None:
        """Cut committed files back to the size their rows give. Writes past it since
        the last flush (a crash came before the next) reached the file but not the row:
        if the file grew again later they would show where zeros belong."""
        for key, size in sizes.items():
            path = self.path(key)
            try:
                if os.stat(path).st_size > size:
                    os.truncate(path, size)
            except FileNotFoundError:
                pass  # (read as a hole, as any missing tail; fsck names the row)

    def folded(self, keys: Iterable[Key]) -> None:
        """These generations are in blobs now and their files are deleted: nothing of
        them is left to sync (a writer's open marked one written with no change since the
        flush before: the flush after the fold found the file gone and saved nothing)."""
        keys = list(keys)
        self.forget(keys)
        self.dirty.difference_update(keys)
        self.fresh.difference_update(keys)

    def forget(self, keys: Iterable[Key]) -> None:
        """Stop keeping these generations open (they are about to be deleted)."""
        for key in keys:
            self._open.pop(key, None)

    def unlink(self, keys: Iterable[Key]) -> None:
        """Delete files no committed row names (any thread: only the file system
        changes). Best effort: what stays is a left-over, swept at the next load.
        Many at once (a fold) go in parallel: an unlink waits on the journal as it frees
        the file's blocks (about 0.5 ms each on a virtual disk; 4 threads: 2-3x)."""
        paths = [self.path(key) for key in keys]
        if len(paths) < _PARALLEL_UNLINK:
            for path in paths:
                remove_quietly(path)  # (what it cannot remove, the next mount does)
            return
        with ThreadPoolExecutor(_UNLINK_THREADS, thread_name_prefix="casfs-unlink") as pool:
            for _ in pool.map(remove_quietly, paths):
                pass


_PARALLEL_UNLINK = 16
_UNLINK_THREADS = 4


@dataclass
class FileSync:
    """One flush's share of the upper files (captured on the view's thread, run in the
    flush's worker): make them durable before the commit, delete retired ones after."""

    uppers: FileUppers
    keys: list[Key]
    fresh: set[Key]
    retired: list[Key]
    parent: bool = False  # also the folder's own name (once per view: it may be new)

    def sync(self) -> None:
        if len(self.keys) > _FDATASYNC_UP_TO:
            fd = os.open(self.uppers.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                syncfs(fd)  # one flush of the file system beats thousands of fdatasyncs
            finally:
                os.close(fd)
            return
        for key in self.keys:  # (own descriptors: the view's thread owns its open ones)
            fd = os.open(self.uppers.path(key), os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        if self.fresh:
            fsync_dir(self.uppers.folder)
        if self.parent:
            fsync_dir(self.uppers.folder.parent)

    def after_commit(self) -> None:
        self.uppers.unlink(self.retired)


_CREATE = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC


def copy_in(path: str, pieces: Iterable[tuple[int, Callable[[], bytes]]], size: int) -> None:
    """Make a new upper file of each piece's bytes at its offset (holes stay holes) and
    `size` (a worker thread: no row names the file yet; a left-over of that name is
    emptied first)."""
    fd = os.open(path, _CREATE, 0o600)
    try:
        for offset, read in pieces:
            pwrite_all(fd, read(), offset)
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def copy_prefix(src: str, dst: str, size: int) -> None:
    """Make a new upper file of the first `size` bytes of another, copied in the kernel."""
    with open(src, "rb") as fin, open(os.open(dst, _CREATE, 0o600), "r+b") as fout:
        done = 0
        while done < size:
            n = os.copy_file_range(fin.fileno(), fout.fileno(), size - done, done, done)
            if n == 0:
                break
            done += n
        os.ftruncate(fout.fileno(), size)


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
