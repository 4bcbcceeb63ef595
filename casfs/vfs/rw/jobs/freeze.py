"""A block volume's O(1) snapshot: the written epoch frozen as the next snapshot, in one
catalog transaction (frozen_fold.py folds it into blobs later, beside writes).

Prepared right after a flush, unless chunks an older casfs flushed changed the disk
too (then the snapshot is a fold: fold_block.py). Nothing written since the last
snapshot: an empty epoch is frozen, so this snapshot too is O(1) instead of a fold that
would wait for the ones queued before it. The disk file's own attributes are no part
of a snapshot (its root is a chunk map): their row, flushed, stays over the freeze and
the fold that follows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from casfs.catalog import overlay, transaction
from casfs.ids import ROOT_INO, SnapshotNo
from casfs.vfs.overlay.stack import Frozen
from casfs.vfs.overlay.upper import Sync, Upper
from casfs.vfs.rw.jobs.puts import NOT_YET

if TYPE_CHECKING:
    from casfs.vfs.rw.blockkind import BlockKind


@dataclass
class Freeze:
    kind: BlockKind
    epoch: int
    label: str | None
    # An epoch made for this snapshot, nothing written to it (the volume is unchanged
    # since the last one): its files made durable and named here, then frozen.
    new: tuple[Upper, Sync] | None = None
    root: tuple[object, ...] | None = None  # the disk file's row, rewritten with the freeze
    snapshot: SnapshotNo = NOT_YET  # given out by run()
    taken: float = 0.0  # the time run() recorded (its fold stores the snapshot with it)
    what: str = "snapshot"
    slot: bool = False
    stored_bytes: int = 0

    @staticmethod
    def capture(kind: BlockKind, label: str | None) -> Freeze | None:
        """None: the kind cannot freeze now (a fold instead)."""
        vol = kind.vol
        if vol.chunk_ids:
            return None
        new = None
        if kind.uppers.active is None:
            active = kind.writable_upper()
            first = active.capture()
            assert first is not None and first.first  # (a new epoch: its files to name)
            new = (active, first)
        else:
            active = kind.uppers.active
            if active.dirty:
                return None
        vol.freeze()
        root = vol.nodes[ROOT_INO].row(vol.name) if kind.row_stale() else None
        return Freeze(kind, active.epoch, label, new=new, root=root)

    def run(self) -> None:
        if self.new is not None:
            upper, first = self.new
            upper.sync(first)
        vol = self.kind.vol
        with transaction(vol.repo.conn) as conn:
            if self.new is not None:
                overlay.add_upper(conn, vol.name, self.epoch)
            if self.root is not None:
                overlay.put_inodes(conn, [self.root])
            self.taken = time.time()
            self.snapshot = overlay.freeze_upper(conn, vol.name, self.epoch, self.label, self.taken)

    def apply(self) -> None:
        kind, vol = self.kind, self.kind.vol
        vol.frozen = False
        active = kind.uppers.active
        assert active is not None and active.epoch == self.epoch
        if self.new is not None:
            active.synced(self.new[1])
        if self.root is not None:
            kind.row_mtime = vol.nodes[ROOT_INO].attrs.mtime_ns
        kind.uppers.frozen.append(Frozen(active, self.snapshot, self.label, self.taken))
        kind.uppers.active = None
        vol.overlay.discard(ROOT_INO)  # (what it held is the frozen epoch's now)
        vol.thaw()

    def abort(self) -> None:
        if self.new is not None and self.kind.uppers.active is not None:
            self.kind.uppers.active.failed(self.new[1])  # (the next flush names the empty epoch)
        self.kind.vol.thaw()
