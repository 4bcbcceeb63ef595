"""The catalog: one SQLite database (WAL) that is the store's single source of truth.

The schema is written once, here, with every column explained. FORMAT_VERSION names
it; a store of a newer version is refused, an older one is migrated step by step by
MIGRATIONS (one function per version step) so that no volume is lost to an upgrade.
"""

from __future__ import annotations

import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from casfs.errors import UnsupportedFormat

FORMAT_VERSION = 5

# The format-1 schema; later formats add to it (see MIGRATIONS).
SCHEMA = """
-- Key/value facts about the store: format_version, created (unix time).
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Every blob the store holds or is about to free. A row holds references on its
-- children (the ids its plaintext names): inserting a row increments them, and gc
-- decrements them when it deletes the row. Hence, always:
--   refs(b) = references from roots + occurrences of b among the children of all rows.
CREATE TABLE blobs (
    id     BLOB PRIMARY KEY,       -- BLAKE3-256 of the plaintext
    kind   INTEGER NOT NULL,       -- 0 data chunk, 1 chunk-map root, 2 chunk-map page, 3 tree
    refs   INTEGER NOT NULL,       -- 0 means garbage: gc deletes the file, then the row
    size   INTEGER NOT NULL,       -- plaintext bytes
    stored INTEGER NOT NULL        -- bytes on disk (compressed, or raw when smaller)
) WITHOUT ROWID;
CREATE INDEX blobs_garbage ON blobs (refs) WHERE refs = 0;

-- Immutable imported content. A ready image's root holds one reference.
CREATE TABLE images (
    name       TEXT PRIMARY KEY,
    kind       TEXT NOT NULL CHECK (kind IN ('dir', 'block')),
    phase      TEXT NOT NULL,      -- importing | verifying | ready | failed
    root       BLOB,               -- tree (dir) or chunk-map root (block); NULL until ready
    size       INTEGER NOT NULL DEFAULT 0,   -- logical bytes (file bytes, or the disk size)
    chunk_size INTEGER NOT NULL,
    next_ino   INTEGER NOT NULL DEFAULT 2,   -- inode numbers below this are taken (1 is the root)
    source     TEXT,               -- what it was imported from, for `info`
    digest     TEXT,               -- blake3:HEX of the source as read (and sha256 when asked)
    spec       TEXT,               -- JSON of the request, so a repeat can be told from a conflict
    error      TEXT,               -- why it failed
    owner_pid  INTEGER,            -- the process doing the current phase's work
    created    REAL NOT NULL
);

-- Named, mountable state: a base root plus (while mounted read/write) an overlay.
CREATE TABLE volumes (
    name          TEXT PRIMARY KEY,
    kind          TEXT NOT NULL CHECK (kind IN ('dir', 'block')),
    mode          TEXT NOT NULL CHECK (mode IN ('rw', 'ro')),
    phase         TEXT NOT NULL,   -- creating | ready | mounted | snapshotting | deleting
    base          BLOB NOT NULL,   -- root the overlay applies to; holds one reference
    origin        TEXT NOT NULL,   -- 'image:NAME', 'snapshot:VOL@N' or 'blank'
    size          INTEGER NOT NULL, -- logical bytes of the base
    chunk_size    INTEGER NOT NULL,
    next_ino      INTEGER NOT NULL DEFAULT 2,
    next_snapshot INTEGER NOT NULL DEFAULT 1,  -- numbers are never reused
    spec          TEXT,
    owner_pid     INTEGER,
    created       REAL NOT NULL
);

-- Immutable numbered states of a volume. Each root holds one reference.
CREATE TABLE snapshots (
    volume     TEXT NOT NULL REFERENCES volumes (name),
    n          INTEGER NOT NULL,
    root       BLOB NOT NULL,
    size       INTEGER NOT NULL,
    next_ino   INTEGER NOT NULL,
    label      TEXT,
    created    REAL NOT NULL,
    PRIMARY KEY (volume, n)
);
"""

