"""Volume, snapshot and overlay rows: the only SQL about them (the mounted read/write
view, casfs.vfs, keeps its own overlay statements).

Plain SQL inside the caller's transaction, and nothing else: counting references is the
caller's (refcount.ledger) and so are phase steps (lifecycle.phases), so this sits below
everything that writes volumes (casfs.volumes at rest, casfs.vfs while mounted, claims).
"""

# (No `from __future__ import annotations` here: typing.NamedTuple compiles each string
# annotation, and the first compile() in a process costs a command's start-up 3 ms.)

import sqlite3
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from casfs.catalog.overlay import PENDING_INODE
from casfs.ids import InodeNo, SnapshotNo
from casfs.kinds import VolumeKind
from casfs.store.ids import ZERO_ID, BlobId


def add_snapshot(
    conn: sqlite3.Connection,
    volume: str,
    root: BlobId,
    size: int,
    next_ino: InodeNo,
    label: str | None,
    taken: tuple[SnapshotNo, float] | None = None,
) -> SnapshotNo:
    """Add snapshot n+1 of `volume` with `root`; returns n+1. With `taken` (n, time):
    the snapshot a freeze numbered then (catalog.overlay.freeze_upper). The caller adds
    the snapshot's reference on `root` (ledger.retain) in the same transaction."""
    if taken is None:
        (n,) = conn.execute("SELECT next_snapshot FROM volumes WHERE name = ?", (volume,)).fetchone()
        conn.execute("UPDATE volumes SET next_snapshot = ? WHERE name = ?", (n + 1, volume))
        when = time.time()
    else:
        n, when = taken
    conn.execute(
        "INSERT INTO snapshots (volume, n, root, size, next_ino, label, created) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (volume, n, root, size, next_ino, label, when),
    )
    return SnapshotNo(n)


def touch(conn: sqlite3.Connection, name: str) -> None:
    """Record that a volume is used now (the daemon calls this at mount and unmount):
    an ephemeral volume's grace period counts from its last use. Commits at once
    unless the caller has a transaction open."""
    conn.execute("UPDATE volumes SET last_used = ? WHERE name = ?", (time.time(), name))


def generation(conn: sqlite3.Connection, name: str) -> tuple[object, ...]:
    """What changes whenever the volume does at rest or changes hands: its base, its
    next snapshot number and its last use (every claim and release stamps it)."""
    query = "SELECT base, next_snapshot, last_used FROM volumes WHERE name = ?"
    row = conn.execute(query, (name,)).fetchone()
    return tuple(row) if row is not None else ()


def record_unsaved(conn: sqlite3.Connection, name: str, note: dict[str, Any] | None) -> None:
    """Record what a read/write mount could not save as it ended (None: it saved all)."""
    import json  # (here: listings and clones do not load json for this)

    conn.execute("UPDATE volumes SET unsaved = ? WHERE name = ?", (json.dumps(note) if note else None, name))


# -- volume rows -----------------------------------------------------------------


class VolumeRow(NamedTuple):
    name: str
    kind: VolumeKind
    mode: str
    phase: str
    base: BlobId
    origin: str
    size: int
    chunk_size: int
    next_ino: InodeNo
    next_snapshot: SnapshotNo
    spec: str | None
    owner_pid: int | None
    created: float
    grace_s: float | None
    last_used: float | None
    unsaved: str | None


_VOLUME = "SELECT " + ", ".join(VolumeRow._fields) + " FROM volumes"


def _volume(row: tuple[Any, ...]) -> VolumeRow:
    return VolumeRow(row[0], VolumeKind(row[1]), row[2], row[3], BlobId(bytes(row[4])), *row[5:])


def volume_row(conn: sqlite3.Connection, name: str) -> VolumeRow | None:
    row = conn.execute(f"{_VOLUME} WHERE name = ?", (name,)).fetchone()
    return None if row is None else _volume(row)


def volume_rows(conn: sqlite3.Connection) -> list[VolumeRow]:
    return [_volume(r) for r in conn.execute(f"{_VOLUME} ORDER BY name").fetchall()]


