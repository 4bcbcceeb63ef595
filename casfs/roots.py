"""Every root reference the catalog holds, in one place (gc and fsck both count from here).

A root reference is a catalog row, other than a blob row, that keeps a blob alive:
a ready image's root, a volume's base, a snapshot's root, a chunk written to a
mounted volume's overlay (holes, ZERO_ID, hold nothing).
"""

from __future__ import annotations

import sqlite3
from collections import Counter

from casfs.store.ids import ZERO_ID, BlobId

ROOT_QUERIES = (
    "SELECT root FROM images WHERE root IS NOT NULL",
    "SELECT base FROM volumes",
    "SELECT root FROM snapshots",
    "SELECT chunk FROM overlay_chunks",
)


def live_roots(conn: sqlite3.Connection) -> Counter[BlobId]:
    counts: Counter[BlobId] = Counter()
    for query in ROOT_QUERIES:
        for (bid,) in conn.execute(query):
            if bid is not None and bid != ZERO_ID:
                counts[BlobId(bid)] += 1
    return counts


def root_kind(kind: str) -> int:
    """The blob kind of a root of a 'dir' or 'block' image, volume or snapshot."""
    from casfs.snapshots.kinds import MAP_ROOT, TREE

    return TREE if kind == "dir" else MAP_ROOT
