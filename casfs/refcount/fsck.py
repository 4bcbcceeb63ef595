"""fsck: recount every reference, re-hash the blobs, and (with repair) fix the counts.

The invariant (catalog.schema) gives the expected count of every blob:

    expected(b) = references from roots + occurrences of b among the children of all rows

Rows at refs 0 that gc has not collected yet count too: they still hold their children.
So fsck reads every metadata blob (trees, map roots, map pages: the walk needs them) and
a `sample` fraction of data blobs (re-hashing is the expensive part), and reports:

  missing     a row, or a reference, with no file
  corrupt     a file that fails decoding, its hash, or its kind's format
  miscounted  stored refs differ from expected (both are shown)
  dangling    a reference to an id with no row
  orphan      a file with no row, referenced by nothing
  size        a row's size or stored bytes differ from the verified file
  kind        a parent reads a blob as metadata of another kind than its row says, so
              the children it sees are not the ones the row holds references on
  logical     an image's, volume's or snapshot's recorded size differs from what its
              root holds (refcount.logical); repair sets the recomputed one
  figures     a kept space figure (refcount.figures) or the blob totals differ from
              their count (a pending figure is no problem); repair keeps the counts,
              pending ones too

Consistency: the rows, the roots and the file list are read in one read transaction
while fsck holds the store's lock exclusively, so no batch is between publishing its
files and committing their rows (no false orphans) and no writer moves a count under
the recount (no false miscounts). A read-only fsck then downgrades to the shared lock:
writers go on, gc waits, so no file fsck is about to read disappears. (Linux converts a
flock atomically, so no gc slips in between.) fsck --repair keeps the exclusive lock.

Repair sets each count to its expected value by applying the difference seen, so a
concurrent retain()/release(), which moves the stored and the expected count alike,
stays correct. It never lowers a count when some referenced metadata blob could not
be read: the children of that blob are unknown, and lowering could free live data that
restoring the blob would have saved. It removes orphan files, and deletes rows that
nothing references whose file is missing or corrupt. It inserts nothing: a missing or
corrupt blob that is referenced stays reported.
"""

from __future__ import annotations

import fcntl
import random
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import ExitStack, closing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeVar

from casfs import catalog
from casfs.catalog import blobs as blob_rows
from casfs.errors import Corruption, MissingBlob
from casfs.kinds import BlobKind
from casfs.refcount import logical
from casfs.snapshots.children import children
from casfs.store.filecache import FileCache, cache_root
from casfs.store.ids import BlobId

if TYPE_CHECKING:
    from casfs.repo import Repository

ProblemKind = Literal[
    "missing",
    "corrupt",
    "miscounted",
    "dangling",
    "orphan",
    "size",
    "kind",
    "logical",
    "figures",
    "cache",
]

READ_WORKERS = 4


@dataclass
class Problem:
    kind: ProblemKind
    blob: str  # hex id
    message: str
    stored: int | None = None  # miscounted: the catalog's count
    expected: int | None = None  # miscounted: the recount
    repaired: bool = False


@dataclass
class FsckReport:
    problems: list[Problem] = field(default_factory=list)
    rows: int = 0  # blob rows in the catalog
    garbage: int = 0  # of which at refs 0, waiting for gc
    root_refs: int = 0
    files: int = 0
    blobs_checked: int = 0  # blobs read and re-hashed (found sound or not)
    bytes_checked: int = 0  # plaintext bytes re-hashed
    data_skipped: int = 0  # data blobs not re-hashed (sample < 1); their files exist
    # Some referenced metadata could not be read: counts of what it names are unknown.
    incomplete: bool = False

    @property
    def clean(self) -> bool:
        """Nothing was found (repaired or not)."""
        return not self.problems

    @property
    def remaining(self) -> list[Problem]:
        """Problems still present: all of them without repair."""
        return [p for p in self.problems if not p.repaired]

    def of_kind(self, kind: ProblemKind) -> list[Problem]:
        return [p for p in self.problems if p.kind == kind]


