"""Claims: one read/write daemon per volume (phase ready -> mounted, with its pid).

A claim is a catalog write on the caller's connection; a dead holder's claim is taken
over (its overlay is recovered by the view that opens the volume next).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from casfs.catalog import transaction
from casfs.catalog import volumes as rows
from casfs.errors import Busy, NotFound, Stale, UsageError
from casfs.lifecycle.phases import VolumePhase, give_volume, take_volume
from casfs.lifecycle.pids import alive

if TYPE_CHECKING:
    from casfs.repo import Repository  # (floor 2: a claim needs only its connection)


def claim_volume(repo: Repository, name: str, expected: tuple[object, ...] | None = None) -> None:
    """Phase ready -> mounted with our pid; Busy if a live process holds it. With
    `expected` (a view's volume_generation when it loaded), Stale if the volume has
    been claimed, written or snapshotted since: that view no longer shows it."""
    conn = repo.conn
    with transaction(conn):
        row = rows.volume_row(conn, name)
        if row is None:
            raise NotFound(f"no volume named {name!r}")
        phase, pid = VolumePhase(row.phase), row.owner_pid
        if expected is not None and rows.generation(conn, name) != expected:
            raise Stale(f"volume {name!r} changed since this mount read it: look it up again")
        if row.mode != "rw":
            raise UsageError(f"volume {name!r} is read-only")
        if phase in (VolumePhase.CREATING, VolumePhase.DELETING):
            raise Busy(f"volume {name!r} is {phase}")
        if phase != VolumePhase.READY and pid and pid != os.getpid() and alive(pid):
            raise Busy(f"volume {name!r} is {phase} by process {pid}")
        # A dead holder left it mounted (or this process holds it): the read/write view
        # recovers its overlay.
        take_volume(conn, name, phase, VolumePhase.MOUNTED)
        rows.touch(conn, name)


def release_volume(repo: Repository, *, name: str, unsaved: dict[str, Any] | None = None) -> None:
    conn = repo.conn
    with transaction(conn):
        if give_volume(conn, name, VolumePhase.MOUNTED, os.getpid()):
            rows.record_unsaved(conn, name, unsaved)
        rows.touch(conn, name)
