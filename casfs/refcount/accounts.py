"""Kept space figures as read (refcount.figures keeps them): one subject's, or a page
of a listing's, in O(1) a subject; and the counts that settle pending figures, within
a budget (every command that shows figures) or in full (gc, fsck --repair, the
migration to format 10). A count is written only if the subject's row did not change
while it was made (catalog.figures.put_if_unchanged), so a count never overwrites a
change it did not see.
"""

from __future__ import annotations

import os
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from casfs.catalog import blobs as blob_rows
from casfs.catalog import figures as kept
from casfs.catalog import images as image_rows
from casfs.catalog import read_transaction, transaction
from casfs.catalog import volumes as volume_rows
from casfs.errors import NotFound
from casfs.ids import SnapshotNo
from casfs.lifecycle.faults import fault_point
from casfs.refcount.figures import origin_root, previous_root
from casfs.store.ids import BlobId

if TYPE_CHECKING:  # (the walks' codecs and the upper files' module are imported where used:
    # a listing with nothing pending needs neither, and a command's start-up pays for each)
    from casfs.refcount import usage as u
    from casfs.repo import Repository  # (types only: repo sits above refcount's ledger)

# Blob rows a command may look up to settle pending figures (~5 µs each): enough for
# subjects of a few GiB, bounded whatever the store holds.
BUDGET = 50_000


class Figures:
    """One subject's figures as shown (kept ones, plus a volume's upper files)."""

    __slots__ = ("local", "logical", "pending", "stored", "unique", "written")

    def __init__(
        self, logical: int, stored: int, written: int, unique: int, pending: int, local: int = 0
    ) -> None:
        self.logical, self.stored, self.written, self.unique = logical, stored, written, unique
        self.pending = pending  # catalog.figures bits: STORED, WRITTEN, UNIQUE
        # A volume's upper files: written since its last fold, on this host's disk only;
        # part of stored, written and unique.
        self.local = local

    @property
    def ratio(self) -> float:
        return self.logical / self.stored if self.stored else 0.0

    def is_pending(self, bit: int) -> bool:
        return bool(self.pending & bit)

    def pending_names(self) -> list[str]:
        return [name for bit, name in kept.NAMES.items() if self.pending & bit]

    def to_json(self) -> dict[str, object]:
        """As `ls --json` and `info --json` show them: `pending` lists the estimates."""
        return {
            "logical": self.logical,
            "stored": self.stored,
            "written": self.written,
            "unique": self.unique,
            "ratio": round(self.ratio, 3),
            "local": self.local,
            "pending": self.pending_names(),
        }


# -- reading --------------------------------------------------------------------------


def volume_figures(repo: Repository, name: str, budget: int | None = BUDGET) -> Figures:
    """One volume's figures: its kept row (settled first within `budget` blob rows if
    pending; None: not settled), its sizes and its upper files. O(1) in the volume's
    size: the call the CSI plugin's ListVolumes, GetCapacity and NodeGetVolumeStats use.
    NotFound if there is no such volume."""
    row = volume_rows.volume_row(repo.conn, name)
    if row is None:
        raise NotFound(f"no volume named {name!r}")
    if budget is not None:
        settle(repo, [kept.volume(name)], budget)
    return volume_listing(repo, [row.name])[row.name]


def volume_listing(repo: Repository, names: Sequence[str]) -> dict[str, Figures]:
    """The figures of the named volumes (those that exist), in a few queries."""
    conn = repo.conn
    rows = kept.get_many(conn, [kept.volume(n) for n in names])
    logical = volume_rows.logical_sizes(conn, names)
    epochs = volume_rows.upper_epochs(conn, names)
    folders = _upper_folders(repo)
    out = {}
    for name in names:
        if name not in logical:
            continue
        k = rows.get(kept.volume(name), kept.MISSING)
        local = _local(repo, name, epochs.get(name, [])) if name in folders else 0
        out[name] = Figures(
            logical[name], k.stored + local, k.written + local, k.unique + local, k.pending, local
        )
    return out


def _local(repo: Repository, name: str, epochs: list[int]) -> int:
    from casfs.store import uppers

    return uppers.local_bytes(repo.path, name, epochs)


