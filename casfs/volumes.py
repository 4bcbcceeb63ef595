"""Volumes and their snapshots, at rest: create, list, delete, snapshot, rollback.

A volume is a base root plus (while mounted read/write) an overlay. Creating one from
an image or a snapshot adds one reference to that root: O(1) whatever its size. The
mount daemon (casfs.fuse) folds the overlay into a new base; everything here works on
volumes that are not mounted read/write.

Phases (recorded before the work, with the owner's pid; casfs.lifecycle.recovery
handles those a dead process left):

  creating       a blank volume's base is being written (a clone is one transaction)
  ready          at rest
  mounted        held read/write by a daemon (casfs.lifecycle.claims.claim_volume)
  snapshotting   a crashed mount's overlay is being folded (settle): on a crash the
                 overlay is intact (the fold is one transaction) and the next snapshot
                 redoes it
  deleting       recorded first; the deletion transaction follows, and recovery
                 finishes it if the process died in between
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
from casfs.catalog.volumes import add_snapshot
from casfs.errors import Busy, Conflict, NotFound, UsageError
from casfs.images import image_root
from casfs.lifecycle import pids
from casfs.lifecycle.faults import fault_point
from casfs.lifecycle.queue import job_slot
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
    owner_pid: int | None = None  # the process holding the phase (the daemon, when mounted)
    grace_s: float | None = None  # ephemeral: gc removes it once unused for this long
    last_used: float | None = None  # created, or last mounted or unmounted
    unsaved: dict[str, Any] | None = None  # what the last read/write mount lost (catalog.UNSAVED_SCHEMA)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Source:
    """Where a new volume comes from: exactly one of image, snapshot, blank_dir, blank_block."""

    image: str | None = None
    snapshot: str | None = None
    blank_dir: bool = False
    blank_block: int | None = None


_COLUMNS = (
    "name, kind, mode, phase, origin, size, chunk_size, base, created, owner_pid, grace_s, last_used, unsaved"
)


def _info(conn: sqlite3.Connection, row: tuple[Any, ...]) -> VolumeInfo:
    name, kind, mode, phase, origin, size, chunk_size, base, created, pid, grace_s, last_used, unsaved = row
    snaps = [n for (n,) in conn.execute("SELECT n FROM snapshots WHERE volume = ? ORDER BY n", (name,))]
    info = VolumeInfo(
        name, kind, mode, phase, origin, size, chunk_size, base.hex(), created, snaps, pid, grace_s, last_used
    )
    info.unsaved = json.loads(unsaved) if unsaved else None
    return info


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
    repo: Repository, name: str, source: Source, read_only: bool = False, grace_s: float | None = None
) -> tuple[VolumeInfo, bool]:
    """Create a volume; returns (info, created). Repeating an identical create
    succeeds and changes nothing (created False); a different one is a Conflict.
    With `grace_s` the volume is ephemeral: gc removes it once unused that long."""
    check_name(name, "volume")
    chosen = [
        source.image is not None,
        source.snapshot is not None,
        source.blank_dir,
        source.blank_block is not None,
    ]
    if sum(chosen) != 1:
        raise UsageError("give exactly one of --from IMAGE, --from VOL@N, --blank-dir, --blank-block SIZE")
    if grace_s is not None and grace_s <= 0:
        raise UsageError("a grace period must be positive")
    mode = "ro" if read_only else "rw"
    # grace_s only when given: the spec of a volume without one stays what format 2 wrote.
    spec = json.dumps(
        {**asdict(source), "mode": mode, **({"grace_s": grace_s} if grace_s is not None else {})},
        sort_keys=True,
    )
    if source.blank_dir or source.blank_block is not None:
        return _create_blank(repo, name, source, mode, spec, grace_s)
    conn = repo.conn
    # A clone is one transaction: no phase 'creating' is ever visible, nothing to recover.
    with transaction(conn):
        if _existing(conn, name, spec):
            return get_volume(repo, name), False
        if source.image is not None:
            base, kind, chunk_size = image_root(repo, source.image)
            size, next_ino = conn.execute(
                "SELECT size, next_ino FROM images WHERE name = ?", (source.image,)
            ).fetchone()
            origin = f"image:{source.image}"
        else:
            vol, n = parse_snapshot_ref(source.snapshot or "")
            snap = conn.execute(
                "SELECT s.root, s.size, s.next_ino, v.kind, v.chunk_size, v.phase FROM snapshots s "
                "JOIN volumes v ON v.name = s.volume WHERE s.volume = ? AND s.n = ?",
                (vol, n),
            ).fetchone()
            if snap is None:
                raise NotFound(f"no snapshot {vol}@{n}")
            root, size, next_ino, kind, chunk_size, phase = snap
            if phase == "deleting":
                raise Busy(f"volume {vol!r} is being deleted")
            base = BlobId(root)
            origin = f"snapshot:{vol}@{n}"
        ledger.retain(conn, [base])
        conn.execute(
            "INSERT INTO volumes (name, kind, mode, phase, base, origin, size, chunk_size, next_ino, spec, "
            "created, grace_s, last_used) VALUES (?, ?, ?, 'ready', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                name,
                kind,
                mode,
                base,
                origin,
                size,
                chunk_size,
                next_ino,
                spec,
                time.time(),
                grace_s,
                time.time(),
            ),
        )
    return get_volume(repo, name), True


def _existing(conn: sqlite3.Connection, name: str, spec: str) -> bool:
    """Inside the caller's transaction: True if `name` exists with this spec (a repeat);
    Conflict if with another; Busy while a live process creates or deletes it."""
    row = conn.execute("SELECT spec, phase, owner_pid FROM volumes WHERE name = ?", (name,)).fetchone()
    if row is None:
        return False
    old_spec, phase, pid = row
    if phase in ("creating", "deleting"):
        verb = "created" if phase == "creating" else "deleted"
        if pids.alive(pid):
            raise Busy(f"volume {name!r} is being {verb} by process {pid}")
        raise Busy(f"volume {name!r} was being {verb} by process {pid}, which died: rerun to recover it")
    if old_spec != spec:
        raise Conflict(f"volume {name!r} already exists with a different spec")
    return True


def _create_blank(
    repo: Repository, name: str, source: Source, mode: str, spec: str, grace_s: float | None
) -> tuple[VolumeInfo, bool]:
    """Record the volume (phase creating) before writing its base, then publish both."""
    chunk_size = DEFAULT_CHUNK_SIZE
    kind, size = ("dir", 0) if source.blank_dir else ("block", int(source.blank_block or 0))
    if size > MAX_BLOCK_SIZE:
        raise UsageError(f"a block volume is at most {MAX_BLOCK_SIZE >> 40} TiB")
    conn = repo.conn
    with transaction(conn):
        if _existing(conn, name, spec):
            return get_volume(repo, name), False
        # ZERO_ID: a base that holds no reference until the real one is committed.
        conn.execute(
            "INSERT INTO volumes (name, kind, mode, phase, base, origin, size, chunk_size, spec, created, "
            "owner_pid, grace_s, last_used) VALUES (?, ?, ?, 'creating', ?, 'blank', ?, ?, ?, ?, ?, ?, ?)",
            (
                name,
                kind,
                mode,
                ZERO_ID,
                size,
                chunk_size,
                spec,
                time.time(),
                os.getpid(),
                grace_s,
                time.time(),
            ),
        )
    try:
        fault_point("create:after-claim")
        with repo.batch() as batch:
            if source.blank_dir:
                base = batch.put(_blank_tree(chunk_size), TREE)
            else:
                holes = [ZERO_ID] * chunkmap.n_chunks(size, chunk_size)
                base = chunkmap.build_map(batch.put_kind, holes, size, chunk_size)

            def finish(c: sqlite3.Connection) -> None:
                c.execute(
                    "UPDATE volumes SET base = ?, phase = 'ready', owner_pid = NULL WHERE name = ?",
                    (base, name),
                )

            batch.commit({base: 1}, then=finish)
    except BaseException:
        with transaction(conn):
            conn.execute(
                "DELETE FROM volumes WHERE name = ? AND phase = 'creating' AND owner_pid = ?",
                (name, os.getpid()),
            )
        raise
    return get_volume(repo, name), True


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


def _require_at_rest(phase: str, name: str, pid: int | None = None) -> None:
    if phase != "ready":
        raise Busy(f"volume {name!r} is {phase}" + (f" by process {pid}" if pid else ""))


def remove_volume(repo: Repository, name: str, if_exists: bool = False) -> bool:
    """Delete a volume and its snapshots, in two steps: phase deleting is recorded
    (the checks pass or nothing changes), then one transaction releases and deletes.
    A process that dies in between leaves the delete for recovery to finish."""
    conn = repo.conn
    with transaction(conn):
        row = conn.execute("SELECT phase, owner_pid FROM volumes WHERE name = ?", (name,)).fetchone()
        if row is None:
            if if_exists:
                return False
            raise NotFound(f"no volume named {name!r}")
        if row[0] == "deleting" and pids.alive(row[1]):
            raise Busy(f"volume {name!r} is being deleted by process {row[1]}")
        if row[0] != "deleting":
            mark_deleting(conn, name)
        else:  # its deleter died: take the delete over
            conn.execute("UPDATE volumes SET owner_pid = ? WHERE name = ?", (os.getpid(), name))
    fault_point("delete:after-phase")
    finish_delete(repo, name)
    return True


def mark_deleting(conn: sqlite3.Connection, name: str) -> None:
    """Step 1 of a delete, inside the caller's transaction: refuse (Busy) unless the
    volume is at rest and nothing was made from its snapshots, then record phase deleting."""
    phase, *_, pid = _volume_row(conn, name)
    _require_at_rest(phase, name, pid)
    users = _snapshot_users(conn, name)
    if users:
        raise Busy(f"volume {name!r} has snapshots that volume(s) {', '.join(users)} were made from")
    conn.execute("UPDATE volumes SET phase = 'deleting', owner_pid = ? WHERE name = ?", (os.getpid(), name))


def finish_delete(repo: Repository, name: str) -> bool:
    """Step 2: release every root the volume holds and delete its rows, in one
    transaction. Idempotent: False if the volume is gone (or not being deleted)."""
    conn = repo.conn
    with transaction(conn):
        row = conn.execute("SELECT phase, base FROM volumes WHERE name = ?", (name,)).fetchone()
        if row is None or row[0] != "deleting":
            return False
        roots = [BlobId(r) for (r,) in conn.execute("SELECT root FROM snapshots WHERE volume = ?", (name,))]
        chunks = [
            BlobId(c) for (c,) in conn.execute("SELECT chunk FROM overlay_chunks WHERE volume = ?", (name,))
        ]
        ledger.release(conn, [BlobId(row[1]), *roots, *chunks])
        conn.execute("DELETE FROM overlay_chunks WHERE volume = ?", (name,))
        conn.execute("DELETE FROM overlay_inodes WHERE volume = ?", (name,))
        conn.execute("DELETE FROM overlay_entries WHERE volume = ?", (name,))
        conn.execute("DELETE FROM snapshots WHERE volume = ?", (name,))
        conn.execute("DELETE FROM volumes WHERE name = ?", (name,))
    return True


def record_snapshot(
    conn: sqlite3.Connection, volume: str, root: BlobId, size: int, next_ino: int, label: str | None
) -> int:
    """Add snapshot n+1 of `volume` with `root` (inside the caller's transaction): one
    reference on the root, whatever the volume's size."""
    ledger.retain(conn, [root])
    return add_snapshot(conn, volume, root, size, next_ino, label)


def has_overlay(conn: sqlite3.Connection, volume: str) -> bool:
    return (
        conn.execute("SELECT 1 FROM overlay_inodes WHERE volume = ? LIMIT 1", (volume,)).fetchone()
        is not None
    )


def settle(repo: Repository, volume: str, label: str | None = None) -> int | None:
    """Fold what a crashed mount left in a volume's overlay into a snapshot, as its
    unmount would have; returns the snapshot number, or None if there was nothing.
    Phase snapshotting while it works, in a job slot (a fold is heavy work)."""
    conn = repo.conn
    with transaction(conn):
        phase, *_, pid = _volume_row(conn, volume)
        if not has_overlay(conn, volume):
            return None
        _require_at_rest(phase, volume, pid)
        conn.execute(
            "UPDATE volumes SET phase = 'snapshotting', owner_pid = ? WHERE name = ?", (os.getpid(), volume)
        )
    try:
        # Only here: the read/write view brings trio, half of `casfs snapshot create`'s time.
        from casfs.vfs.volume import open_volume

        fault_point("snapshot:after-phase")
        with job_slot(repo, f"snapshot {volume}"):
            return open_volume(repo, volume).snapshot_sync(label)
    finally:
        with transaction(conn):
            conn.execute(
                "UPDATE volumes SET phase = 'ready', owner_pid = NULL "
                "WHERE name = ? AND phase = 'snapshotting' AND owner_pid = ?",
                (volume, os.getpid()),
            )


def create_snapshot(repo: Repository, volume: str, label: str | None = None) -> int:
    """Snapshot a volume at rest: its base (with any overlay a crash left) becomes snapshot n+1."""
    settled = settle(repo, volume, label)
    if settled is not None:
        return settled
    conn = repo.conn
    with transaction(conn):
        phase, base, size, next_ino, *_, pid = _volume_row(conn, volume)
        _require_at_rest(phase, volume, pid)
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


def resize(repo: Repository, volume: str, size: int, allow_shrink: bool = False) -> int:
    """Set a block volume's size (at rest): growing adds holes; shrinking drops the end
    and needs allow_shrink. O(pages touched), not O(size). Returns the old size."""
    settle(repo, volume)
    with transaction(repo.conn):
        phase, base, old_size, *_ = _volume_row(repo.conn, volume)
        kind = repo.conn.execute("SELECT kind FROM volumes WHERE name = ?", (volume,)).fetchone()[0]
    if kind != "block":
        raise UsageError(f"volume {volume!r} is a directory volume: only block volumes have a size to set")
    _require_at_rest(phase, volume)
    if size > MAX_BLOCK_SIZE:
        raise UsageError(f"a block volume is at most {MAX_BLOCK_SIZE >> 40} TiB")
    if size < old_size and not allow_shrink:
        raise UsageError(
            f"shrinking {volume!r} from {old_size} to {size} bytes drops data: pass --allow-shrink"
        )
    if size == old_size:
        return int(old_size)
    cmap = chunkmap.ChunkMap(repo.get_meta, BlobId(base))
    cs = cmap.chunk_size
    with repo.batch() as batch:
        changes: dict[int, BlobId] = {}
        tail = size % cs
        if size < old_size and tail:
            # The cut chunk keeps only the bytes below the new end, so growing back reads zeros.
            last = size // cs
            cid = cmap.chunk(last)
            if cid != ZERO_ID:
                changes[last] = batch.put(repo.get(cid)[:tail])
        new_base = cmap.rewrite(batch.put_kind, changes, size)

        def swap(conn: sqlite3.Connection) -> None:
            phase_now, base_now, *_ = _volume_row(conn, volume)
            if phase_now != "ready" or BlobId(base_now) != BlobId(base):
                raise Busy(f"volume {volume!r} changed while resizing; try again")
            ledger.release(conn, [BlobId(base)])
            conn.execute("UPDATE volumes SET base = ?, size = ? WHERE name = ?", (new_base, size, volume))

        batch.commit({new_base: 1}, then=swap)
    return int(old_size)


def snapshot_at_rest(repo: Repository, volume: str, label: str | None, held: bool) -> int:
    """Snapshot a volume that has no read/write view here: its base. A volume this
    daemon holds (phase mounted) is at rest all the same: nothing writes it."""
    if not held:
        return create_snapshot(repo, volume, label)
    conn = repo.conn
    with transaction(conn):
        row = conn.execute(
            "SELECT phase, owner_pid, base, size, next_ino FROM volumes WHERE name = ?", (volume,)
        ).fetchone()
        if row is None or row[0] != "mounted" or row[1] != os.getpid():
            raise Busy(f"volume {volume!r} is no longer held by this mount")
        return record_snapshot(conn, volume, BlobId(bytes(row[2])), row[3], row[4], label)
