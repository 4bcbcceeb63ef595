"""Four processes opening a new pack index (or catalog) at once all get in: switching a
new SQLite file to WAL mode answers "database is locked" without waiting for a busy
handler when another process holds a lock, and casfs retries it (casfs.sqlitewal)."""

from __future__ import annotations

import multiprocessing
import sqlite3
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from casfs import catalog
from casfs.sqlitewal import enable_wal
from casfs.store.ids import blob_id
from casfs.store.packindex import PackIndex

ROUNDS = 100  # without the retry, about 1 round in 20 failed


def open_index(path: Path) -> None:
    index = PackIndex(path)
    try:
        assert index.locate(blob_id(b"nothing")) is None
    finally:
        index.close()


def open_catalog(path: Path) -> None:
    catalog.connect(path).close()


def _run(opener: Callable[[Path], None], path: Path, errors: multiprocessing.Queue[str]) -> None:
    try:
        opener(path)
    except BaseException:
        errors.put(traceback.format_exc())


@pytest.mark.parametrize("opener", [open_index, open_catalog])
def test_four_processes_open_a_new_database_at_once(tmp_path: Path, opener: Callable[[Path], None]) -> None:
    ctx = multiprocessing.get_context("fork")
    errors: multiprocessing.Queue[str] = ctx.Queue()
    for n in range(ROUNDS):
        path = tmp_path / f"{n}" / "index.sqlite"
        path.parent.mkdir()
        procs = [ctx.Process(target=_run, args=(opener, path, errors)) for _ in range(4)]
        for p in procs:
            p.start()
        try:
            for p in procs:
                p.join(60)
        finally:
            for p in procs:
                if p.is_alive():  # (hung: not left to outlive the test)
                    p.kill()
                    p.join()
        assert [p.exitcode for p in procs] == [0] * 4
        assert errors.empty(), errors.get()


def test_a_file_that_is_no_database_is_refused_and_its_connection_closed(tmp_path: Path) -> None:
    path = tmp_path / "not-a-db"
    path.write_bytes(b"this is not a SQLite file" * 200)
    conn = sqlite3.connect(path)
    with pytest.raises(sqlite3.DatabaseError):
        enable_wal(conn, 1.0)
    with pytest.raises(sqlite3.ProgrammingError):  # (closed: its file is let go)
        conn.execute("SELECT 1")
