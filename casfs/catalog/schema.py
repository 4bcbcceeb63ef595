"""The catalog's schema in its CURRENT shape, written once: what a new store gets.

A store made by an older casfs reaches the same shape through catalog.migrate (one
step per format). Sentinels are named where they are used: ZERO_ID (32 zero bytes) is
"no blob" (a hole, or a base not written yet) and holds no reference.

The phase lists below are the values of casfs.lifecycle.phases (ImagePhase,
VolumePhase); the catalog sits below lifecycle, so they are spelled out here and a test
(tests/test_migration.py) keeps the two equal.
"""

from __future__ import annotations

import sqlite3
import time

FORMAT_VERSION = 11

IMAGE_PHASES = ("queued", "importing", "verifying", "ready", "failed")
VOLUME_PHASES = ("creating", "ready", "mounted", "snapshotting", "deleting")


def _one_of(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


TABLES = f"""
-- Key/value facts and settings: format_version (this file's FORMAT_VERSION), created
-- (unix time), store_id (a random id, made by the first replica command: casfs.replica),
-- and the settings of casfs.lifecycle.config (e.g. queue.limit).
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Every blob the store holds or is about to free. A row holds references on its
-- children (the ids its plaintext names): inserting a row increments them, and gc
-- decrements them when it deletes the row. Hence, always:
--   refs(b) = references from roots + occurrences of b among the children of all rows.
CREATE TABLE blobs (
    id     BLOB PRIMARY KEY,       -- BLAKE3-256 of the plaintext (metadata: derive-key mode)
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
    -- queued -> importing -> verifying -> ready, or failed (casfs.lifecycle.phases)
    phase      TEXT NOT NULL CHECK (phase IN ({_one_of(IMAGE_PHASES)})),
    root       BLOB,               -- tree (dir) or chunk-map root (block); NULL until ready
    size       INTEGER NOT NULL DEFAULT 0,   -- logical bytes (file bytes, or the disk size)
    chunk_size INTEGER NOT NULL,
    next_ino   INTEGER NOT NULL DEFAULT 2,   -- inode numbers below this are taken (1 is the root)
    source     TEXT,               -- what it was imported from, for `info`
    digest     TEXT,               -- blake3:HEX of the source as read (and sha256 when asked)
    spec       TEXT,               -- JSON of the request, so a repeat can be told from a conflict
    error      TEXT,               -- why it failed (phase failed)
    owner_pid  INTEGER,            -- the process doing the current phase's work; NULL at rest
    created    REAL NOT NULL,      -- unix time
    -- An OCI image's (casfs.importers.oci): JSON of its manifest, index and config digests,
    -- its layers' chain id (a later import sharing those layers starts from this root),
    -- its layers, and the config a runtime needs (entrypoint, cmd, env, workdir, user,
    -- labels, platform). NULL: not imported from an OCI image.
    oci        TEXT
);
-- Start-up recovery looks up the "-ing" phases: one indexed query when there are none.
CREATE INDEX images_phase ON images (phase);

-- The trees of an OCI image's first k layers (k = 1 .. layers - 1; all of them is the
-- image's root), so that an import of another image with those layers starts there
-- (casfs.importers.oci.importer). Each root holds one reference; removed with the image.
CREATE TABLE image_chains (
    image    TEXT NOT NULL REFERENCES images (name),
    layers   INTEGER NOT NULL,     -- k
    chain_id TEXT NOT NULL,        -- sha256:HEX, the chain id of those layers (image-spec config.md)
    root     BLOB NOT NULL,        -- their tree
    PRIMARY KEY (image, layers)
) WITHOUT ROWID;
CREATE INDEX image_chains_chain ON image_chains (chain_id);

-- Named, mountable state: a base root plus (while mounted read/write) an overlay.
CREATE TABLE volumes (
    name          TEXT PRIMARY KEY,
    kind          TEXT NOT NULL CHECK (kind IN ('dir', 'block')),
    mode          TEXT NOT NULL CHECK (mode IN ('rw', 'ro')),
    -- creating | ready | mounted | snapshotting | deleting (casfs.lifecycle.phases)
    phase         TEXT NOT NULL CHECK (phase IN ({_one_of(VOLUME_PHASES)})),
    base          BLOB NOT NULL,   -- root the overlay applies to; holds one reference
                                   -- (ZERO_ID while a blank volume is creating: none)
    origin        TEXT NOT NULL,   -- 'image:NAME', 'snapshot:VOL@N' or 'blank'
    size          INTEGER NOT NULL, -- logical bytes of the base
    chunk_size    INTEGER NOT NULL,
    next_ino      INTEGER NOT NULL DEFAULT 2,  -- inode numbers below this are taken
    next_snapshot INTEGER NOT NULL DEFAULT 1,  -- numbers are never reused
    spec          TEXT,            -- JSON of the create request (repeat or conflict)
    owner_pid     INTEGER,         -- the process holding the phase (the daemon when mounted)
    created       REAL NOT NULL,   -- unix time
    -- Seconds the volume may go unused (not mounted) before `casfs gc` removes it.
    -- NULL: kept until removed by hand.
    grace_s       REAL,
    -- Unix time of its creation, or its last mount or unmount (catalog.volumes.touch).
    -- NULL (a volume from format 2): its creation time counts.
    last_used     REAL,
    -- Set when a read/write mount ended without saving every change it had acknowledged
    -- (a forced unmount while the store could not take the data): JSON {{"time", "pid",
    -- "error", "unsaved": [[path, bytes], ...]}}. Cleared by the next mount that ends
    -- cleanly. NULL: the last mount saved everything.
    unsaved       TEXT
);
CREATE INDEX volumes_phase ON volumes (phase);

-- Immutable numbered states of a volume. Each root holds one reference.
CREATE TABLE snapshots (
    volume     TEXT NOT NULL REFERENCES volumes (name),
    n          INTEGER NOT NULL,   -- 1, 2, ...: from volumes.next_snapshot
    root       BLOB NOT NULL,
    size       INTEGER NOT NULL,   -- logical bytes
    next_ino   INTEGER NOT NULL,
    label      TEXT,               -- free-form, from --label
    created    REAL NOT NULL,      -- unix time
    PRIMARY KEY (volume, n)
);

-- Space figures kept for every ready image, volume and snapshot (casfs.refcount.figures),
-- so that listings read them instead of walking chunk maps. Kept in the transaction that
-- changes what they count; a figure that operation cannot know exactly is marked pending
-- and counted again later (within a budget by the next command, in full by `casfs gc`
-- and `casfs fsck --repair`). No row (rows made by hand): every figure pending.
CREATE TABLE figures (
    subject TEXT PRIMARY KEY,      -- 'image:NAME', 'volume:NAME' or 'snapshot:VOL@N'
    stored  INTEGER NOT NULL,      -- bytes on disk of the distinct blobs its roots reach
    written INTEGER NOT NULL,      -- of those, what its origin (a snapshot: the one before) does not reach
    uniq    INTEGER NOT NULL,      -- bytes removing it and running gc would free
    pending INTEGER NOT NULL DEFAULT 0, -- bits that may be out of date: 1 stored, 2 written, 4 unique
    marks   INTEGER NOT NULL DEFAULT 0  -- bumped by every change: a count made meanwhile is not written
) WITHOUT ROWID;
-- The blobs table's totals, kept by triggers so that the store's summary line reads one
-- row, not millions (fsck recounts it). Garbage: the stored bytes of rows at refs 0.
CREATE TABLE blob_totals (
    one     INTEGER PRIMARY KEY CHECK (one = 0),
    blobs   INTEGER NOT NULL,
    stored  INTEGER NOT NULL,
    garbage INTEGER NOT NULL
);
CREATE TRIGGER blob_totals_insert AFTER INSERT ON blobs BEGIN
    UPDATE blob_totals SET blobs = blobs + 1, stored = stored + NEW.stored,
        garbage = garbage + (CASE WHEN NEW.refs = 0 THEN NEW.stored ELSE 0 END);
END;
CREATE TRIGGER blob_totals_delete AFTER DELETE ON blobs BEGIN
    UPDATE blob_totals SET blobs = blobs - 1, stored = stored - OLD.stored,
        garbage = garbage - (CASE WHEN OLD.refs = 0 THEN OLD.stored ELSE 0 END);
END;
CREATE TRIGGER blob_totals_update AFTER UPDATE OF refs, stored ON blobs
WHEN (OLD.refs = 0) != (NEW.refs = 0) OR OLD.stored != NEW.stored BEGIN
    UPDATE blob_totals SET stored = stored + NEW.stored - OLD.stored,
        garbage = garbage + (CASE WHEN NEW.refs = 0 THEN NEW.stored ELSE 0 END)
            - (CASE WHEN OLD.refs = 0 THEN OLD.stored ELSE 0 END);
END;
-- Who holds a root (catalog.figures.holder_rows): one indexed lookup per table.
CREATE INDEX images_root ON images (root);
CREATE INDEX volumes_base ON volumes (base);
CREATE INDEX snapshots_root ON snapshots (root);

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
    listing    BLOB,               -- directory: non-NULL once copied up: the listing's header
                                   -- (next readdir cookie, 8 bytes little-endian), its entries
                                   -- in overlay_entries; NULL: the base subtree's entries
    upper      INTEGER,            -- file of a directory volume: its whole content is the
                                   -- upper file STORE/upper/<volume>/i<ino>.<upper>; NULL: the
                                   -- base content and overlay_chunks
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

-- The entries of the overlay's materialized directories (those whose overlay_inodes
-- row has a non-NULL listing).
CREATE TABLE overlay_entries (
    volume TEXT NOT NULL,
    dir    INTEGER NOT NULL,       -- the directory's ino
    name   BLOB NOT NULL,
    cookie INTEGER NOT NULL,       -- its readdir offset: stable while others come and go
    ino    INTEGER NOT NULL,       -- the inode it names (an overlay_inodes row)
    PRIMARY KEY (volume, dir, name)
) WITHOUT ROWID;

-- Upper files of read/write block volumes (casfs.vfs.overlay.upper): the blocks
-- written since the base, in STORE/upper/<volume>/<epoch>.data and .map. A row names
-- an epoch once its first sync made the files durable; a snapshot freezes it; the fold
-- that turns it into blobs deletes the row in the transaction that adds its snapshot.
-- Files no row names are left-overs, deleted when seen. Epochs apply in order: a
-- volume reads as its base, then each frozen epoch, then the one written now.
CREATE TABLE uppers (
    volume TEXT NOT NULL REFERENCES volumes (name),
    epoch  INTEGER NOT NULL,       -- names the files: unique (nanoseconds at creation)
    -- NULL: the epoch writes go to. n: frozen as snapshot n (taken, its number given
    -- out), until the fold that stores it as blobs adds the snapshots row.
    snapshot INTEGER,
    label    TEXT,                 -- the frozen snapshot's label
    taken    REAL,                 -- when it was taken (unix time): the snapshot's time
    PRIMARY KEY (volume, epoch)
) WITHOUT ROWID;

-- Where each snapshot received from another store came from (casfs.replica). A
-- snapshot without a row was taken here. Numbers are the origin's: a replica's vm1@7
-- is the origin's vm1@7, same root.
CREATE TABLE provenance (
    volume   TEXT NOT NULL,
    n        INTEGER NOT NULL,
    made_by  TEXT NOT NULL,        -- id of the store that took it (meta 'store_id' there)
    source   TEXT NOT NULL,        -- what it was received from: a SOURCE of `casfs pull`, or 'stream'
    received REAL NOT NULL,        -- unix time
    PRIMARY KEY (volume, n)
) WITHOUT ROWID;

-- Removed snapshots' numbers and roots (casfs.volumes.prune): no reference, the blobs
-- may be gone; a pull's lineage check compares them as it compares snapshots (ZFS's
-- bookmarks). Removed with the volume.
CREATE TABLE bookmarks (
    volume  TEXT NOT NULL,
    n       INTEGER NOT NULL,
    root    BLOB NOT NULL,
    created REAL NOT NULL,         -- when the snapshot was taken (unix time)
    PRIMARY KEY (volume, n)
) WITHOUT ROWID;

-- Other stores holding a replica of a volume, as last seen by a pull or a check
-- (casfs.replica.peers): the newest snapshot each had then.
CREATE TABLE peers (
    volume TEXT NOT NULL,          -- the local volume's name
    source TEXT NOT NULL,          -- how to reach it: a store path or ssh://[USER@]HOST[:PORT]/STORE
    store  TEXT NOT NULL,          -- its store id
    remote TEXT NOT NULL,          -- the volume's name there
    newest INTEGER,                -- its newest snapshot number (NULL: none)
    root   BLOB,                   -- that snapshot's root
    seen   REAL NOT NULL,          -- unix time
    PRIMARY KEY (volume, source)
) WITHOUT ROWID;

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


def create_tables(conn: sqlite3.Connection) -> None:
    """A new store's catalog. One script, one transaction: a crash leaves either no
    schema or all of it."""
    conn.executescript(
        "BEGIN IMMEDIATE;"
        + TABLES
        + f"INSERT INTO meta VALUES ('format_version', '{FORMAT_VERSION}');"
        + f"INSERT INTO meta VALUES ('created', '{time.time()}');"
        + "INSERT INTO blob_totals VALUES (0, 0, 0, 0);"
        + "COMMIT;"
    )
