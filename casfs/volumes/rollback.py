"""Changing a volume's base at rest: back to one of its snapshots (rollback), or to a
new size (resize, block volumes). Either first settles what a crashed mount left."""

from __future__ import annotations

import sqlite3

from casfs.catalog import transaction
from casfs.catalog import volumes as rows
from casfs.errors import Busy, NotFound, UsageError
from casfs.ids import ChunkNo, SnapshotNo
from casfs.kinds import VolumeKind
from casfs.lifecycle.phases import VolumePhase
from casfs.refcount import figures, ledger
from casfs.repo import Repository
from casfs.store.ids import ZERO_ID, BlobId
from casfs.volumes.create import check_block_size
from casfs.volumes.info import require_at_rest, volume_row
from casfs.volumes.settle import settle


def rollback(repo: Repository, volume: str, n: SnapshotNo) -> None:
    """Make snapshot n the volume's base again (the volume must not be mounted rw).
    Changes a crashed mount left behind are kept as a snapshot first, never dropped."""
    settle(repo, volume)
    conn = repo.conn
    with transaction(conn):
        row = volume_row(conn, volume)
        read_only_mount = row.phase == VolumePhase.MOUNTED and row.mode == "ro"
        if row.phase != VolumePhase.READY and not read_only_mount:
            raise Busy(f"volume {volume!r} is {row.phase}: unmount it before rolling back")
        snap = rows.snapshot_row(conn, volume, n)
        if snap is None:
            raise NotFound(f"no snapshot {volume}@{n}")
        ledger.retain(conn, [snap.root])
        ledger.release(conn, [row.base])
        rows.set_base(conn, volume, snap.root, snap.size, snap.next_ino)
        figures.changed(conn, [f"volume:{volume}"])


def resize(repo: Repository, volume: str, size: int, allow_shrink: bool = False) -> int:
    """Set a block volume's size (at rest): growing adds holes; shrinking drops the end
    and needs allow_shrink. O(pages touched), not O(size). Returns the old size."""
    settle(repo, volume)
    with transaction(repo.conn):
        row = volume_row(repo.conn, volume)
    if row.kind != VolumeKind.BLOCK:
        raise UsageError(f"volume {volume!r} is a directory volume: only block volumes have a size to set")
    require_at_rest(row, name_holder=False)
    check_block_size(size)
    old_size, base = row.size, row.base
    if size < old_size and not allow_shrink:
        raise UsageError(
            f"shrinking {volume!r} from {old_size} to {size} bytes drops data: pass --allow-shrink"
        )
    if size == old_size:
        return int(old_size)
    from casfs.snapshots import chunkmap  # (resize only: not every command's start-up)

    cmap = chunkmap.ChunkMap(repo.get_meta, base)
    cs = cmap.chunk_size
    with repo.batch() as batch:
        changes: dict[ChunkNo, BlobId] = {}
        tail = size % cs
        if size < old_size and tail:
            # The cut chunk keeps only the bytes below the new end, so growing back reads zeros.
            last = ChunkNo(size // cs)
            cid = cmap.chunk(last)
            if cid != ZERO_ID:
                changes[last] = batch.put(repo.get(cid)[:tail])
        new_base = cmap.rewrite(batch.put_kind, changes, size)

        def swap(conn: sqlite3.Connection) -> None:
            now = volume_row(conn, volume)
            if now.phase != VolumePhase.READY or now.base != base:
                raise Busy(f"volume {volume!r} changed while resizing; try again")
            ledger.release(conn, [base])
            rows.set_base(conn, volume, new_base, size)
            figures.changed(conn, [f"volume:{volume}"])

        batch.commit({new_base: 1}, then=swap)
    return int(old_size)
