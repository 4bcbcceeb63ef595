"""Space accounting: what a set of roots costs the store, and what removing it would free.

For roots R (an image's root; a volume's base plus its snapshots' roots):

  logical   the sizes the catalog records for those roots, added up (a volume with two
            snapshots counts three states: what they would take without casfs)
  stored    bytes on disk of every blob reachable from R, each blob counted once
  unique    bytes on disk that removing R would free: gc's cascade, simulated. A blob is
            freed when every reference it holds (`blobs.refs`) comes from R itself or
            from blobs that are freed in turn, multiplicity counted.

The walk reads only metadata blobs (trees and chunk maps), through the repository's
verified cache; data chunks are never read. A mounted volume's overlay chunks count as
roots of logical size 0 (their bytes are counted when a snapshot folds them in).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

from casfs.catalog import blobs as blob_rows
from casfs.catalog import images as image_rows
from casfs.catalog import overlay as overlay_rows
from casfs.catalog import volumes as volume_rows
from casfs.errors import Corruption
from casfs.ids import SnapshotNo
from casfs.kinds import BlobKind
from casfs.repo import Repository
from casfs.snapshots.children import children
from casfs.store import uppers
from casfs.store.ids import ZERO_ID, BlobId


@dataclass(frozen=True)
class Root:
    blob: BlobId
    size: int  # logical bytes the catalog records for this root


@dataclass(frozen=True)
class Usage:
    logical: int
    stored: int
    unique: int
    unreadable: int = 0  # metadata blobs that could not be read: the figures are a lower bound
    # A volume's upper files: written since its last fold, on this host's disk only (for
    # a store on S3, not yet uploaded); part of stored and unique.
    local: int = 0

    @property
    def ratio(self) -> float:
        """Logical bytes per stored byte (holes, compression and dedup together)."""
        return self.logical / self.stored if self.stored else 0.0

    def to_json(self) -> dict[str, int | float]:
        """The figures as `ls --json` and `info --json` show them (unreadable_blobs apart)."""
        return {
            "logical": self.logical,
            "stored": self.stored,
            "unique": self.unique,
            "ratio": round(self.ratio, 3),
            "local": self.local,
        }


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


def usage(repo: Repository, roots: Iterable[Root], budget: Budget | None = None) -> Usage:
    """The figures of `roots`, counted in full (fsck's recount and the kept figures' source)."""
    roots = list(roots)
    rows, _, unreadable = reach(repo, [r.blob for r in roots], budget)
    held = garbage_holds(repo, budget)
    return Usage(
        logical=sum(r.size for r in roots),
        stored=sum(row.stored for row in rows.values()),
        unique=unique_bytes(repo, [r.blob for r in roots], held, budget),
        unreadable=unreadable,
    )


def image_roots(conn: sqlite3.Connection, name: str) -> list[Root]:
    row = image_rows.image_row(conn, name)
    out = [Root(row.root, row.size)] if row is not None and row.root is not None else []
    return out + [Root(r, 0) for r in image_rows.chain_roots(conn, name)]  # (an OCI image's first layers)


def volume_roots(conn: sqlite3.Connection, name: str) -> list[Root]:
    """A volume's base, its snapshots' roots and its overlay's chunks (each chunk holds
    a reference of its own until a snapshot folds it into the base)."""
    row = volume_rows.volume_row(conn, name)
    out = [Root(row.base, row.size)] if row is not None else []
    out += [Root(s.root, s.size) for s in volume_rows.snapshot_rows(conn, name)]
    out += [Root(c, 0) for c in volume_rows.overlay_chunks(conn, name)]
    return out


def snapshot_roots(conn: sqlite3.Connection, volume: str, n: SnapshotNo) -> list[Root]:
    row = volume_rows.snapshot_row(conn, volume, n)
    return [Root(row.root, row.size)] if row is not None else []


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


# The usage of one image, volume (with its snapshots) or snapshot: the CLI listings and
# the control plane's user.casfs.unique read these.


def image_usage(repo: Repository, name: str) -> Usage:
    return usage(repo, image_roots(repo.conn, name))


def volume_usage(repo: Repository, name: str) -> Usage:
    """The volume's blobs, and its upper files: data written since the base, not yet
    folded into blobs, is stored (locally) and unique to it."""
    found = usage(repo, volume_roots(repo.conn, name))
    local = uppers.local_bytes(repo.path, name, [u.epoch for u in overlay_rows.uppers(repo.conn, name)])
    return replace(found, stored=found.stored + local, unique=found.unique + local, local=local)


def snapshot_usage(repo: Repository, volume: str, n: SnapshotNo) -> Usage:
    return usage(repo, snapshot_roots(repo.conn, volume, n))
