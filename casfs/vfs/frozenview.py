"""A snapshot of a block volume taken while mounted, read before its fold commits: its
frozen epochs (casfs.vfs.overlay.upper files, oldest first) over the base it was taken
on, read-only, in a whole-store mount's snapshots/VOLUME/N.

Safe from any process, the one writing the volume or another: a frozen epoch's files
are never written again (writes go to the epoch above), and they are deleted only after
the transaction of the fold that stores them as blobs, so a view that opened them reads
the same bytes to the end. Opening races that deletion: a missing file means the fold
committed, and the catalog is read again (the snapshot is stored now).

Once its fold committed (each read looks, and the daemon's fold timer, one fstat: the
oldest epoch's file is unlinked), the view reads the stored snapshot instead, bytes
identical, and lets the epochs' files go: their disk space comes back, and nothing is
read from a base that gc may free once no snapshot keeps it.
"""

from __future__ import annotations

import errno
import stat
import time

from casfs.catalog import overlay, read_transaction
from casfs.catalog.volumes import snapshot_row, volume_row
from casfs.ids import ChunkNo, InodeNo, SnapshotNo
from casfs.repo import Repository
from casfs.snapshots.chunkmap import ChunkMap
from casfs.store.ids import ZERO_ID, BlobId
from casfs.vfs.api import ROOT_INO, ReadPiece, Stat
from casfs.vfs.blockview import BlockView, OneFile, allocated_blocks
from casfs.vfs.overlay.stack import Frozen, UpperStack
from casfs.vfs.overlay.upper import BLOCK, Upper

_OPEN_TRIES = 5  # catalog reads when each found an epoch already deleted


class FrozenBlockView(OneFile):
    immutable = True  # the same bytes before, during and after the fold

    def __init__(self, repo: Repository, volume: str, n: SnapshotNo, label: str) -> None:
        self.repo, self.volume, self.n, self.label = repo, volume, n, label
        self.stored: BlockView | None = None  # once folded: the snapshot as stored
        self._stack = UpperStack()
        self._below: ChunkMap | None = None
        self._size = self._chunk_size = 0
        self._gone = False
        if not self._load():
            raise FileNotFoundError(errno.ENOENT, f"no snapshot {volume}@{n}")
        self._stat = self._make_stat()

    @classmethod
    def open(cls, repo: Repository, volume: str, n: SnapshotNo, label: str) -> FrozenBlockView | None:
        """The view, or None if the snapshot is neither frozen nor stored (gone)."""
        try:
            return cls(repo, volume, n, label)
        except FileNotFoundError:
            return None

    def _load(self) -> bool:
        """Read the catalog: the stored snapshot, else its frozen epochs, opened.
        False: the snapshot is gone (removed after its fold)."""
        conn = self.repo.conn
        for _ in range(_OPEN_TRIES):
            with read_transaction(conn):
                snap = snapshot_row(conn, self.volume, self.n)
                frozen = overlay.frozen_under(conn, self.volume, self.n) if snap is None else []
                row = volume_row(conn, self.volume)
            if snap is not None:
                mtime_ns = int(snap.created * 1e9)
                self.stored = BlockView(self.repo, snap.root, mtime_ns=mtime_ns, label=self.label)
                self._stack, self._below = UpperStack(), None  # (their files close when unread)
                return True
            if not frozen or row is None:
                return False
            base, size = row.base, row.size
            try:
                layers = [
                    Frozen(
                        Upper.open(self.repo.path, self.volume, u.epoch, size, writable=False),
                        taken_as,
                        u.label,
                        u.taken or 0.0,
                    )
                    for u in frozen
                    if (taken_as := u.snapshot) is not None
                ]
            except FileNotFoundError:
                continue  # a fold committed meanwhile: read again
            self._stack = UpperStack(frozen=layers)
            self._below = ChunkMap(self.repo.get_meta, base) if base != ZERO_ID else None
            self._size, self._chunk_size = size, row.chunk_size
            self._taken = frozen[-1].taken or time.time()
            return True
        raise OSError(errno.EIO, f"the frozen epochs of {self.volume}@{self.n} keep vanishing")

    def _make_stat(self) -> Stat:
        if self.stored is not None:
            return self.stored.getattr(ROOT_INO)
        cs = self._chunk_size
        chunks = set(self._stack.chunks(cs // BLOCK))
        if self._below is not None:
            chunks.update(self._below.data_chunks())
        mtime_ns = int(self._taken * 1e9)
        return Stat(
            ino=ROOT_INO,
            mode=stat.S_IFREG | 0o444,
            nlink=1,
            uid=0,
            gid=0,
            size=self._size,
            blocks=allocated_blocks(sorted(chunks), self._size, cs),
            atime_ns=mtime_ns,
            mtime_ns=mtime_ns,
            ctime_ns=mtime_ns,
        )

    def check_folded(self) -> bool:
        """Read the stored snapshot once the fold committed (its oldest epoch is gone);
        whether the snapshot is no longer frozen (stored, or removed since: the epochs
        stay open then, for the reads of the files the kernel holds)."""
        if self.stored is None and not self._gone and self._stack.frozen[0].upper.deleted():
            # (stored now, or the next epoch's fold is still to commit)
            self._gone = not self._load()
        return self.stored is not None or self._gone

    def _below_chunk(self, n: ChunkNo) -> BlobId:
        return self._below.chunk(n) if self._below is not None else ZERO_ID

    # -- View --------------------------------------------------------------------

    def getattr(self, ino: InodeNo) -> Stat:
        self._check(ino)
        return self._stat  # (kept across the fold: what was shown stays)

    def read_plan(self, ino: InodeNo, offset: int, size: int) -> list[ReadPiece]:
        self._check(ino)
        self.check_folded()
        if self.stored is not None:
            return self.stored.read_plan(ino, offset, size)
        return self._stack.plan(self._below_chunk, self._size, self._chunk_size, offset, size)

    def describe(self, ino: InodeNo) -> str:
        return self.label
