"""A mounted read/write directory volume: a base tree plus the overlay (names,
attributes), with the data of changed files in upper files (casfs.vfs.overlay.files).
Synchronous and trio-free: tests drive it without a mount, the FUSE adapter through
casfs.vfs.api.RwView."""

from __future__ import annotations

import dataclasses
import errno
import functools
import logging
from collections.abc import Callable

from casfs.catalog import overlay as rows
from casfs.ids import ChunkNo, InodeNo
from casfs.kinds import BlobKind, VolumeKind
from casfs.snapshots import chunkmap
from casfs.store.ids import ZERO_ID
from casfs.vfs.api import ROOT_INO, Fetched, NeedWork, Piece, RwView, assemble, fs_error
from casfs.vfs.overlay.files import FileUppers, Key, UpperFile, copy_in, copy_prefix
from casfs.vfs.overlay.fold import FlushJob, FoldJob, run_fold_dir
from casfs.vfs.overlay.namespace import Namespace
from casfs.vfs.overlay.nodes import Node
from casfs.vfs.overlay.spill import Spill, SpillJob
from casfs.vfs.overlay.writeback import now_ns

log = logging.getLogger(__name__)

# Errors of the store's disk that a write survives in memory (casfs.vfs.overlay.spill):
# the next flush retries them; fsync fails until one succeeds.
_SPILL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EPERM, errno.EACCES})


