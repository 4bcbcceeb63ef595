"""Writing blobs into the store and counting references to them.

The rule (see catalog.schema): a catalog row holds references on its children, so

  * Batch.commit inserts a row for each new blob and increments its children, then
    increments the roots it is given, in one catalog transaction, after the blobs
    themselves are durable (blob data is durable before the row that names it);
  * release() decrements roots; nothing is freed there: a row whose count reaches 0
    is garbage that gc deletes, decrementing its children in turn.

A batch holds the store's shared writer lock from its first put to its commit, and gc
takes that lock exclusively, so gc never frees a blob a batch is about to reference.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from casfs.catalog import blobs as blob_rows
from casfs.catalog import transaction
from casfs.kinds import BlobKind
from casfs.store.ids import ZERO_ID, BlobId, blob_id, is_zero, meta_id

if TYPE_CHECKING:
    from casfs.repo import Repository

_NO_KIDS: Counter[BlobId] = Counter()  # a chunk's children (shared: never changed)


class Batch:
    """New blobs on their way in. Thread-safe put(); commit() once."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo
        self.lock = repo.writer_lock()
        try:
            self.staging = repo.blobs.staging()
        except BaseException:
            self.lock.release()  # (a full disk: no staging directory, and no lock kept)
            raise
        self._mutex = threading.Lock()
        # id -> (kind, plaintext size, stored size, children with multiplicity)
        self.new: dict[BlobId, tuple[BlobKind, int, int, Counter[BlobId]]] = {}
        self.stored_bytes = 0
        self.reused = 0
        self.revived = 0  # staged again over a garbage row (refcount.figures: a dedup of sorts)
        self.closed = False
        # Found damaged by a read: stored again, not deduplicated against (heals them).
        self.damaged = repo.blobs.damaged()
        self.healed: set[BlobId] = set()

    def put(
        self,
        plain: bytes | memoryview,
        kind: BlobKind = BlobKind.DATA,
        kids: Iterable[tuple[BlobId, BlobKind]] | None = None,
    ) -> BlobId:
        """Stage a blob unless the store already holds it live; returns its id.
        All-zero data is a hole: ZERO_ID, nothing stored. `kids`: a metadata blob's
        children (snapshots.children's), when the caller has them at hand (a tree it
        has just encoded: decoding it again cost a tenth of a tree import's CPU)."""
        if kind != BlobKind.DATA:
            bid = meta_id(plain)
            if self._unstored([bid]):
                if kids is None:
                    # (here: the tree and map codecs are not a clone's or a listing's start-up)
                    from casfs.snapshots.children import children

                    kids = children(kind, bytes(plain))
                self._staged(kind, [(bid, plain)], Counter(c for c, _ in kids))
            return bid
        return self.put_many([plain])[0]

    def put_many(self, chunks: Sequence[bytes | memoryview]) -> list[BlobId]:
        """put() of data chunks, several at once (a fold's or an import's group): one
        catalog lookup and one staging call for them all; their ids, in order."""
        ids = [ZERO_ID if is_zero(c) else blob_id(c) for c in chunks]
        todo = dict(zip(ids, chunks, strict=True))
        todo.pop(ZERO_ID, None)
        if todo:
            self._staged(BlobKind.DATA, [(bid, todo[bid]) for bid in self._unstored(todo)], _NO_KIDS)
        return ids

    def _unstored(self, ids: Iterable[BlobId]) -> list[BlobId]:
        """Those of `ids` (distinct) to stage: not staged by this batch yet, nor live in
        the store. A blob found damaged by a read is staged again (the copy heals it)."""
        with self._mutex:
            fresh = [bid for bid in ids if bid not in self.new]
        heal = [bid for bid in fresh if bid in self.damaged]
        asked = [bid for bid in fresh if bid not in self.damaged]
        # The catalog first (one query for the group: a fold's chunks are mostly new);
        # a live row whose bytes the store lacks is stored again.
        rows = list(blob_rows.rows_of(self.repo.conn, asked)) if asked else []
        live = {bid for bid, row in rows if row.refs > 0 and self.repo.blobs.has(bid)}
        dead = sum(1 for _, row in rows if row.refs <= 0)
        if heal or live or dead:
            with self._mutex:
                self.healed.update(heal)
                self.reused += len(live)
                self.revived += dead
        return [bid for bid in fresh if bid not in live]

    def _staged(
        self, kind: BlobKind, blobs: list[tuple[BlobId, bytes | memoryview]], kids: Counter[BlobId]
    ) -> None:
        """Stage `blobs` and count them in (kids: each one's children, for a page)."""
        if not blobs:
            return
        sizes = self.staging.add_many(blobs)
        with self._mutex:
            for (bid, plain), stored in zip(blobs, sizes, strict=True):
                if bid not in self.new:
                    self.new[bid] = (kind, len(plain), stored, kids)
                    self.stored_bytes += stored

    def adopted(self, bid: BlobId, kind: BlobKind, size: int, stored: int, kids: Counter[BlobId]) -> None:
        """Count a blob the caller staged without its bytes (an adoption of another
        store's copy on the same bucket: replica.adopt); its row comes at commit."""
        with self._mutex:
            if bid not in self.new:
                self.new[bid] = (kind, size, stored, kids)
                self.stored_bytes += stored

    @property
    def shared(self) -> bool:
        """Whether it used blobs stored before (dedup) or revived garbage: their holders
        may now share them (refcount.figures)."""
        return bool(self.reused or self.revived or self.healed)

    def put_kind(self, plain: bytes, kind: BlobKind) -> BlobId:
        """put() with the (plain, kind) order chunkmap.Put expects."""
        return self.put(plain, kind)

    def commit(
        self,
        refs: Mapping[BlobId, int] | None = None,
        then: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        """Publish the blobs, then in one transaction: insert their rows, count their
        children, add `refs` (root references) and run `then` (the caller's rows)."""
        try:
            self.staging.publish()
            conn = self.repo.conn
            with transaction(conn):
                increments: Counter[BlobId] = Counter()
                for bid, (kind, size, stored, kids) in self.new.items():
                    if kids and blob_rows.insert(conn, bid, kind, size, stored):
                        increments.update(kids)
                if refs:
                    increments.update(refs)
                # Chunks, by the thousand: each row written once, with its count, in
                # the ids' order (the B-tree's pages in turn: 22,000 rows into a
                # million took 0.19 s so, 0.24 s in random order).
                leaves = sorted(
                    (b, k, increments.pop(b, 0), n, st) for b, (k, n, st, c) in self.new.items() if not c
                )
                blob_rows.add_leaves(conn, leaves)
                blob_rows.add_refs(conn, increments)
                if then is not None:
                    then(conn)
            for bid in self.healed:
                self.repo.blobs.clear_damaged(bid)
        finally:
            self.close()

    def abort(self) -> None:
        """Forget what is staged and release the lock; never raises (discard logs)."""
        try:
            self.staging.discard()
        finally:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.lock.release()

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        # Also after a failed commit: what it staged and did not publish goes (published
        # blobs no row names are orphans, swept by gc and recovery).
        self.abort()


def release(conn: sqlite3.Connection, roots: Iterable[BlobId]) -> None:
    """Drop one reference per listed root (inside the caller's transaction)."""
    blob_rows.add_refs(conn, {bid: -n for bid, n in Counter(r for r in roots if r != ZERO_ID).items()})


def retain(conn: sqlite3.Connection, roots: Iterable[BlobId]) -> None:
    """Add one reference per listed root: a clone is one call here, O(1) in its size."""
    blob_rows.add_refs(conn, Counter(r for r in roots if r != ZERO_ID))