def insert_volume(
    conn: sqlite3.Connection,
    name: str,
    *,
    kind: VolumeKind,
    mode: str,
    phase: str,
    base: BlobId,
    origin: str,
    size: int,
    chunk_size: int,
    next_ino: InodeNo,
    spec: str,
    owner_pid: int | None,
    grace_s: float | None,
) -> None:
    now = time.time()
    conn.execute(
        "INSERT INTO volumes (name, kind, mode, phase, base, origin, size, chunk_size, next_ino, spec, "
        "owner_pid, created, grace_s, last_used) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            name,
            kind,
            mode,
            phase,
            base,
            origin,
            size,
            chunk_size,
            next_ino,
            spec,
            owner_pid,
            now,
            grace_s,
            now,
        ),
    )


def set_phase(
    conn: sqlite3.Connection,
    name: str,
    phase: str,
    owner_pid: int | None,
    when: tuple[str, int | None] | None = None,
) -> bool:
    """Set a volume's phase and owner; with `when` (phase, owner) only if it is still
    in that phase by that owner. True if the row changed. (Steps: lifecycle.phases.)"""
    query = "UPDATE volumes SET phase = ?, owner_pid = ? WHERE name = ?"
    args: tuple[object, ...] = (phase, owner_pid, name)
    if when is not None:
        query, args = query + " AND phase = ? AND owner_pid IS ?", (*args, *when)
    return bool(conn.execute(query, args).rowcount)


def delete_in_phase(conn: sqlite3.Connection, name: str, phase: str, owner_pid: int | None) -> bool:
    """Remove a volume row that holds no reference yet (phase creating) if it is still
    in `phase` by `owner_pid`."""
    query = "DELETE FROM volumes WHERE name = ? AND phase = ? AND owner_pid IS ?"
    return bool(conn.execute(query, (name, phase, owner_pid)).rowcount)


def set_base(
    conn: sqlite3.Connection,
    name: str,
    base: BlobId,
    size: int | None = None,
    next_ino: InodeNo | None = None,
) -> None:
    """A new base (the caller moves the references); `size` and `next_ino` too when
    given (next_ino never goes down: inode numbers once handed out stay taken)."""
    conn.execute(
        "UPDATE volumes SET base = ?, size = COALESCE(?, size), next_ino = MAX(next_ino, COALESCE(?, 0)) "
        "WHERE name = ?",
        (base, size, next_ino, name),
    )


def made_from(conn: sqlite3.Connection, origin: str) -> list[str]:
    """Volumes made from `origin` ('image:NAME' or 'snapshot:VOL@N'), by name."""
    return [v for (v,) in conn.execute("SELECT name FROM volumes WHERE origin = ? ORDER BY name", (origin,))]


def made_from_snapshots_of(conn: sqlite3.Connection, volume: str) -> list[str]:
    """Other volumes made from any snapshot of `volume`."""
    pattern = f"snapshot:{_like_escape(volume)}@%"
    query = "SELECT name FROM volumes WHERE origin LIKE ? ESCAPE '\\' AND name != ?"
    return [v for (v,) in conn.execute(query, (pattern, volume))]


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def expired(conn: sqlite3.Connection, now: float, name: str | None = None) -> list[str]:
    """Ephemeral volumes at rest and unused for longer than their grace (`name`: that one
    only, if it is)."""
    query = (
        "SELECT name FROM volumes WHERE grace_s IS NOT NULL AND phase = 'ready' "
        "AND COALESCE(last_used, created) + grace_s < ?"
    )
    if name is None:
        return [n for (n,) in conn.execute(query + " ORDER BY name", (now,))]
    return [n for (n,) in conn.execute(query + " AND name = ?", (now, name))]


def held_roots(conn: sqlite3.Connection, name: str) -> list[BlobId]:
    """Every root reference the volume's rows hold: its base, its snapshots' roots and
    its overlay's chunks (holes included: ledger.release skips ZERO_ID)."""
    row = conn.execute("SELECT base FROM volumes WHERE name = ?", (name,)).fetchone()
    roots = [BlobId(bytes(row[0]))] if row else []
    roots += [
        BlobId(bytes(r)) for (r,) in conn.execute("SELECT root FROM snapshots WHERE volume = ?", (name,))
    ]
    chunks = conn.execute("SELECT chunk FROM overlay_chunks WHERE volume = ?", (name,))
    return roots + [BlobId(bytes(c)) for (c,) in chunks]