# Format 2: the durable overlay of mounted read/write volumes.
OVERLAY_SCHEMA = """
-- Inodes of a read/write volume changed (or copied up) since its base: the whole
-- inode, so a row never needs its base entry. A directory's children are copied up
-- with it, so every inode an overlay listing names has a row here.
CREATE TABLE overlay_inodes (
    volume     TEXT NOT NULL,
    ino        INTEGER NOT NULL,
    mode       INTEGER NOT NULL,
    uid        INTEGER NOT NULL,
    gid        INTEGER NOT NULL,
    rdev       INTEGER NOT NULL,
    size       INTEGER NOT NULL,
    atime_ns   INTEGER NOT NULL,
    mtime_ns   INTEGER NOT NULL,
    ctime_ns   INTEGER NOT NULL,
    nlink      INTEGER NOT NULL,
    xattrs     BLOB NOT NULL,      -- encoded (name, value) pairs
    base       BLOB NOT NULL,      -- file: content id in the base, dir: base subtree id, ZERO_ID: none
    base_limit INTEGER NOT NULL,   -- file: base chunks at or past this number are gone (truncated)
    target     BLOB NOT NULL,      -- symlink target
    parent     INTEGER NOT NULL,   -- directory: its parent's ino (the root is its own parent)
    listing    BLOB,               -- directory: non-NULL once copied up (format 5: its header, entries
                                   -- in overlay_entries, before: every entry), NULL: the base subtree's
    PRIMARY KEY (volume, ino)
) WITHOUT ROWID;

-- Chunks written since the base: each non-hole chunk id holds one reference.
CREATE TABLE overlay_chunks (
    volume TEXT NOT NULL,
    ino    INTEGER NOT NULL,
    n      INTEGER NOT NULL,       -- chunk number within the file
    chunk  BLOB NOT NULL,          -- ZERO_ID: a hole (hides the base's chunk)
    PRIMARY KEY (volume, ino, n)
) WITHOUT ROWID;
"""


# Format 3: lifecycle (casfs.lifecycle). New columns for ephemeral volumes. Also new in
# format 3, with no schema change: image phase 'queued' (an import waiting for a job
# slot, before 'importing'), volume phase 'creating' recorded while a blank volume's base
# is written, and the meta key 'queue.limit' (concurrent heavy jobs; default 2).
LIFECYCLE_SCHEMA = """
-- Seconds a volume may go unused (not mounted) before `casfs gc` removes it.
-- NULL: kept until removed by hand.
ALTER TABLE volumes ADD COLUMN grace_s REAL;
-- Unix time of the volume's creation, or its last mount or unmount (catalog.volumes.touch).
-- NULL (a volume from format 2): its creation time counts.
ALTER TABLE volumes ADD COLUMN last_used REAL;
"""


# Format 4: what a read/write mount could not save when it ended.
UNSAVED_SCHEMA = """
-- Set when a read/write mount of the volume ended without saving every change it had
-- acknowledged to writers (a forced unmount while the store could not take the data):
-- JSON {"time", "pid", "error", "unsaved": [[path, bytes], ...]}. Cleared by the next
-- mount that ends cleanly. NULL: the last mount saved everything.
ALTER TABLE volumes ADD COLUMN unsaved TEXT;
"""


# Format 5: a materialized directory's entries as rows, so a flush writes the entries
# that changed, not the whole listing (overlay_inodes.listing keeps only its header).
ENTRIES_SCHEMA = """
-- The entries of the overlay's materialized directories (those whose overlay_inodes
-- row has a non-NULL listing). Since format 5 that column holds only the listing's
-- header: the next readdir cookie, 8 bytes little-endian.
CREATE TABLE overlay_entries (
    volume TEXT NOT NULL,
    dir    INTEGER NOT NULL,       -- the directory's ino
    name   BLOB NOT NULL,
    cookie INTEGER NOT NULL,       -- its readdir offset: stable while others come and go
    ino    INTEGER NOT NULL,       -- the inode it names (an overlay_inodes row)
    PRIMARY KEY (volume, dir, name)
) WITHOUT ROWID;
"""


def _statements(script: str) -> list[str]:
    # Split on ';' (no comment holds one): executescript would commit the transaction.
    return [s for s in script.split(";") if s.strip()]


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    for statement in _statements(OVERLAY_SCHEMA):
        conn.execute(statement)


def _migrate_2_to_3(conn: sqlite3.Connection) -> None:
    for statement in _statements(LIFECYCLE_SCHEMA):
        conn.execute(statement)


def _migrate_3_to_4(conn: sqlite3.Connection) -> None:
    for statement in _statements(UNSAVED_SCHEMA):
        conn.execute(statement)


