"""A block volume's upper epochs as one stack: the frozen ones (each a snapshot taken
and not yet folded into blobs, oldest first) under the one writes go to. A block's
current bytes are in the newest epoch that has it, else below them all (the base).

Owned by the view (casfs.vfs.rw.blockkind), read by its background fold; a whole-store
mount reads a snapshot not yet folded through a stack of its own (casfs.vfs.frozenview).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from casfs.ids import ChunkNo, SnapshotNo
from casfs.store.ids import BlobId
from casfs.vfs.api import ReadPiece
from casfs.vfs.overlay.upper import BLOCK, Upper
from casfs.vfs.plan import chunk_spans


@dataclass
class Frozen:
    """An epoch frozen as snapshot `snapshot` (the catalog's uppers row says so)."""

    upper: Upper
    snapshot: SnapshotNo
    label: str | None
    taken: float


@dataclass
class UpperStack:
    active: Upper | None = None
    frozen: list[Frozen] = field(default_factory=list)  # oldest first

    def layers(self) -> list[Upper]:
        """Newest first: the order a block is looked up in."""
        out = [f.upper for f in reversed(self.frozen)]
        return out if self.active is None else [self.active, *out]

    def __bool__(self) -> bool:
        return self.active is not None or bool(self.frozen)

    def owner(self, block: int) -> Upper | None:
        """The epoch holding the block's current bytes, None: below every epoch."""
        for upper in self.layers():
            if upper.present(block):
                return upper
        return None

    def runs(self, first: int, count: int) -> list[tuple[int, int, Upper | None]]:
        """Blocks [first, first + count) as runs (start, stop, owner), offsets relative
        to first; one run with owner None when no epoch has any of them."""
        layers = [(u, m) for u in self.layers() if (m := u.mask(first, count))]
        if not layers:
            return [(0, count, None)]
        if layers[0][1] == (1 << count) - 1:  # the newest holding any holds them all
            return [(0, count, layers[0][0])]
        out: list[tuple[int, int, Upper | None]] = []
        for i in range(count):
            owner = next((u for u, m in layers if m >> i & 1), None)
            if out and out[-1][2] is owner:
                out[-1] = (out[-1][0], i + 1, owner)
            else:
                out.append((i, i + 1, owner))
        return out

    def any_in(self, first: int, count: int) -> bool:
        return any(u.any_in(first, count) for u in self.layers())

    def chunks(self, blocks_per_chunk: int) -> list[int]:
        """Chunks any epoch touches, ascending."""
        found: set[int] = set()
        for upper in self.layers():
            found.update(upper.chunks(blocks_per_chunk))
        return sorted(found)

    def plan(
        self, below: Callable[[ChunkNo], BlobId], disk_size: int, cs: int, offset: int, size: int
    ) -> list[ReadPiece]:
        """The pieces of a read of the disk: each block from the newest epoch holding
        it (read when the reply is assembled), else from chunk `below(n)`."""
        per = cs // BLOCK
        pieces = []
        for n, start, stop in chunk_spans(offset, min(offset + size, disk_size), cs):
            # Only the blocks the read covers (a 4 KiB read asks one epoch about one block).
            b0 = start // BLOCK
            for first, last, owner in self.runs(n * per + b0, -(-stop // BLOCK) - b0):
                lo, hi = max(start, (b0 + first) * BLOCK), min(stop, (b0 + last) * BLOCK)
                if owner is None:
                    pieces.append(ReadPiece(lo, hi, blob=below(n)))
                else:
                    read = functools.partial(owner.pread, n * cs + lo, hi - lo)
                    pieces.append(ReadPiece(0, hi - lo, read=read))
        return pieces
