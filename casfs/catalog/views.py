"""What the whole-store mount (casfs.vfs.storeview) reads of the catalog: the names
under images/, volumes/ and snapshots/VOLUME/, and the row behind each name."""

from __future__ import annotations

import sqlite3
from typing import NamedTuple

from casfs.store.ids import BlobId

# Volumes being made or removed are not shown.
_VISIBLE = "phase NOT IN ('creating', 'deleting')"


class RootRow(NamedTuple):
    """A root to serve read-only: an image's, a volume's base or a snapshot's."""

    kind: str
    root: BlobId
    chunk_size: int
    next_ino: int
    created: float


class VolumeRow(NamedTuple):
    static: RootRow  # its base, served read-only when this process may not write it
    mode: str  # 'rw' or 'ro'
    phase: str
    owner_pid: int | None
    next_snapshot: int


def image_names(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM images WHERE phase = 'ready' ORDER BY name")]


def volume_names(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute(f"SELECT name FROM volumes WHERE {_VISIBLE} ORDER BY name")]


def snapshot_names(conn: sqlite3.Connection, volume: str) -> list[str]:
    query = "SELECT CAST(n AS TEXT) FROM snapshots WHERE volume = ? ORDER BY n"
    return [r[0] for r in conn.execute(query, (volume,))]


def dir_images(conn: sqlite3.Connection) -> int:
    return int(
        conn.execute("SELECT COUNT(*) FROM images WHERE phase = 'ready' AND kind = 'dir'").fetchone()[0]
    )


def dir_volumes(conn: sqlite3.Connection) -> int:
    return int(conn.execute(f"SELECT COUNT(*) FROM volumes WHERE {_VISIBLE} AND kind = 'dir'").fetchone()[0])


def dir_snapshots(conn: sqlite3.Connection, volume: str) -> int:
    """Snapshots of `volume` that are directories (all of them, or none)."""
    query = (
        "SELECT COUNT(*) FROM snapshots s JOIN volumes v ON v.name = s.volume "
        "WHERE s.volume = ? AND v.kind = 'dir'"
    )
    return int(conn.execute(query, (volume,)).fetchone()[0])


def image(conn: sqlite3.Connection, name: str) -> RootRow | None:
    row = conn.execute(
        "SELECT kind, root, chunk_size, next_ino, created FROM images WHERE name = ? AND phase = 'ready'",
        (name,),
    ).fetchone()
    return None if row is None else RootRow(row[0], BlobId(bytes(row[1])), row[2], row[3], row[4])


def volume(conn: sqlite3.Connection, name: str) -> VolumeRow | None:
    row = conn.execute(
        "SELECT kind, mode, base, chunk_size, next_ino, created, phase, owner_pid, next_snapshot "
        f"FROM volumes WHERE name = ? AND {_VISIBLE}",
        (name,),
    ).fetchone()
    if row is None:
        return None
    kind, mode, base, chunk_size, next_ino, created, phase, pid, next_snapshot = row
    return VolumeRow(
        RootRow(kind, BlobId(bytes(base)), chunk_size, next_ino, created), mode, phase, pid, next_snapshot
    )


def snapshot(conn: sqlite3.Connection, volume: str, n: int) -> RootRow | None:
    """Snapshot n of a volume (the snapshot-join: its root with the volume's kind)."""
    row = conn.execute(
        "SELECT v.kind, s.root, v.chunk_size, s.next_ino, s.created FROM snapshots s "
        "JOIN volumes v ON v.name = s.volume WHERE s.volume = ? AND s.n = ?",
        (volume, n),
    ).fetchone()
    return None if row is None else RootRow(row[0], BlobId(bytes(row[1])), row[2], row[3], row[4])