def _upper_folders(repo: Repository) -> set[str]:
    try:
        return set(os.listdir(repo.path / "upper"))  # (uppers.upper_dir's parent)
    except FileNotFoundError:
        return set()


def image_figures(repo: Repository, name: str, budget: int | None = BUDGET) -> Figures:
    row = image_rows.image_row(repo.conn, name)
    if budget is not None:
        settle(repo, [kept.image(name)], budget)
    k = kept.get(repo.conn, kept.image(name))
    if row is None or row.phase != "ready":  # (nothing stored yet: nothing pending)
        return Figures(row.size if row else 0, 0, 0, 0, 0)
    return Figures(row.size, k.stored, k.written, k.unique, k.pending)


def snapshot_figures(repo: Repository, volume: str, n: SnapshotNo, budget: int | None = BUDGET) -> Figures:
    row = volume_rows.snapshot_row(repo.conn, volume, n)
    if row is None:  # (taken while mounted, not folded yet: nothing stored yet)
        return Figures(0, 0, 0, 0, kept.ALL)
    if budget is not None:
        settle(repo, [kept.snapshot(volume, n)], budget)
    k = kept.get(repo.conn, kept.snapshot(volume, n))
    return Figures(row.size, k.stored, k.written, k.unique, k.pending)


# -- counting -------------------------------------------------------------------------


def settle(repo: Repository, subjects: Iterable[str] | None = None, budget: int | None = BUDGET) -> int:
    """Count the pending figures of `subjects` (None: every subject) within `budget`
    blob rows (None: no limit), and keep each count unless its row changed meanwhile.
    Returns how many subjects stay pending."""
    conn = repo.conn
    with read_transaction(conn):
        names = (
            list(dict.fromkeys(subjects)) if subjects is not None else kept.pending(conn) + kept.missing(conn)
        )
        rows = kept.get_many(conn, names)
        todo = [(s, rows.get(s, kept.MISSING)) for s in names]
        todo = [(s, k) for s, k in todo if k.pending]
        if not todo:
            return 0
        from casfs.refcount import usage as u

        spend = u.Budget(budget)
        held: Counter[BlobId] | None = None
        counted: list[tuple[str, kept.Kept, kept.Kept | None]] = []
        for subject, was in todo:
            try:
                if was.pending & kept.UNIQUE and held is None:
                    held = u.garbage_holds(repo, spend)
                counted.append((subject, was, count(repo, subject, was, held, spend)))
            except u.OverBudget:
                break
    if not counted:
        return len(todo)
    fault_point("figures:counted")
    try:
        with transaction(conn):
            for subject, was, now in counted:
                if now is None:
                    kept.delete(conn, [subject])
                else:
                    kept.put_if_unchanged(conn, subject, was, now)
    except sqlite3.OperationalError as e:
        if "readonly" not in str(e):
            raise
        return len(todo)  # (a store this user may read, not write: shown as kept, pending)
    return len(todo) - len(counted)


def refresh(repo: Repository, progress: Callable[[int, int], None] | None = None) -> int:
    """Count every pending or missing figure of the store, without a budget; returns
    how many subjects were counted. `progress(done, total)` if given."""
    conn = repo.conn
    with read_transaction(conn):
        names = kept.pending(conn) + kept.missing(conn)
    for i, subject in enumerate(names):
        settle(repo, [subject], None)
        if progress is not None:
            progress(i + 1, len(names))
    return len(names)


Reach = dict[BlobId, int]  # blob -> its stored bytes


