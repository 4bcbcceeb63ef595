"""Volume and snapshot rows the read/write view and the daemon write as they go.

Plain SQL inside the caller's transaction, and nothing else: counting references is the
caller's (refcount.ledger), so this sits below everything that writes volumes
(casfs.volumes at rest, casfs.vfs while mounted, the daemon's claims).
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from casfs.store.ids import BlobId


def add_snapshot(
    conn: sqlite3.Connection, volume: str, root: BlobId, size: int, next_ino: int, label: str | None
) -> int:
    """Add snapshot n+1 of `volume` with `root`; returns n+1. The caller adds the
    snapshot's reference on `root` (ledger.retain) in the same transaction."""
    (n,) = conn.execute("SELECT next_snapshot FROM volumes WHERE name = ?", (volume,)).fetchone()
    conn.execute(
        "INSERT INTO snapshots (volume, n, root, size, next_ino, label, created) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (volume, n, root, size, next_ino, label, time.time()),
    )
    conn.execute("UPDATE volumes SET next_snapshot = ? WHERE name = ?", (n + 1, volume))
    return int(n)


def touch(conn: sqlite3.Connection, name: str) -> None:
    """Record that a volume is used now (the daemon calls this at mount and unmount):
    an ephemeral volume's grace period counts from its last use. Commits at once
    unless the caller has a transaction open."""
    conn.execute("UPDATE volumes SET last_used = ? WHERE name = ?", (time.time(), name))


def generation(conn: sqlite3.Connection, name: str) -> tuple[object, ...]:
    """What changes whenever the volume does at rest or changes hands: its base, its
    next snapshot number and its last use (every claim and release stamps it)."""
    query = "SELECT base, next_snapshot, last_used FROM volumes WHERE name = ?"
    row = conn.execute(query, (name,)).fetchone()
    return tuple(row) if row is not None else ()


def record_unsaved(conn: sqlite3.Connection, name: str, note: dict[str, Any] | None) -> None:
    """Record what a read/write mount could not save as it ended (None: it saved all)."""
    conn.execute("UPDATE volumes SET unsaved = ? WHERE name = ?", (json.dumps(note) if note else None, name))


# --- for the CLI ---


def snapshot_source(conn: sqlite3.Connection, volume: str, n: int) -> tuple[BlobId, str, int] | None:
    """Snapshot N of a volume as an export reads it: its root, the volume's kind and chunk size."""
    row = conn.execute(
        "SELECT s.root, v.kind, v.chunk_size FROM snapshots s JOIN volumes v ON v.name = s.volume "
        "WHERE s.volume = ? AND s.n = ?",
        (volume, n),
    ).fetchone()
    return None if row is None else (BlobId(bytes(row[0])), row[1], row[2])
