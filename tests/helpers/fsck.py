"""A store's consistency, checked from the outside: fsck through the repository's API
(not the CLI: no interpreter start, no recovery first), and a look at the catalog and
the files that goes through neither (so it changes nothing)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

from casfs.refcount.fsck import fsck
from casfs.repo import Repository
from tests.helpers.blobs import blob_ids, indexed_packs, pack_files


class Stores:
    """The stores a test made, to be checked when it ends (the
    autouse `stores` fixture in tests/conftest.py)."""

    def __init__(self) -> None:
        self.paths: list[Path] = []

    def add(self, path: Path) -> Path:
        self.paths.append(path)
        return path


def fsck_clean(store: Path, timeout: float = 30.0) -> None:
    """fsck finds nothing; Busy if the store's lock is not free within `timeout`."""
    with contextlib.closing(Repository.open(store)) as repo:
        report = fsck(repo, timeout=timeout)
    found = [f"{p.kind}: {p.message}" for p in report.problems]
    assert not found, f"fsck of {store}: {len(found)} problem(s), first {found[:5]}"


def query(store: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows from the catalog, read-only."""
    conn = sqlite3.connect(f"file:{store / 'catalog.db'}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def tmp_files(store: Path) -> list[str]:
    return [str(p.relative_to(store)) for p in (store / "tmp").rglob("*")]


def assert_consistent(store: Path) -> None:
    """fsck is clean, every stored blob has a row (no orphans), every pack file an
    index row and every index row its file, nothing is left staged."""
    fsck_clean(store)
    rows = {bytes(r[0]).hex() for r in query(store, "SELECT id FROM blobs")}
    assert blob_ids(store) == rows
    assert pack_files(store) == indexed_packs(store)
    assert tmp_files(store) == []
