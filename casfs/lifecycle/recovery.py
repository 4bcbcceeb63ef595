"""Crash recovery: at the start of every command and of the daemon, finish or roll back
what a dead process left in an "-ing" phase.

    image  queued | importing | verifying   the row is removed. Staged blobs are only
                                            published at commit, so the import left
                                            staging files (swept) or, if it died between
                                            publishing and committing, blob files no row
                                            names (orphans, swept below)
    volume creating        the row is removed (it held no reference yet)
    volume snapshotting    back to ready: the fold is one transaction, so the overlay is
                           intact and the next snapshot redoes it
    volume deleting        the delete is finished
    volume mounted         back to ready: its overlay stays, the next mount or
                           snapshot takes it up

"Dead" is casfs.lifecycle.pids.alive: a process of this PID namespace that is gone or
a zombie. Every decision is re-checked inside the transaction that acts on it, so two
processes recovering at once do each thing once.

Orphan files are swept only after a dead writer was found, and only while holding the
store's lock exclusively (no batch is then between publishing files and committing
their rows); if the lock is busy, the sweep is left to `casfs gc`, which always does it.
"""

from __future__ import annotations

import os
import sqlite3
from typing import TYPE_CHECKING

from casfs.catalog import transaction
from casfs.errors import Busy
from casfs.lifecycle.pids import alive
from casfs.refcount.gc import unreferenced_files

if TYPE_CHECKING:
    from casfs.repo import Repository


def recover(repo: Repository) -> list[str]:
    """Recover what dead processes left; one message per action (the CLI prints each
    as `casfs: recovered: MESSAGE`)."""
    messages: list[str] = []
    wrote = _images(repo.conn, messages)
    wrote = _volumes(repo, messages) or wrote
    staged = repo.blobs.recover_staging(alive)
    if staged:
        messages.append(f"removed {staged} staging file(s) left by dead processes")
    if wrote:
        orphans = sweep_orphans(repo)
        if orphans is None:
            messages.append("the store is busy: `casfs gc` will remove any orphan blob files")
        elif orphans:
            messages.append(f"removed {orphans} orphan blob file(s) published but never committed")
    return messages


def _dead(conn: sqlite3.Connection, query: str) -> list[tuple[str, str, int | None]]:
    return [(n, p, pid) for n, p, pid in conn.execute(query).fetchall() if not alive(pid)]


def _images(conn: sqlite3.Connection, messages: list[str]) -> bool:
    found = False
    query = "SELECT name, phase, owner_pid FROM images WHERE phase IN ('queued', 'importing', 'verifying')"
    for name, phase, pid in _dead(conn, query):
        with transaction(conn):
            gone = conn.execute(
                "DELETE FROM images WHERE name = ? AND phase = ? AND owner_pid IS ?", (name, phase, pid)
            ).rowcount
        if gone:
            found = True
            messages.append(f"image {name}: import by dead process {pid} ({phase}) rolled back")
    return found


def _volumes(repo: Repository, messages: list[str]) -> bool:
    from casfs.volumes import finish_delete

    conn = repo.conn
    wrote = False
    query = (
        "SELECT name, phase, owner_pid FROM volumes "
        "WHERE phase IN ('creating', 'snapshotting', 'deleting', 'mounted')"
    )
    for name, phase, pid in _dead(conn, query):
        same = (name, phase, pid)
        where = "name = ? AND phase = ? AND owner_pid IS ?"
        with transaction(conn):
            if phase == "creating":
                done = conn.execute(f"DELETE FROM volumes WHERE {where}", same).rowcount
                what = "creation rolled back"
            elif phase == "deleting":
                done = conn.execute(
                    f"UPDATE volumes SET owner_pid = ? WHERE {where}", (os.getpid(), *same)
                ).rowcount
                what = "delete finished"
            else:
                done = conn.execute(
                    f"UPDATE volumes SET phase = 'ready', owner_pid = NULL WHERE {where}", same
                ).rowcount
                what = (
                    "snapshot undone, the overlay is kept for the next snapshot"
                    if phase == "snapshotting"
                    else "mount ended, its overlay is kept for the next mount or snapshot"
                )
        if not done:
            continue  # another process recovered it first
        if phase == "deleting":
            finish_delete(repo, name)
        else:
            wrote = True
        messages.append(f"volume {name}: {phase} by dead process {pid}: {what}")
    return wrote


def sweep_orphans(repo: Repository) -> int | None:
    """Remove blob files no catalog row names; None if the store's lock is busy."""
    try:
        lock = repo.exclusive_lock(timeout=0)
    except Busy:
        return None
    removed = 0
    try:
        for orphans in unreferenced_files(repo, repo.conn):
            for bid in orphans:
                repo.blobs.delete(bid)
            removed += len(orphans)
    finally:
        lock.release()
    return removed
