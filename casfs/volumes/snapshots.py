"""Snapshots of volumes at rest: create (settling a crashed mount's overlay first),
list, delete, and the at-rest snapshot of a volume a daemon holds but does not write."""

from __future__ import annotations

import os
import sqlite3

from casfs.catalog import overlay as overlay_rows
from casfs.catalog import transaction
from casfs.catalog import volumes as rows
from casfs.errors import Busy, NotFound
from casfs.ids import InodeNo, SnapshotNo
from casfs.lifecycle.phases import VolumePhase
from casfs.refcount import figures, ledger
from casfs.repo import Repository
from casfs.store.ids import BlobId
from casfs.units import parse_snapshot_ref
from casfs.volumes.info import SnapshotInfo, get_volume, require_at_rest, volume_row
from casfs.volumes.settle import settle, wait_folded


def record_snapshot(
    conn: sqlite3.Connection, volume: str, root: BlobId, size: int, next_ino: InodeNo, label: str | None
) -> SnapshotNo:
    """Add snapshot n+1 of `volume` with `root` (inside the caller's transaction): one
    reference on the root, whatever the volume's size."""
    ledger.retain(conn, [root])
    n = rows.add_snapshot(conn, volume, root, size, next_ino, label)
    figures.snapshot_taken(conn, volume, n, root)
    return n


def create_snapshot(repo: Repository, volume: str, label: str | None = None) -> SnapshotNo:
    """Snapshot a volume at rest: its base (with any overlay a crash left) becomes snapshot n+1."""
    settled = settle(repo, volume, label)
    if settled is not None:
        return settled
    conn = repo.conn
    with transaction(conn):
        row = volume_row(conn, volume)
        require_at_rest(row)
        return record_snapshot(conn, volume, row.base, row.size, row.next_ino, label)


def list_snapshots(repo: Repository, volume: str) -> list[SnapshotInfo]:
    """Stored snapshots, and those taken while mounted whose fold has not committed
    yet (folded False: no root yet; reading one waits for its fold)."""
    info = get_volume(repo, volume)
    out = [
        SnapshotInfo(volume, s.n, s.root.hex(), s.size, s.label, s.created)
        for s in rows.snapshot_rows(repo.conn, volume)
    ]
    for u in overlay_rows.uppers(repo.conn, volume):
        if u.snapshot is not None:
            out.append(SnapshotInfo(volume, u.snapshot, "", info.size, u.label, u.taken or 0.0, folded=False))
    return sorted(out, key=lambda s: s.n)


def removal_refusal(conn: sqlite3.Connection, volume: str, n: SnapshotNo) -> str | None:
    """Why snapshot `volume@n` may not be removed now (None: it may): another volume is
    made from it (a clone holds its root as its origin)."""
    users = [v for v in rows.made_from(conn, f"snapshot:{volume}@{n}") if v != volume]
    if users:
        return f"snapshot {volume}@{n} is in use by volume(s): {', '.join(users)}"
    return None


def drop_snapshot(conn: sqlite3.Connection, volume: str, n: SnapshotNo) -> None:
    """Remove a stored snapshot (inside the caller's transaction, its refusal checked):
    its root's reference released, its number and root kept as a bookmark."""
    snap = rows.snapshot_row(conn, volume, n)
    assert snap is not None
    ledger.release(conn, [snap.root])
    rows.delete_snapshot(conn, volume, n)
    rows.add_bookmark(conn, volume, n, snap.root, snap.created)
    figures.snapshot_removed(conn, volume, n, snap.root)


def remove_snapshot(repo: Repository, ref: str, if_exists: bool = False) -> bool:
    volume, n = parse_snapshot_ref(ref)
    wait_folded(repo, volume, n)
    conn = repo.conn
    with transaction(conn):
        if rows.snapshot_row(conn, volume, n) is None:
            if if_exists:
                return False
            raise NotFound(f"no snapshot {volume}@{n}")
        refusal = removal_refusal(conn, volume, n)
        if refusal is not None:
            raise Busy(refusal)
        drop_snapshot(conn, volume, n)
    return True


def snapshot_at_rest(repo: Repository, volume: str, label: str | None, held: bool) -> SnapshotNo:
    """Snapshot a volume that has no read/write view here: its base. A volume this
    daemon holds (phase mounted) is at rest all the same: nothing writes it."""
    if not held:
        return create_snapshot(repo, volume, label)
    conn = repo.conn
    with transaction(conn):
        row = rows.volume_row(conn, volume)
        if row is None or row.phase != VolumePhase.MOUNTED or row.owner_pid != os.getpid():
            raise Busy(f"volume {volume!r} is no longer held by this mount")
        return record_snapshot(conn, volume, row.base, row.size, row.next_ino, label)
