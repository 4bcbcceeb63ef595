"""SQLite's errors, wherever they are met, map into casfs's error tree (errors.of_database):
a locked database is Busy (exit 4), a full one NoSpace (ENOSPC, exit 1), a damaged one
Corruption (exit 5), each one clear line, never "unexpected". The errors are SQLite's
own, made for real: a lock held by another connection, a database at its page limit,
a file that is not a database."""

from __future__ import annotations

import contextlib
import errno
import sqlite3
from pathlib import Path

import pytest

from casfs.errors import Busy, Corruption, NoSpace, ReadOnly, of_database
from casfs.repo import Repository
from tests.helpers.cli import casfs


def _raised(fn: object) -> sqlite3.Error:
    assert callable(fn)
    with pytest.raises(sqlite3.Error) as e:
        fn()
    return e.value


def test_a_locked_database_is_busy(tmp_path: Path) -> None:
    db = tmp_path / "db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    other = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        mapped = of_database(_raised(lambda: other.execute("INSERT INTO t VALUES (1)")))
    finally:
        other.close()
        holder.close()
    assert isinstance(mapped, Busy) and mapped.exit_code == 4 and mapped.errno == errno.EBUSY
    assert "database is locked" in str(mapped)


def test_a_full_database_is_no_space(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "db", isolation_level=None)
    conn.execute("CREATE TABLE t (x)")
    conn.execute("PRAGMA max_page_count = 4")  # (SQLite's own 'database or disk is full')

    def grow() -> None:
        for _ in range(100):
            conn.execute("INSERT INTO t VALUES (randomblob(4000))")

    try:
        mapped = of_database(_raised(grow))
    finally:
        conn.close()
    assert isinstance(mapped, NoSpace) and mapped.exit_code == 1 and mapped.errno == errno.ENOSPC
    assert str(mapped).startswith("No space left on device") and "database or disk is full" in str(mapped)


def test_a_read_only_database_is_read_only(tmp_path: Path) -> None:
    db = tmp_path / "db"
    sqlite3.connect(db).close()
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    try:
        mapped = of_database(_raised(lambda: conn.execute("CREATE TABLE t (x)")))
    finally:
        conn.close()
    assert isinstance(mapped, ReadOnly) and mapped.exit_code == 4


def test_other_errors_are_not_database_errors() -> None:
    assert of_database(ValueError("database is locked")) is None
    assert of_database(OSError(errno.ENOSPC, "No space left on device")) is None


def test_a_damaged_catalog_is_corruption_in_one_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    Repository.init(store).close()
    with contextlib.suppress(FileNotFoundError):
        for suffix in ("-wal", "-shm"):
            (store / f"catalog.db{suffix}").unlink()
    (store / "catalog.db").write_bytes(b"not a database" * 1000)
    done = casfs(store, "volume", "ls")
    assert done.returncode == Corruption.exit_code, done
    assert "damaged" in done.stderr and "unexpected" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
