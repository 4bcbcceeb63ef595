"""Kept space figures (casfs.refcount.figures decides; this reads and writes) and the
holders of a root: the only SQL about either.

A subject is 'image:NAME', 'volume:NAME' or 'snapshot:VOL@N'. A row's `pending` bits
name the figures that may be out of date (a missing row: all of them).
"""

# (No `from __future__ import annotations` here: typing.NamedTuple compiles each string
# annotation, and the first compile() in a process costs a command's start-up 3 ms.)

import sqlite3
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from casfs.store.ids import BlobId

STORED, WRITTEN, UNIQUE = 1, 2, 4
ALL = STORED | WRITTEN | UNIQUE
NAMES = {STORED: "stored", WRITTEN: "written", UNIQUE: "unique"}


class Kept(NamedTuple):
    stored: int
    written: int
    unique: int
    pending: int  # bits of STORED, WRITTEN, UNIQUE
    marks: int = -1  # the row's change count (-1: no row)


MISSING = Kept(0, 0, 0, ALL)


def image(name: str) -> str:
    return f"image:{name}"


def volume(name: str) -> str:
    return f"volume:{name}"


def snapshot(vol: str, n: int) -> str:
    return f"snapshot:{vol}@{n}"


def get(conn: sqlite3.Connection, subject: str) -> Kept:
    row = conn.execute(
        "SELECT stored, written, uniq, pending, marks FROM figures WHERE subject = ?", (subject,)
    )
    found = row.fetchone()
    return MISSING if found is None else Kept(*found)


def get_many(conn: sqlite3.Connection, subjects: Sequence[str]) -> dict[str, Kept]:
    """The rows of `subjects` (missing ones left out), in batches of 500."""
    out: dict[str, Kept] = {}
    for i in range(0, len(subjects), 500):
        part = subjects[i : i + 500]
        marks = ",".join("?" * len(part))
        query = (
            f"SELECT subject, stored, written, uniq, pending, marks FROM figures WHERE subject IN ({marks})"
        )
        out.update((s, Kept(*rest)) for s, *rest in conn.execute(query, part))
    return out


def put(conn: sqlite3.Connection, subject: str, stored: int, written: int, unique: int, pending: int) -> None:
    conn.execute(
        "INSERT INTO figures (subject, stored, written, uniq, pending) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (subject) DO UPDATE SET stored = excluded.stored, written = excluded.written, "
        "uniq = excluded.uniq, pending = excluded.pending, marks = marks + 1",
        (subject, stored, written, unique, pending),
    )


def put_if_unchanged(conn: sqlite3.Connection, subject: str, was: Kept, now: Kept) -> bool:
    """Write a count made since `was` was read, unless the row changed meanwhile."""
    if was.marks < 0:
        cur = conn.execute(
            "INSERT OR IGNORE INTO figures (subject, stored, written, uniq, pending) VALUES (?, ?, ?, ?, ?)",
            (subject, *now[:4]),
        )
    else:
        cur = conn.execute(
            "UPDATE figures SET stored = ?, written = ?, uniq = ?, pending = ?, marks = marks + 1 "
            "WHERE subject = ? AND marks = ?",
            (*now[:4], subject, was.marks),
        )
    return cur.rowcount == 1


def add(conn: sqlite3.Connection, subject: str, stored: int, written: int, unique: int, bits: int) -> None:
    """Add to the figures (a fold's new bytes) and set pending bits, in one change."""
    conn.execute(
        "UPDATE figures SET stored = stored + ?, written = written + ?, uniq = uniq + ?, "
        "pending = pending | ?, marks = marks + 1 WHERE subject = ?",
        (stored, written, unique, bits, subject),
    )


def mark(conn: sqlite3.Connection, subjects: Iterable[str], bits: int) -> None:
    """Set pending bits; a subject without a row gets one, every figure pending (so a
    count made meanwhile cannot insert it: put_if_unchanged)."""
    conn.executemany(
        "INSERT INTO figures (subject, stored, written, uniq, pending) VALUES (?, 0, 0, 0, ?) "
        "ON CONFLICT (subject) DO UPDATE SET pending = pending | ?, marks = marks + 1",
        [(s, ALL, bits) for s in set(subjects)],
    )


