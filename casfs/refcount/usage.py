"""Space accounting by walks: what a set of roots reaches, what removing them would
free, and the store's totals. The walks are the counts behind the kept figures
(refcount.accounts, which listings read instead); each takes a Budget of blob rows.

  reach           every blob reachable from the roots, with its row (stored bytes: a sum)
  garbage_holds   the references rows at refs 0 hold (and the rows only they hold):
                  left out of unique figures, so that gc changes none
  unique_bytes    gc's cascade from the roots, simulated, visiting only what it frees

The walks read only metadata blobs (trees and chunk maps), through the repository's
verified cache; data chunks are never read.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from casfs.catalog import blobs as blob_rows
from casfs.catalog import images as image_rows
from casfs.catalog import volumes as volume_rows
from casfs.errors import Corruption
from casfs.kinds import BlobKind
from casfs.snapshots.children import children
from casfs.store.ids import ZERO_ID, BlobId

if TYPE_CHECKING:
    from casfs.repo import Repository  # (types only: repo sits above refcount's ledger)


@dataclass(frozen=True)
class StoreUsage:
    logical: int  # sizes of ready images, volumes and snapshots, added up
    stored: int  # every blob file, garbage included
    garbage: int  # stored bytes at refcount 0: what `casfs gc` would free now
    blobs: int
    images: int
    volumes: int
    snapshots: int

    @property
    def ratio(self) -> float:
        return self.logical / self.stored if self.stored else 0.0


class OverBudget(Exception):
    """A walk would read more blobs than it was allowed (casfs.refcount.figures keeps
    the figure pending instead)."""


class Budget:
    """How many blob rows a walk may still look up; None: no limit."""

    def __init__(self, blobs: int | None = None) -> None:
        self.left = blobs

    def spend(self, n: int) -> None:
        if self.left is not None:
            self.left -= n
            if self.left < 0:
                raise OverBudget


def reach(
    repo: Repository, roots: Iterable[BlobId], budget: Budget | None = None
) -> tuple[dict[BlobId, blob_rows.BlobRow], dict[BlobId, Counter[BlobId]], int]:
    """Every blob reachable from `roots` with its row, each metadata blob's children
    (with multiplicity), and how many metadata blobs could not be read."""
    conn = repo.conn
    rows: dict[BlobId, blob_rows.BlobRow] = {}
    edges: dict[BlobId, Counter[BlobId]] = {}
    unreadable = 0
    frontier = list(dict.fromkeys(r for r in roots if r != ZERO_ID))
    while frontier:
        if budget is not None:
            budget.spend(len(frontier))
        found = dict(blob_rows.rows_of(conn, [b for b in frontier if b not in rows]))
        rows.update(found)
        nxt: list[BlobId] = []
        for bid, row in found.items():
            if row.kind == BlobKind.DATA:
                continue
            try:
                kids: Counter[BlobId] = Counter(c for c, _ in children(row.kind, repo.get_meta(bid)))
            except (Corruption, ValueError):
                unreadable += 1
                continue
            edges[bid] = kids
            nxt.extend(c for c in kids if c not in rows)
        frontier = list(dict.fromkeys(nxt))
    return rows, edges, unreadable


def garbage_holds(repo: Repository, budget: Budget | None = None) -> Counter[BlobId]:
    """The references that garbage holds: rows at refs 0, and the rows only garbage
    references (gc's cascade, simulated), counted on each child they name. A unique
    figure leaves these out, so that gc, which frees them, changes no figure."""
    conn = repo.conn
    holds: Counter[BlobId] = Counter()
    queue = [(bid, kind) for bid, kind, _ in blob_rows.garbage(conn, -1)]
    while queue:
        if budget is not None:
            budget.spend(len(queue))
        kids: Counter[BlobId] = Counter()
        for bid, kind in queue:
            if kind == BlobKind.DATA:
                continue
            with contextlib.suppress(Corruption, ValueError):
                kids.update(c for c, _ in children(kind, repo.get_meta(bid)))
        kids.pop(ZERO_ID, None)
        holds.update(kids)
        queue = [
            (bid, row.kind)
            for bid, row in blob_rows.rows_of(conn, list(kids))
            if row.refs > 0 and row.refs - holds[bid] <= 0 and row.refs - holds[bid] + kids[bid] > 0
        ]
    return holds


def unique_bytes(
    repo: Repository, roots: Iterable[BlobId], held: Counter[BlobId], budget: Budget | None = None
) -> int:
    """Stored bytes that removing the root references `roots` (with multiplicity) and
    running gc would free: gc's cascade, simulated, visiting only what it frees (a clone
    that shares everything costs one row). `held`: garbage_holds()."""
    conn = repo.conn
    drop: Counter[BlobId] = Counter(r for r in roots if r != ZERO_ID)
    rows: dict[BlobId, blob_rows.BlobRow] = {}
    freed: set[BlobId] = set()
    todo = list(drop)
    total = 0
    while todo:
        if budget is not None:
            budget.spend(len(todo))
        rows.update(blob_rows.rows_of(conn, [b for b in todo if b not in rows]))
        gone = [b for b in todo if b not in freed and b in rows and rows[b].refs - held[b] - drop[b] <= 0]
        todo = []
        for bid in gone:
            freed.add(bid)
            row = rows[bid]
            total += row.stored
            if row.kind == BlobKind.DATA:
                continue
            try:
                kids = Counter(c for c, _ in children(row.kind, repo.get_meta(bid)))
            except (Corruption, ValueError):
                continue
            kids.pop(ZERO_ID, None)
            for child, n in kids.items():
                drop[child] += n
                todo.append(child)
        todo = list(dict.fromkeys(todo))
    return total


def store_usage(repo: Repository) -> StoreUsage:
    conn = repo.conn
    images, image_bytes = image_rows.ready_totals(conn)
    volumes, volume_bytes, snapshots, snapshot_bytes = volume_rows.totals(conn)
    blobs, stored, garbage = blob_rows.totals(conn)
    return StoreUsage(
        logical=image_bytes + volume_bytes + snapshot_bytes,
        stored=stored,
        garbage=garbage,
        blobs=blobs,
        images=images,
        volumes=volumes,
        snapshots=snapshots,
    )
