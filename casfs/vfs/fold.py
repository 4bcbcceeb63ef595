"""The blocking halves of a read/write volume's write-back (run in worker threads).

run_flush stores dirty chunks and writes overlay rows; run_fold turns the overlay into
new tree and map blobs, snapshot n+1 and the new base. Each ends in one catalog
transaction, after the blobs it names are durable (Batch.commit's ordering).
"""

from __future__ import annotations

import sqlite3
import stat
from dataclasses import dataclass, field

from casfs.catalog import volumes as rows
from casfs.refcount import ledger
from casfs.repo import Repository
from casfs.snapshots import chunkmap
from casfs.snapshots.kinds import MAP_ROOT, TREE
from casfs.snapshots.tree import Entry, Tree, dir_entry
from casfs.store.ids import ZERO_ID, BlobId
from casfs.vfs.api import ROOT_INO
from casfs.vfs.nodes import NO_LIMIT, Node


@dataclass
class FlushJob:
    chunks: list[tuple[int, int, bytes, int]]  # ino, n, data, buffer version
    rows: list[tuple[object, ...]]
    deleted: list[int]
    cuts: dict[int, int]
    next_ino: int
    logical: int
    ids: dict[tuple[int, int], BlobId] = field(default_factory=dict)
    inos: set[int] = field(default_factory=set)  # the dirty inodes it carries (rows, or gone)
    # Directory entries: only the changed ones, or every entry of a `whole_dirs` listing.
    listings: list[int] = field(default_factory=list)  # directories whose entries it writes
    whole_dirs: list[int] = field(default_factory=list)
    entries: list[tuple[int, bytes, int, int]] = field(default_factory=list)  # dir, name, cookie, ino
    gone: list[tuple[int, bytes]] = field(default_factory=list)  # dir, name


@dataclass
class FoldJob:
    rows: dict[int, Node]
    chunk_ids: dict[int, dict[int, BlobId]]
    label: str | None
    logical: int
    new_root: BlobId = ZERO_ID
    size: int = 0
    snapshot: int = 0
    bases: dict[int, BlobId] = field(default_factory=dict)  # ino -> its id in the new root
    parents: dict[int, int] = field(default_factory=dict)  # ino -> a directory naming it there


def delete_inode_rows(conn: sqlite3.Connection, volume: str, ino: int, from_chunk: int = 0) -> None:
    olds = [
        BlobId(c)
        for (c,) in conn.execute(
            "SELECT chunk FROM overlay_chunks WHERE volume = ? AND ino = ? AND n >= ?",
            (volume, ino, from_chunk),
        )
    ]
    ledger.release(conn, olds)
    conn.execute(
        "DELETE FROM overlay_chunks WHERE volume = ? AND ino = ? AND n >= ?", (volume, ino, from_chunk)
    )
    if from_chunk == 0:
        conn.execute("DELETE FROM overlay_inodes WHERE volume = ? AND ino = ?", (volume, ino))
        conn.execute("DELETE FROM overlay_entries WHERE volume = ? AND dir = ?", (volume, ino))


_UPSERT_INODE = "INSERT OR REPLACE INTO overlay_inodes VALUES (" + ", ".join("?" * 17) + ")"


def run_flush(repo: Repository, volume: str, job: FlushJob) -> None:
    """Store the job's chunks as blobs, then write its rows in one transaction."""
    with repo.batch() as batch:
        for ino, n, data, _ in job.chunks:
            job.ids[(ino, n)] = batch.put(data)

        def write_rows(conn: sqlite3.Connection) -> None:
            for ino in job.deleted:
                delete_inode_rows(conn, volume, ino)
            for ino, cut in job.cuts.items():
                if ino not in job.deleted:
                    delete_inode_rows(conn, volume, ino, from_chunk=cut)
            conn.executemany(_UPSERT_INODE, job.rows)
            whole = [(volume, d) for d in job.whole_dirs]
            conn.executemany("DELETE FROM overlay_entries WHERE volume = ? AND dir = ?", whole)
            conn.executemany(
                "DELETE FROM overlay_entries WHERE volume = ? AND dir = ? AND name = ?",
                [(volume, d, name) for d, name in job.gone],
            )
            conn.executemany(
                "INSERT OR REPLACE INTO overlay_entries VALUES (?, ?, ?, ?, ?)",
                [(volume, d, name, cookie, ino) for d, name, cookie, ino in job.entries],
            )
            for (ino, n), bid in job.ids.items():
                old = conn.execute(
                    "SELECT chunk FROM overlay_chunks WHERE volume = ? AND ino = ? AND n = ?",
                    (volume, ino, n),
                ).fetchone()
                if old is not None:
                    ledger.release(conn, [BlobId(old[0])])
                conn.execute(
                    "INSERT OR REPLACE INTO overlay_chunks VALUES (?, ?, ?, ?)", (volume, ino, n, bid)
                )
                ledger.retain(conn, [bid])
            conn.execute(
                "UPDATE volumes SET next_ino = MAX(next_ino, ?), size = ? WHERE name = ?",
                (job.next_ino, job.logical, volume),
            )

        batch.commit(then=write_rows)