@dataclass(frozen=True)
class _Read:
    """What one blob read found: its children with their kinds, or an error."""

    bid: BlobId
    kids: list[tuple[BlobId, BlobKind]]
    size: int = 0
    stored: int = 0
    error: tuple[Literal["missing", "corrupt"], str] | None = None


def fsck(
    repo: Repository,
    repair: bool = False,
    sample: float = 1.0,
    timeout: float = 30.0,
    workers: int = READ_WORKERS,
) -> FsckReport:
    """Check the store; with `repair`, fix what can be fixed without guessing.

    Raises Busy when the store's lock cannot be had within `timeout` seconds."""
    if not 0.0 <= sample <= 1.0:
        raise ValueError(f"sample must be within [0, 1], got {sample}")
    report = FsckReport()
    with ExitStack() as stack:
        lock = repo.exclusive_lock(timeout)
        stack.callback(lock.release)
        # A connection of its own: the snapshot's transaction must not meet the caller's.
        conn = stack.enter_context(closing(catalog.connect(repo.catalog_path)))
        rows, roots, files = _snapshot(repo, conn)
        if not repair:
            fcntl.flock(lock.fd, fcntl.LOCK_SH)  # writers may go on now; gc may not
        report.rows, report.files = len(rows), len(files)
        report.garbage = sum(1 for r in rows.values() if r.refs == 0)
        report.root_refs = sum(roots.values())
        plan = _Plan(rows, roots, files)
        _walk(repo, plan, report, sample, workers)
        plan.findings(report)
        _check_logical(repo, conn, report, repair)
        _check_file_cache(repo, report)
        if repair and report.problems:
            _repair(repo, conn, plan, report)
        _check_figures(repo, report, repair)
    report.problems.sort(key=lambda p: (p.kind, p.blob))
    return report


def _check_file_cache(repo: Repository, report: FsckReport) -> None:
    """The whole files passthrough hands the kernel: one that fails its digest is removed
    whatever `repair` says (a cache; the next open fills it again from verified chunks)."""
    for name, why in FileCache(cache_root(repo.path)).check():
        report.problems.append(Problem("cache", name, f"cached file removed: {why}", repaired=True))


def _snapshot(
    repo: Repository, conn: sqlite3.Connection
) -> tuple[dict[BlobId, blob_rows.BlobRow], Counter[BlobId], set[BlobId]]:
    with catalog.read_transaction(conn):  # rows and roots from the same instant
        rows = blob_rows.all_rows(conn)
        roots = blob_rows.live_roots(conn)
    return rows, roots, set(repo.blobs.list())


