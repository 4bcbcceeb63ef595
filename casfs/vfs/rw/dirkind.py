"""A read/write directory volume's kind: a base tree plus the overlay (names,
attributes: casfs.vfs.rw.names), the data of changed files in upper files
(casfs.vfs.overlay.files), and writes the store's disk refused kept in memory until a
flush can store them (casfs.vfs.overlay.spill)."""

from __future__ import annotations

import dataclasses
import errno
import functools
import logging
from collections.abc import Callable

from casfs.catalog import overlay as rows
from casfs.ids import ChunkNo, InodeNo, SnapshotNo
from casfs.kinds import BlobKind, VolumeKind
from casfs.snapshots import chunkmap
from casfs.store.ids import ZERO_ID
from casfs.vfs.api import ROOT_INO, Fetched, Job, NeedWork, ReadPiece, SnapshotJob, assemble, fs_error
from casfs.vfs.overlay.files import FileUppers, Key, UpperFile, copy_in, copy_prefix
from casfs.vfs.overlay.nodes import Node
from casfs.vfs.overlay.spill import Spill, SpillJob
from casfs.vfs.rw.below import chunk_blocks
from casfs.vfs.rw.jobs.flush import FlushJob
from casfs.vfs.rw.jobs.fold_dir import DirFold
from casfs.vfs.rw.kernelfiles import KernelOpens
from casfs.vfs.rw.names import DirNames
from casfs.vfs.rw.volume import RwVolume, finish, now_ns

log = logging.getLogger(__name__)

# Errors of the store's disk that a write survives in memory (casfs.vfs.overlay.spill):
# the next flush retries them; fsync fails until one succeeds.
_SPILL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EPERM, errno.EACCES})


