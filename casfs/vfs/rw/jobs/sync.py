"""A sync of a block volume's written upper file alone, that writes go on beside.

Prepared only when nothing else is to flush and the catalog names the epoch already
(not its first sync): its run touches only the epoch's files, so the view is not
frozen and the session lets go of the lock while it runs. Writes meanwhile set bits
the captured map pages do not carry, and a block's bit is written only after its
data's fdatasync: each block reads back old or new. Syncs run one at a time, in the
order they capture (casfs.fuse.rwsession.flush): a later page written before an
earlier one would lose bits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from casfs.vfs.overlay.upper import Sync, Upper

if TYPE_CHECKING:
    from casfs.vfs.rw.volume import RwVolume


@dataclass
class SyncJob:
    vol: RwVolume
    upper: Upper
    sync: Sync
    what: str = "sync"
    slot: bool = False
    stored_bytes: int = 0

    def run(self) -> None:
        """A worker thread, without the view's lock: the epoch's files only."""
        self.upper.sync(self.sync)

    def apply(self) -> None:
        self.upper.synced(self.sync)
        vol = self.vol
        vol.dirty_since = time.monotonic() if self.upper.dirty or vol.dirty_nodes or vol.deleted else None

    def abort(self) -> None:
        self.upper.failed(self.sync)
        self.vol.dirty_since = time.monotonic()  # (retried after the dirty age, as a failed flush)
