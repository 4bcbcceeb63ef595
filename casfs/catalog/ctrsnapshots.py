"""Rows of containerd's snapshots (the snapshotter's, casfs.snapshotter): the only SQL
about them. Inside the caller's transaction."""

# (No `from __future__ import annotations`: NamedTuple, as in the other row modules.)

import sqlite3
from typing import Any, NamedTuple


class CtrRow(NamedTuple):
    key: str
    kind: str  # view | active | committed
    phase: str  # preparing | ready | committing | removing
    owner_pid: int | None
    parent: str
    volume: str
    snapshot: int | None
    labels: str  # JSON object
    created: float
    updated: float


_SELECT = "SELECT " + ", ".join(CtrRow._fields) + " FROM ctr_snapshots"


def row(conn: sqlite3.Connection, key: str) -> CtrRow | None:
    found = conn.execute(_SELECT + " WHERE key = ?", (key,)).fetchone()
    return None if found is None else CtrRow(*found)


def rows(conn: sqlite3.Connection) -> list[CtrRow]:
    return [CtrRow(*r) for r in conn.execute(_SELECT + " ORDER BY key")]


def children(conn: sqlite3.Connection, key: str) -> list[str]:
    return [k for (k,) in conn.execute("SELECT key FROM ctr_snapshots WHERE parent = ? ORDER BY key", (key,))]


def insert(conn: sqlite3.Connection, r: CtrRow) -> None:
    conn.execute(f"INSERT INTO ctr_snapshots VALUES ({', '.join('?' * len(CtrRow._fields))})", tuple(r))


def update(conn: sqlite3.Connection, key: str, **values: Any) -> None:
    """Set the named columns of `key`'s row."""
    names = [n for n in values if n in CtrRow._fields and n != "key"]
    assert names and len(names) == len(values), values
    conn.execute(
        f"UPDATE ctr_snapshots SET {', '.join(f'{n} = ?' for n in names)} WHERE key = ?",
        (*(values[n] for n in names), key),
    )


def delete(conn: sqlite3.Connection, key: str) -> None:
    conn.execute("DELETE FROM ctr_snapshots WHERE key = ?", (key,))