def delete_volume(conn: sqlite3.Connection, name: str) -> None:
    """Delete a volume with its snapshots and overlay (the caller released held_roots)."""
    for table, column in (
        ("overlay_chunks", "volume"),
        ("overlay_inodes", "volume"),
        ("overlay_entries", "volume"),
        ("uppers", "volume"),
        ("provenance", "volume"),
        ("peers", "volume"),
        ("bookmarks", "volume"),
        ("snapshots", "volume"),
        ("volumes", "name"),
    ):
        conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (name,))


def totals(conn: sqlite3.Connection) -> tuple[int, int, int, int]:
    """(volumes, their logical bytes, snapshots, their logical bytes)."""
    volumes, volume_bytes = conn.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM volumes").fetchone()
    snaps, snap_bytes = conn.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM snapshots").fetchone()
    return int(volumes), int(volume_bytes), int(snaps), int(snap_bytes)


def volume_page(conn: sqlite3.Connection, after: str | None, limit: int | None) -> list[VolumeRow]:
    """Volumes by name, those after `after` (any string: a cursor), at most `limit`."""
    query = f"{_VOLUME} WHERE name > ? ORDER BY name LIMIT ?"
    return [_volume(r) for r in conn.execute(query, (after or "", -1 if limit is None else limit))]


def _marks(names: Sequence[str]) -> str:
    return ",".join("?" * len(names))


def _by_volume(conn: sqlite3.Connection, query: str, names: Sequence[str]) -> list[tuple[Any, ...]]:
    """Rows of `query` (with one IN (...) mark group) for `names`, in batches of 500."""
    out: list[tuple[Any, ...]] = []
    for i in range(0, len(names), 500):
        part = names[i : i + 500]
        out += conn.execute(query.format(marks=_marks(part)), part).fetchall()
    return out


def logical_sizes(conn: sqlite3.Connection, names: Sequence[str]) -> dict[str, int]:
    """Each named volume's base size plus its snapshots' (what they take without casfs)."""
    query = (
        "SELECT v.name, v.size + COALESCE((SELECT SUM(s.size) FROM snapshots s WHERE s.volume = v.name), 0) "
        "FROM volumes v WHERE v.name IN ({marks})"
    )
    return {name: int(size) for name, size in _by_volume(conn, query, names)}


