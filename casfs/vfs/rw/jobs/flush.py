"""A flush: every change not yet committed, made durable (fsync covers all).

Captured without clearing anything (a change stays dirty until a flush that contains
it has committed); run() makes the kind's data durable first (a directory volume's
upper files and spilled writes, a block volume's upper file), then writes the overlay
rows in one transaction; apply() clears what the job carried, abort() changes nothing,
so the next flush retries it all. The catalog writes are idempotent: a retry is safe.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from casfs.catalog import overlay, transaction
from casfs.ids import ChunkNo, InodeNo
from casfs.vfs.overlay.files import FileSync
from casfs.vfs.overlay.spill import SpillJob
from casfs.vfs.overlay.upper import Sync, Upper
from casfs.vfs.rw.jobs.puts import delete_inode_rows

if TYPE_CHECKING:
    from casfs.vfs.rw.volume import RwVolume


@dataclass
class FlushJob:
    vol: RwVolume
    rows: list[tuple[object, ...]]
    deleted: list[InodeNo]
    cuts: dict[InodeNo, ChunkNo]
    next_ino: InodeNo
    logical: int
    inos: set[InodeNo] = field(default_factory=set)  # the dirty inodes it carries (rows, or gone)
    # Directory entries: only the changed ones, or every entry of a `whole_dirs` listing.
    listings: list[InodeNo] = field(default_factory=list)  # directories whose entries it writes
    whole_dirs: list[InodeNo] = field(default_factory=list)
    entries: list[tuple[InodeNo, bytes, int, InodeNo]] = field(default_factory=list)  # dir, name, cookie, ino
    gone: list[tuple[InodeNo, bytes]] = field(default_factory=list)  # dir, name
    upper: tuple[Upper, Sync] | None = None  # a block volume's upper file to make durable
    files: FileSync | None = None  # a directory volume's upper files to make durable
    spilled: SpillJob | None = None  # writes a directory volume kept in memory, to store
    what: str = "flush"
    slot: bool = False
    stored_bytes: int = 0

    @staticmethod
    def capture(vol: RwVolume, always: bool = False) -> FlushJob | None:
        """The dirty rows of `vol` (None: none, unless `always`)."""
        if not (always or vol.dirty_nodes or vol.deleted or vol.cuts):
            return None
        inos = sorted(i for i in vol.dirty_nodes if i in vol.nodes)
        node_rows = [vol.nodes[i].row(vol.name) for i in inos]
        job = FlushJob(vol, node_rows, sorted(vol.deleted), dict(vol.cuts), vol.next_ino, vol.logical)
        job.inos = set(vol.dirty_nodes)
        for ino in inos:  # a changed listing's directory is always dirty (touch of the parent)
            listing = vol.nodes[ino].listing
            if listing is not None:
                whole, present, gone = listing.pending()
                job.listings.append(ino)
                if whole:
                    job.whole_dirs.append(ino)
                job.entries += [(ino, name, cookie, child) for name, cookie, child in present]
                job.gone += [(ino, name) for name in gone]
        return job

    @property
    def has_rows(self) -> bool:
        """Whether it changes catalog rows (a block volume's sync alone does not)."""
        return bool(self.rows or self.deleted or self.cuts or self.listings)

    def run(self) -> None:
        if self.spilled is not None:
            self.spilled.run()
        if self.files is not None:
            self.files.sync()  # the data before the rows that name it
        if self.upper is not None:
            upper, sync = self.upper
            upper.sync(sync)
            if sync.first:
                with transaction(self.vol.repo.conn) as conn:
                    overlay.add_upper(conn, self.vol.name, upper.epoch)
        if self.has_rows or self.upper is None:  # (a block volume's sync alone writes no row)
            self._write_rows()
        if self.files is not None:
            self.files.after_commit()

    def _write_rows(self) -> None:
        """The rows in one transaction. No blob is stored (file data is in upper files,
        durable before this): it still commits while the store refuses new blobs."""
        name = self.vol.name
        with transaction(self.vol.repo.conn) as conn:  # (releases only: no lock against gc needed)
            for ino in self.deleted:
                delete_inode_rows(conn, name, ino)
            for ino, cut in self.cuts.items():
                if ino not in self.deleted:
                    delete_inode_rows(conn, name, ino, from_chunk=cut)
            overlay.put_inodes(conn, self.rows)
            overlay.put_entries(conn, name, self.whole_dirs, self.gone, self.entries)
            overlay.flushed(conn, name, self.next_ino, self.logical)

    def apply(self) -> None:
        """The job committed: what it carried is clean, unless changed again since."""
        vol = self.vol
        vol.kind.flushed(self)
        vol.frozen = False
        vol.dirty_nodes -= self.inos
        for ino in self.listings:
            node = vol.nodes.get(ino)
            if node is not None and node.listing is not None:
                node.listing.committed()
        vol.deleted.difference_update(self.deleted)
        for ino, cut in self.cuts.items():
            if vol.cuts.get(ino) == cut:
                del vol.cuts[ino]
        still = vol.dirty_nodes or vol.deleted or (self.upper is not None and self.upper[0].dirty)
        vol.dirty_since = time.monotonic() if still else None
        vol.thaw()

    def abort(self) -> None:
        """The job failed: everything it carried is still dirty (the next flush retries).
        The age clock restarts, so the timer retries after the dirty age, not every tick."""
        self.vol.kind.flush_failed(self)
        self.vol.dirty_since = time.monotonic()
        self.vol.thaw()
