"""What a volume kind adds to the read/write volume's core (casfs.vfs.rw.volume).

Two kinds: casfs.vfs.rw.dirkind.DirKind (a tree: names, copy-up, hardlinks, file
uppers, spill) and casfs.vfs.rw.blockkind.BlockKind (one file: the upper stack and its
epochs). The core holds one and calls it for everything that differs; a kind holds
its core (`vol`) for the shared state. Neither inherits from anything of the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from casfs.ids import InodeNo, SnapshotNo
from casfs.kinds import VolumeKind
from casfs.snapshots import chunkmap
from casfs.vfs.api import Fetched, Job, ReadPiece, SnapshotJob
from casfs.vfs.overlay.nodes import Node

if TYPE_CHECKING:
    from casfs.vfs.rw.jobs.flush import FlushJob
    from casfs.vfs.rw.names import DirNames


class Kind(Protocol):
    """What a volume kind adds to the core. Made with the core it belongs to; `load`
    runs once the core has read its overlay rows."""

    volume_kind: VolumeKind
    fixed_size: bool  # one regular file (ROOT_INO) whose size writes never change
    atime: bool  # reads move atime (relatime)

    @property
    def namespace(self) -> DirNames | None:
        """The namespace (None: no names, the volume is one file)."""
        ...

    def load(self) -> None: ...

    def base_root(self, size: int) -> Node:
        """The root inode as the base has it (no overlay row)."""
        ...

    def content(self, node: Node) -> chunkmap.Content | chunkmap.ChunkMap:
        """A file's base content, to find its base chunks."""
        ...

    def copy_up(self, ino: InodeNo) -> None:
        """Give a changing inode an overlay row (a directory volume copies its parents up)."""
        ...

    def path_of(self, ino: InodeNo) -> str:
        """A path naming the inode now, or <inode N> if it has none (unlinked)."""
        ...

    def on_claim(self) -> None:
        """The view has just claimed its volume (ensure_writable)."""
        ...

    def plan(self, node: Node, offset: int, size: int) -> list[ReadPiece]: ...

    def write_at(self, node: Node, offset: int, data: bytes, fetched: Fetched | None) -> int: ...

    def resize(self, node: Node, size: int, fetched: Fetched) -> None:
        """Cut or extend a file, or refuse a size change the kind does not allow."""
        ...

    def blocks(self, node: Node) -> int:
        """A file's 512-byte blocks allocated (called before its attributes are read)."""
        ...

    def settle(self) -> None:
        """Bring the nodes' attributes up to date (before they are read or written out)."""
        ...

    def dropped(self, ino: InodeNo) -> None:
        """An inode left memory and the overlay (unlinked and forgotten)."""
        ...

    def unsaved_bytes(self, held: dict[InodeNo, int]) -> None:
        """Add to `held` the bytes not yet committed, per inode."""
        ...

    def add_to_flush(self, job: FlushJob | None) -> FlushJob | None:
        """Add what the kind makes durable to a flush of the rows (or make one)."""
        ...

    def flushed(self, job: FlushJob) -> None: ...

    def flush_failed(self, job: FlushJob) -> None: ...

    def sync_job(self) -> Job | None: ...

    def snapshot_job(self, label: str | None) -> SnapshotJob: ...

    def background_fold_job(self) -> Job | None: ...

    def fold_now(self, label: str | None) -> SnapshotNo: ...

    def closing(self) -> None:
        """Before a claimed view's last flush (close)."""
        ...

    def folded(self) -> None:
        """Forget what described the old base."""
        ...

    @property
    def volume_size(self) -> int: ...
