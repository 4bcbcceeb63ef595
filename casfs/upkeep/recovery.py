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

from casfs.catalog import Unfinished, transaction, unfinished
from casfs.catalog import images as image_rows
from casfs.catalog import volumes as volume_rows
from casfs.errors import Busy
from casfs.lifecycle.phases import (
    IMAGE_IN_PROGRESS,
    VOLUME_HELD,
    VOLUME_STEPS,
    VolumePhase,
    check_step,
    give_volume,
)
from casfs.lifecycle.pids import alive

if TYPE_CHECKING:
    from casfs.repo import Repository


def recover(repo: Repository) -> list[str]:
    """Recover what dead processes left; one message per action (the CLI prints each
    as `casfs: recovered: MESSAGE`). With nothing to recover this costs one indexed
    query (catalog.unfinished) and a listing of the staging directory."""
    messages: list[str] = []
    conn = repo.conn
    dead = [u for u in unfinished(conn, IMAGE_IN_PROGRESS, VOLUME_HELD) if not alive(u.owner_pid)]
    wrote = False
    for u in dead:
        if u.table == "images":
            wrote = _image(conn, u, messages) or wrote
        else:
            wrote = _volume(repo, u, messages) or wrote
    staged = repo.recover_staging(alive)
    if staged:
        messages.append(f"removed {staged} staging file(s) left by dead processes")
    if wrote:
        orphans = sweep_orphans(repo)
        if orphans is None:
            messages.append("the store is busy: `casfs gc` will remove any orphan blob files")
        elif orphans:
            messages.append(f"removed {orphans} orphan blob file(s) published but never committed")
    return messages


def _image(conn: sqlite3.Connection, u: Unfinished, messages: list[str]) -> bool:
    with transaction(conn):
        gone = image_rows.delete_unready(conn, u.name, u.owner_pid, u.phase)
    if gone:
        messages.append(f"image {u.name}: import by dead process {u.owner_pid} ({u.phase}) rolled back")
    return gone


def _volume(repo: Repository, u: Unfinished, messages: list[str]) -> bool:
    """Finish or undo a dead process's volume phase; True if it may have left orphans."""
    from casfs.volumes import finish_delete

    conn = repo.conn
    phase = VolumePhase(u.phase)
    with transaction(conn):
        if phase == VolumePhase.CREATING:
            check_step(VOLUME_STEPS, phase, None)
            done = volume_rows.delete_in_phase(conn, u.name, phase, u.owner_pid)
            what = "creation rolled back"
        elif phase == VolumePhase.DELETING:
            check_step(VOLUME_STEPS, phase, phase)
            done = volume_rows.set_phase(conn, u.name, phase, os.getpid(), when=(phase, u.owner_pid))
            what = "delete finished"
        else:
            done = give_volume(conn, u.name, phase, u.owner_pid)
            what = (
                "snapshot undone, the overlay is kept for the next snapshot"
                if phase == VolumePhase.SNAPSHOTTING
                else "mount ended, its overlay is kept for the next mount or snapshot"
            )
    if not done:
        return False  # another process recovered it first
    if phase == VolumePhase.DELETING:
        finish_delete(repo, u.name)
    messages.append(f"volume {u.name}: {phase} by dead process {u.owner_pid}: {what}")
    return phase != VolumePhase.DELETING


def sweep_orphans(repo: Repository) -> int | None:
    """Remove blob files no catalog row names; None if the store's lock is busy."""
    from casfs.refcount.gc import unreferenced_files  # (every command recovers; few sweep)

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
