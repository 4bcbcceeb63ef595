"""The catalog: one SQLite database (WAL) that is the store's single source of truth,
and the only code that runs SQL on it (outside the mounted read/write view, casfs.vfs).

    schema.py    FORMAT_VERSION and the tables in their current shape, every column explained
    migrate.py   one function per format step (history): no volume is lost to an upgrade
    images.py    image rows
    volumes.py   volume, snapshot and overlay rows
    blobs.py     blob rows, their reference counts, and the root references of all rows

Here: connections (one owner each), transactions, opening (create or check and
migrate), the meta table, and the one query of start-up recovery.
"""

# (No `from __future__ import annotations` here: typing.NamedTuple compiles each string
# annotation, and the first compile() in a process costs a command's start-up 3 ms.)

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from casfs.catalog.schema import FORMAT_VERSION as FORMAT_VERSION
from casfs.errors import UnsupportedFormat
from casfs.sqlitewal import enable_wal

if TYPE_CHECKING:
    import os

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


def connect(path: "str | os.PathLike[str]") -> sqlite3.Connection:
    """A new connection, owned by the calling thread (OwnedConnection)."""
    conn = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False, factory=OwnedConnection
    )
    enable_wal(conn, BUSY_TIMEOUT_S)
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


@contextmanager
def read_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN … COMMIT with no write: every read inside sees the same instant."""
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        conn.execute("COMMIT")


def format_version(conn: sqlite3.Connection) -> int:
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone()
    except sqlite3.DatabaseError as e:
        raise UnsupportedFormat(f"the catalog is not a casfs catalog: {e}") from None
    if row is None:
        raise UnsupportedFormat("the catalog has no format version")
    return int(row[0])


def check_and_migrate(conn: sqlite3.Connection, store: str) -> bool:
    """Refuse a catalog newer than this casfs; migrate an older one (`store`: its
    directory, for the message). True if the store was older (whoever migrated it)."""
    version = format_version(conn)
    if version > FORMAT_VERSION:
        raise UnsupportedFormat(
            f"store at {store} has format {version}; this casfs reads up to {FORMAT_VERSION}: upgrade casfs"
        )
    if version == FORMAT_VERSION:
        return False
    from casfs.catalog.migrate import MIGRATIONS  # (only for an old store: not every open's)

    # Off while tables are rebuilt (a PRAGMA that is a no-op inside a transaction),
    # checked before each step commits, as SQLite's procedure for schema changes says.
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
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
                broken = conn.execute("PRAGMA foreign_key_check").fetchone()
                if broken is not None:
                    raise UnsupportedFormat(
                        f"store format {version} -> {version + 1}: broken reference {broken}"
                    )
                conn.execute("UPDATE meta SET value = ? WHERE key = 'format_version'", (str(version + 1),))
            version += 1
    finally:
        conn.execute("PRAGMA foreign_keys = ON")
    return True


# -- meta ---------------------------------------------------------------------


def meta_value(conn: sqlite3.Connection, key: str) -> str | None:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def set_meta(conn: sqlite3.Connection, key: str, value: str | None) -> None:
    """Set a meta value (None: remove it), inside the caller's transaction."""
    if value is None:
        conn.execute("DELETE FROM meta WHERE key = ?", (key,))
    else:
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))


# -- start-up recovery ------------------------------------------------------------


class Unfinished(NamedTuple):
    table: str  # 'images' or 'volumes'
    name: str
    phase: str
    owner_pid: int | None


def unfinished(
    conn: sqlite3.Connection, image_phases: tuple[str, ...], volume_phases: tuple[str, ...]
) -> list[Unfinished]:
    """Image and volume rows in the given phases: one query over the phase indexes
    (nothing else is read when there are none)."""
    marks_i, marks_v = ",".join("?" * len(image_phases)), ",".join("?" * len(volume_phases))
    query = (
        f"SELECT 'images', name, phase, owner_pid FROM images WHERE phase IN ({marks_i}) UNION ALL "
        f"SELECT 'volumes', name, phase, owner_pid FROM volumes WHERE phase IN ({marks_v})"
    )
    return [Unfinished(*row) for row in conn.execute(query, (*image_phases, *volume_phases))]
