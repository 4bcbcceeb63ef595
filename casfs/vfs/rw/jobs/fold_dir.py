"""A directory volume's snapshot: its overlay folded into new tree and map blobs (the
materialized directories, bottom-up; an unmaterialized directory's subtree is
provably unchanged and keeps its blob), snapshot n+1 and the new base in one
transaction; the upper files now in blobs are deleted after it commits."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from casfs.catalog import overlay
from casfs.ids import ChunkNo, InodeNo, SnapshotNo
from casfs.kinds import BlobKind
from casfs.refcount import ledger
from casfs.repo import Repository
from casfs.snapshots import chunkmap
from casfs.snapshots.tree import Entry, Tree, dir_entry
from casfs.store.ids import ZERO_ID, BlobId
from casfs.vfs.api import ROOT_INO
from casfs.vfs.overlay.files import FileUppers, Key
from casfs.vfs.overlay.nodes import NO_LIMIT, Node
from casfs.vfs.rw.jobs.fold import OverlayFold
from casfs.vfs.rw.jobs.puts import publish_fold, put_all

if TYPE_CHECKING:
    from casfs.vfs.rw.dirkind import DirKind


@dataclass
class DirFold:
    fold: OverlayFold
    kind: DirKind
    files: FileUppers
    chunk_size: int
    folded_files: list[Key] = field(default_factory=list)  # upper files now in blobs
    # Upper files the kernel holds open (passthrough): folded, but kept as the files'
    # content (the kernel goes on reading and writing them), named again at the next flush.
    kept: set[Key] = field(default_factory=set)
    what: str = "snapshot"
    slot: bool = True
    stored_bytes: int = 0

    @staticmethod
    def capture(kind: DirKind, label: str | None) -> DirFold:
        kept = kind.kernel.keys()
        return DirFold(OverlayFold.capture(kind.vol, label), kind, kind.files, kind.vol.chunk_size, kept=kept)

    @property
    def snapshot(self) -> SnapshotNo:
        return self.fold.snapshot

    def run(self) -> None:
        fold, vol = self.fold, self.fold.vol
        with vol.repo.batch() as batch:
            folder = _Folder(vol.repo, batch, self)
            folder.store_uppers()
            fold.new_root = folder.fold_dir(ROOT_INO) if ROOT_INO in fold.rows else fold.base
            fold.snapshot = publish_fold(
                batch, vol.name, fold.base, fold.next_ino, fold.new_root, fold.logical, fold.label
            )
            self.stored_bytes = batch.stored_bytes
        self.files.unlink(self.folded_files)  # (after the commit: now in blobs)

    def apply(self) -> None:
        for ino, gen in self.folded_files:
            node = self.fold.vol.nodes.get(ino)
            if node is not None and node.upper == gen:
                node.upper = None
        self.files.folded(self.folded_files)
        self.fold.applied()
        vol = self.fold.vol
        for key in self.kept:
            node = vol.nodes.get(key[0])
            if node is not None and node.upper == key[1] and node.attrs.nlink:
                self.files.adopt(key)  # (no committed row names it now)
                vol.touch(key[0])

    def abort(self) -> None:
        self.fold.aborted()


class _Folder:
    """Builds the new tree bottom-up from the materialized directories."""

    def __init__(self, repo: Repository, batch: ledger.Batch, job: DirFold) -> None:
        self.repo = repo
        self.batch = batch
        self.cs = job.chunk_size
        self.job = job
        self.fold = job.fold
        self._upper_ids: dict[tuple[InodeNo, int, ChunkNo], BlobId] = {}

    def store_uppers(self) -> None:
        """Every upper file's chunks, stored at once before the walk: one pool keeps
        both cores busy across files (most are a chunk or two, too few to share)."""
        files = self.job.files
        rows = self.fold.rows.values()
        keys = [(n.ino, n.upper) for n in rows if n.is_file and n.upper is not None and n.attrs.nlink]
        sizes = {ino: self.fold.rows[ino].attrs.size for ino, _ in keys}

        def chunks() -> Iterator[tuple[tuple[InodeNo, int, ChunkNo], bytes]]:
            for ino, gen in keys:
                with open(files.path((ino, gen)), "rb", buffering=0) as f:
                    for n, data in _UpperReader(f.fileno(), sizes[ino], self.cs).chunks():
                        yield (ino, gen, n), data

        self._upper_ids = put_all(self.batch, chunks())

    def fold_dir(self, ino: InodeNo) -> BlobId:
        node = self.fold.rows[ino]
        if node.listing is None:
            # Copied up with its parent, never entered: same entries, maybe new attrs.
            tree = Tree.decode(self.repo.get_meta(node.base))
            tree.attrs = node.tree_attrs()
        else:
            entries = [self._entry(ino, name, child) for name, (_, child) in node.listing.entries.items()]
            tree = Tree(node.tree_attrs(), self.cs, entries)
        bid = self.batch.put(tree.encode(), BlobKind.TREE)
        self.fold.bases[ino] = bid
        return bid

    def _entry(self, parent: InodeNo, name: bytes, ino: InodeNo) -> Entry:
        node = self.fold.rows[ino]
        self.fold.parents[ino] = parent
        if node.is_dir:
            return dir_entry(name, node.attrs.mode, ino, self.fold_dir(ino))
        if node.is_file:
            content = self._content(node)
            self.fold.bases[ino] = content
            return Entry(name, node.tree_attrs(), content)
        return Entry(name, node.tree_attrs(), node.target if stat.S_ISLNK(node.attrs.mode) else b"")

    def _content(self, node: Node) -> BlobId:
        if node.upper is not None:
            return self._upper_content(node, node.upper)
        changes = dict(self.fold.chunk_ids.get(node.ino, {}))
        count = chunkmap.n_chunks(node.attrs.size, self.cs)
        for n in map(ChunkNo, range(min(node.base_limit, count), count)):
            changes.setdefault(n, ZERO_ID)
        if node.base == ZERO_ID:
            ids = [changes.get(ChunkNo(n), ZERO_ID) for n in range(count)]
            return chunkmap.build_content(self.batch.put_kind, ids, node.attrs.size, self.cs)
        mapped = overlay.blob_kind(self.repo.conn, node.base) == BlobKind.MAP_ROOT
        content = chunkmap.Content(self.repo.get_meta, node.base, node.attrs.size, self.cs, mapped)
        # Unchanged content keeps its id, unless a truncate cut it (base_limit): the old
        # id still names the bytes past the cut, which a later grow would bring back.
        uncut = node.base_limit >= NO_LIMIT
        if not changes and uncut and mapped == chunkmap.is_mapped(node.base, node.attrs.size, self.cs):
            return node.base
        return content.rewrite(self.batch.put_kind, changes, node.attrs.size)

    def _upper_content(self, node: Node, gen: int) -> BlobId:
        """A file whose content is its upper file: its chunks holding data stored as
        blobs (holes read nothing), then its map."""
        size, cs = node.attrs.size, self.cs
        ids = [
            self._upper_ids.get((node.ino, gen, ChunkNo(n)), ZERO_ID)
            for n in range(chunkmap.n_chunks(size, cs))
        ]
        if (node.ino, gen) not in self.job.kept:
            self.job.folded_files.append((node.ino, gen))
        return chunkmap.build_content(self.batch.put_kind, ids, size, cs)


@dataclass
class _UpperReader:
    """The chunks of an upper file that hold data, in canonical form (whole, or to the
    end of the file for the last: equal data dedups with what an import stores)."""

    fd: int
    size: int
    chunk_size: int

    def chunks(self) -> Iterator[tuple[ChunkNo, bytes]]:
        cs = self.chunk_size
        last = -1
        for start, end in _data_ranges(self.fd, self.size):
            for n in range(max(start // cs, last + 1), -(-end // cs)):
                want = min(cs, self.size - n * cs)
                data = os.pread(self.fd, want, n * cs)
                yield ChunkNo(n), data + bytes(want - len(data))
                last = n


def _data_ranges(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """[start, end) of each run of data below `size` (SEEK_DATA/SEEK_HOLE: a sparse
    file folds in time for what it holds, not for its size)."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:  # ENXIO: no data past pos
            return
        if start >= size:
            return
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        yield start, end
        pos = end