def mark_all(conn: sqlite3.Connection, bits: int) -> None:
    conn.execute("UPDATE figures SET pending = pending | ?, marks = marks + 1", (bits,))


def delete(conn: sqlite3.Connection, subjects: Iterable[str]) -> None:
    conn.executemany("DELETE FROM figures WHERE subject = ?", [(s,) for s in subjects])


def delete_volume(conn: sqlite3.Connection, name: str) -> None:
    """The rows of a volume and of all its snapshots."""
    conn.execute("DELETE FROM figures WHERE subject = ?", (volume(name),))
    pattern = "snapshot:" + name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "@%"
    conn.execute("DELETE FROM figures WHERE subject LIKE ? ESCAPE '\\'", (pattern,))


def pending(conn: sqlite3.Connection, limit: int = -1) -> list[str]:
    """Subjects with pending figures (rows only: see missing())."""
    query = "SELECT subject FROM figures WHERE pending != 0 ORDER BY subject LIMIT ?"
    return [s for (s,) in conn.execute(query, (limit,))]


def subjects(conn: sqlite3.Connection) -> list[str]:
    """Every image (ready), volume and snapshot there is, as subjects."""
    query = (
        "SELECT 'image:' || name FROM images WHERE phase = 'ready' "
        "UNION ALL SELECT 'volume:' || name FROM volumes WHERE phase != 'creating' "
        "UNION ALL SELECT 'snapshot:' || volume || '@' || n FROM snapshots"
    )
    return [s for (s,) in conn.execute(query)]


def missing(conn: sqlite3.Connection) -> list[str]:
    """Subjects that have no row (made by a crash between a commit and its count, or
    by the migration to format 10)."""
    query = (
        "SELECT 'image:' || name AS s FROM images WHERE phase = 'ready' "
        "UNION ALL SELECT 'volume:' || name FROM volumes WHERE phase != 'creating' "
        "UNION ALL SELECT 'snapshot:' || volume || '@' || n FROM snapshots"
    )
    return [
        s for (s,) in conn.execute(f"SELECT s FROM ({query}) WHERE s NOT IN (SELECT subject FROM figures)")
    ]


def prune(conn: sqlite3.Connection) -> int:
    """Delete rows of subjects that are gone; how many."""
    query = (
        "SELECT 'image:' || name FROM images UNION ALL SELECT 'volume:' || name FROM volumes "
        "UNION ALL SELECT 'snapshot:' || volume || '@' || n FROM snapshots"
    )
    return conn.execute(f"DELETE FROM figures WHERE subject NOT IN ({query})").rowcount


# -- holders -------------------------------------------------------------------------


_HOLDERS = (
    "SELECT 'image:' || name, NULL FROM images WHERE root = ?1 "
    "UNION ALL SELECT 'image:' || image, NULL FROM image_chains WHERE root = ?1 "
    "UNION ALL SELECT 'volume:' || name, NULL FROM volumes WHERE base = ?1 "
    "UNION ALL SELECT 'volume:' || volume, 'snapshot:' || volume || '@' || n "
    "FROM snapshots WHERE root = ?1 "
    "UNION ALL SELECT 'volume:' || volume, NULL FROM overlay_chunks WHERE chunk = ?1"
)


def holder_rows(conn: sqlite3.Connection, root: BlobId, limit: int = -1) -> list[frozenset[str]]:
    """Catalog rows that hold a reference on `root` (at most `limit`), each as the
    subjects it belongs to: its owner (an image or a volume), and a snapshot's row its
    snapshot too."""
    query = f"{_HOLDERS} LIMIT ?2"
    return [frozenset(s for s in row if s is not None) for row in conn.execute(query, (root, limit))]


def holder_count(conn: sqlite3.Connection, root: BlobId) -> int:
    return int(conn.execute(f"SELECT COUNT(*) FROM ({_HOLDERS})", (root,)).fetchone()[0])


def refs(conn: sqlite3.Connection, root: BlobId) -> int:
    row = conn.execute("SELECT refs FROM blobs WHERE id = ?", (root,)).fetchone()
    return 0 if row is None else int(row[0])
