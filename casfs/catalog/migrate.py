"""Migrations: one function per catalog format step, kept as history.

MIGRATIONS[v] upgrades a store of format v to v + 1 inside one transaction (foreign keys
off, as SQLite's table-rebuild procedure asks, and checked before the commit). A step
is never edited once released: the schema texts below are each format's as it was, and
the current shape is catalog.schema's (a test compares a migrated store with a new one).
"""

from __future__ import annotations

import sqlite3
import struct
from collections.abc import Callable

from casfs.errors import UnsupportedFormat

# Format 1 is tests/data/stores/format-1 (casfs 2642236): blobs, images, volumes, snapshots, meta.

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


# Format 6: a CHECK on every phase column (the values of casfs.lifecycle.phases as of
# format 6) and an index on each, so start-up recovery finds the "-ing" phases in one
# indexed query. SQLite cannot add a CHECK to a table: the tables are rebuilt
# (https://www.sqlite.org/lang_altertable.html, "making other kinds of table schema
# changes": create the new table, copy, drop the old, rename, recreate its indexes).
PHASES_6 = {
    "images": ("queued", "importing", "verifying", "ready", "failed"),
    "volumes": ("creating", "ready", "mounted", "snapshotting", "deleting"),
}
CHECKED_TABLES = {
    "images": """
CREATE TABLE new_images (
    name       TEXT PRIMARY KEY,
    kind       TEXT NOT NULL CHECK (kind IN ('dir', 'block')),
    phase      TEXT NOT NULL CHECK (phase IN ('queued', 'importing', 'verifying', 'ready', 'failed')),
    root       BLOB,
    size       INTEGER NOT NULL DEFAULT 0,
    chunk_size INTEGER NOT NULL,
    next_ino   INTEGER NOT NULL DEFAULT 2,
    source     TEXT,
    digest     TEXT,
    spec       TEXT,
    error      TEXT,
    owner_pid  INTEGER,
    created    REAL NOT NULL
)""",
    "volumes": """
CREATE TABLE new_volumes (
    name          TEXT PRIMARY KEY,
    kind          TEXT NOT NULL CHECK (kind IN ('dir', 'block')),
    mode          TEXT NOT NULL CHECK (mode IN ('rw', 'ro')),
    phase         TEXT NOT NULL CHECK (phase IN ('creating', 'ready', 'mounted', 'snapshotting', 'deleting')),
    base          BLOB NOT NULL,
    origin        TEXT NOT NULL,
    size          INTEGER NOT NULL,
    chunk_size    INTEGER NOT NULL,
    next_ino      INTEGER NOT NULL DEFAULT 2,
    next_snapshot INTEGER NOT NULL DEFAULT 1,
    spec          TEXT,
    owner_pid     INTEGER,
    created       REAL NOT NULL,
    grace_s       REAL,
    last_used     REAL,
    unsaved       TEXT
)""",
}


def _migrate_5_to_6(conn: sqlite3.Connection) -> None:
    """Rebuild images and volumes with a CHECK on phase. A row of a phase no casfs
    wrote stops the migration: the store stays at format 5, as it was."""
    for table, create in CHECKED_TABLES.items():
        known = ", ".join(f"'{p}'" for p in PHASES_6[table])
        odd = conn.execute(f"SELECT name, phase FROM {table} WHERE phase NOT IN ({known})").fetchall()
        if odd:
            listed = ", ".join(f"{name} ({phase!r})" for name, phase in odd)
            raise UnsupportedFormat(f"{table} in phases no casfs writes, left as they are: {listed}")
        columns = ", ".join(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))
        conn.execute(create)
        conn.execute(f"INSERT INTO new_{table} ({columns}) SELECT {columns} FROM {table}")
        conn.execute(f"DROP TABLE {table}")
        conn.execute(f"ALTER TABLE new_{table} RENAME TO {table}")
        conn.execute(f"CREATE INDEX {table}_phase ON {table} (phase)")


# Format 7: block volumes write into upper files (casfs.vfs.overlay.upper). A format-6
# volume's overlay rows stay as they are (a block volume reads and folds them under its
# upper); older casfs must not open a store whose uppers it would ignore.
UPPERS_SCHEMA = """
CREATE TABLE uppers (
    volume TEXT NOT NULL REFERENCES volumes (name),
    epoch  INTEGER NOT NULL,
    snapshot INTEGER,
    label    TEXT,
    taken    REAL,
    PRIMARY KEY (volume, epoch)
) WITHOUT ROWID
"""


