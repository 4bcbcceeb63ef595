"""Kept space figures: what listings, `info`, the control xattrs and the CSI plugin read,
O(1) a subject whatever its size, instead of walking its chunk maps (refcount.usage).

Each ready image, volume and snapshot (a subject) keeps four figures:

  logical   the catalog's sizes (a volume's: its base's and its snapshots', added up)
  stored    bytes on disk of the distinct blobs its roots reach
  written   of those, the bytes its origin does not reach (an image: all of them; a
            snapshot: the bytes the snapshot before it, or the volume's origin, does not)
  unique    what removing it and running gc would free (garbage is left out: gc frees
            it anyway, so gc changes no figure)

They are kept in the transaction that changes what they count (catalog.figures), by
rules that are exact where the operation knows enough, and otherwise mark the figure
pending: a pending figure is the last count adjusted by what the operation knew (an
estimate; the listings mark it) until a count settles it. `settle` counts pending figures
within a budget of blob rows (every command that lists or changes figures runs it, so
small subjects are exact again at once); `refresh` counts them all (gc, fsck --repair,
the migration to format 10). A count is written only if the subject's row did not
change while it was made (catalog.figures.put_if_unchanged).

The rules (who else a change can affect): a root reference taken or dropped changes
another subject's unique only if, after it, that subject holds every remaining
reference on the root (released, retained below); a blob that becomes garbage, or a
stored blob a batch found and used again (dedup), may be shared with anyone: every
unique is marked pending then. A fold adds the bytes it stored new to its volume's
stored, written and unique: exact while the old base stays held (by a snapshot, an
image), pending otherwise (see docs/developer-notes.md, "Kept figures").
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence

from casfs.catalog import figures as kept
from casfs.catalog import images as image_rows
from casfs.catalog import volumes as volume_rows
from casfs.ids import SnapshotNo
from casfs.store.ids import ZERO_ID, BlobId


def origin_root(conn: sqlite3.Connection, origin: str) -> BlobId | None:
    """The root a volume was made from, if it is still there ('blank', a replica: none;
    'chain:ID', the tree of those layers an image keeps)."""
    what, _, name = origin.partition(":")
    if what == "image":
        row = image_rows.image_row(conn, name)
        return row.root if row is not None else None
    if what == "snapshot":
        vol, _, n = name.rpartition("@")
        snap = volume_rows.snapshot_row(conn, vol, SnapshotNo(int(n)))
        return snap.root if snap is not None else None
    if what == "chain":  # (the tree an image keeps for those layers: volumes.clone_chain)
        held = image_rows.chain_holder(conn, name)
        return held[1] if held is not None else None
    return None


def previous_root(conn: sqlite3.Connection, volume: str, n: int) -> BlobId | None:
    """The root of the snapshot before n, or else of the volume's origin."""
    before = volume_rows.previous_snapshot_root(conn, volume, n)
    if before is not None:
        return before
    row = volume_rows.volume_row(conn, volume)
    return origin_root(conn, row.origin) if row is not None else None


# -- keeping: called inside the transaction that makes the change, after it ---------------


def _sole(rows: list[frozenset[str]]) -> set[str]:
    """The subjects every one of `rows` belongs to."""
    if not rows:
        return set()
    common = set(rows[0])
    for r in rows[1:]:
        common &= r
    return common


# Holder rows read to find a root's sole holder: past this, three owners show it has none
# (10,000 clones of one image cost a clone 64 rows, not 10,000).
_SAMPLE = 64


def _owners(rows: list[frozenset[str]]) -> set[str]:
    return {s for r in rows for s in r if not s.startswith("snapshot:")}


def _holders(conn: sqlite3.Connection, root: BlobId) -> tuple[int, list[frozenset[str]] | None]:
    """(rows holding `root`, those rows; None when a sample shows three owners or more:
    then no subject holds it alone, before or after one row came or went)."""
    sample = kept.holder_rows(conn, root, _SAMPLE)
    if len(sample) < _SAMPLE:
        return len(sample), sample
    if len(_owners(sample)) >= 3:
        return kept.holder_count(conn, root), None
    rows = kept.holder_rows(conn, root)
    return len(rows), rows


def released(conn: sqlite3.Connection, root: BlobId, by: Iterable[str]) -> None:
    """A reference on `root` held by a row of the subjects `by` was dropped."""
    if root == ZERO_ID:
        return
    count, rows = _holders(conn, root)
    n = kept.refs(conn, root)
    if n <= 0 or n != count:  # garbage now, or held by blobs too: anyone may share its blobs
        kept.mark_all(conn, kept.UNIQUE)
        return
    if rows is not None:
        kept.mark(conn, _sole(rows) - set(by), kept.UNIQUE)


def retained(conn: sqlite3.Connection, root: BlobId, by: Iterable[str]) -> None:
    """A reference on `root` was taken by a new row of the subjects `by` (exactly those)."""
    if root == ZERO_ID:
        return
    mine = frozenset(by)
    count, rows = _holders(conn, root)
    n = kept.refs(conn, root)
    # n == 1: it had none before (revived garbage, whose children others' figures left out).
    if n != count or n == 1 or (rows is not None and mine not in rows):
        kept.mark_all(conn, kept.UNIQUE)
        return
    if rows is not None:
        rows.remove(mine)
        kept.mark(conn, _sole(rows) - mine, kept.UNIQUE)


def shared_unknown(conn: sqlite3.Connection) -> None:
    """Stored blobs were used again (dedup) or revived: whoever held them may now share."""
    kept.mark_all(conn, kept.UNIQUE)


