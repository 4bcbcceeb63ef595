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

from casfs.catalog import blobs as blob_rows
from casfs.catalog import read_transaction
from casfs.errors import Corruption, MissingBlob
from casfs.kinds import VolumeKind
from casfs.snapshots import chunkmap
from casfs.snapshots.tree import Tree
from casfs.store.ids import ZERO_ID, BlobId

GetMeta = Callable[[BlobId], bytes]


class Mismatch(NamedTuple):
    what: str  # "volume vm1", "snapshot vm1@3", "image debian"
    table: str
    key: str
    recorded: int
    actual: int


def mismatches(conn: sqlite3.Connection, get_meta: GetMeta) -> list[Mismatch]:
    """Every recorded size that differs from its root's. Roots that cannot be read are
    skipped: fsck reports those blobs."""
    with read_transaction(conn):
        rows = blob_rows.sized(conn)
    known: dict[tuple[str, BlobId], int] = {}
    found = []
    for table, what, key, kind, root, size in rows:
        if (kind, root) not in known:
            try:
                known[kind, root] = root_size(get_meta, kind, root)
            except (Corruption, MissingBlob, ValueError):
                continue
        if known[kind, root] != size:
            found.append(Mismatch(what, table, key, size, known[kind, root]))
    return found


def root_size(get_meta: GetMeta, kind: VolumeKind, root: BlobId) -> int:
    if kind == VolumeKind.BLOCK:
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
    blob_rows.set_logical_size(conn, m.table, m.key, m.actual)
