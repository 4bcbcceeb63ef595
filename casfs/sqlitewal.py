"""Putting a SQLite database in WAL mode when other processes may be opening it too.

`PRAGMA journal_mode = WAL` on a database that is not yet in WAL mode (a new file: the
pack index of a store a newer casfs opens first, a new catalog) needs the file's
exclusive lock, and SQLite answers "database is locked" at once when another
connection holds a lock then, without calling its busy handler (4 processes opening
a new file at once: 9-10 rounds in 200 failed, 2026-11-27). A full suite saw it once:
one of four `casfs volume ls` opening a format-7 store failed. So it is retried here,
for as long as a busy connection would wait. A leaf module: both the catalog and the
store use it.
"""

from __future__ import annotations

import sqlite3
import time

_RETRY_S = 0.01


def enable_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """Put the connection's database in WAL mode, retrying while another holds a lock.
    If it cannot, the connection is closed (it is of no use) and the error raised."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            busy = e.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
            if not busy or time.monotonic() >= deadline:
                conn.close()
                raise
            time.sleep(_RETRY_S)
        except BaseException:
            conn.close()
            raise
