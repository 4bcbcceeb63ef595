"""Volumes and their snapshots, at rest: create, list, delete, snapshot, rollback.

A volume is a base root plus (while mounted read/write) an overlay. Creating one from
an image or a snapshot adds one reference to that root: O(1) whatever its size. The
mount daemon (casfs.fuse) folds the overlay into a new base; everything here works on
volumes that are not mounted read/write.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from casfs.catalog import transaction
from casfs.errors import Busy, Conflict, NotFound, UsageError
from casfs.images import image_root
from casfs.refcount import ledger
from casfs.repo import Repository
from casfs.snapshots import chunkmap
from casfs.snapshots.kinds import TREE
from casfs.snapshots.tree import Attrs, Tree
from casfs.store.ids import ZERO_ID, BlobId
from casfs.units import check_name, parse_snapshot_ref

DEFAULT_CHUNK_SIZE = 64 << 10
# A blank block volume's map is a list of holes: 10 TiB is 5 MiB of map root.
MAX_BLOCK_SIZE = 16 << 40


@dataclass
class SnapshotInfo:
    volume: str
    n: int
    root: str
    size: int
    label: str | None
    created: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VolumeInfo:
    name: str
    kind: str
    mode: str
    phase: str
    origin: str
    size: int
    chunk_size: int
    base: str
    created: float
    snapshots: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Source:
    """Where a new volume comes from: exactly one of image, snapshot, blank_dir, blank_block."""

    image: str | None = None
    snapshot: str | None = None
    blank_dir: bool = False
    blank_block: int | None = None


_COLUMNS = "name, kind, mode, phase, origin, size, chunk_size, base, created"


def _info(conn: sqlite3.Connection, row: tuple[Any, ...]) -> VolumeInfo:
    name, kind, mode, phase, origin, size, chunk_size, base, created = row
    snaps = [n for (n,) in conn.execute("SELECT n FROM snapshots WHERE volume = ? ORDER BY n", (name,))]
    return VolumeInfo(name, kind, mode, phase, origin, size, chunk_size, base.hex(), created, snaps)


def list_volumes(repo: Repository) -> list[VolumeInfo]:
    conn = repo.conn
    return [_info(conn, r) for r in conn.execute(f"SELECT {_COLUMNS} FROM volumes ORDER BY name").fetchall()]


def get_volume(repo: Repository, name: str) -> VolumeInfo:
    row = repo.conn.execute(f"SELECT {_COLUMNS} FROM volumes WHERE name = ?", (name,)).fetchone()
    if row is None:
        raise NotFound(f"no volume named {name!r}")
    return _info(repo.conn, row)


def _blank_tree(chunk_size: int) -> bytes:
    now = time.time_ns()
    attrs = Attrs(
        mode=stat.S_IFDIR | 0o755,
        uid=os.getuid(),
        gid=os.getgid(),
        atime_ns=now,
        mtime_ns=now,
        ctime_ns=now,
        ino=1,
        nlink=2,
    )
    return Tree(attrs, chunk_size).encode()


def create_volume(
    repo: Repository, name: str, source: Source, read_only: bool = False
) -> tuple[VolumeInfo, bool]:
    """Create a volume; returns (info, created). Repeating an identical create
    succeeds and changes nothing (created False); a different one is a Conflict."""
    check_name(name, "volume")
    chosen = [
        source.image is not None,
        source.snapshot is not None,
        source.blank_dir,
        source.blank_block is not None,
    ]
    if sum(chosen) != 1:
        raise UsageError("give exactly one of --from IMAGE, --from VOL@N, --blank-dir, --blank-block SIZE")
    mode = "ro" if read_only else "rw"
    spec = json.dumps({**asdict(source), "mode": mode}, sort_keys=True)
    conn = repo.conn
    row = conn.execute("SELECT spec FROM volumes WHERE name = ?", (name,)).fetchone()
    if row is not None:
        if row[0] == spec:
            return get_volume(repo, name), False
        raise Conflict(f"volume {name!r} already exists with a different spec")

    if source.blank_dir or source.blank_block is not None:
        chunk_size = DEFAULT_CHUNK_SIZE
        with repo.batch() as batch:
            if source.blank_dir:
                kind, size = "dir", 0
                base = batch.put(_blank_tree(chunk_size), TREE)
            else:
                kind, size = "block", int(source.blank_block or 0)
                if size > MAX_BLOCK_SIZE:
                    raise UsageError(f"a block volume is at most {MAX_BLOCK_SIZE >> 40} TiB")
                holes = [ZERO_ID] * chunkmap.n_chunks(size, chunk_size)
                base = chunkmap.build_map(batch.put_kind, holes, size, chunk_size)
            batch.commit(
                {base: 1},
                then=lambda c: _insert(c, name, kind, mode, base, "blank", size, chunk_size, 2, spec),
            )
        return get_volume(repo, name), True

    with transaction(conn):
        if source.image is not None:
            base, kind, chunk_size = image_root(repo, source.image)
            size, next_ino = conn.execute(
                "SELECT size, next_ino FROM images WHERE name = ?", (source.image,)
            ).fetchone()
            origin = f"image:{source.image}"
        else:
            vol, n = parse_snapshot_ref(source.snapshot or "")
            snap = conn.execute(
                "SELECT s.root, s.size, s.next_ino, v.kind, v.chunk_size FROM snapshots s "
                "JOIN volumes v ON v.name = s.volume WHERE s.volume = ? AND s.n = ?",
                (vol, n),
            ).fetchone()
            if snap is None:
                raise NotFound(f"no snapshot {vol}@{n}")
            root, size, next_ino, kind, chunk_size = snap
            base = BlobId(root)
            origin = f"snapshot:{vol}@{n}"
        ledger.retain(conn, [base])
        _insert(conn, name, kind, mode, base, origin, size, chunk_size, next_ino, spec)
    return get_volume(repo, name), True


def _insert(
    conn: sqlite3.Connection,
    name: str,
    kind: str,
    mode: str,
    base: BlobId,
    origin: str,
    size: int,
    chunk_size: int,
    next_ino: int,
    spec: str,
) -> None:
    if conn.execute("SELECT 1 FROM volumes WHERE name = ?", (name,)).fetchone():
        raise Conflict(f"volume {name!r} already exists")
    conn.execute(
        "INSERT INTO volumes (name, kind, mode, phase, base, origin, size, chunk_size, next_ino, spec, "
        "created) VALUES (?, ?, ?, 'ready', ?, ?, ?, ?, ?, ?, ?)",
        (name, kind, mode, base, origin, size, chunk_size, next_ino, spec, time.time()),
    )


def _volume_row(conn: sqlite3.Connection, name: str) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT phase, base, size, next_ino, next_snapshot, mode, owner_pid FROM volumes WHERE name = ?",
        (name,),
    ).fetchone()
    if row is None:
        raise NotFound(f"no volume named {name!r}")
    return tuple(row)


def _snapshot_users(conn: sqlite3.Connection, volume: str, n: int | None = None) -> list[str]:
    if n is None:
        pattern, args = "origin LIKE ? ESCAPE '\\'", (f"snapshot:{_like_escape(volume)}@%",)
    else:
        pattern, args = "origin = ?", (f"snapshot:{volume}@{n}",)
    return [
        v for (v,) in conn.execute(f"SELECT name FROM volumes WHERE {pattern} AND name != ?", (*args, volume))
    ]


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _require_at_rest(phase: str, name: str) -> None:
    if phase != "ready":
        raise Busy(f"volume {name!r} is {phase}")


def remove_volume(repo: Repository, name: str, if_exists: bool = False) -> bool:
    conn = repo.conn
    with transaction(conn):
        try:
            phase, base, *_ = _volume_row(conn, name)
        except NotFound:
            if if_exists:
                return False
            raise
        _require_at_rest(phase, name)
        users = _snapshot_users(conn, name)
        if users:
            raise Busy(f"volume {name!r} has snapshots that volume(s) {', '.join(users)} were made from")
        roots = [BlobId(r) for (r,) in conn.execute("SELECT root FROM snapshots WHERE volume = ?", (name,))]
        chunks = [
            BlobId(c) for (c,) in conn.execute("SELECT chunk FROM overlay_chunks WHERE volume = ?", (name,))
        ]
        ledger.release(conn, [BlobId(base), *roots, *chunks])
        conn.execute("DELETE FROM overlay_chunks WHERE volume = ?", (name,))
        conn.execute("DELETE FROM overlay_inodes WHERE volume = ?", (name,))
        conn.execute("DELETE FROM snapshots WHERE volume = ?", (name,))
        conn.execute("DELETE FROM volumes WHERE name = ?", (name,))
    return True


def record_snapshot(
    conn: sqlite3.Connection, volume: str, root: BlobId, size: int, next_ino: int, label: str | None
) -> int:
    """Add snapshot n+1 of `volume` with `root` (inside the caller's transaction): one
    reference on the root, whatever the volume's size."""
    (n,) = conn.execute("SELECT next_snapshot FROM volumes WHERE name = ?", (volume,)).fetchone()
    ledger.retain(conn, [root])
    conn.execute(
        "INSERT INTO snapshots (volume, n, root, size, next_ino, label, created) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (volume, n, root, size, next_ino, label, time.time()),
    )
    conn.execute("UPDATE volumes SET next_snapshot = ? WHERE name = ?", (n + 1, volume))
    return int(n)


def has_overlay(conn: sqlite3.Connection, volume: str) -> bool:
    return (
        conn.execute("SELECT 1 FROM overlay_inodes WHERE volume = ? LIMIT 1", (volume,)).fetchone()
        is not None
    )


def settle(repo: Repository, volume: str, label: str | None = None) -> int | None:
    """Fold what a crashed mount left in a volume's overlay into a snapshot, as its
    unmount would have; returns the snapshot number, or None if there was nothing."""
    phase, *_ = _volume_row(repo.conn, volume)
    if not has_overlay(repo.conn, volume):
        return None
    _require_at_rest(phase, volume)
    from casfs.vfs.volume import VolumeView

    return VolumeView(repo, volume).snapshot_sync(label)


def create_snapshot(repo: Repository, volume: str, label: str | None = None) -> int:
    """Snapshot a volume at rest: its base (with any overlay a crash left) becomes snapshot n+1."""
    settled = settle(repo, volume, label)
    if settled is not None:
        return settled
    conn = repo.conn
    with transaction(conn):
        phase, base, size, next_ino, *_ = _volume_row(conn, volume)
        _require_at_rest(phase, volume)
        return record_snapshot(conn, volume, BlobId(base), size, next_ino, label)


def list_snapshots(repo: Repository, volume: str) -> list[SnapshotInfo]:
    get_volume(repo, volume)
    return [
        SnapshotInfo(volume, n, root.hex(), size, label, created)
        for n, root, size, label, created in repo.conn.execute(
            "SELECT n, root, size, label, created FROM snapshots WHERE volume = ? ORDER BY n", (volume,)
        )
    ]


def remove_snapshot(repo: Repository, ref: str, if_exists: bool = False) -> bool:
    volume, n = parse_snapshot_ref(ref)
    conn = repo.conn
    with transaction(conn):
        row = conn.execute("SELECT root FROM snapshots WHERE volume = ? AND n = ?", (volume, n)).fetchone()
        if row is None:
            if if_exists:
                return False
            raise NotFound(f"no snapshot {volume}@{n}")
        users = _snapshot_users(conn, volume, n)
        if users:
            raise Busy(f"snapshot {volume}@{n} is in use by volume(s): {', '.join(users)}")
        ledger.release(conn, [BlobId(row[0])])
        conn.execute("DELETE FROM snapshots WHERE volume = ? AND n = ?", (volume, n))
    return True


def rollback(repo: Repository, volume: str, n: int) -> None:
    """Make snapshot n the volume's base again (the volume must not be mounted rw).
    Changes a crashed mount left behind are kept as a snapshot first, never dropped."""
    settle(repo, volume)
    conn = repo.conn
    with transaction(conn):
        phase, base, *_rest = _volume_row(conn, volume)
        mode = _rest[3]
        if phase not in ("ready",) and not (phase == "mounted" and mode == "ro"):
            raise Busy(f"volume {volume!r} is {phase}: unmount it before rolling back")
        row = conn.execute(
            "SELECT root, size, next_ino FROM snapshots WHERE volume = ? AND n = ?", (volume, n)
        ).fetchone()
        if row is None:
            raise NotFound(f"no snapshot {volume}@{n}")
        root, size, next_ino = row
        ledger.retain(conn, [BlobId(root)])
        ledger.release(conn, [BlobId(base)])
        conn.execute(
            "UPDATE volumes SET base = ?, size = ?, next_ino = MAX(next_ino, ?) WHERE name = ?",
            (root, size, next_ino, volume),
        )
