"""A mounted read/write volume's overlay rows (overlay_inodes, overlay_entries,
overlay_chunks, uppers) and the volume columns its flushes and folds move: the only SQL of
casfs.vfs.overlay.

Plain statements inside the caller's transaction. Counting references is the caller's
(refcount.ledger sits above the catalog): every function that drops or replaces an
overlay chunk returns the ids it dropped, for the caller to release.
"""

# (No `from __future__ import annotations` here: typing.NamedTuple compiles each string
# annotation, and the first compile() in a process costs a command's start-up 3 ms.)

import sqlite3
from collections.abc import Iterable
from typing import Any, NamedTuple

from casfs.ids import ROOT_INO, ChunkNo, InodeNo, SnapshotNo
from casfs.kinds import VolumeKind
from casfs.store.ids import BlobId

# An overlay_inodes row `o` of volume `v` that is a change not yet folded: every row but
# a block volume's disk file's, which holds the volume's attributes for good (fold's
# `keep`; no part of its snapshots).
PENDING_INODE = f"(o.ino != {ROOT_INO} OR v.kind != '{VolumeKind.BLOCK.value}')"


class OverlayRows(NamedTuple):
    """A volume's overlay as the last flush left it."""

    inodes: list[tuple[Any, ...]]  # overlay_inodes rows, in column order
    entries: dict[InodeNo, dict[bytes, tuple[int, InodeNo]]]  # dir -> name -> (cookie, ino)
    chunks: dict[InodeNo, dict[ChunkNo, BlobId]]  # ino -> n -> chunk id


def base_time(conn: sqlite3.Connection, name: str, base: BlobId) -> float:
    """When the base was made: its snapshot's time, or the volume's creation (unix time)."""
    row = conn.execute(
        "SELECT coalesce((SELECT max(created) FROM snapshots WHERE volume = ? AND root = ?), created) "
        "FROM volumes WHERE name = ?",
        (name, base, name),
    ).fetchone()
    return float(row[0])


def blob_kind(conn: sqlite3.Connection, bid: BlobId) -> int | None:
    """A blob's kind (a casfs.kinds.BlobKind value), None if the catalog has no row for it."""
    row = conn.execute("SELECT kind FROM blobs WHERE id = ?", (bid,)).fetchone()
    return None if row is None else int(row[0])


def orphans(conn: sqlite3.Connection, volume: str) -> list[InodeNo]:
    """Unlinked inodes that were still open when a daemon died: nothing names them."""
    query = "SELECT ino FROM overlay_inodes WHERE volume = ? AND nlink = 0"
    return [InodeNo(i) for (i,) in conn.execute(query, (volume,))]


def load(conn: sqlite3.Connection, volume: str) -> OverlayRows:
    entries: dict[InodeNo, dict[bytes, tuple[int, InodeNo]]] = {}
    query = "SELECT dir, name, cookie, ino FROM overlay_entries WHERE volume = ?"
    for d, name, cookie, ino in conn.execute(query, (volume,)):
        entries.setdefault(InodeNo(d), {})[bytes(name)] = (cookie, InodeNo(ino))
    inodes = [tuple(r) for r in conn.execute("SELECT * FROM overlay_inodes WHERE volume = ?", (volume,))]
    chunks: dict[InodeNo, dict[ChunkNo, BlobId]] = {}
    for ino, n, chunk in conn.execute("SELECT ino, n, chunk FROM overlay_chunks WHERE volume = ?", (volume,)):
        chunks.setdefault(InodeNo(ino), {})[ChunkNo(n)] = BlobId(chunk)
    return OverlayRows(inodes, entries, chunks)


def delete_inode(conn: sqlite3.Connection, volume: str, ino: InodeNo, from_chunk: int = 0) -> list[BlobId]:
    """Drop an inode's chunks from `from_chunk` on (and, from 0, its row and entries);
    returns the chunk ids dropped."""
    where = "volume = ? AND ino = ? AND n >= ?"
    args = (volume, ino, from_chunk)
    olds = [BlobId(c) for (c,) in conn.execute(f"SELECT chunk FROM overlay_chunks WHERE {where}", args)]
    conn.execute(f"DELETE FROM overlay_chunks WHERE {where}", args)
    if from_chunk == 0:
        conn.execute("DELETE FROM overlay_inodes WHERE volume = ? AND ino = ?", (volume, ino))
        conn.execute("DELETE FROM overlay_entries WHERE volume = ? AND dir = ?", (volume, ino))
    return olds


_UPSERT_INODE = "INSERT OR REPLACE INTO overlay_inodes VALUES (" + ", ".join("?" * 18) + ")"


def put_inodes(conn: sqlite3.Connection, rows: Iterable[tuple[object, ...]]) -> None:
    conn.executemany(_UPSERT_INODE, rows)


def put_entries(
    conn: sqlite3.Connection,
    volume: str,
    whole_dirs: Iterable[InodeNo],
    gone: Iterable[tuple[InodeNo, bytes]],
    entries: Iterable[tuple[InodeNo, bytes, int, InodeNo]],
) -> None:
    """Directory entries: every entry of a `whole_dirs` directory is rewritten, `gone`
    (dir, name) deleted, `entries` (dir, name, cookie, ino) stored."""
    conn.executemany(
        "DELETE FROM overlay_entries WHERE volume = ? AND dir = ?", [(volume, d) for d in whole_dirs]
    )
    conn.executemany(
        "DELETE FROM overlay_entries WHERE volume = ? AND dir = ? AND name = ?",
        [(volume, d, name) for d, name in gone],
    )
    conn.executemany(
        "INSERT OR REPLACE INTO overlay_entries VALUES (?, ?, ?, ?, ?)",
        [(volume, d, name, cookie, ino) for d, name, cookie, ino in entries],
    )


