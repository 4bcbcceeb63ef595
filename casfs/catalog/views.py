"""What the whole-store mount (casfs.vfs.storeview) lists of the catalog: the names under
images/, volumes/ and snapshots/VOLUME/ and how many are directories (the row behind a
name is catalog.images.image_row, catalog.volumes.volume_row or snapshot_row)."""

from __future__ import annotations

import sqlite3

from casfs.catalog.volumes import snapshot_numbers

# Volumes being made or removed are not shown.
HIDDEN_PHASES = ("creating", "deleting")
_VISIBLE = "phase NOT IN (" + ", ".join(f"'{p}'" for p in HIDDEN_PHASES) + ")"


def image_names(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM images WHERE phase = 'ready' ORDER BY name")]


def volume_names(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute(f"SELECT name FROM volumes WHERE {_VISIBLE} ORDER BY name")]


def snapshot_names(conn: sqlite3.Connection, volume: str) -> list[str]:
    """Stored snapshots and those frozen whose fold is still to commit (both readable)."""
    return [str(n) for n in snapshot_numbers(conn, volume)]


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
