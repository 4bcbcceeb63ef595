"""The receiver's side of a transfer: what is still missing under a snapshot's root,
taking blobs in as they arrive (verified), and the one transaction that lands it.

What is present is what has a catalog row: a row holds references on its children,
so a blob with a row has its whole subtree (that is what lets a pull skip a subtree
it shares with an older snapshot, and a rerun skip what an interrupted one stored).

Blobs go into two batches (refcount.ledger.Batch):

  * data chunks into one committed every BATCH_BYTES stored: rows at refs 0 (leaves
    name nothing), invisible (gc's garbage), but present for a rerun after a crash
    (the first BATCH_BYTES ride with the metadata: a small pull is one commit);
  * trees and map pages into one committed last, with the snapshot's rows
    (`finish`): metadata is a small part of a snapshot, and a metadata row may exist
    only once its children's do.

The metadata batch holds the store's writer lock (shared) from the start, so gc cannot
free the data rows committed meanwhile; a crash loses at most the batch in flight.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from casfs.catalog import blobs as blob_rows
from casfs.errors import Corruption
from casfs.kinds import BlobKind
from casfs.refcount.ledger import Batch
from casfs.replica.wire import Record, verify
from casfs.repo import Repository
from casfs.snapshots.children import children
from casfs.snapshots.chunkmap import MapRoot, decode_page
from casfs.store.ids import ZERO_ID, BlobId

# Stored bytes of data per intermediate commit: what a crash may make a rerun move again.
# CASFS_REPLICA_BATCH_BYTES overrides it (tests: many batches in a small volume).
BATCH_BYTES = int(os.environ.get("CASFS_REPLICA_BATCH_BYTES") or 16 << 20)

Want = tuple[BlobId, BlobKind]


class Assembler:
    """Collects the blobs of one snapshot. Not thread-safe: one caller; it uses `pool`
    to verify and store the blobs of each `arrive` call in parallel."""

    def __init__(self, repo: Repository, root: BlobId, kind: BlobKind, pool: ThreadPoolExecutor) -> None:
        self.repo, self.root, self.kind, self.pool = repo, root, kind, pool
        self.meta = repo.batch()  # (takes the writer lock, held until finish or close)
        self.data: Batch | None = None
        self.present: set[BlobId] = set()  # has a row, or staged by this run
        self.wanted: dict[BlobId, BlobKind] = {}
        self._held: Future[MapRoot] | None = None  # holding's read of the base root, under way
        self._base_root: MapRoot | None = None
        self._places: dict[BlobId, int] = {}  # the new map's pages: their place in it

    def holding(self, root: BlobId, kind: BlobKind) -> None:
        """`root` has a row here (a local snapshot's): so has everything under it. For a
        chunk map, each page that arrives is paired with the base's page at its place:
        that page's chunks are taken as present without asking the catalog (a volume's
        next snapshot names mostly its previous one's chunks). Only the base pages of
        changed places are read, never the rest of the map: the work is the change's,
        not the volume's. Under the writer lock, none of them goes. The base's root is
        read in the pool while the new root is asked for; the first map record waits for it."""
        if kind == BlobKind.MAP_ROOT:
            self._held = self.pool.submit(lambda: MapRoot.decode(self.repo.get_meta(root)))

    def _base(self) -> MapRoot | None:
        if self._held is not None:
            held, self._held = self._held, None
            self._base_root = held.result()
        return self._base_root

    def _pair(self, r: Record, plain: bytes) -> None:
        """Take the base's chunks at the place of an arriving map root or page as present
        (see holding): a depth-0 root's chunk for chunk, a page's page for page."""
        base = self._base()
        if base is None:
            return
        if r.kind == BlobKind.MAP_ROOT:
            new = MapRoot.decode(plain)
            if new.depth == 0 and base.depth == 0:
                self.present.update(i for i in base.ids if i != ZERO_ID)
            elif new.depth == 1 and base.depth == 1:
                self._places = {p: n for n, p in enumerate(new.ids) if p != ZERO_ID}
        elif r.kind == BlobKind.MAP_PAGE and base.depth == 1:
            n = self._places.get(r.bid)
            old = base.ids[n] if n is not None and n < len(base.ids) else ZERO_ID
            if old not in (ZERO_ID, r.bid):
                self.present.update(i for i in decode_page(self.repo.get_meta(old)) if i != ZERO_ID)

    def start(self) -> list[Want]:
        """What to fetch first: the root, unless it is present (nothing to move)."""
        return self.missing([(self.root, self.kind)])

    def missing(self, items: Sequence[Want]) -> list[Want]:
        """Those of `items` neither present nor wanted yet; they become wanted."""
        fresh: dict[BlobId, BlobKind] = {}
        for bid, kind in items:
            if bid != ZERO_ID and bid not in self.present and bid not in self.wanted:
                fresh[bid] = kind
        ids = list(fresh)
        for part in blob_rows.batches(ids):
            have = blob_rows.known(self.repo.conn, part)
            self.present.update(BlobId(b) for b in have)
            for b in have:
                del fresh[BlobId(b)]
        self.wanted.update(fresh)
        return list(fresh.items())

    def took(self, bid: BlobId) -> None:
        """A wanted blob was staged by the caller (an adoption: replica.adopt)."""
        self.wanted.pop(bid, None)
        self.present.add(bid)

    def arrive(self, records: Sequence[Record]) -> list[Want]:
        """Verify and store arrived blobs; returns what they name that is missing.
        Corruption (exit 5) if one is not what its id says, or not of the kind wanted.
        Decoding and hashing, then storing, run in the pool; in between, the records
        are taken in order, so a blob may arrive in the same call as its parent."""
        if self.data is None and self.meta.stored_bytes >= BATCH_BYTES:
            self.data = self.repo.batch()
        data = self.meta if self.data is None else self.data
        plains = list(self.pool.map(verify, records))
        take: list[tuple[Record, bytes]] = []
        found: list[Want] = []
        for r, plain in zip(records, plains, strict=True):
            expected = self.wanted.pop(r.bid, None)
            if expected is None:
                continue  # held already, or named by nothing: verified, not stored
            if expected != r.kind:
                raise Corruption(
                    f"blob {r.bid.hex()} arrived as a {r.kind.label}, wanted as a {expected.label}"
                )
            self.present.add(r.bid)
            take.append((r, plain))
            if r.kind != BlobKind.DATA:
                self._pair(r, plain)
                found.extend(self.missing(list(children(r.kind, plain))))

        def store(item: tuple[Record, bytes]) -> None:
            r, plain = item
            batch = data if r.kind == BlobKind.DATA else self.meta
            if batch.put(plain, r.kind) != r.bid:  # (an all-zero chunk is a hole, never sent)
                raise Corruption(f"blob {r.bid.hex()} does not store under its id")

        list(self.pool.map(store, take))
        if data is not self.meta and data.stored_bytes >= BATCH_BYTES:
            self._commit_data()
        return found

    def _commit_data(self) -> None:
        if self.data is not None:
            batch, self.data = self.data, None
            batch.commit()

    def finish(self, refs: dict[BlobId, int], then: Callable[[sqlite3.Connection], None]) -> None:
        """Land the snapshot: the last data rows, then in one transaction the metadata
        rows, `refs` (root references) and `then` (the caller's rows)."""
        if self.wanted:
            sample = ", ".join(b.hex() for b in list(self.wanted)[:3])
            raise Corruption(f"{len(self.wanted)} blob(s) of the snapshot never arrived (e.g. {sample})")
        self._commit_data()
        self.meta.commit(refs, then)

    def close(self) -> None:
        """Drop what is staged and not committed (after a failure); idempotent."""
        if self.data is not None:
            self.data.abort()
            self.data = None
        self.meta.abort()

    def __enter__(self) -> Assembler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
