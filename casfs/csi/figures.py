"""Per-volume and per-snapshot byte counts for CSI answers, behind one function each:
what casfs counts today (refcount.usage walks the metadata of the roots) is where a
cheaper kept figure can be switched in without touching the servicers."""

from __future__ import annotations

from casfs.ids import SnapshotNo
from casfs.refcount.usage import snapshot_usage
from casfs.repo import Repository


def snapshot_stored_bytes(repo: Repository, volume: str, n: SnapshotNo) -> int:
    """Bytes on disk of every blob snapshot `volume@n` reaches (Snapshot.size_bytes)."""
    return snapshot_usage(repo, volume, n).stored