def put_chunk(conn: sqlite3.Connection, volume: str, ino: InodeNo, n: ChunkNo, bid: BlobId) -> BlobId | None:
    """Store chunk n of an inode; returns the id it replaced (None: a new chunk)."""
    old = conn.execute(
        "SELECT chunk FROM overlay_chunks WHERE volume = ? AND ino = ? AND n = ?", (volume, ino, n)
    ).fetchone()
    conn.execute("INSERT OR REPLACE INTO overlay_chunks VALUES (?, ?, ?, ?)", (volume, ino, n, bid))
    return None if old is None else BlobId(old[0])


def flushed(conn: sqlite3.Connection, volume: str, next_ino: InodeNo, size: int) -> None:
    conn.execute(
        "UPDATE volumes SET next_ino = MAX(next_ino, ?), size = ? WHERE name = ?", (next_ino, size, volume)
    )


def fold(
    conn: sqlite3.Connection,
    volume: str,
    new_root: BlobId,
    size: int,
    next_ino: InodeNo,
    keep: InodeNo | None = None,
) -> list[BlobId]:
    """Empty the overlay into a new base (the fold's snapshot is already added); returns
    the chunk ids dropped. Inodes unlinked but still open keep their rows and chunks
    until forgotten; so does `keep`'s row (a block volume's disk file: its attributes
    are the volume's, no part of a snapshot)."""
    live = "volume = ? AND ino NOT IN (SELECT ino FROM overlay_inodes WHERE volume = ? AND nlink = 0)"
    olds = [
        BlobId(c) for (c,) in conn.execute(f"SELECT chunk FROM overlay_chunks WHERE {live}", (volume, volume))
    ]
    conn.execute(f"DELETE FROM overlay_chunks WHERE {live}", (volume, volume))
    conn.execute("DELETE FROM overlay_inodes WHERE volume = ? AND nlink > 0 AND ino IS NOT ?", (volume, keep))
    conn.execute("DELETE FROM overlay_entries WHERE volume = ?", (volume,))
    conn.execute(
        "UPDATE volumes SET base = ?, size = ?, next_ino = MAX(next_ino, ?) WHERE name = ?",
        (new_root, size, next_ino, volume),
    )
    return olds


class UpperRow(NamedTuple):
    epoch: int
    snapshot: SnapshotNo | None  # frozen as this snapshot (its fold not yet committed)
    label: str | None
    taken: float | None


def uppers(conn: sqlite3.Connection, volume: str) -> list[UpperRow]:
    """The volume's upper epochs the catalog names, oldest first."""
    query = "SELECT epoch, snapshot, label, taken FROM uppers WHERE volume = ? ORDER BY epoch"
    return [
        UpperRow(int(e), None if n is None else SnapshotNo(n), lb, t)
        for e, n, lb, t in conn.execute(query, (volume,))
    ]


def add_upper(conn: sqlite3.Connection, volume: str, epoch: int) -> None:
    conn.execute("INSERT OR IGNORE INTO uppers (volume, epoch) VALUES (?, ?)", (volume, epoch))


def freeze_upper(
    conn: sqlite3.Connection, volume: str, epoch: int, label: str | None, taken: float
) -> SnapshotNo:
    """Freeze an epoch as the volume's next snapshot taken at `taken` (its number given
    out now, its snapshots row added by its fold, with the same time)."""
    (n,) = conn.execute("SELECT next_snapshot FROM volumes WHERE name = ?", (volume,)).fetchone()
    conn.execute("UPDATE volumes SET next_snapshot = ? WHERE name = ?", (n + 1, volume))
    done = conn.execute(
        "UPDATE uppers SET snapshot = ?, label = ?, taken = ? "
        "WHERE volume = ? AND epoch = ? AND snapshot IS NULL",
        (n, label, taken, volume, epoch),
    )
    assert done.rowcount == 1, f"upper {epoch} of {volume} is not the one written"
    return SnapshotNo(n)


def drop_upper(conn: sqlite3.Connection, volume: str, epoch: int) -> None:
    conn.execute("DELETE FROM uppers WHERE volume = ? AND epoch = ?", (volume, epoch))


def frozen_under(conn: sqlite3.Connection, volume: str, n: SnapshotNo) -> list[UpperRow]:
    """The frozen epochs snapshot n reads, oldest first (over the volume's base: each
    fold makes its snapshot the base in the transaction that forgets its epoch); empty
    if n is not frozen (stored already, or never taken)."""
    if not pending_snapshot(conn, volume, n):
        return []
    return [u for u in uppers(conn, volume) if u.snapshot is not None and u.snapshot <= n]


def pending_snapshot(conn: sqlite3.Connection, volume: str, n: SnapshotNo) -> bool:
    """Snapshot n is taken but not yet folded (its upper is frozen)."""
    query = "SELECT 1 FROM uppers WHERE volume = ? AND snapshot = ?"
    return conn.execute(query, (volume, n)).fetchone() is not None