def _migrate_6_to_7(conn: sqlite3.Connection) -> None:
    conn.execute(UPPERS_SCHEMA)


# Format 8: what an OCI image remembers (casfs.importers.oci): a JSON column, and the
# trees of its first layers, which later imports sharing those layers start from. And
# a directory volume's changed files live in upper files, one per inode
# (casfs.vfs.overlay.files), named by the overlay row's new `upper` column; rows of
# format 7 keep NULL (their data is in overlay_chunks, read and folded as before). And
# replicas (casfs.replica): where received snapshots came from, and what other stores
# held when last seen (a snapshot without provenance was taken here).
FORMAT_8_SCHEMA = """
ALTER TABLE images ADD COLUMN oci TEXT;
CREATE TABLE image_chains (
    image    TEXT NOT NULL REFERENCES images (name),
    layers   INTEGER NOT NULL,
    chain_id TEXT NOT NULL,
    root     BLOB NOT NULL,
    PRIMARY KEY (image, layers)
) WITHOUT ROWID;
CREATE INDEX image_chains_chain ON image_chains (chain_id);
ALTER TABLE overlay_inodes ADD COLUMN upper INTEGER;
CREATE TABLE provenance (
    volume   TEXT NOT NULL,
    n        INTEGER NOT NULL,
    made_by  TEXT NOT NULL,
    source   TEXT NOT NULL,
    received REAL NOT NULL,
    PRIMARY KEY (volume, n)
) WITHOUT ROWID;
CREATE TABLE peers (
    volume TEXT NOT NULL,
    source TEXT NOT NULL,
    store  TEXT NOT NULL,
    remote TEXT NOT NULL,
    newest INTEGER,
    root   BLOB,
    seen   REAL NOT NULL,
    PRIMARY KEY (volume, source)
) WITHOUT ROWID
"""


def _migrate_7_to_8(conn: sqlite3.Connection) -> None:
    for statement in _statements(FORMAT_8_SCHEMA):
        conn.execute(statement)


# Format 9: a local store's new blobs go into pack files (casfs.store.packstore), named by
# an index of the store's own (STORE/packs/index.sqlite), not by a file per blob. No
# catalog table changes: the step is the version, so that an older casfs, which would
# see none of the packed blobs, refuses the store. The blob files of the older store
# stay where they are and are read there (why: casfs.store.packstore).
def _migrate_8_to_9(conn: sqlite3.Connection) -> None:
    pass


# Format 10: kept space figures (casfs.refcount.figures), so that listings cost what they
# list. The step adds the table and the indexes that find a root's holders, a row for
# every image, volume and snapshot with every figure pending (7), and meta
# 'figures.recount', which makes the next command count them all once, with progress on
# a terminal (casfs.cli.store).
FIGURES_SCHEMA = """
CREATE TABLE figures (
    subject TEXT PRIMARY KEY,
    stored  INTEGER NOT NULL,
    written INTEGER NOT NULL,
    uniq    INTEGER NOT NULL,
    pending INTEGER NOT NULL DEFAULT 0,
    marks   INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX images_root ON images (root);
CREATE INDEX volumes_base ON volumes (base);
CREATE INDEX snapshots_root ON snapshots (root);
INSERT INTO figures (subject, stored, written, uniq, pending)
    SELECT 'image:' || name, 0, 0, 0, 7 FROM images WHERE phase = 'ready'
    UNION ALL SELECT 'volume:' || name, 0, 0, 0, 7 FROM volumes WHERE phase != 'creating'
    UNION ALL SELECT 'snapshot:' || volume || '@' || n, 0, 0, 0, 7 FROM snapshots;
INSERT INTO meta (key, value) VALUES ('figures.recount', 'format 10')
"""
# And the blobs table's totals, kept by triggers (counted once here). The triggers' bodies
# hold ';': each is one statement, run whole.
TOTALS_TABLE = """
CREATE TABLE blob_totals (
    one     INTEGER PRIMARY KEY CHECK (one = 0),
    blobs   INTEGER NOT NULL,
    stored  INTEGER NOT NULL,
    garbage INTEGER NOT NULL
)"""
TOTALS_TRIGGERS = (
    """CREATE TRIGGER blob_totals_insert AFTER INSERT ON blobs BEGIN
    UPDATE blob_totals SET blobs = blobs + 1, stored = stored + NEW.stored,
        garbage = garbage + (CASE WHEN NEW.refs = 0 THEN NEW.stored ELSE 0 END);
END""",
    """CREATE TRIGGER blob_totals_delete AFTER DELETE ON blobs BEGIN
    UPDATE blob_totals SET blobs = blobs - 1, stored = stored - OLD.stored,
        garbage = garbage - (CASE WHEN OLD.refs = 0 THEN OLD.stored ELSE 0 END);
END""",
    """CREATE TRIGGER blob_totals_update AFTER UPDATE OF refs, stored ON blobs
WHEN (OLD.refs = 0) != (NEW.refs = 0) OR OLD.stored != NEW.stored BEGIN
    UPDATE blob_totals SET stored = stored + NEW.stored - OLD.stored,
        garbage = garbage + (CASE WHEN NEW.refs = 0 THEN NEW.stored ELSE 0 END)
            - (CASE WHEN OLD.refs = 0 THEN OLD.stored ELSE 0 END);
END""",
)