class DirKind:
    volume_kind = VolumeKind.DIR
    fixed_size = False
    atime = True

    def __init__(self, vol: RwVolume) -> None:
        self.vol = vol
        self.namespace = DirNames(vol)
        self.files = FileUppers.of(vol.repo.path, vol.name)
        self.spill = Spill()
        self._no_upper: dict[InodeNo, int] = {}  # making its upper file failed: errno
        self.kernel = KernelOpens()  # inodes whose upper file the kernel serves (passthrough)
        self._next_gen = 1

    def load(self) -> None:
        vol = self.vol
        named = {(n.ino, n.upper) for n in vol.nodes.values() if n.upper is not None}
        on_disk = self.files.named() if vol.claimed else set()
        # Generations are numbered per volume, above any a crash may have left behind.
        self._next_gen = 1 + max((gen for _, gen in named | on_disk), default=0)
        if vol.claimed:
            self.files.remove_unnamed(named)
            self.files.trim(
                {(n.ino, n.upper): n.attrs.size for n in vol.nodes.values() if n.upper is not None}
            )

    def base_root(self, size: int) -> Node:
        return Node.from_tree(self.namespace.tree(self.vol.base), self.vol.base, ROOT_INO)

    def copy_up(self, ino: InodeNo) -> None:
        self.namespace.materialize_up(ino)

    def path_of(self, ino: InodeNo) -> str:
        return self.namespace.path(ino)

    def on_claim(self) -> None:
        """(Nothing beside the core's: upper files are trimmed at load.)"""

    def settle(self) -> None:
        """The files the kernel writes itself (passthrough): what moved is a change."""
        for ino, held in self.kernel.writers():
            node = self.vol.nodes.get(ino)
            if node is not None:
                self._look(node)
            if held.changed:
                held.changed = False
                self.files.written(held.key)
                self.vol.touch(ino)

    def folded(self) -> None:
        self.namespace.forget_links()

    def content(self, node: Node) -> chunkmap.Content | chunkmap.ChunkMap:
        content = self.vol.contents.get(node.ino)
        if content is None:
            mapped = rows.blob_kind(self.vol.repo.conn, node.base) == BlobKind.MAP_ROOT
            content = chunkmap.Content(
                self.vol.repo.get_meta, node.base, node.attrs.size, self.vol.chunk_size, mapped
            )
            self.vol.contents[node.ino] = content
        return content

    @property
    def volume_size(self) -> int:
        return self.vol.logical

    # -- file data in upper files ------------------------------------------------------

    def _upper(self, node: Node) -> UpperFile:
        assert node.upper is not None
        return self.files.open((node.ino, node.upper))

    def plan(self, node: Node, offset: int, size: int) -> list[ReadPiece]:
        ino = node.ino
        n = min(offset + size, node.attrs.size) - offset
        if node.upper is None:
            pieces = self.vol.chunk_plan(node, offset, size)
        elif n <= 0:
            return []
        else:
            pieces = [ReadPiece(0, n, read=functools.partial(self._upper(node).pread, offset, n))]
        if ino in self.spill and n > 0:
            return [ReadPiece(0, n, read=functools.partial(self._read_spilled, ino, pieces, offset, n))]
        return pieces

    def _read_spilled(self, ino: InodeNo, pieces: list[ReadPiece], offset: int, n: int) -> bytes:
        buf = bytearray(assemble(pieces, self.vol.repo.get))
        buf.extend(bytes(n - len(buf)))
        self.spill.apply(ino, offset, buf)
        return bytes(buf)

    def blocks(self, node: Node) -> int:
        if node.upper is None:
            return chunk_blocks(self.vol, node)
        self._look(node)  # (first: a file the kernel writes has moved on)
        return self.files.allocated_blocks((node.ino, node.upper))

    def write_at(self, node: Node, offset: int, data: bytes, fetched: Fetched | None) -> int:
        """One pwrite into the file's upper file (copied up first: NeedWork)."""
        ino = node.ino
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
                log.warning("%s: kept in memory until a flush can store it: %s", self.vol.describe(ino), e)
                if node.upper is None:
                    self._no_upper[ino] = e.errno
                self._spill(node, offset, data)
        end = offset + len(data)
        now = now_ns()
        if end > node.attrs.size:
            if node.attrs.nlink:
                self.vol.logical += end - node.attrs.size
            node.set(size=end, mtime_ns=now, ctime_ns=now)
        else:
            node.set(mtime_ns=now, ctime_ns=now)
        self.vol.touch(ino)
        return len(data)

    def resize(self, node: Node, size: int, fetched: Fetched) -> None:
        if not node.is_file:
            raise fs_error(errno.EISDIR if node.is_dir else errno.EINVAL)
        failed = self._no_upper.get(node.ino)
        if failed is not None:  # (a truncate fails in its own call: nothing is dropped)
            raise fs_error(failed, "the store cannot take this file's data now")
        if node.upper is None:
            self._start_upper(node, keep=size)
        assert node.upper is not None
        key = (node.ino, node.upper)
        if size < node.attrs.size and key not in self.files.fresh and not self.kernel.held(node.ino):
            # The committed row names this file with the old size: cutting it in place
            # would let a crash show the old size over zeros. A new generation instead
            # (not for a file the kernel holds open: it writes only the one it was given).
            if size:
                raise self._copy_prefix(node, key, size)
            self._replace_upper(node, self._new_upper(node.ino))
            key = (node.ino, node.upper)
        self.files.open(key).truncate(size)
        self.files.written(key)
        self.spill.cut(node.ino, size)
        self.vol.dirty_bytes = self.spill.size
        if node.attrs.nlink:
            self.vol.logical += size - node.attrs.size
        node.set(size=size)
        self.vol.touch(node.ino)

    def _start_upper(self, node: Node, keep: int | None = None) -> None:
        """Give a file an upper file: empty (a new, emptied or all-hole file) or a copy
        of its content up to `keep` bytes (NeedWork: read and written in a thread)."""
        keep = node.attrs.size if keep is None else min(keep, node.attrs.size)
        cs = self.vol.chunk_size
        refs = [
            (n * cs, ref)
            for n in range(chunkmap.n_chunks(keep, cs))
            if (ref := self.vol.chunk_ref(node, ChunkNo(n))) != ZERO_ID
        ]
        if not refs:
            f = self._new_upper(node.ino)
            if node.attrs.size:  # (not a no-op on ext4: a cut to 0 makes the close flush)
                f.truncate(node.attrs.size)
            self._adopt(node, f)
            return
        key = (node.ino, self._take_gen())
        pieces = [(offset, functools.partial(self.vol.repo.get, ref)) for offset, ref in refs]
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

        raise NeedWork(f"copying up {self.namespace.path(node.ino)}", run, apply)

    def _spill(self, node: Node, offset: int, data: bytes) -> None:
        self.spill.add(node.ino, offset, data)
        self.vol.dirty_bytes = self.spill.size

    def _copy_prefix(self, node: Node, old: Key, size: int) -> NeedWork:
        new = (node.ino, self._take_gen())
        src, dst = self.files.path(old), self.files.path(new)
        return NeedWork(
            f"cutting {self.namespace.path(node.ino)}",
            functools.partial(copy_prefix, src, dst, size),
            functools.partial(self._copied, new),
        )

    def _copied(self, key: Key) -> None:
        """A generation made in a worker thread (NeedWork) becomes the file's content."""
        node = self.vol.node(key[0])
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
        if self.vol.chunk_ids.pop(node.ino, None) is not None or node.ino in self.vol.cuts:
            self.vol.cuts[node.ino] = ChunkNo(0)
        node.base_limit = 0
        self.vol.contents.pop(node.ino, None)
        self.vol.touch(node.ino)

    def _replace_upper(self, node: Node, f: UpperFile) -> None:
        assert node.upper is not None
        self.files.retire((node.ino, node.upper))
        node.upper = f.key[1]
        self.vol.touch(node.ino)

    # -- upper files the kernel serves itself (FUSE passthrough) -----------------------

    def kernel_open(self, ino: InodeNo, writer: bool) -> str | None:
        """The upper file to give the kernel for one more open of `ino` (copied up first
        for a writer: NeedWork), or None: the daemon serves it (no upper file to read, or
        writes the store's disk refused, kept in memory)."""
        node = self.vol.node(ino)
        if not node.is_file or ino in self.spill or ino in self._no_upper:
            return None
        if node.upper is None:
            if not writer:
                return None
            self._start_upper(node)
        assert node.upper is not None
        key = (ino, node.upper)
        self.kernel.add(ino, key, writer, self.files.open(key).fd)
        if writer:
            self.files.written(key)
        return self.files.path(key)

    def kernel_release(self, ino: InodeNo, writer: bool) -> None:
        """One passthrough handle of `ino` closed: a writer's last changes are taken. A
        reader's release changes nothing (it runs outside the view lock): what a writer
        still open has changed is taken at its own release or at the next settle."""
        node = self.vol.nodes.get(ino)
        if writer and node is not None:
            self._look(node)
        held = self.kernel.remove(ino, writer)
        if writer and held.changed and node is not None:
            held.changed = False
            self.files.written(held.key)
            self.vol.touch(ino)

    def kernel_file(self, ino: InodeNo) -> str | None:
        """The path of the upper file the kernel holds for `ino` (an fsync syncs it)."""
        held = self.kernel.opens.get(ino)
        return None if held is None else self.files.path(held.key)

    def _look(self, node: Node) -> None:
        """A file the kernel writes: its size and mtime from its upper file, if moved
        (attributes only; the change is marked at the next settle)."""
        held = self.kernel.opens.get(node.ino)
        if held is None or not held.writers:
            return
        seen = self.kernel.look(held, self.files.open(held.key).fd)
        if seen is None:
            return
        size, mtime_ns = seen
        if node.attrs.nlink:
            self.vol.logical += size - node.attrs.size
        node.set(size=size, mtime_ns=mtime_ns, ctime_ns=max(mtime_ns, node.attrs.ctime_ns))

    def dropped(self, ino: InodeNo) -> None:
        self.kernel.opens.pop(ino, None)
        node = self.vol.nodes.get(ino)
        if node is not None and node.upper is not None:
            self.files.retire((ino, node.upper))
        self.spill.drop(ino)
        self.vol.dirty_bytes = self.spill.size
        self._no_upper.pop(ino, None)

    def unsaved_bytes(self, held: dict[InodeNo, int]) -> None:
        for ino, writes in self.spill.writes.items():
            held[ino] = held.get(ino, 0) + sum(len(d) for _, d in writes)
        for ino, _ in self.files.dirty | self.files.fresh:
            node = self.vol.nodes.get(ino)
            if node is not None:
                held[ino] = held.get(ino, 0) + node.attrs.size  # (its whole file: the upper's size)

    # -- flush and fold ----------------------------------------------------------------

    def add_to_flush(self, job: FlushJob | None) -> FlushJob | None:
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
            node = self.vol.nodes[ino]
            if node.upper is not None:
                targets[ino] = (self.files.path((ino, node.upper)), node.attrs.size, None)
                continue
            key = (ino, self._take_gen())
            targets[ino] = (self.files.path(key), node.attrs.size, key[1])
            cs = self.vol.chunk_size
            refs = (
                (n * cs, self.vol.chunk_ref(node, ChunkNo(n)))
                for n in range(chunkmap.n_chunks(node.attrs.size, cs))
            )
            copies[ino] = [(o, functools.partial(self.vol.repo.get, r)) for o, r in refs if r != ZERO_ID]
            row = dataclasses.replace(node, upper=key[1], base_limit=0).row(self.vol.name)
            if ino in rows:
                job.rows[rows[ino]] = row
            else:
                job.rows.append(row)
            job.cuts[ino] = ChunkNo(0)
        return SpillJob(str(self.files.folder), self.spill.capture(), targets, copies)

    def flushed(self, job: FlushJob) -> None:
        if job.files is not None:
            self.files.synced(job.files)
        if job.spilled is not None:
            self.spill.drained(job.spilled.captured)
            self.vol.dirty_bytes = self.spill.size
            for ino, (_, _, new) in job.spilled.targets.items():
                node = self.vol.nodes.get(ino)
                if new is not None and node is not None:
                    node.upper = new
                    node.base_limit = 0
                    self.vol.chunk_ids.pop(ino, None)
                    self.vol.contents.pop(ino, None)
                    self._no_upper.pop(ino, None)

    def flush_failed(self, job: FlushJob) -> None:
        """(What the job carried stays: the spill, the dirty upper files.)"""

    def sync_job(self) -> Job | None:
        return None  # (upper files are synced with the rows that name them)

    def snapshot_job(self, label: str | None) -> SnapshotJob:
        return DirFold.capture(self, label)

    def background_fold_job(self) -> Job | None:
        return None  # (a snapshot is folded when taken)

    def fold_now(self, label: str | None) -> SnapshotNo:
        self.vol.flush_sync()
        return finish(self.snapshot_job(label)).snapshot

    def closing(self) -> None:
        """The session is over: no file is the kernel's now (a release still in flight
        at the unmount never comes). A writer's last changes are taken first; its row
        exists already (its upper file was made with one), so marking it is enough."""
        for ino, held in self.kernel.writers():
            node = self.vol.nodes.get(ino)
            if node is not None:
                self._look(node)
                if held.changed:
                    self.files.written(held.key)
                    self.vol.dirty_nodes.add(ino)
        self.kernel.opens.clear()