class _Plan:
    """The recount, built from the snapshot and the blobs read."""

    def __init__(
        self, rows: dict[BlobId, blob_rows.BlobRow], roots: Counter[BlobId], files: set[BlobId]
    ) -> None:
        self.rows = rows
        self.roots = roots
        self.files = files
        self.child_refs: Counter[BlobId] = Counter()
        # How a parent reads each child it names, for the kind check and for dangling
        # references (whose row would say).
        self.ref_kind: dict[BlobId, BlobKind] = {}
        self.unreadable: dict[BlobId, Problem] = {}
        self.sizes: dict[BlobId, tuple[int, int]] = {}  # verified (size, stored) that differ
        self.kind_problems: dict[BlobId, Problem] = {}

    def add_read(self, r: _Read, report: FsckReport) -> None:
        row = self.rows[r.bid]
        report.blobs_checked += 1
        if r.error is not None:
            self.unreadable[r.bid] = Problem(r.error[0], r.bid.hex(), r.error[1])
            return
        report.bytes_checked += r.size
        if (r.size, r.stored) != (row.size, row.stored):
            self.sizes[r.bid] = (r.size, r.stored)
        for child, kind in r.kids:
            self.child_refs[child] += 1
            self.ref_kind.setdefault(child, kind)
            crow = self.rows.get(child)
            if (
                crow is not None
                and kind != BlobKind.DATA
                and kind != crow.kind
                and child not in self.kind_problems
            ):
                self.kind_problems[child] = Problem(
                    "kind",
                    child.hex(),
                    f"blob {child.hex()} is a {BlobKind.label_of(crow.kind)} in the catalog but "
                    f"{BlobKind.label_of(row.kind)} {r.bid.hex()} reads it as a {BlobKind.label_of(kind)}",
                )

    def expected(self, bid: BlobId) -> int:
        return self.roots[bid] + self.child_refs[bid]

    def findings(self, report: FsckReport) -> None:
        problems = report.problems
        for bid, p in self.unreadable.items():
            p.message += f" (refs: stored {self.rows[bid].refs}, expected {self.expected(bid)})"
            if self.expected(bid) > 0:
                p.message += "; importing the same content again heals it"
            problems.append(p)
        # The children of unreadable referenced metadata are unknown; so, for a dangling
        # reference read as metadata (or from a root, kind unknown), are its own.
        report.incomplete = any(
            self.rows[b].kind != BlobKind.DATA and self.expected(b) > 0 for b in self.unreadable
        ) or any(b not in self.rows and self.ref_kind.get(b, -1) != BlobKind.DATA for b in self._referenced())
        for bid, row in self.rows.items():
            want = self.expected(bid)
            if row.refs != want:
                note, what = "", BlobKind.label_of(row.kind)
                if report.incomplete and row.refs > want:
                    note = "; unreadable metadata may hold the difference"
                problems.append(
                    Problem(
                        "miscounted",
                        bid.hex(),
                        f"{what} blob {bid.hex()} has refs {row.refs}, expected {want}{note}",
                        stored=row.refs,
                        expected=want,
                    )
                )
        for bid, (size, stored) in self.sizes.items():
            row = self.rows[bid]
            problems.append(
                Problem(
                    "size",
                    bid.hex(),
                    f"blob {bid.hex()}: the catalog says {row.size} bytes ({row.stored} stored), "
                    f"the file holds {size} ({stored} stored)",
                )
            )
        problems.extend(self.kind_problems.values())
        for bid in self._referenced():
            if bid in self.rows:
                continue
            how = f"{self.roots[bid]} root and {self.child_refs[bid]} blob reference(s)"
            problems.append(Problem("dangling", bid.hex(), f"blob {bid.hex()} has {how} but no catalog row"))
            if bid not in self.files:
                problems.append(
                    Problem("missing", bid.hex(), f"blob {bid.hex()} is referenced but has no file")
                )
        for bid in self.orphans():
            problems.append(Problem("orphan", bid.hex(), f"file of blob {bid.hex()} has no catalog row"))

    def _referenced(self) -> Iterator[BlobId]:
        yield from self.roots
        yield from (b for b in self.child_refs if b not in self.roots)

    def orphans(self) -> list[BlobId]:
        # A file named by a reference but without a row is evidence: kept, not an orphan.
        return [b for b in self.files if b not in self.rows and self.expected(b) == 0]


def _walk(repo: Repository, plan: _Plan, report: FsckReport, sample: float, workers: int) -> None:
    todo: list[tuple[BlobId, int]] = []
    for bid, row in plan.rows.items():
        if bid not in plan.files:
            what = BlobKind.label_of(row.kind)
            plan.unreadable[bid] = Problem(
                "missing", bid.hex(), f"{what} blob {bid.hex()} has a row but no file"
            )
        elif row.kind != BlobKind.DATA or sample >= 1.0 or random.random() < sample:
            todo.append((bid, row.kind))
        else:
            report.data_skipped += 1

    def read(item: tuple[BlobId, int]) -> _Read:
        return _read(repo, *item)

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="casfs-fsck") as pool:
        for r in _bounded_map(pool, read, todo, window=8 * max(1, workers)):
            plan.add_read(r, report)


