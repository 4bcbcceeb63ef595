"""Per-snapshot byte counts for CSI answers, behind one function: the store's kept
figures (refcount.accounts), read in O(1) whatever the snapshot's size; a figure still
pending is settled within accounts' budget first."""

from __future__ import annotations

from casfs.refcount.accounts import snapshot_figures
from casfs.repo import Repository
from casfs.volumes import SnapshotInfo


def snapshot_stored_bytes(repo: Repository, snap: SnapshotInfo) -> int:
    """Bytes on disk of every blob snapshot `snap` reaches (Snapshot.size_bytes)."""
    return snapshot_figures(repo, snap.volume, snap.n).stored
