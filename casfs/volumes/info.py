"""What a volume and a snapshot are to callers (VolumeInfo, SnapshotInfo), where a new
volume comes from (Source), and the checks every at-rest operation makes."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from casfs.catalog import volumes as rows
from casfs.catalog.volumes import VolumeRow
from casfs.errors import Busy, NotFound
from casfs.ids import SnapshotNo
from casfs.kinds import VolumeKind
from casfs.lifecycle.phases import VolumePhase
from casfs.repo import Repository


@dataclass
class SnapshotInfo:
    volume: str
    n: SnapshotNo
    root: str
    size: int
    label: str | None
    created: float
    folded: bool = True  # False: taken while mounted, its fold into blobs still to commit

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VolumeInfo:
    name: str
    kind: VolumeKind
    mode: str
    phase: VolumePhase
    origin: str
    size: int
    chunk_size: int
    base: str
    created: float
    snapshots: list[SnapshotNo] = field(default_factory=list)
    owner_pid: int | None = None  # the process holding the phase (the daemon, when mounted)
    grace_s: float | None = None  # ephemeral: gc removes it once unused for this long
    last_used: float | None = None  # created, or last mounted or unmounted
    unsaved: dict[str, Any] | None = None  # what the last read/write mount lost (volumes.unsaved)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Source:
    """Where a new volume comes from: exactly one of image, snapshot, blank_dir, blank_block."""

    image: str | None = None
    snapshot: str | None = None
    blank_dir: bool = False
    blank_block: int | None = None


def _json(text: str) -> Any:
    import json  # (here, not at import: a listing needs it only for a note of unsaved changes)

    return json.loads(text)


def _info(conn: sqlite3.Connection, row: VolumeRow) -> VolumeInfo:
    return VolumeInfo(
        row.name,
        row.kind,
        row.mode,
        VolumePhase(row.phase),
        row.origin,
        row.size,
        row.chunk_size,
        row.base.hex(),
        row.created,
        rows.snapshot_numbers(conn, row.name),
        row.owner_pid,
        row.grace_s,
        row.last_used,
        _json(row.unsaved) if row.unsaved else None,
    )


def describe_unsaved(note: dict[str, Any]) -> str:
    """One line on what a volume's last read/write mount could not save."""
    items = note.get("unsaved") or []
    listed = ", ".join(f"{path} ({size} bytes)" for path, size in items[:5])
    more = f" and {len(items) - 5} more" if len(items) > 5 else ""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(note.get("time", 0)))
    lost = f"{listed or 'changes'}{more}"
    return f"its last mount (pid {note.get('pid')}, {when}) could not save {lost}: {note.get('error')}"


def list_volumes(repo: Repository) -> list[VolumeInfo]:
    conn = repo.conn
    return [_info(conn, r) for r in rows.volume_rows(conn)]


def get_volume(repo: Repository, name: str) -> VolumeInfo:
    return _info(repo.conn, volume_row(repo.conn, name))


def volume_row(conn: sqlite3.Connection, name: str) -> VolumeRow:
    """The volume's row; NotFound if there is none."""
    row = rows.volume_row(conn, name)
    if row is None:
        raise NotFound(f"no volume named {name!r}")
    return row


def require_at_rest(row: VolumeRow, name_holder: bool = True) -> None:
    """Busy unless the volume is ready (no process holds a phase on it)."""
    if row.phase != VolumePhase.READY:
        pid = row.owner_pid if name_holder else None
        raise Busy(f"volume {row.name!r} is {row.phase}" + (f" by process {pid}" if pid else ""))
