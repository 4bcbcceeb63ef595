"""The oldest frozen epoch of a block volume folded into blobs over the base, in the
background: it reads only what no one writes any more, so writes go on meanwhile into
the epoch above it (the view is not frozen; the session takes the lock to apply)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING

from casfs.catalog import overlay
from casfs.catalog import volumes as rows
from casfs.ids import ROOT_INO, InodeNo
from casfs.lifecycle.faults import fault_point
from casfs.refcount import figures, ledger
from casfs.snapshots import chunkmap
from casfs.store.ids import ZERO_ID, BlobId
from casfs.vfs.overlay.nodes import NO_LIMIT
from casfs.vfs.overlay.stack import Frozen
from casfs.vfs.rw.jobs.puts import put_all, upper_chunks

if TYPE_CHECKING:
    from casfs.vfs.rw.blockkind import BlockKind


@dataclass
class FrozenFold:
    kind: BlockKind
    frozen: Frozen
    base: BlobId
    size: int
    next_ino: InodeNo
    new_root: BlobId = ZERO_ID
    what: str = "fold"
    slot: bool = True
    stored_bytes: int = 0

    @staticmethod
    def capture(kind: BlockKind) -> FrozenFold | None:
        """The oldest frozen epoch, unless none is waiting or one is folding."""
        if not kind.uppers.frozen or kind.folding:
            return None
        kind.folding = True
        vol = kind.vol
        return FrozenFold(kind, kind.uppers.frozen[0], vol.base, kind.volume_size, vol.next_ino)

    def run(self) -> None:
        """Store the epoch's chunks, then in one transaction add its snapshot (the
        number and time it was taken with), make it the base and forget the epoch; its
        files go after the commit."""
        repo, volume = self.kind.vol.repo, self.kind.vol.name
        upper, frozen = self.frozen.upper, self.frozen
        with repo.batch() as batch:
            cmap = chunkmap.ChunkMap(repo.get_meta, self.base)
            changes = put_all(batch, upper_chunks(repo, cmap, {}, upper, self.size))
            self.new_root = cmap.rewrite(batch.put_kind, changes, self.size)
            fault_point("fold:before-publish")

            def publish(conn: sqlite3.Connection) -> None:
                taken = (frozen.snapshot, frozen.taken)
                rows.add_snapshot(conn, volume, self.new_root, self.size, self.next_ino, frozen.label, taken)
                ledger.retain(conn, [self.new_root, self.new_root])  # the snapshot's and the base's
                ledger.release(conn, [self.base])
                rows.set_base(conn, volume, self.new_root, self.size, self.next_ino)
                overlay.drop_upper(conn, volume, upper.epoch)
                stored, shared = batch.stored_bytes, batch.shared
                figures.folded(conn, volume, frozen.snapshot, self.base, self.new_root, stored, shared)

            batch.commit(then=publish)
            self.stored_bytes = batch.stored_bytes
        fault_point("fold:after-publish")
        upper.delete()

    def apply(self) -> None:
        kind, vol = self.kind, self.kind.vol
        kind.folding = False
        assert kind.uppers.frozen and kind.uppers.frozen[0] is self.frozen
        kind.uppers.frozen.pop(0)
        vol.base = self.new_root
        root = vol.nodes[ROOT_INO]
        root.base, root.base_limit = self.new_root, NO_LIMIT
        vol.contents.clear()
        kind.folded()
        kind.recount()

    def abort(self) -> None:
        self.kind.folding = False
