"""Settling a volume: folding what a crashed read/write mount left in its overlay into
a snapshot, as its unmount would have. The fold itself is the read/write view's
(casfs.vfs.volume), imported only here and only when there is an overlay: it brings
trio, half of `casfs snapshot create`'s start-up otherwise."""

from __future__ import annotations

import os
import sqlite3
import time

from casfs.catalog import overlay as overlay_rows
from casfs.catalog import transaction
from casfs.catalog import volumes as rows
from casfs.errors import Busy
from casfs.ids import SnapshotNo
from casfs.lifecycle.faults import fault_point
from casfs.lifecycle.phases import VolumePhase, give_volume, take_volume
from casfs.repo import Repository
from casfs.volumes.info import require_at_rest, volume_row


def has_overlay(conn: sqlite3.Connection, volume: str) -> bool:
    return rows.has_overlay(conn, volume)


# How long a command waits for a snapshot taken while mounted to be folded into blobs.
FOLD_WAIT_S = 600.0


def wait_folded(repo: Repository, volume: str, n: SnapshotNo, timeout: float = FOLD_WAIT_S) -> None:
    """A snapshot taken while mounted is numbered at once and stored as blobs by a fold
    that follows. Before reading it, wait for that fold (its daemon alive), or fold it
    here (its daemon died: the volume is at rest, its frozen epoch durable)."""
    deadline = time.monotonic() + timeout
    while pending(repo, volume, n):
        if time.monotonic() > deadline:
            row = rows.volume_row(repo.conn, volume)
            pid = row.owner_pid if row is not None else None
            raise Busy(f"snapshot {volume}@{n} is still being folded by process {pid}")
        time.sleep(0.05)
    gone = rows.volume_row(repo.conn, volume) is None
    if not gone and overlay_rows.pending_snapshot(repo.conn, volume, n):
        settle(repo, volume)  # at rest: no daemon will fold it


def pending(repo: Repository, volume: str, n: SnapshotNo) -> bool:
    """Snapshot n is not stored as blobs yet, and a daemon holds its volume to fold it."""
    if not overlay_rows.pending_snapshot(repo.conn, volume, n):
        return False
    row = rows.volume_row(repo.conn, volume)
    return row is not None and row.phase != VolumePhase.READY


def settle(repo: Repository, volume: str, label: str | None = None) -> SnapshotNo | None:
    """Fold what a crashed mount left in a volume's overlay into a snapshot, as its
    unmount would have; returns the snapshot number, or None if there was nothing.
    Phase snapshotting while it works, in a job slot (a fold is heavy work)."""
    conn = repo.conn
    with transaction(conn):
        row = volume_row(conn, volume)
        if not rows.has_overlay(conn, volume):
            return None
        require_at_rest(row)
        take_volume(conn, volume, VolumePhase.READY, VolumePhase.SNAPSHOTTING)
    try:
        from casfs.lifecycle.queue import job_slot
        from casfs.vfs.volume import open_volume

        fault_point("snapshot:after-phase")
        with job_slot(repo, f"snapshot {volume}"):
            return open_volume(repo, volume).snapshot_sync(label)
    finally:
        with transaction(conn):
            give_volume(conn, volume, VolumePhase.SNAPSHOTTING, os.getpid())
