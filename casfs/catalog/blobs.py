"""Blob rows and their reference counts, and every root reference the other rows hold:
the only SQL about blobs (refcount.ledger, gc and fsck decide; this reads and writes).

A root reference is a catalog row, other than a blob row, that keeps a blob alive: a
ready image's root, a volume's base, a snapshot's root, a chunk written to a mounted
volume's overlay (holes, ZERO_ID, hold nothing). The invariant (catalog.schema):
refs(b) = references from roots + occurrences of b among the children of all rows.
"""

# (No `from __future__ import annotations` here: typing.NamedTuple compiles each string
# annotation, and the first compile() in a process costs a command's start-up 3 ms.)

import sqlite3
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple, TypeVar

from casfs.catalog.overlay import PENDING_INODE
from casfs.errors import MissingBlob
from casfs.kinds import BlobKind, VolumeKind
from casfs.store.ids import ZERO_ID, BlobId

# Ids per `IN (...)` query: well under SQLite's limit on bound parameters.
IN_BATCH = 500

T = TypeVar("T")


def batches(items: Iterable[T], size: int = IN_BATCH) -> Iterator[list[T]]:
    """`items` in lists of at most `size` (the IN-batching of every id lookup)."""
    part: list[T] = []
    for item in items:
        part.append(item)
        if len(part) == size:
            yield part
            part = []
    if part:
        yield part


class BlobRow(NamedTuple):
    """A blob's row. A tuple: fsck holds one per blob in memory."""

    kind: int  # a BlobKind value; a damaged catalog may hold any (fsck reports it)
    refs: int
    size: int
    stored: int


def insert(conn: sqlite3.Connection, bid: BlobId, kind: BlobKind, size: int, stored: int) -> bool:
    """A new blob row at refs 0; False if the row exists (its children are counted already)."""
    cur = conn.execute(
        "INSERT OR IGNORE INTO blobs (id, kind, refs, size, stored) VALUES (?, ?, 0, ?, ?)",
        (bid, kind, size, stored),
    )
    return cur.rowcount == 1


def add_leaves(conn: sqlite3.Connection, rows: Sequence[tuple[BlobId, BlobKind, int, int, int]]) -> None:
    """Rows of blobs without children, (id, kind, refs, size, stored), in one statement
    (a fold's or an import's thousands of chunks): a new row starts at `refs`, an
    existing one gains them (as insert() then add_refs(), without the garbage index's
    entry for a row at refs 0)."""
    conn.executemany(
        "INSERT INTO blobs (id, kind, refs, size, stored) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (id) DO UPDATE SET refs = refs + excluded.refs",
        rows,
    )


def add_refs(conn: sqlite3.Connection, increments: Mapping[BlobId, int]) -> None:
    """Add to reference counts (negative: remove); MissingBlob if a blob has no row."""
    # In the ids' order: the B-tree's pages in turn, each read and dirtied once (a new
    # map page's thousand children, in hash order, touch every page of the table, which
    # outgrows SQLite's page cache: in any other order each page is read again and again).
    changes = sorted((bid, n) for bid, n in increments.items() if n and bid != ZERO_ID)
    cur = conn.executemany("UPDATE blobs SET refs = refs + ?2 WHERE id = ?1", changes)
    if cur.rowcount != len(changes):  # (a total over the rows: find the one missing)
        missing = next(bid for bid, _ in changes if not known(conn, [bid]))
        raise MissingBlob(f"blob {missing.hex()} is referenced but not in the catalog")


def decrement(conn: sqlite3.Connection, bid: BlobId, n: int) -> int | None:
    """refs -= n; the new count, or None if the blob has no row."""
    row = conn.execute("UPDATE blobs SET refs = refs - ? WHERE id = ? RETURNING refs", (n, bid)).fetchone()
    return None if row is None else int(row[0])


def is_live(conn: sqlite3.Connection, bid: BlobId) -> bool:
    row = conn.execute("SELECT refs FROM blobs WHERE id = ?", (bid,)).fetchone()
    return row is not None and row[0] > 0


def rows_of(conn: sqlite3.Connection, ids: Sequence[BlobId]) -> Iterator[tuple[BlobId, BlobRow]]:
    """The rows of those of `ids` that have one, IN-batched."""
    for part in batches(ids):
        marks = ",".join("?" * len(part))
        query = f"SELECT id, kind, refs, size, stored FROM blobs WHERE id IN ({marks})"
        for bid, kind, refs, size, stored in conn.execute(query, part):
            yield BlobId(bytes(bid)), BlobRow(kind, refs, size, stored)


def known(conn: sqlite3.Connection, ids: Sequence[bytes]) -> set[bytes]:
    """Those of `ids` (at most IN_BATCH) that have a row."""
    marks = ",".join("?" * len(ids))
    return {bytes(r[0]) for r in conn.execute(f"SELECT id FROM blobs WHERE id IN ({marks})", ids)}


