"""Where a local pack store's blobs are: STORE/packs/index.sqlite, the store's own
SQLite file (WAL), beside its packs. It is the store's, not the catalog's: the catalog
says what is live, this says where the bytes of each published blob lie.

    packs   one row per published pack file packs/<name>.pack: its size
    blobs   one row per published blob: its pack, offset and stored length

A blob is published when its row is committed; a pack file without a row is nobody's
(a crash between its rename into packs/ and the commit, or between a commit that
emptied it and its unlink): recover_staging and compaction remove those.

Durability: publish() commits with synchronous=FULL, after its packs are synced and
renamed in (data before the rows that point at it); deletes commit without a sync (a
delete is not durable by itself, BlobStore.delete), except the one that removes a
pack's row, which is made durable (with every delete before it) before the file goes.

Connections: a pool, each taken by one thread at a time, each with a small page cache:
a daemon's RSS must not grow with the store (the OS page cache keeps the file).
Writers of one process queue on a lock rather than on SQLite's busy handler, which
sleeps in steps of milliseconds; writers of other processes (the CLI beside a mount
daemon) wait on SQLite's lock, up to BUSY_TIMEOUT_S.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from casfs.sqlitewal import enable_wal
from casfs.store.ids import BlobId
from casfs.store.located import Located
from casfs.store.packfile import Entry

BUSY_TIMEOUT_S = 60.0
PAGE_CACHE_KIB = 512  # per connection (SQLite's default is 2 MiB)
_IN = 500  # ids per IN (...) query, under SQLite's limit on bound parameters
# warm() asks for at most this much of the index file (and of its WAL): about 600,000
# blobs' rows. A larger index is warmed in part (its first pages: the oldest rows).
WARM_MAX = 64 << 20

SCHEMA = """
CREATE TABLE IF NOT EXISTS packs (
    id   INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: a cached fd names one file
    name TEXT NOT NULL UNIQUE,               -- the file packs/<name>.pack
    size INTEGER NOT NULL                    -- its bytes: header and every blob written to it
);
CREATE TABLE IF NOT EXISTS blobs (
    id     BLOB PRIMARY KEY,                 -- the blob's id (store.ids)
    pack   INTEGER NOT NULL,                 -- packs.id
    offset INTEGER NOT NULL,                 -- of its stored (encoded) bytes in the pack
    length INTEGER NOT NULL                  -- stored bytes
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS blobs_pack ON blobs (pack);
"""

Location = tuple[str, int, int]  # pack name, offset, stored length


@functools.lru_cache(maxsize=64)
def _locate_query(n: int) -> str:
    """locate_many's query for n ids: their places in one row (the ids joined by index)."""
    ids = ",".join(f"({i},?)" for i in range(n))
    return (
        f"WITH q(i, id) AS (VALUES {ids}) SELECT "
        "json_group_array(json_array(q.i, b.pack, b.offset, b.length)) "
        "FROM q JOIN blobs b ON b.id = q.id"
    )


_BITS = 40  # a remembered location: pack id, offset, length in one int, 40 bits each
_MASK = (1 << _BITS) - 1


class PackIndex:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []  # (a stack: the warmest page cache next)
        self._all: list[sqlite3.Connection] = []
        self._write_lock = threading.Lock()
        self._created = False
        self._names: dict[int, str] = {}  # pack id -> name (one str per pack: not per blob)
        # Recent locate() answers, each as one int of pack id, offset and length (_BITS
        # each): 145 bytes an entry where a tuple of them took 235.
        self.located: Located[BlobId, int] = Located()

    def create(self) -> None:
        self._put(self._take())

    def close(self) -> None:
        """Close every connection (none in use); later calls open new ones."""
        with self._lock:
            conns, self._all, self._idle = self._all, [], []
        self.located.clear()
        for c in conns:
            c.close()

    # Connections are pooled, not one per thread: a daemon's worker threads come and go,
    # and SQLite keeps the file descriptor of a closed connection open while another
    # holds a lock on the file. The pool holds as many as ever ran at once.
    def _take(self) -> sqlite3.Connection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        conn = self._connect()
        with self._lock:
            self._all.append(conn)
        return conn

    def _put(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            if conn in self._all:  # (not if close() ran meanwhile)
                self._idle.append(conn)
                return
        conn.close()

    def _rows(self, sql: str, params: tuple[object, ...]) -> list[Any]:
        conn = self._take()
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            self._put(conn)

    def _row(self, sql: str, params: tuple[object, ...]) -> Any:
        conn = self._take()
        try:
            return conn.execute(sql, params).fetchone()
        finally:
            self._put(conn)

    def _connect(self) -> sqlite3.Connection:
        if not self._created:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        enable_wal(conn, BUSY_TIMEOUT_S)
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(f"PRAGMA cache_size = -{PAGE_CACHE_KIB}")
        if not self._created:
            found = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'blobs'").fetchone()
            if found is None:
                conn.execute("BEGIN IMMEDIATE")
                for statement in filter(str.strip, SCHEMA.split(";")):
                    conn.execute(statement)
                conn.execute("COMMIT")
            self._created = True
        return conn

    @contextmanager
    def _write(self, durable: bool) -> Iterator[sqlite3.Connection]:
        conn = self._take()
        try:
            with self._write_lock:
                if durable:
                    conn.execute("PRAGMA synchronous = FULL")
                try:
                    with conn:  # (sqlite3's: COMMIT, or ROLLBACK on an error)
                        conn.execute("BEGIN IMMEDIATE")
                        yield conn
                finally:
                    if durable:
                        conn.execute("PRAGMA synchronous = NORMAL")
        finally:
            self._put(conn)

    def warm(self, most: int = WARM_MAX) -> None:
        """Ask the kernel to read the index file (and its WAL) into the page cache, up
        to `most` bytes each, without waiting (POSIX_FADV_WILLNEED: one sequential read).
        Why: a mount's first reads look up blobs by id, at random places in the file,
        and SQLite reads a page at a time: after a drop of caches, a sequential read of
        a 1 GiB image through a store that also held a 58,000-entry tree (a 7.5 MB
        index) spent 1.9-2.5 s of its read-ahead threads' time per GiB in those lookups,
        0.3-0.4 s with the file asked for first (a 1 MB index alone: 0.4-0.6 s)."""
        for path in (self.path, self.path.with_name(self.path.name + "-wal")):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # (none yet: a new store, or no WAL since the last checkpoint)
            try:
                os.posix_fadvise(fd, 0, min(os.fstat(fd).st_size, most), os.POSIX_FADV_WILLNEED)
            except OSError:
                pass  # (a hint only)
            finally:
                os.close(fd)

    # -- reads ---------------------------------------------------------------------

    def locate(self, bid: BlobId) -> Location | None:
        """Where the blob's stored bytes are, or None; maybe from memory (store.located:
        a place the bytes were published at, which the reader verifies as always)."""
        packed = self.located.get(bid)
        if packed is not None:
            return self._names[packed >> 2 * _BITS], (packed >> _BITS) & _MASK, packed & _MASK
        row = self._row("SELECT pack, offset, length FROM blobs WHERE id = ?", (bid,))
        if row is None:
            return None
        name = self._name(row[0])
        if name is None:
            return None
        if row[1] <= _MASK and row[2] <= _MASK:
            self.located.put(bid, row[0] << 2 * _BITS | row[1] << _BITS | row[2])
        return name, row[1], row[2]

    def locate_many(self, bids: Sequence[BlobId]) -> dict[BlobId, Location]:
        """locate() of each id, in one query per _IN ids (a read-ahead run's: one round
        trip into SQLite instead of one per chunk); ids not found are left out. The
        answer is one row (a JSON array of [index in the part, pack, offset, length]):
        sqlite3 lets go of the GIL for every row it steps to, and on a busy daemon each
        row then waited to have it back (a cold read of a 32 KiB-chunk image: 0.9 ms a
        run of 64 in the read-ahead threads' lookups, 0.11 of it CPU)."""
        import json  # (here: a CLI command that reads no blob skips it)

        out: dict[BlobId, Location] = {}
        for i in range(0, len(bids), _IN):
            part = bids[i : i + _IN]
            (found,) = self._row(_locate_query(len(part)), tuple(part))
            for at, pack, offset, length in json.loads(found):
                name = self._name(pack)
                if name is not None:
                    out[part[at]] = (name, offset, length)
        return out

    def _name(self, pack: int) -> str | None:
        """Pack `pack`'s name (None: dropped since, by a repack)."""
        name = self._names.get(pack)
        if name is None:  # (a pack's id is never reused: AUTOINCREMENT)
            found = self._row("SELECT name FROM packs WHERE id = ?", (pack,))
            if found is None:
                return None  # (dropped since: a repack)
            name = self._names[pack] = found[0]
        return name

    def forget(self, bid: BlobId) -> None:
        """Look `bid` up in the index next time (its remembered pack is gone, or holds
        a copy that failed its check)."""
        self.located.forget((bid,))

    def has(self, bid: BlobId) -> bool:
        return self._row("SELECT 1 FROM blobs WHERE id = ?", (bid,)) is not None

    def page(self, after: bytes, n: int) -> list[BlobId]:
        """Up to n published ids above `after`, in order (list() pages through them)."""
        rows = self._rows("SELECT id FROM blobs WHERE id > ? ORDER BY id LIMIT ?", (after, n))
        return [BlobId(r[0]) for r in rows]

    def has_pack(self, name: str) -> bool:
        return bool(self._rows("SELECT 1 FROM packs WHERE name = ?", (name,)))

    def pack_names(self) -> set[str]:
        return {r[0] for r in self._rows("SELECT name FROM packs", ())}

    def pack_usage(self) -> list[tuple[str, int, int]]:
        """(name, size, live stored bytes) of every pack."""
        query = (
            "SELECT p.name, p.size, COALESCE(SUM(b.length), 0) FROM packs p "
            "LEFT JOIN blobs b ON b.pack = p.id GROUP BY p.id"
        )
        return [(r[0], r[1], r[2]) for r in self._rows(query, ())]

    def live(self, name: str) -> list[Entry]:
        """The blobs pack `name` holds, in the pack's order."""
        query = (
            "SELECT b.id, b.offset, b.length FROM blobs b JOIN packs p ON p.id = b.pack "
            "WHERE p.name = ? ORDER BY b.offset"
        )
        return [(BlobId(r[0]), r[1], r[2]) for r in self._rows(query, (name,))]

    # -- writes --------------------------------------------------------------------

    def publish(self, packs: Sequence[tuple[str, int, Sequence[Entry]]]) -> list[str]:
        """Make the blobs of `packs` (name, size, entries; the files synced and in place)
        visible, durably, in one transaction; a blob already published elsewhere now
        points here. Returns the packs that left with no blob (their rows are gone:
        the caller removes their files)."""
        with self._write(durable=True) as conn:
            before: set[int] = set()
            for name, size, entries in packs:
                pack = conn.execute("INSERT INTO packs (name, size) VALUES (?, ?)", (name, size)).lastrowid
                assert pack is not None
                # New blobs, the common case, cost one insert each (no lookup of every id
                # first), in the ids' order (random order thrashed the page cache: 22,000
                # rows took 0.13 s, sorted 0.06 s); a blob published already (healed,
                # repacked) is moved here by _move.
                added = conn.executemany(
                    "INSERT OR IGNORE INTO blobs (id, pack, offset, length) VALUES (?, ?, ?, ?)",
                    sorted((bid, pack, offset, length) for bid, offset, length in entries),
                ).rowcount
                if added != len(entries):
                    before.update(_move(conn, pack, entries))
            emptied = (_drop_if_empty(conn, pack) for pack in sorted(before))
            gone = [name for name in emptied if name is not None]
        self.located.forget([bid for _, _, entries in packs for bid, _, _ in entries])
        # (forgotten after the commit: a lookup meanwhile may see the old row)
        return gone

    def delete(self, bid: BlobId) -> str | None:
        """Drop `bid`'s row; the name of its pack if that now holds no blob (its row
        then goes too, durably: the caller removes the file)."""
        emptied = self.delete_many([bid])
        return emptied[0] if emptied else None

    def delete_many(self, bids: Sequence[BlobId]) -> list[str]:
        """delete() of every id in one transaction (a gc round frees thousands: one
        commit each cost ~90 us); the names of the packs that now hold no blob."""
        touched: set[int] = set()
        with self._write(durable=False) as conn:
            for i in range(0, len(bids), _IN):
                part = bids[i : i + _IN]
                marks = ",".join("?" * len(part))
                query = f"DELETE FROM blobs WHERE id IN ({marks}) RETURNING pack"
                touched.update(r[0] for r in conn.execute(query, part))
            empty = [p for p in sorted(touched) if not _holds_any(conn, p)]
        self.located.forget(list(bids))
        if not empty:
            return []
        with self._write(durable=True) as conn:  # (every delete before it durable too)
            emptied = (_drop_if_empty(conn, pack) for pack in empty)
            return [name for name in emptied if name is not None]

    def drop_pack(self, name: str) -> bool:
        """Remove pack `name`'s row if no blob is in it (durably); whether it went."""
        with self._write(durable=True) as conn:
            row = conn.execute("SELECT id FROM packs WHERE name = ?", (name,)).fetchone()
            return row is not None and _drop_if_empty(conn, row[0]) is not None


def _move(conn: sqlite3.Connection, pack: int, entries: Sequence[Entry]) -> set[int]:
    """Point the rows of those of `entries` that another pack holds at `pack` (where
    they were just stored again); the packs they were in."""
    where = {bid: (offset, length) for bid, offset, length in entries}
    ids = list(where)
    old: list[tuple[BlobId, int]] = []
    for i in range(0, len(ids), _IN):
        part = ids[i : i + _IN]
        marks = ",".join("?" * len(part))
        query = f"SELECT id, pack FROM blobs WHERE pack != ? AND id IN ({marks})"
        old += [(BlobId(bytes(r[0])), r[1]) for r in conn.execute(query, [pack, *part])]
    conn.executemany(
        "UPDATE blobs SET pack = ?, offset = ?, length = ? WHERE id = ?",
        [(pack, *where[bid], bid) for bid, _ in old],
    )
    return {p for _, p in old}


def _holds_any(conn: sqlite3.Connection, pack: int) -> bool:
    return conn.execute("SELECT 1 FROM blobs WHERE pack = ? LIMIT 1", (pack,)).fetchone() is not None


def _drop_if_empty(conn: sqlite3.Connection, pack: int) -> str | None:
    if _holds_any(conn, pack):
        return None
    row = conn.execute("DELETE FROM packs WHERE id = ? RETURNING name", (pack,)).fetchone()
    return None if row is None else str(row[0])
