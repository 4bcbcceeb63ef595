"""Garbage collection: free the blobs whose count reached zero, cascading to their children.

A blob row at refs 0 still holds references on its children (catalog.SCHEMA). gc, in
rounds until none is left:

  1. selects up to ROUND_ROWS zero rows (index blobs_garbage);
  2. reads the metadata ones (trees, maps) to learn their children; data has none, so
     freeing a 10 GiB disk reads only its map, not its chunks;
  3. in ONE catalog transaction deletes the rows still at zero and decrements their
     children by multiplicity; children that reach zero are the next round's work;
  4. after the commit, unlinks the files.

Crash safety: the commit comes first and the unlink after, so a crash in between
leaves files without rows (orphans), which the orphan sweep at the end of every gc
removes. The reverse order could leave a row whose file is gone while its children
still count it, which only fsck --repair could untangle.

Concurrency: a round runs under the store's lock held exclusively. Writer batches hold
it shared from their first put to their commit, so none is in flight during a round:
none is about to reference a zero row it saw as live, none has published a file whose
row is not committed yet (the orphan sweep would take it), and none can re-publish a
file between a round's commit and its unlink. Nothing is carried from one round to the
next, so gc may let writers in between rounds: it does, every `lock_slice` seconds,
because a guest's flush waiting for the whole gc of a large volume would stall for
seconds (measured: ~0.1 ms per freed blob with IO_WORKERS unlinking, ~0.4 ms alone;
the pack index drops a batch of rows in one commit, ~20 us a blob instead of ~85).
release()/retain() take no lock; a row is deleted only if it is still at zero inside
the deleting transaction.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from casfs.catalog import blobs as blob_rows
from casfs.catalog import transaction
from casfs.catalog import volumes as volume_rows
from casfs.errors import Corruption, MissingBlob
from casfs.kinds import BlobKind
from casfs.lifecycle import pids
from casfs.lifecycle.faults import fault_point
from casfs.snapshots.children import children
from casfs.store import uppers
from casfs.store.ids import ZERO_ID, BlobId

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from casfs.repo import FileLock, Repository

# Bounds on one transaction: rows deleted, and child decrements (one full map root
# names 1024 chunks), so gc of a large volume never holds one giant write transaction.
ROUND_ROWS = 1000
ROUND_CHILDREN = 50_000
# ... and on a disk short of room (casfs.store.reserve), where each transaction's WAL
# frames must fit: 50,000 decrements in a 100,000-blob catalog wrote a 10 MB WAL (nearly
# every page of the blobs table, and the blobs_garbage entries of those reaching zero),
# and gc failed with 16 MiB free; rounds this small keep each under ~2 MB.
SMALL_ROUND_ROWS = 250
SMALL_ROUND_CHILDREN = 500
# Threads reading metadata and unlinking files: unlinks wait on the filesystem journal,
# and several in flight overlap those waits (20k files: 9 s with 1, 2.2 s with 8).
IO_WORKERS = 8
DELETE_BATCH = 500  # freed blobs per delete_many
# How long gc holds the lock before letting writers in, and for how long it lets them:
# longer than FileLock's 20 ms poll, so a waiting writer gets its turn.
LOCK_SLICE_S = 0.5
_YIELD_S = 0.05


@dataclass
class GcReport:
    blobs_freed: int = 0
    bytes_freed: int = 0  # stored bytes of freed blobs and removed orphan files
    orphan_files_removed: int = 0
    tmp_files_removed: int = 0
    rounds: int = 0
    # Inconsistencies met on the way (a zero row whose blob could not be read, a child
    # with no row, a count below zero). gc carries on; `casfs fsck --repair` recounts.
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Garbage:
    bid: BlobId
    kind: int
    stored: int


class _SlicedLock:
    """The exclusive lock, given up between rounds once held for `slice_s`."""

    def __init__(self, repo: Repository, timeout: float, slice_s: float) -> None:
        self.repo, self.timeout, self.slice_s = repo, timeout, slice_s
        self.lock: FileLock = repo.exclusive_lock(timeout)
        self.since = time.monotonic()

    def checkpoint(self) -> None:
        """Call only between rounds: nothing decided under the lock may be pending."""
        if time.monotonic() - self.since < self.slice_s:
            return
        self.lock.release()
        time.sleep(_YIELD_S)
        self.lock = self.repo.exclusive_lock(self.timeout)
        self.since = time.monotonic()

    def release(self) -> None:
        self.lock.release()


def gc(
    repo: Repository, timeout: float = 30.0, lock_slice: float = LOCK_SLICE_S, small_rounds: bool = False
) -> GcReport:
    """Free every unreferenced blob, then orphan files and dead staging dirs.
    `small_rounds`: the disk is short of room, so each transaction is kept small.

    Raises Busy when writers keep the store's lock for more than `timeout` seconds
    (before any work, or between rounds: what was freed stays freed and consistent)."""
    from concurrent.futures import ThreadPoolExecutor  # (not at import: start-up recovery imports gc)

    report = GcReport()
    lock = _SlicedLock(repo, timeout, lock_slice)
    try:
        conn = repo.conn
        with ThreadPoolExecutor(max_workers=IO_WORKERS, thread_name_prefix="casfs-gc") as pool:
            round_rows, round_children = (
                (SMALL_ROUND_ROWS, SMALL_ROUND_CHILDREN) if small_rounds else (ROUND_ROWS, ROUND_CHILDREN)
            )
            while True:
                rows = [_Garbage(*row) for row in blob_rows.garbage(conn, round_rows)]
                if not rows:
                    break
                # Read before the transaction, not in it: blobs are immutable, and the
                # DELETE re-checks refs = 0 under the catalog's write lock.
                meta = {g.bid: pool.submit(_children, repo, g) for g in rows if g.kind != BlobKind.DATA}
                kids = [meta[g.bid].result() if g.kind != BlobKind.DATA else Counter[BlobId]() for g in rows]
                for part in _parts(rows, kids, round_children):
                    _free(repo, conn, pool, part, report)
                lock.checkpoint()
            _sweep_orphans(repo, conn, lock, report)
            report.orphan_files_removed += uppers.remove_unknown(
                repo.path, {v.name for v in volume_rows.volume_rows(conn)}
            )
        report.tmp_files_removed = repo.blobs.recover_staging(pids.alive)
    finally:
        lock.release()
    return report


def _children(repo: Repository, g: _Garbage) -> Counter[BlobId] | str:
    """The children of a zero row with multiplicity, or why they cannot be known."""
    try:
        return Counter(c for c, _ in children(g.kind, repo.blobs.get(g.bid, "meta")))
    except (Corruption, ValueError) as e:  # MissingBlob is a Corruption; ValueError: unknown kind
        what = BlobKind.label_of(g.kind)
        return f"{what} blob {g.bid.hex()} is unreadable ({e}): row deleted without decrementing its children"


def _parts(
    rows: Sequence[_Garbage], kids: Sequence[Counter[BlobId] | str], most: int
) -> Iterator[list[tuple[_Garbage, Counter[BlobId] | str]]]:
    part: list[tuple[_Garbage, Counter[BlobId] | str]] = []
    n_children = 0
    for g, k in zip(rows, kids, strict=True):
        part.append((g, k))
        n_children += len(k) if isinstance(k, Counter) else 0
        if n_children >= most:
            yield part
            part, n_children = [], 0
    if part:
        yield part


def _free(
    repo: Repository,
    conn: sqlite3.Connection,
    pool: ThreadPoolExecutor,
    part: Sequence[tuple[_Garbage, Counter[BlobId] | str]],
    report: GcReport,
) -> None:
    freed: list[_Garbage] = []
    notes: list[str] = []
    with transaction(conn):
        decrements: Counter[BlobId] = Counter()
        for g, kids in part:
            # Still zero? A retain() since the SELECT has made it live again.
            if not blob_rows.delete_if_garbage(conn, g.bid):
                continue
            freed.append(g)
            if isinstance(kids, str):
                notes.append(kids)
            else:
                decrements.update(kids)
        for bid, n in decrements.items():
            if bid == ZERO_ID:
                continue
            refs = blob_rows.decrement(conn, bid, n)
            if refs is None:
                notes.append(f"blob {bid.hex()} is referenced by freed blobs but has no catalog row")
            elif refs < 0:
                # Left negative, not clamped: a count that was too low may be hiding live
                # references, and a negative row is never collected. fsck --repair recounts.
                notes.append(f"blob {bid.hex()} refcount fell to {refs}")
    report.rounds += 1
    report.problems += notes
    # After the commit (see the module docstring): a crash here leaves only orphans.
    fault_point("gc:after-commit")
    # In batches, one per worker: a pack store drops a batch's rows in one commit, an
    # object store's deletes (requests each) still overlap.
    bids = [g.bid for g in freed]
    size = max(1, min(DELETE_BATCH, -(-len(bids) // IO_WORKERS)))
    for _ in pool.map(repo.blobs.delete_many, [bids[i : i + size] for i in range(0, len(bids), size)]):
        pass
    report.blobs_freed += len(freed)
    report.bytes_freed += sum(g.stored for g in freed)


def unreferenced_files(repo: Repository, conn: sqlite3.Connection) -> Iterator[list[BlobId]]:
    """Blob files no catalog row names, a batch at a time (the caller holds the store
    lock exclusively between batches, so a file cannot gain its row meanwhile)."""
    for chunk in blob_rows.batches(repo.blobs.list()):
        known = blob_rows.known(conn, chunk)
        yield [bid for bid in chunk if bid not in known]


def _sweep_orphans(repo: Repository, conn: sqlite3.Connection, lock: _SlicedLock, report: GcReport) -> None:
    """Remove files with no catalog row: left by a crash between a gc commit and its
    unlinks, or by a batch whose process died between publish and commit. The row
    check and the unlink happen in one lock slice (a file listed earlier may since have
    been re-published and committed by a batch: its row is then found)."""
    for orphans in unreferenced_files(repo, conn):
        for bid in orphans:
            try:
                size = repo.blobs.stored_size(bid)
            except MissingBlob:
                continue
            repo.blobs.delete(bid)
            report.orphan_files_removed += 1
            report.bytes_freed += size
        lock.checkpoint()
