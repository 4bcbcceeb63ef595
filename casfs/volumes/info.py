"""What a volume and a snapshot are to callers (VolumeInfo, SnapshotInfo), where a new
volume comes from (Source), and the checks every at-rest operation makes."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from casfs.catalog import volumes as rows
from casfs.catalog.volumes import VolumeRow
from casfs.errors import Busy, NotFound
from casfs.ids import SnapshotNo
from casfs.kinds import VolumeKind
from casfs.lifecycle.phases import VolumePhase
from casfs.repo import Repository


class _Record:
    """A plain record: its fields are its __slots__. (Not dataclasses, which import
    inspect: a third of a clone's start-up, and a clone returns one of these.)"""

    __slots__: tuple[str, ...] = ()

    def _values(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._values().items())})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Record) and type(other) is type(self) and self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # (mutable, as a dataclass with eq)


class SnapshotInfo(_Record):
    __slots__ = ("volume", "n", "root", "size", "label", "created", "folded")  # noqa: RUF023 (the JSON's order)

    def __init__(
        self,
        volume: str,
        n: SnapshotNo,
        root: str,
        size: int,
        label: str | None,
        created: float,
        folded: bool = True,  # False: taken while mounted, its fold into blobs still to commit
    ) -> None:
        self.volume, self.n, self.root, self.size = volume, n, root, size
        self.label, self.created, self.folded = label, created, folded

    def to_json(self) -> dict[str, Any]:
        return self._values()


class VolumeInfo(_Record):
    __slots__ = (  # noqa: RUF023 (the order of the fields in the JSON)
        "name",
        "kind",
        "mode",
        "phase",
        "origin",
        "size",
        "chunk_size",
        "base",
        "created",
        "snapshots",
        "owner_pid",
        "grace_s",
        "last_used",
        "unsaved",
    )

    def __init__(
        self,
        name: str,
        kind: VolumeKind,
        mode: str,
        phase: VolumePhase,
        origin: str,
        size: int,
        chunk_size: int,
        base: str,
        created: float,
        snapshots: list[SnapshotNo] | None = None,
        owner_pid: int | None = None,  # the process holding the phase (the daemon, when mounted)
        grace_s: float | None = None,  # ephemeral: gc removes it once unused for this long
        last_used: float | None = None,  # created, or last mounted or unmounted
        unsaved: dict[str, Any] | None = None,  # what the last read/write mount lost (volumes.unsaved)
    ) -> None:
        self.name, self.kind, self.mode, self.phase = name, kind, mode, phase
        self.origin, self.size, self.chunk_size, self.base = origin, size, chunk_size, base
        self.created = created
        self.snapshots: list[SnapshotNo] = [] if snapshots is None else snapshots
        self.owner_pid, self.grace_s, self.last_used, self.unsaved = owner_pid, grace_s, last_used, unsaved

    def to_json(self) -> dict[str, Any]:
        """Its fields (the list and the dict copied: the caller may change the document)."""
        d = self._values()
        d["snapshots"] = list(self.snapshots)
        if self.unsaved is not None:
            d["unsaved"] = dict(self.unsaved)
        return d


class Source(_Record):
    """Where a new volume comes from: exactly one of image, snapshot, blank_dir, blank_block."""

    __slots__ = ("image", "snapshot", "blank_dir", "blank_block")  # noqa: RUF023 (the spec's order)

    def __init__(
        self,
        image: str | None = None,
        snapshot: str | None = None,
        blank_dir: bool = False,
        blank_block: int | None = None,
    ) -> None:
        self.image, self.snapshot, self.blank_dir, self.blank_block = image, snapshot, blank_dir, blank_block

    def to_json(self) -> dict[str, Any]:
        """Its fields: the start of a volume's spec (volumes.create)."""
        return self._values()


def _json(text: str) -> Any:
    import json  # (here, not at import: a listing needs it only for a note of unsaved changes)

    return json.loads(text)


def _info(conn: sqlite3.Connection, row: VolumeRow, snapshots: list[SnapshotNo] | None = None) -> VolumeInfo:
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
        rows.snapshot_numbers(conn, row.name) if snapshots is None else snapshots,
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


def list_volumes(repo: Repository, after: str | None = None, limit: int | None = None) -> list[VolumeInfo]:
    """Volumes by name: those after `after` (a cursor, which need not exist), at most
    `limit`. A few queries whatever the count (not one per volume)."""
    conn = repo.conn
    page = rows.volume_page(conn, after, limit)
    numbers = rows.snapshot_lists(conn, [r.name for r in page])
    return [_info(conn, r, numbers[r.name]) for r in page]


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