class DirVolume(Namespace, volume_kind=VolumeKind.DIR):
    files: FileUppers

    @property
    def rw(self) -> RwView:
        return self

    def _load(self) -> None:
        self.files = FileUppers.of(self.repo.path, self.name)
        self.spill = Spill()
        self._no_upper: dict[InodeNo, int] = {}  # making its upper file failed: errno
        super()._load()

    def _load_overlay(self) -> None:
        super()._load_overlay()
        named = {(n.ino, n.upper) for n in self.nodes.values() if n.upper is not None}
        on_disk = self.files.named() if self.claimed else set()
        # Generations are numbered per volume, above any a crash may have left behind.
        self._next_gen = 1 + max((gen for _, gen in named | on_disk), default=0)
        if self.claimed:
            self.files.remove_unnamed(named)
            self.files.trim(
                {(n.ino, n.upper): n.attrs.size for n in self.nodes.values() if n.upper is not None}
            )

    def _base_root(self, size: int) -> Node:
        return Node.from_tree(self._tree(self.base), self.base, ROOT_INO)

    def _content(self, node: Node) -> chunkmap.Content | chunkmap.ChunkMap:
        content = self._contents.get(node.ino)
        if content is None:
            mapped = rows.blob_kind(self.repo.conn, node.base) == BlobKind.MAP_ROOT
            content = chunkmap.Content(
                self.repo.get_meta, node.base, node.attrs.size, self.chunk_size, mapped
            )
            self._contents[node.ino] = content
        return content

    @property
    def size_bytes(self) -> int:
        return self.logical

    # -- file data in upper files ------------------------------------------------------

    def _upper(self, node: Node) -> UpperFile:
        assert node.upper is not None
        return self.files.open((node.ino, node.upper))

    def read_plan(self, ino: InodeNo, offset: int, size: int) -> list[Piece]:
        node = self.node(ino)
        n = min(offset + size, node.attrs.size) - offset
        if node.upper is None:
            pieces = super().read_plan(ino, offset, size)
        elif n <= 0:
            return []
        else:
            pieces = [Piece(0, n, read=functools.partial(self._upper(node).pread, offset, n))]
        if ino in self.spill and n > 0:
            return [Piece(0, n, read=functools.partial(self._read_spilled, ino, pieces, offset, n))]
        return pieces

    def _read_spilled(self, ino: InodeNo, pieces: list[Piece], offset: int, n: int) -> bytes:
        buf = bytearray(assemble(pieces, self.repo.get))
        buf.extend(bytes(n - len(buf)))
        self.spill.apply(ino, offset, buf)
        return bytes(buf)

    def _blocks(self, node: Node) -> int:
        if node.upper is None:
            return super()._blocks(node)
        assert node.upper is not None
        return self.files.allocated_blocks((node.ino, node.upper))

    def write(self, ino: InodeNo, offset: int, data: bytes, fetched: Fetched | None = None) -> int:
        """One pwrite into the file's upper file (copied up first: NeedWork)."""
        node = self.node(ino)
        if not node.is_file:
            raise fs_error(errno.EBADF)
        if ino in self.spill or ino in self._no_upper:
            self._spill(node, offset, data)  # (after earlier spilled writes, in order)
        else:
            try:
                if node.upper is None:
                    self._start_upper(node)
                assert node.upper is not None
                self._upper(node).pwrite(offset, data)
                self.files.written((ino, node.upper))
            except OSError as e:
                if e.errno not in _SPILL_ERRNOS:
                    raise
                log.warning("%s: kept in memory until a flush can store it: %s", self.describe(ino), e)
                if node.upper is None:
                    self._no_upper[ino] = e.errno
                self._spill(node, offset, data)
        end = offset + len(data)
        now = now_ns()
        if end > node.attrs.size:
            if node.attrs.nlink:
                self.logical += end - node.attrs.size
            node.set(size=end, mtime_ns=now, ctime_ns=now)
        else:
            node.set(mtime_ns=now, ctime_ns=now)
        self._touch(ino)
        return len(data)

    def _resize(self, node: Node, size: int, fetched: Fetched) -> None:
        if not node.is_file:
            raise fs_error(errno.EISDIR if node.is_dir else errno.EINVAL)
        failed = self._no_upper.get(node.ino)
        if failed is not None:  # (a truncate fails in its own call: nothing is dropped)
            raise fs_error(failed, "the store cannot take this file's data now")
        if node.upper is None:
            self._start_upper(node, keep=size)
        assert node.upper is not None
        key = (node.ino, node.upper)
        if size < node.attrs.size and key not in self.files.fresh:
            # The committed row names this file with the old size: cutting it in place
            # would let a crash show the old size over zeros. A new generation instead.
            if size:
                raise self._copy_prefix(node, key, size)
            self._replace_upper(node, self._new_upper(node.ino))
            key = (node.ino, node.upper)
        self.files.open(key).truncate(size)
        self.files.written(key)
        self.spill.cut(node.ino, size)
        self.dirty_bytes = self.spill.size
        if node.attrs.nlink:
            self.logical += size - node.attrs.size
        node.set(size=size)
        self._touch(node.ino)

    def _start_upper(self, node: Node, keep: int | None = None) -> None:
        """Give a file an upper file: empty (a new, emptied or all-hole file) or a copy
        of its content up to `keep` bytes (NeedWork: read and written in a thread)."""
        keep = node.attrs.size if keep is None else min(keep, node.attrs.size)
        cs = self.chunk_size
        refs = [
            (n * cs, ref)
            for n in range(chunkmap.n_chunks(keep, cs))
            if (ref := self._chunk_ref(node, ChunkNo(n))) != ZERO_ID
        ]
        if not refs:
            f = self._new_upper(node.ino)
            if node.attrs.size:  # (not a no-op on ext4: a cut to 0 makes the close flush)
                f.truncate(node.attrs.size)
            self._adopt(node, f)
            return
        key = (node.ino, self._take_gen())
        pieces = [(offset, functools.partial(self.repo.get, ref)) for offset, ref in refs]
        path = self.files.path(key)
        failed: list[OSError] = []

        def run() -> None:
            try:
                self.files.make_folder()
                copy_in(path, pieces, keep)
            except OSError as e:
                if e.errno not in _SPILL_ERRNOS:
                    raise
                failed.append(e)  # (its write spills; a truncate fails)

        def apply() -> None:
            if failed:
                self._no_upper[node.ino] = failed[0].errno or errno.EIO
            else:
                self._copied(key)

        raise NeedWork(f"copying up {self.path_of(node.ino)}", run, apply)

    def _spill(self, node: Node, offset: int, data: bytes) -> None:
        self.spill.add(node.ino, offset, data)
        self.dirty_bytes = self.spill.size

    def _copy_prefix(self, node: Node, old: Key, size: int) -> NeedWork:
        new = (node.ino, self._take_gen())
        src, dst = self.files.path(old), self.files.path(new)
        return NeedWork(
            f"cutting {self.path_of(node.ino)}",
            functools.partial(copy_prefix, src, dst, size),
            functools.partial(self._copied, new),
        )

    def _copied(self, key: Key) -> None:
        """A generation made in a worker thread (NeedWork) becomes the file's content."""
        node = self.node(key[0])
        self.files.adopt(key)
        if node.upper is None:
            self._adopt(node, self.files.open(key))
        else:
            self._replace_upper(node, self.files.open(key))

    def _take_gen(self) -> int:
        gen = self._next_gen
        self._next_gen += 1
        return gen

    def _new_upper(self, ino: InodeNo) -> UpperFile:
        return self.files.create((ino, self._take_gen()))

    def _adopt(self, node: Node, f: UpperFile) -> None:
        """The file's content is now wholly its upper file: its chunk rows go at the
        next flush (a cut from chunk 0) and its base no longer counts. (Chunk rows of a
        directory volume's file are only an older casfs's, all in chunk_ids since the
        load, or rows a pending cut drops: a new file has none, and its flush then
        skips the cut's four statements.)"""
        node.upper = f.key[1]
        if self.chunk_ids.pop(node.ino, None) is not None or node.ino in self.cuts:
            self.cuts[node.ino] = ChunkNo(0)
        node.base_limit = 0
        self._contents.pop(node.ino, None)
        self._touch(node.ino)

    def _replace_upper(self, node: Node, f: UpperFile) -> None:
        assert node.upper is not None
        self.files.retire((node.ino, node.upper))
        node.upper = f.key[1]
        self._touch(node.ino)

    def _drop_inode(self, ino: InodeNo) -> None:
        node = self.nodes.get(ino)
        if node is not None and node.upper is not None:
            self.files.retire((ino, node.upper))
        self.spill.drop(ino)
        self.dirty_bytes = self.spill.size
        self._no_upper.pop(ino, None)
        super()._drop_inode(ino)

    def _unsaved_bytes(self) -> dict[InodeNo, int]:
        held = super()._unsaved_bytes()
        for ino, writes in self.spill.writes.items():
            held[ino] = held.get(ino, 0) + sum(len(d) for _, d in writes)
        for ino, _ in self.files.dirty | self.files.fresh:
            node = self.nodes.get(ino)
            if node is not None:
                held[ino] = held.get(ino, 0) + node.attrs.size  # (its whole file: the upper's size)
        return held

    # -- flush and fold ----------------------------------------------------------------

    def prepare_flush(self) -> FlushJob | None:
        job = super().prepare_flush()
        if job is not None:
            job.files = self.files.capture()
            job.spilled = self._capture_spill(job) if self.spill.writes else None
        return job

    def _capture_spill(self, job: FlushJob) -> SpillJob:
        """The spilled writes into their upper files, a new one where the file had none
        (its row in this job then names it, and its chunk rows go)."""
        targets: dict[InodeNo, tuple[str, int, int | None]] = {}
        copies: dict[InodeNo, list[tuple[int, Callable[[], bytes]]]] = {}
        rows = {r[1]: i for i, r in enumerate(job.rows)}
        for ino in self.spill.writes:
            node = self.nodes[ino]
            if node.upper is not None:
                targets[ino] = (self.files.path((ino, node.upper)), node.attrs.size, None)
                continue
            key = (ino, self._take_gen())
            targets[ino] = (self.files.path(key), node.attrs.size, key[1])
            cs = self.chunk_size
            refs = (
                (n * cs, self._chunk_ref(node, ChunkNo(n)))
                for n in range(chunkmap.n_chunks(node.attrs.size, cs))
            )
            copies[ino] = [(o, functools.partial(self.repo.get, r)) for o, r in refs if r != ZERO_ID]
            row = dataclasses.replace(node, upper=key[1], base_limit=0).row(self.name)
            if ino in rows:
                job.rows[rows[ino]] = row
            else:
                job.rows.append(row)
            job.cuts[ino] = ChunkNo(0)
        return SpillJob(str(self.files.folder), self.spill.capture(), targets, copies)

    def run_flush(self, job: FlushJob) -> None:
        if job.spilled is not None:
            job.spilled.run()
        if job.files is not None:
            job.files.sync()  # the data before the rows that name it
        super().run_flush(job)
        if job.files is not None:
            job.files.after_commit()

    def apply_flush(self, job: FlushJob) -> None:
        if job.files is not None:
            self.files.synced(job.files)
        if job.spilled is not None:
            self.spill.drained(job.spilled.captured)
            self.dirty_bytes = self.spill.size
            for ino, (_, _, new) in job.spilled.targets.items():
                node = self.nodes.get(ino)
                if new is not None and node is not None:
                    node.upper = new
                    node.base_limit = 0
                    self.chunk_ids.pop(ino, None)
                    self._contents.pop(ino, None)
                    self._no_upper.pop(ino, None)
        super().apply_flush(job)

    def prepare_fold(self, label: str | None) -> FoldJob:
        job = super().prepare_fold(label)
        job.files = self.files
        return job

    def run_fold(self, job: FoldJob) -> None:
        run_fold_dir(self.repo, self.name, self.base, self.chunk_size, self.next_ino, job)
        if job.files is not None:
            job.files.unlink(job.folded_files)  # (after the commit: now in blobs)

    def apply_fold(self, job: FoldJob) -> None:
        for ino, gen in job.folded_files:
            node = self.nodes.get(ino)
            if node is not None and node.upper == gen:
                node.upper = None
        self.files.forget(job.folded_files)
        super().apply_fold(job)