def _read(repo: Repository, bid: BlobId, kind: int) -> _Read:
    """Runs in a worker thread: blob reads need no catalog connection."""
    try:
        plain = repo.blobs.get(bid, "data" if kind == BlobKind.DATA else "meta")
        stored = repo.blobs.stored_size(bid)
    except MissingBlob as e:
        return _Read(bid, [], error=("missing", str(e)))
    except Corruption as e:
        return _Read(bid, [], error=("corrupt", str(e)))
    try:
        kids = list(children(kind, plain))
    except (Corruption, ValueError) as e:
        repo.blobs.mark_damaged(bid)  # (its hash is right: the bytes stored were wrong)
        return _Read(
            bid, [], error=("corrupt", f"{BlobKind.label_of(kind)} blob {bid.hex()} is malformed: {e}")
        )
    return _Read(bid, kids, len(plain), stored)


_T = TypeVar("_T")
_R = TypeVar("_R")


def _bounded_map(
    pool: ThreadPoolExecutor, fn: Callable[[_T], _R], items: Iterable[_T], window: int
) -> Iterator[_R]:
    """pool.map in completion order with at most `window` calls in flight, so a store
    of millions of blobs is not turned into millions of futures at once."""
    pending: set[Future[_R]] = set()
    for item in items:
        if len(pending) >= window:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                yield f.result()
        pending.add(pool.submit(fn, item))
    for f in pending:
        yield f.result()


def _check_logical(repo: Repository, conn: sqlite3.Connection, report: FsckReport, repair: bool) -> None:
    found = logical.mismatches(conn, repo.get_meta)
    if repair and found:
        with catalog.transaction(conn):
            for m in found:
                logical.repair(conn, m)
    for m in found:
        message = f"{m.what}: size {m.recorded} recorded, its root holds {m.actual} bytes"
        report.problems.append(Problem("logical", "", message, repaired=repair))


def _check_figures(repo: Repository, report: FsckReport, repair: bool) -> None:
    """After the refcounts' repair: figures are counted from the counts."""
    from casfs.refcount.accounts import audit

    for drift in audit(repo, repair=repair and not report.incomplete):
        report.problems.append(Problem("figures", "", str(drift), repaired=repair and not report.incomplete))


def _repair(repo: Repository, conn: sqlite3.Connection, plan: _Plan, report: FsckReport) -> None:
    by_blob: dict[tuple[str, str], Problem] = {(p.kind, p.blob): p for p in report.problems}
    unlink: list[BlobId] = []
    with catalog.transaction(conn):
        for p in report.of_kind("miscounted"):
            assert p.stored is not None and p.expected is not None
            delta = p.expected - p.stored
            if delta < 0 and report.incomplete:
                p.message += "; not lowered: some referenced metadata is unreadable"
                continue
            # The difference, not the value: a concurrent retain()/release() moved the
            # stored and the expected count alike.
            blob_rows.add_refs(conn, {BlobId(bytes.fromhex(p.blob)): delta})
            p.repaired = True
        for bid, (size, stored) in plan.sizes.items():
            blob_rows.set_sizes(conn, bid, size, stored)
            by_blob[("size", bid.hex())].repaired = True
        for bid, p in plan.unreadable.items():
            if plan.expected(bid) != 0:
                continue  # referenced: only restoring the blob can help
            miscount = by_blob.get(("miscounted", bid.hex()))
            if miscount is not None and not miscount.repaired:
                continue
            if blob_rows.delete_if_garbage(conn, bid):
                p.repaired = True
                p.message += "; unreferenced: row deleted"
                unlink.append(bid)
    # After the commit, as gc does: a crash here leaves only orphan files.
    for bid in unlink:
        repo.blobs.delete(bid)
    for bid in plan.orphans():
        repo.blobs.delete(bid)
        by_blob[("orphan", bid.hex())].repaired = True