def upper_epochs(conn: sqlite3.Connection, names: Sequence[str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for name, epoch in _by_volume(conn, "SELECT volume, epoch FROM uppers WHERE volume IN ({marks})", names):
        out.setdefault(name, []).append(epoch)
    return out


def snapshot_lists(conn: sqlite3.Connection, names: Sequence[str]) -> dict[str, list[SnapshotNo]]:
    """snapshot_numbers() of many volumes at once."""
    query = (
        "SELECT volume, n FROM snapshots WHERE volume IN ({marks}) "
        "UNION SELECT volume, snapshot FROM uppers WHERE snapshot IS NOT NULL AND volume IN ({marks})"
    )
    out: dict[str, list[SnapshotNo]] = {n: [] for n in names}
    for i in range(0, len(names), 250):
        part = list(names[i : i + 250])
        q = query.format(marks=_marks(part))
        for vol, n in conn.execute(q, part + part):
            out[vol].append(SnapshotNo(n))
    for numbers in out.values():
        numbers.sort()
    return out


# -- snapshots ---------------------------------------------------------------------


class SnapshotRow(NamedTuple):
    """A snapshot with what it takes from its volume's row (the one snapshot join)."""

    volume: str
    n: SnapshotNo
    root: BlobId
    size: int
    next_ino: InodeNo
    label: str | None
    created: float
    kind: VolumeKind  # the volume's
    chunk_size: int  # the volume's
    phase: str  # the volume's


_SNAPSHOT = (
    "SELECT s.volume, s.n, s.root, s.size, s.next_ino, s.label, s.created, v.kind, v.chunk_size, v.phase "
    "FROM snapshots s JOIN volumes v ON v.name = s.volume"
)


def _snapshot(row: tuple[Any, ...]) -> SnapshotRow:
    volume, n, root, size, next_ino, label, created, kind, chunk_size, phase = row
    return SnapshotRow(
        volume,
        SnapshotNo(n),
        BlobId(bytes(root)),
        size,
        InodeNo(next_ino),
        label,
        created,
        VolumeKind(kind),
        chunk_size,
        phase,
    )


def snapshot_row(conn: sqlite3.Connection, volume: str, n: SnapshotNo) -> SnapshotRow | None:
    row = conn.execute(f"{_SNAPSHOT} WHERE s.volume = ? AND s.n = ?", (volume, n)).fetchone()
    return None if row is None else _snapshot(row)


def snapshot_rows(conn: sqlite3.Connection, volume: str | None = None) -> list[SnapshotRow]:
    """A volume's snapshots by number (every volume's, by volume then number, if None)."""
    if volume is None:
        return [_snapshot(r) for r in conn.execute(f"{_SNAPSHOT} ORDER BY s.volume, s.n")]
    return [_snapshot(r) for r in conn.execute(f"{_SNAPSHOT} WHERE s.volume = ? ORDER BY s.n", (volume,))]


def snapshot_numbers(conn: sqlite3.Connection, volume: str) -> list[SnapshotNo]:
    """Every snapshot taken: stored ones, and those frozen whose fold is still to commit."""
    query = (
        "SELECT n FROM snapshots WHERE volume = ? "
        "UNION SELECT snapshot FROM uppers WHERE volume = ? AND snapshot IS NOT NULL ORDER BY 1"
    )
    return [SnapshotNo(n) for (n,) in conn.execute(query, (volume, volume))]


def labelled(conn: sqlite3.Connection, label: str) -> list[tuple[str, SnapshotNo]]:
    """(volume, n) of every snapshot with this label: stored, or taken while mounted and
    still folding (its upper epoch carries the label until the fold adds the row)."""
    query = (
        "SELECT volume, n FROM snapshots WHERE label = ? UNION "
        "SELECT volume, snapshot FROM uppers WHERE label = ? AND snapshot IS NOT NULL ORDER BY 1, 2"
    )
    return [(str(v), SnapshotNo(n)) for v, n in conn.execute(query, (label, label))]


def snapshot_roots(conn: sqlite3.Connection, volume: str) -> dict[SnapshotNo, BlobId]:
    query = "SELECT n, root FROM snapshots WHERE volume = ? ORDER BY n"
    return {SnapshotNo(n): BlobId(bytes(r)) for n, r in conn.execute(query, (volume,))}


def snapshots_with_root(conn: sqlite3.Connection, volume: str, root: BlobId, but: int) -> list[SnapshotNo]:
    query = "SELECT n FROM snapshots WHERE volume = ? AND root = ? AND n != ? ORDER BY n"
    return [SnapshotNo(n) for (n,) in conn.execute(query, (volume, root, but))]


def previous_snapshot_root(conn: sqlite3.Connection, volume: str, n: int) -> BlobId | None:
    query = "SELECT root FROM snapshots WHERE volume = ? AND n < ? ORDER BY n DESC LIMIT 1"
    row = conn.execute(query, (volume, n)).fetchone()
    return None if row is None else BlobId(bytes(row[0]))


def next_snapshot_after(conn: sqlite3.Connection, volume: str, n: int) -> SnapshotNo | None:
    row = conn.execute("SELECT MIN(n) FROM snapshots WHERE volume = ? AND n > ?", (volume, n)).fetchone()
    return None if row is None or row[0] is None else SnapshotNo(row[0])


def delete_snapshot(conn: sqlite3.Connection, volume: str, n: SnapshotNo) -> None:
    """Delete a snapshot row (the caller released its root)."""
    conn.execute("DELETE FROM snapshots WHERE volume = ? AND n = ?", (volume, n))
    conn.execute("DELETE FROM provenance WHERE volume = ? AND n = ?", (volume, n))


# -- overlay -----------------------------------------------------------------------


def has_overlay(conn: sqlite3.Connection, volume: str) -> bool:
    """Whether a read/write mount left changes not yet folded into the base. (A block
    volume's disk file keeps the row of its attributes: no part of its snapshots.)"""
    query = (
        "SELECT 1 FROM overlay_inodes o JOIN volumes v ON v.name = o.volume "
        f"WHERE o.volume = ? AND {PENDING_INODE} "
        "UNION ALL SELECT 1 FROM overlay_chunks WHERE volume = ? "
        "UNION ALL SELECT 1 FROM uppers WHERE volume = ? LIMIT 1"
    )
    return conn.execute(query, (volume, volume, volume)).fetchone() is not None


def overlay_chunks(conn: sqlite3.Connection, volume: str) -> list[BlobId]:
    """The chunks (not holes) the volume's overlay holds a reference on."""
    query = "SELECT chunk FROM overlay_chunks WHERE volume = ? AND chunk != ?"
    return [BlobId(bytes(c)) for (c,) in conn.execute(query, (volume, ZERO_ID))]


# -- replicas (casfs.replica) -------------------------------------------------------


class Provenance(NamedTuple):
    """Where a received snapshot came from (a snapshot without one was taken here)."""

    n: SnapshotNo
    made_by: str  # the id of the store that took it
    source: str  # a SOURCE of `casfs pull`, or 'stream'
    received: float


def set_next_snapshot(conn: sqlite3.Connection, volume: str, n: SnapshotNo) -> None:
    """Raise the next snapshot number to at least `n` (a received snapshot keeps its
    origin's number, so numbers given out here must go past it)."""
    conn.execute("UPDATE volumes SET next_snapshot = MAX(next_snapshot, ?) WHERE name = ?", (n, volume))


def add_provenance(conn: sqlite3.Connection, volume: str, p: Provenance) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO provenance (volume, n, made_by, source, received) VALUES (?, ?, ?, ?, ?)",
        (volume, p.n, p.made_by, p.source, p.received),
    )


def provenance(conn: sqlite3.Connection, volume: str) -> dict[SnapshotNo, Provenance]:
    query = "SELECT n, made_by, source, received FROM provenance WHERE volume = ? ORDER BY n"
    return {SnapshotNo(r[0]): Provenance(SnapshotNo(r[0]), *r[1:]) for r in conn.execute(query, (volume,))}


def add_bookmark(conn: sqlite3.Connection, volume: str, n: SnapshotNo, root: BlobId, created: float) -> None:
    """Keep a removed snapshot's number and root (no reference on it): a pull's lineage
    check still knows that line had this root at n, as a ZFS bookmark does."""
    conn.execute(
        "INSERT OR REPLACE INTO bookmarks (volume, n, root, created) VALUES (?, ?, ?, ?)",
        (volume, n, root, created),
    )


def drop_bookmark(conn: sqlite3.Connection, volume: str, n: SnapshotNo) -> None:
    """A snapshot of that number is back (received again): the row is the record."""
    conn.execute("DELETE FROM bookmarks WHERE volume = ? AND n = ?", (volume, n))


def bookmarks(conn: sqlite3.Connection, volume: str) -> dict[SnapshotNo, BlobId]:
    query = "SELECT n, root FROM bookmarks WHERE volume = ? ORDER BY n"
    return {SnapshotNo(n): BlobId(bytes(r)) for n, r in conn.execute(query, (volume,))}


class Peer(NamedTuple):
    """Another store holding a replica of a volume, as last seen."""

    source: str
    store: str
    remote: str  # the volume's name there
    newest: SnapshotNo | None
    root: BlobId | None
    seen: float


def record_peer(conn: sqlite3.Connection, volume: str, peer: Peer) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO peers (volume, source, store, remote, newest, root, seen) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (volume, *peer),
    )


def peer_sources(conn: sqlite3.Connection) -> list[str]:
    """Every other store a pull of any volume was made from (its SOURCE, as given)."""
    return [str(source) for (source,) in conn.execute("SELECT DISTINCT source FROM peers ORDER BY source")]


def peers(conn: sqlite3.Connection, volume: str) -> list[Peer]:
    query = "SELECT source, store, remote, newest, root, seen FROM peers WHERE volume = ? ORDER BY source"
    return [
        Peer(source, store, remote, newest, None if root is None else BlobId(bytes(root)), seen)
        for source, store, remote, newest, root, seen in conn.execute(query, (volume,))
    ]