def run_fold(
    repo: Repository, volume: str, kind: str, base: BlobId, chunk_size: int, next_ino: int, job: FoldJob
) -> None:
    """Fold the overlay into new tree/map blobs; in one transaction make the result
    snapshot n+1 and the new base, and empty the overlay."""
    with repo.batch() as batch:
        folder = _Folder(repo, batch, chunk_size, job)
        if kind == "block":
            root = job.rows.get(ROOT_INO)
            size = root.size if root else chunkmap.MapRoot.decode(repo.get_meta(base)).size
            changes = job.chunk_ids.get(ROOT_INO, {})
            job.new_root = chunkmap.ChunkMap(repo.get_meta, base).rewrite(batch.put_kind, changes, size)
            job.size = size
        else:
            job.new_root = folder.fold_dir(ROOT_INO) if ROOT_INO in job.rows else base
            job.size = job.logical

        def publish(conn: sqlite3.Connection) -> None:
            job.snapshot = rows.add_snapshot(conn, volume, job.new_root, job.size, next_ino, job.label)
            ledger.retain(conn, [job.new_root, job.new_root])  # the snapshot's and the base's
            ledger.release(conn, [base])
            # Inodes unlinked but still open keep their rows and chunks until forgotten.
            live = "volume = ? AND ino NOT IN (SELECT ino FROM overlay_inodes WHERE volume = ? AND nlink = 0)"
            olds = [
                BlobId(c)
                for (c,) in conn.execute(f"SELECT chunk FROM overlay_chunks WHERE {live}", (volume, volume))
            ]
            ledger.release(conn, olds)
            conn.execute(f"DELETE FROM overlay_chunks WHERE {live}", (volume, volume))
            conn.execute("DELETE FROM overlay_inodes WHERE volume = ? AND nlink > 0", (volume,))
            conn.execute("DELETE FROM overlay_entries WHERE volume = ?", (volume,))
            conn.execute(
                "UPDATE volumes SET base = ?, size = ?, next_ino = MAX(next_ino, ?) WHERE name = ?",
                (job.new_root, job.size, next_ino, volume),
            )

        batch.commit(then=publish)
    if kind == "block":
        job.bases[ROOT_INO] = job.new_root


class _Folder:
    """Builds the new tree bottom-up from the materialized directories."""

    def __init__(self, repo: Repository, batch: ledger.Batch, chunk_size: int, job: FoldJob) -> None:
        self.repo = repo
        self.batch = batch
        self.cs = chunk_size
        self.job = job

    def fold_dir(self, ino: int) -> BlobId:
        node = self.job.rows[ino]
        if node.listing is None:
            # Copied up with its parent, never entered: same entries, maybe new attrs.
            tree = Tree.decode(self.repo.get_meta(node.base))
            tree.attrs = node.attrs()
        else:
            entries = [self._entry(ino, name, child) for name, (_, child) in node.listing.entries.items()]
            tree = Tree(node.attrs(), self.cs, entries)
        bid = self.batch.put(tree.encode(), TREE)
        self.job.bases[ino] = bid
        return bid

    def _entry(self, parent: int, name: bytes, ino: int) -> Entry:
        node = self.job.rows[ino]
        self.job.parents[ino] = parent
        if node.is_dir:
            return dir_entry(name, node.mode, ino, self.fold_dir(ino))
        if node.is_file:
            content = self._content(node)
            self.job.bases[ino] = content
            return Entry(name, node.attrs(), content)
        return Entry(name, node.attrs(), node.target if stat.S_ISLNK(node.mode) else b"")

    def _content(self, node: Node) -> BlobId:
        changes = dict(self.job.chunk_ids.get(node.ino, {}))
        count = chunkmap.n_chunks(node.size, self.cs)
        for n in range(min(node.base_limit, count), count):
            changes.setdefault(n, ZERO_ID)
        if node.base == ZERO_ID:
            ids = [changes.get(n, ZERO_ID) for n in range(count)]
            return chunkmap.build_content(self.batch.put_kind, ids, node.size, self.cs)
        row = self.repo.conn.execute("SELECT kind FROM blobs WHERE id = ?", (node.base,)).fetchone()
        mapped = row is not None and row[0] == MAP_ROOT
        content = chunkmap.Content(self.repo.get_meta, node.base, node.size, self.cs, mapped)
        # Unchanged content keeps its id, unless a truncate cut it (base_limit): the old
        # id still names the bytes past the cut, which a later grow would bring back.
        uncut = node.base_limit >= NO_LIMIT
        if not changes and uncut and mapped == chunkmap.is_mapped(node.base, node.size, self.cs):
            return node.base
        return content.rewrite(self.batch.put_kind, changes, node.size)