def count(
    repo: Repository,
    subject: str,
    was: kept.Kept = kept.MISSING,
    held: Counter[BlobId] | None = None,
    budget: u.Budget | None = None,
    memo: dict[BlobId, Reach] | None = None,
) -> kept.Kept | None:
    """The subject's figures counted (the pending ones; the others as kept), or None if
    the subject is gone. `held`: usage.garbage_holds(), for a unique figure; `memo`:
    the reach of roots counted before (fsck's 10,000 clones of one image walk it once)."""
    from casfs.refcount import usage as u

    roots, origin = _roots(repo.conn, subject)
    if roots is None:
        return None
    memo = {} if memo is None else memo
    stored, written, unique = was.stored, was.written, was.unique
    if was.pending & (kept.STORED | kept.WRITTEN):
        rows: Reach = {}
        for root in dict.fromkeys(roots):
            rows.update(_reach(repo, root, budget, memo))
        stored = sum(rows.values())
        if origin is None:
            written = stored
        else:
            before = _reach(repo, origin, budget, memo)
            written = sum(n for b, n in rows.items() if b not in before)
    if was.pending & kept.UNIQUE:
        if held is None:
            held = u.garbage_holds(repo, budget)
        unique = u.unique_bytes(repo, roots, held, budget)
    return kept.Kept(stored, written, unique, 0)


def _reach(repo: Repository, root: BlobId, budget: u.Budget | None, memo: dict[BlobId, Reach]) -> Reach:
    if root not in memo:
        from casfs.refcount import usage as u

        rows, _, _ = u.reach(repo, [root], budget)
        memo[root] = {b: r.stored for b, r in rows.items()}
    return memo[root]


class Drift:
    """A kept figure that differs from its count (fsck)."""

    __slots__ = ("counted", "figure", "kept", "subject")

    def __init__(self, subject: str, figure: str, kept: object, counted: object) -> None:
        self.subject, self.figure, self.kept, self.counted = subject, figure, kept, counted

    def __str__(self) -> str:
        return f"{self.subject}: {self.figure} {self.kept} kept, {self.counted} counted"


def audit(repo: Repository, repair: bool = False) -> list[Drift]:
    """Count every subject's figures and the blob totals in one read transaction and
    compare them with what is kept (a pending figure is not a drift); with `repair`,
    keep the counts (pending ones too) and delete rows of subjects that are gone."""
    from casfs.refcount import usage as u

    conn = repo.conn
    found: list[Drift] = []
    fixes: list[tuple[str, kept.Kept, kept.Kept]] = []
    with read_transaction(conn):
        subjects = kept.subjects(conn)
        rows = kept.get_many(conn, subjects)
        held = u.garbage_holds(repo)
        memo: dict[BlobId, Reach] = {}
        for subject in subjects:
            was = rows.get(subject, kept.MISSING)
            now = count(repo, subject, was._replace(pending=kept.ALL), held, None, memo)
            if now is None:
                continue
            for bit, name in kept.NAMES.items():
                i = (kept.STORED, kept.WRITTEN, kept.UNIQUE).index(bit)
                if not was.pending & bit and was[i] != now[i]:
                    found.append(Drift(subject, name, was[i], now[i]))
            if was.pending or was[:3] != now[:3]:
                fixes.append((subject, was, now))
        totals, counted = blob_rows.totals(conn), blob_rows.counted_totals(conn)
        if totals != counted:
            found.append(Drift("store", "blob totals (rows, stored, garbage)", totals, counted))
    if repair:
        with transaction(conn):
            for subject, was, now in fixes:
                kept.put_if_unchanged(conn, subject, was, now)
            if totals != counted:
                blob_rows.set_totals(conn, counted)
            kept.prune(conn)
    return found


def _roots(conn: sqlite3.Connection, subject: str) -> tuple[list[BlobId] | None, BlobId | None]:
    """A subject's root references (None: no such subject) and the root its written
    figure is counted against (None: none, all is written)."""
    what, _, name = subject.partition(":")
    if what == "image":
        row = image_rows.image_row(conn, name)
        if row is None or row.root is None or row.phase != "ready":
            return None, None
        return [row.root, *image_rows.chain_roots(conn, name)], None
    if what == "volume":
        vrow = volume_rows.volume_row(conn, name)
        if vrow is None:
            return None, None
        return volume_rows.held_roots(conn, name), origin_root(conn, vrow.origin)
    vol, _, n = name.rpartition("@")
    snap = volume_rows.snapshot_row(conn, vol, SnapshotNo(int(n)))
    if snap is None:
        return None, None
    return [snap.root], previous_root(conn, vol, snap.n)
