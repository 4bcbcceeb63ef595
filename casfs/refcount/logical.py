"""Logical sizes, recomputed: what fsck checks the catalog's `size` columns against.

An image's, volume's or snapshot's size is derived from its root: a block root's disk
size (its map root says), or for a directory tree the bytes of its regular files, each
inode counted once (hardlinks share one). Volumes with an overlay are skipped: their
size is the overlay's, folded at the next snapshot. Everything is read in one read
transaction, so a fold committing meanwhile (base and size change together) is seen
whole or not at all.
"""

from __future__ import annotations

import sqlite3
import stat
from collections.abc import Callable
from typing import NamedTuple

from casfs.errors import Corruption, MissingBlob
from casfs.snapshots import chunkmap
from casfs.snapshots.tree import Tree
from casfs.store.ids import ZERO_ID, BlobId

GetMeta = Callable[[BlobId], bytes]

# Each sized row: (what, kind, root, recorded size, key), and how to correct one.
_QUERIES = {
    "images": (
        "SELECT 'image ' || name, kind, root, size, name FROM images WHERE phase = 'ready'",
        "UPDATE images SET size = ? WHERE name = ?",
    ),
    "volumes": (
        "SELECT 'volume ' || name, kind, base, size, name FROM volumes WHERE phase IN ('ready', 'mounted') "
        "AND NOT EXISTS (SELECT 1 FROM overlay_inodes o WHERE o.volume = volumes.name)",
        "UPDATE volumes SET size = ? WHERE name = ?",
    ),
    "snapshots": (
        "SELECT 'snapshot ' || s.volume || '@' || s.n, v.kind, s.root, s.size, s.volume || '@' || s.n "
        "FROM snapshots s JOIN volumes v ON v.name = s.volume",
        "UPDATE snapshots SET size = ? WHERE volume || '@' || n = ?",
    ),
}


class Mismatch(NamedTuple):
    what: str  # "volume vm1", "snapshot vm1@3", "image debian"
    table: str
    key: str
    recorded: int
    actual: int


def mismatches(conn: sqlite3.Connection, get_meta: GetMeta) -> list[Mismatch]:
    """Every recorded size that differs from its root's. Roots that cannot be read are
    skipped: fsck reports those blobs."""
    conn.execute("BEGIN")
    try:
        rows = [
            (table, what, kind, BlobId(root), size, key)
            for table, (query, _) in _QUERIES.items()
            for what, kind, root, size, key in conn.execute(query)
        ]
    finally:
        conn.execute("COMMIT")
    known: dict[tuple[str, BlobId], int] = {}
    found = []
    for table, what, kind, root, size, key in rows:
        if (kind, root) not in known:
            try:
                known[kind, root] = root_size(get_meta, kind, root)
            except (Corruption, MissingBlob, ValueError):
                continue
        if known[kind, root] != size:
            found.append(Mismatch(what, table, key, size, known[kind, root]))
    return found


def root_size(get_meta: GetMeta, kind: str, root: BlobId) -> int:
    if kind == "block":
        return chunkmap.MapRoot.decode(get_meta(root)).size if root != ZERO_ID else 0
    seen: set[int] = set()
    total = 0
    todo = [root]
    while todo:
        for entry in Tree.decode(get_meta(todo.pop())).entries:
            if entry.is_dir:
                todo.append(entry.blob)
            elif stat.S_ISREG(entry.attrs.mode) and entry.attrs.ino not in seen:
                seen.add(entry.attrs.ino)
                total += entry.attrs.size
    return total


def repair(conn: sqlite3.Connection, m: Mismatch) -> None:
    conn.execute(_QUERIES[m.table][1], (m.actual, m.key))