def all_rows(conn: sqlite3.Connection) -> dict[BlobId, BlobRow]:
    query = "SELECT id, kind, refs, size, stored FROM blobs"
    return {
        BlobId(bytes(bid)): BlobRow(kind, refs, size, stored)
        for bid, kind, refs, size, stored in conn.execute(query)
    }


def garbage(conn: sqlite3.Connection, limit: int) -> list[tuple[BlobId, int, int]]:
    """Up to `limit` rows at refs 0: (id, kind, stored)."""
    query = "SELECT id, kind, stored FROM blobs WHERE refs = 0 LIMIT ?"
    return [(BlobId(bytes(bid)), kind, stored) for bid, kind, stored in conn.execute(query, (limit,))]


def delete_if_garbage(conn: sqlite3.Connection, bid: BlobId) -> bool:
    """Delete the row if it is still at refs 0 (a retain() since may have revived it)."""
    return conn.execute("DELETE FROM blobs WHERE id = ? AND refs = 0", (bid,)).rowcount == 1


def set_totals(conn: sqlite3.Connection, totals: tuple[int, int, int]) -> None:
    conn.execute("UPDATE blob_totals SET blobs = ?, stored = ?, garbage = ?", totals)


def set_sizes(conn: sqlite3.Connection, bid: BlobId, size: int, stored: int) -> None:
    conn.execute("UPDATE blobs SET size = ?, stored = ? WHERE id = ?", (size, stored, bid))


def totals(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """(blob rows, their stored bytes, the stored bytes of those at refs 0), as the
    triggers keep them: one row read."""
    count, stored, garbage_bytes = conn.execute("SELECT blobs, stored, garbage FROM blob_totals").fetchone()
    return int(count), int(stored), int(garbage_bytes)


def counted_totals(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """totals() counted over every row (fsck's check of the kept ones)."""
    count, stored, garbage_bytes = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(stored), 0), COALESCE(SUM(CASE WHEN refs = 0 THEN stored END), 0) "
        "FROM blobs"
    ).fetchone()
    return int(count), int(stored), int(garbage_bytes)


# -- root references -----------------------------------------------------------------

ROOT_QUERIES = (
    "SELECT root FROM images WHERE root IS NOT NULL",
    "SELECT root FROM image_chains",
    "SELECT base FROM volumes",
    "SELECT root FROM snapshots",
    "SELECT chunk FROM overlay_chunks",
)


def live_roots(conn: sqlite3.Connection) -> Counter[BlobId]:
    """Every root reference, counted (gc and fsck both count from here)."""
    counts: Counter[BlobId] = Counter()
    for query in ROOT_QUERIES:
        for (bid,) in conn.execute(query):
            if bid is not None and bid != ZERO_ID:
                counts[BlobId(bid)] += 1
    return counts


class Sized(NamedTuple):
    """A row with a recorded logical size derived from its root (refcount.logical)."""

    table: str  # 'images', 'volumes' or 'snapshots'
    what: str  # "image debian", "volume vm1", "snapshot vm1@3"
    key: str  # name, or VOL@N
    kind: VolumeKind
    root: BlobId
    size: int


_SIZED = {
    "images": (
        "SELECT 'image ' || name, name, kind, root, size FROM images WHERE phase = 'ready'",
        "UPDATE images SET size = ? WHERE name = ?",
    ),
    # Volumes with an overlay are skipped: their size is the overlay's until the next fold.
    "volumes": (
        "SELECT 'volume ' || v.name, v.name, v.kind, v.base, v.size FROM volumes v "
        "WHERE v.phase IN ('ready', 'mounted') "
        f"AND NOT EXISTS (SELECT 1 FROM overlay_inodes o WHERE o.volume = v.name AND {PENDING_INODE})",
        "UPDATE volumes SET size = ? WHERE name = ?",
    ),
    "snapshots": (
        "SELECT 'snapshot ' || s.volume || '@' || s.n, s.volume || '@' || s.n, v.kind, s.root, s.size "
        "FROM snapshots s JOIN volumes v ON v.name = s.volume",
        "UPDATE snapshots SET size = ? WHERE volume || '@' || n = ?",
    ),
}


def sized(conn: sqlite3.Connection) -> list[Sized]:
    """Every row with a logical size (read inside the caller's read transaction)."""
    return [
        Sized(table, what, key, VolumeKind(kind), BlobId(bytes(root)), size)
        for table, (query, _) in _SIZED.items()
        for what, key, kind, root, size in conn.execute(query)
    ]


def set_logical_size(conn: sqlite3.Connection, table: str, key: str, size: int) -> None:
    conn.execute(_SIZED[table][1], (size, key))