def changed(conn: sqlite3.Connection, subjects: Iterable[str]) -> None:
    """Subjects whose roots changed in ways no rule here follows (rollback, resize, a
    received snapshot): every figure pending (a new subject gets its row), and every
    unique (who shares is unknown)."""
    kept.mark(conn, subjects, kept.ALL)
    kept.mark_all(conn, kept.UNIQUE)


def new_subject(conn: sqlite3.Connection, subject: str) -> None:
    """A subject whose figures nothing knows yet (an import, a blank volume)."""
    kept.put(conn, subject, 0, 0, 0, kept.ALL)


def cloned(conn: sqlite3.Connection, name: str, base: BlobId, source: str) -> None:
    """A volume made from `source` ('image:NAME' or 'snapshot:VOL@N'), whose root is
    `base`: it reaches what the source's root reaches, writes nothing, frees nothing."""
    retained(conn, base, [kept.volume(name)])
    stored, pending = _single_root_stored(conn, source)
    kept.put(conn, kept.volume(name), stored, 0, 0, pending)


def _single_root_stored(conn: sqlite3.Connection, source: str) -> tuple[int, int]:
    """(stored, pending bit) of a subject holding one root: a snapshot, or an image
    without chains (one with chains holds more than its root)."""
    k = kept.get(conn, source)
    what, _, name = source.partition(":")
    if what == "image" and image_rows.chain_roots(conn, name):
        return k.stored, kept.STORED
    return k.stored, k.pending & kept.STORED


def snapshot_taken(conn: sqlite3.Connection, volume: str, n: SnapshotNo, root: BlobId) -> None:
    """Snapshot n of a volume at rest: its base, one more reference (record_snapshot)."""
    v, s = kept.volume(volume), kept.snapshot(volume, n)
    retained(conn, root, [v, s])
    same = volume_rows.snapshots_with_root(conn, volume, root, but=n)
    whole = kept.get(conn, v)
    stored, pending = whole.stored, kept.STORED
    if same:
        stored, pending = _single_root_stored(conn, kept.snapshot(volume, same[0]))
    elif set(volume_rows.held_roots(conn, volume)) == {root}:  # the volume is this one root
        pending = whole.pending & kept.STORED
    prev = previous_root(conn, volume, n)
    written_pending = 0 if prev == root else kept.WRITTEN  # (the base as the snapshot before it: nothing new)
    kept.put(conn, s, stored, 0, 0, pending | written_pending)  # (unique 0: the base holds the same root)


def folded(
    conn: sqlite3.Connection,
    volume: str,
    n: SnapshotNo,
    old_base: BlobId,
    new_root: BlobId,
    born: int,
    reused: bool,
) -> None:
    """A fold made snapshot n and the new base `new_root` over `old_base`, storing
    `born` bytes of new blobs (reused: it also used blobs stored before, or revived
    garbage, or released overlay chunk rows). Called after the publish's retains and
    releases, in its transaction."""
    v = kept.volume(volume)
    if reused:
        shared_unknown(conn)
    roots = volume_rows.snapshot_roots(conn, volume)
    held = old_base == new_root or old_base in roots.values()
    origin = volume_rows.volume_row(conn, volume)
    assert origin is not None
    origin_at = origin_root(conn, origin.origin)
    bits = kept.STORED | kept.WRITTEN if reused else 0
    if not held:
        # What the old base alone reached left the volume: its stored bytes are an estimate
        # (an upper bound); its written ones too unless that base was the origin's root.
        bits |= kept.STORED | (0 if old_base == origin_at else kept.WRITTEN)
    if kept.refs(conn, old_base) <= 0 and old_base != ZERO_ID:
        bits |= kept.UNIQUE  # the old base is garbage: what it alone held is freed
    kept.add(conn, v, born, born, born, bits)
    prev = volume_rows.previous_snapshot_root(conn, volume, n)
    exact_written = not reused and old_base == (prev if prev is not None else origin_at)
    after = kept.get(conn, v)
    kept.put(
        conn,
        kept.snapshot(volume, n),
        after.stored,
        born,
        0,
        kept.STORED | (0 if exact_written else kept.WRITTEN),
    )
    released(conn, old_base, [v])


def snapshot_removed(conn: sqlite3.Connection, volume: str, n: SnapshotNo, root: BlobId) -> None:
    """Snapshot n (root `root`) was deleted, its reference dropped."""
    v = kept.volume(volume)
    kept.delete(conn, [kept.snapshot(volume, n)])
    row = volume_rows.volume_row(conn, volume)
    still = (row is not None and row.base == root) or root in volume_rows.snapshot_roots(
        conn, volume
    ).values()
    if not still:
        kept.mark(conn, [v], kept.STORED | kept.WRITTEN)
    after = volume_rows.next_snapshot_after(conn, volume, n)
    if after is not None:  # its written figure was counted against the one removed
        kept.mark(conn, [kept.snapshot(volume, after)], kept.WRITTEN)
    released(conn, root, [v, kept.snapshot(volume, n)])


def volume_removed(conn: sqlite3.Connection, name: str, roots: Sequence[BlobId]) -> None:
    """A volume and its snapshots were deleted, their references (`roots`) dropped."""
    kept.delete_volume(conn, name)
    for root in dict.fromkeys(roots):
        released(conn, root, [kept.volume(name)])


def image_removed(conn: sqlite3.Connection, name: str, roots: Sequence[BlobId]) -> None:
    kept.delete(conn, [kept.image(name)])
    for root in dict.fromkeys(roots):
        released(conn, root, [kept.image(name)])