def _migrate_9_to_10(conn: sqlite3.Connection) -> None:
    for statement in _statements(FIGURES_SCHEMA):
        conn.execute(statement)
    conn.execute(TOTALS_TABLE)
    conn.execute(
        "INSERT INTO blob_totals SELECT 0, COUNT(*), COALESCE(SUM(stored), 0), "
        "COALESCE(SUM(CASE WHEN refs = 0 THEN stored END), 0) FROM blobs"
    )
    for trigger in TOTALS_TRIGGERS:
        conn.execute(trigger)


# Format 11: the containerd snapshotter's snapshots (casfs.snapshotter).
SNAPSHOTTER_SCHEMA = """
-- containerd's snapshots served by `casfs snapshotter serve`: each is a casfs volume
-- (active, view) or one of its snapshots (committed). Keys are the snapshotter's, as
-- containerd names them (its namespace and sequence in them).
CREATE TABLE ctr_snapshots (
    key       TEXT PRIMARY KEY,
    kind      TEXT NOT NULL CHECK (kind IN ('view', 'active', 'committed')),
    -- preparing | ready | committing | removing (casfs.snapshotter.records)
    phase     TEXT NOT NULL CHECK (phase IN ('preparing', 'ready', 'committing', 'removing')),
    owner_pid INTEGER,              -- the snapshotter in a phase other than ready
    parent    TEXT NOT NULL,        -- its parent's key ('' for none)
    volume    TEXT NOT NULL,        -- the casfs volume it is, or whose snapshot it is
    snapshot  INTEGER,              -- committed: that volume's snapshot number
    labels    TEXT NOT NULL,        -- JSON object
    created   REAL NOT NULL,        -- unix time
    updated   REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX ctr_snapshots_parent ON ctr_snapshots (parent);
"""


# Also in format 11: bookmarks, a removed snapshot's number and root (casfs.volumes.prune), so
# that a pull after retention still checks the line. A new table only; an older casfs
# would remove snapshots without them, so the step is the version.
BOOKMARKS_TABLE = """
CREATE TABLE bookmarks (
    volume  TEXT NOT NULL,
    n       INTEGER NOT NULL,
    root    BLOB NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (volume, n)
) WITHOUT ROWID"""


def _migrate_10_to_11(conn: sqlite3.Connection) -> None:
    for statement in _statements(SNAPSHOTTER_SCHEMA):
        conn.execute(statement)
    conn.execute(BOOKMARKS_TABLE)


Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: dict[int, Migration] = {
    1: _migrate_1_to_2,
    2: _migrate_2_to_3,
    3: _migrate_3_to_4,
    4: _migrate_4_to_5,
    5: _migrate_5_to_6,
    6: _migrate_6_to_7,
    7: _migrate_7_to_8,
    8: _migrate_8_to_9,
    9: _migrate_9_to_10,
    10: _migrate_10_to_11,
}