def _migrate_4_to_5(conn: sqlite3.Connection) -> None:
    """Split each listing blob of format 4 into entry rows and its header. The blob
    was: next cookie (u64), then per entry cookie (u64), ino (u64), name length (u16),
    name (all little-endian)."""
    for statement in _statements(ENTRIES_SCHEMA):
        conn.execute(statement)
    head = struct.Struct("<QQH")
    query = "SELECT volume, ino, listing FROM overlay_inodes WHERE listing IS NOT NULL"
    rows = conn.execute(query).fetchall()
    for volume, ino, blob in rows:
        raw = bytes(blob)
        pos = 8
        while pos < len(raw):
            cookie, child, n = head.unpack_from(raw, pos)
            pos += head.size
            entry = (volume, ino, raw[pos : pos + n], cookie, child)
            conn.execute("INSERT INTO overlay_entries VALUES (?, ?, ?, ?, ?)", entry)
            pos += n
        header = (raw[:8], volume, ino)
        conn.execute("UPDATE overlay_inodes SET listing = ? WHERE volume = ? AND ino = ?", header)


Migration = Callable[[sqlite3.Connection], None]
# MIGRATIONS[v] upgrades a store of format v to v + 1, inside one transaction.
MIGRATIONS: dict[int, Migration] = {
    1: _migrate_1_to_2,
    2: _migrate_2_to_3,
    3: _migrate_3_to_4,
    4: _migrate_4_to_5,
}
# The schema text of each format step, applied in order by create().
SCHEMAS = (SCHEMA, OVERLAY_SCHEMA, LIFECYCLE_SCHEMA, UNSAVED_SCHEMA, ENTRIES_SCHEMA)

BUSY_TIMEOUT_S = 60.0


class OwnedConnection(sqlite3.Connection):
    """A connection used by exactly one thread, its owner: the one that opened it.

    Statements from any other thread fail at once (a connection shared between the
    event loop and a worker interleaved their transactions: "cannot start a transaction
    within a transaction", and reads of another thread's uncommitted rows). sqlite3's own
    check_same_thread would do as much, but also refuses close() from another thread,
    which a repository needs when it closes the connections of its worker threads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.owner = threading.get_ident()

    def _check_owner(self) -> None:
        if threading.get_ident() != self.owner:
            raise sqlite3.ProgrammingError(
                f"catalog connection of thread {self.owner} used by thread {threading.get_ident()}"
            )

    def execute(self, *args: Any, **kwargs: Any) -> sqlite3.Cursor:
        self._check_owner()
        return super().execute(*args, **kwargs)

    def executemany(self, *args: Any, **kwargs: Any) -> sqlite3.Cursor:
        self._check_owner()
        return super().executemany(*args, **kwargs)

    def executescript(self, *args: Any, **kwargs: Any) -> sqlite3.Cursor:
        self._check_owner()
        return super().executescript(*args, **kwargs)


def connect(path: Path) -> sqlite3.Connection:
    """A new connection, owned by the calling thread (OwnedConnection)."""
    conn = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False, factory=OwnedConnection
    )
    conn.execute("PRAGMA journal_mode = WAL")
    # FULL: a transaction that returned is on disk, which fsync's promise to users needs.
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE … COMMIT: takes the write lock up front so readers of a
    decision (a phase, a refcount) cannot race a second writer."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def create(conn: sqlite3.Connection) -> None:
    # One script, one transaction: a crash leaves either no schema or all of it.
    conn.executescript(
        "BEGIN IMMEDIATE;"
        + "".join(SCHEMAS)
        + f"INSERT INTO meta VALUES ('format_version', '{FORMAT_VERSION}');"
        + f"INSERT INTO meta VALUES ('created', '{time.time()}');"
        + "COMMIT;"
    )


def format_version(conn: sqlite3.Connection) -> int:
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone()
    except sqlite3.DatabaseError as e:
        raise UnsupportedFormat(f"the catalog is not a casfs catalog: {e}") from None
    if row is None:
        raise UnsupportedFormat("the catalog has no format version")
    return int(row[0])


def check_and_migrate(conn: sqlite3.Connection, path: Path) -> None:
    version = format_version(conn)
    if version > FORMAT_VERSION:
        raise UnsupportedFormat(
            f"store at {path.parent} has format {version}; this casfs reads up to "
            f"{FORMAT_VERSION}: upgrade casfs"
        )
    while version < FORMAT_VERSION:
        with transaction(conn):
            # Again under the write lock: another process opening the store may have
            # migrated it since (each step may run only once: ALTER TABLE is not idempotent).
            version = format_version(conn)
            if version >= FORMAT_VERSION:
                break
            step = MIGRATIONS.get(version)
            if step is None:
                raise UnsupportedFormat(f"no migration from store format {version}")
            step(conn)
            conn.execute("UPDATE meta SET value = ? WHERE key = 'format_version'", (str(version + 1),))
        version += 1
