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

import sqlite3
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from casfs.catalog import blobs as blob_rows
from casfs.catalog import images as image_rows
from casfs.catalog import overlay as overlay_rows
from casfs.catalog import volumes as volume_rows
from casfs.errors import Corruption
from casfs.ids import SnapshotNo
from casfs.kinds import BlobKind
from casfs.snapshots.children import children
from casfs.store import uppers
from casfs.store.ids import ZERO_ID, BlobId

if TYPE_CHECKING:
    from casfs.repo import Repository  # (types only: repo sits above refcount's ledger)


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


def usage(repo: Repository, roots: Iterable[Root]) -> Usage:
    roots = list(roots)
    conn = repo.conn
    root_refs: Counter[BlobId] = Counter(r.blob for r in roots if r.blob != ZERO_ID)
    rows: dict[BlobId, blob_rows.BlobRow] = {}
    edges: dict[BlobId, Counter[BlobId]] = {}  # metadata blob -> children with multiplicity
    unreadable = 0
    frontier = list(root_refs)
    while frontier:
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

    # gc's cascade on a copy of the counts: drop the roots' references, free what reaches 0.
    remaining = {bid: row.refs - root_refs[bid] for bid, row in rows.items()}
    queue = [bid for bid, n in remaining.items() if n == 0 and bid in root_refs]
    freed: set[BlobId] = set()
    while queue:
        bid = queue.pop()
        freed.add(bid)
        for child, n in edges.get(bid, Counter()).items():
            if child in remaining:
                remaining[child] -= n
                if remaining[child] == 0:
                    queue.append(child)
    return Usage(
        logical=sum(r.size for r in roots),
        stored=sum(row.stored for row in rows.values()),
        unique=sum(rows[b].stored for b in freed),
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
