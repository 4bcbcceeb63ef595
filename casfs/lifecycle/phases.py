"""The image and volume state machines: phases, the allowed steps, and taking and
giving back a volume's phase, in one place.

A phase is recorded before the work it names, with the pid of the process doing it
(owner_pid), so that a second caller sees the work in progress (Busy) and
casfs.upkeep.recovery can finish or undo what a dead process left. The values are
the strings the catalog has always held (catalog.schema checks them).

    image   (none) -> queued -> importing [-> verifying] -> ready
                      any of those but ready -> failed, or the row removed
    volume  (none) -> ready (a clone: one transaction) | creating -> ready
            ready -> mounted | snapshotting | deleting
            mounted | snapshotting -> ready, or -> mounted (a dead holder's, taken over)
            creating | deleting -> (none)
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar

from casfs.catalog import volumes as rows


class ImagePhase(StrEnum):
    QUEUED = "queued"  # waiting for a job slot (casfs.lifecycle.queue)
    IMPORTING = "importing"
    VERIFYING = "verifying"  # read in full; checking the digest against --expect
    READY = "ready"
    FAILED = "failed"  # the error column says why; holds no blob


class VolumePhase(StrEnum):
    CREATING = "creating"  # a blank volume's base is being written
    READY = "ready"  # at rest
    MOUNTED = "mounted"  # held read/write by a daemon (casfs.lifecycle.claims)
    SNAPSHOTTING = "snapshotting"  # a crashed mount's overlay is being folded (settle)
    DELETING = "deleting"  # recorded before the deletion transaction


# Work some process is doing: a dead owner's row is recovered.
IMAGE_IN_PROGRESS = (ImagePhase.QUEUED, ImagePhase.IMPORTING, ImagePhase.VERIFYING)
VOLUME_HELD = (VolumePhase.CREATING, VolumePhase.SNAPSHOTTING, VolumePhase.DELETING, VolumePhase.MOUNTED)

# The steps a row may take; None is "no row" (created from, or removed to).
IMAGE_STEPS: dict[ImagePhase | None, frozenset[ImagePhase | None]] = {
    None: frozenset({ImagePhase.QUEUED}),
    ImagePhase.QUEUED: frozenset({ImagePhase.IMPORTING, ImagePhase.FAILED, None}),
    ImagePhase.IMPORTING: frozenset({ImagePhase.VERIFYING, ImagePhase.READY, ImagePhase.FAILED, None}),
    ImagePhase.VERIFYING: frozenset({ImagePhase.READY, ImagePhase.FAILED, None}),
    ImagePhase.READY: frozenset({None}),
    ImagePhase.FAILED: frozenset({None}),
}
VOLUME_STEPS: dict[VolumePhase | None, frozenset[VolumePhase | None]] = {
    None: frozenset({VolumePhase.READY, VolumePhase.CREATING}),
    VolumePhase.CREATING: frozenset({VolumePhase.READY, None}),
    VolumePhase.READY: frozenset({VolumePhase.MOUNTED, VolumePhase.SNAPSHOTTING, VolumePhase.DELETING}),
    # A dead holder's mount or fold is taken over by a new mount (which recovers the
    # overlay), and its delete by the next process to finish it.
    VolumePhase.MOUNTED: frozenset({VolumePhase.READY, VolumePhase.MOUNTED}),
    VolumePhase.SNAPSHOTTING: frozenset({VolumePhase.READY, VolumePhase.MOUNTED}),
    VolumePhase.DELETING: frozenset({VolumePhase.DELETING, None}),
}


P = TypeVar("P", ImagePhase, VolumePhase)


def check_step(steps: Mapping[P | None, frozenset[P | None]], old: P | None, new: P | None) -> None:
    """A programming error (not a user's) if `old -> new` is not a step of the machine."""
    if new not in steps.get(old, frozenset()):
        raise AssertionError(f"phase {old} -> {new} is not an allowed step")


def take_volume(conn: sqlite3.Connection, name: str, old: VolumePhase, new: VolumePhase) -> None:
    """Record phase `new` with our pid on a volume the caller found in phase `old`
    (inside the caller's transaction, after its checks)."""
    check_step(VOLUME_STEPS, old, new)
    rows.set_phase(conn, name, new, os.getpid())


def give_volume(conn: sqlite3.Connection, name: str, held: VolumePhase, owner: int | None) -> bool:
    """Back to ready if the volume is still in phase `held` by `owner` (os.getpid(), or
    a dead holder's pid); False if it is not (another process took it, or recovered it)."""
    check_step(VOLUME_STEPS, held, VolumePhase.READY)
    return rows.set_phase(conn, name, VolumePhase.READY, None, when=(held, owner))
