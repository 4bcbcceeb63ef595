"""Image rows: the only SQL about images. Inside the caller's transaction; the phase
steps are casfs.lifecycle.phases', the references refcount.ledger's."""

# (No `from __future__ import annotations` here: typing.NamedTuple compiles each string
# annotation, and the first compile() in a process costs a command's start-up 3 ms.)

import sqlite3
import time
from typing import Any, NamedTuple

from casfs.errors import Busy, NotFound
from casfs.ids import InodeNo
from casfs.kinds import VolumeKind
from casfs.store.ids import BlobId


class ImageRow(NamedTuple):
    name: str
    kind: VolumeKind
    phase: str
    size: int
    chunk_size: int
    next_ino: InodeNo
    source: str | None
    digest: str | None
    root: BlobId | None
    created: float
    error: str | None
    owner_pid: int | None
    spec: str | None
    oci: str | None  # JSON: what an OCI image remembers (catalog.schema)


_IMAGE = "SELECT " + ", ".join(ImageRow._fields) + " FROM images"


def _image(row: tuple[Any, ...]) -> ImageRow:
    name, kind, phase, size, chunk_size, next_ino, source, digest, root, created, error, pid, spec, oci = row
    root_id = BlobId(bytes(root)) if root is not None else None
    return ImageRow(
        name,
        VolumeKind(kind),
        phase,
        size,
        chunk_size,
        InodeNo(next_ino),
        source,
        digest,
        root_id,
        created,
        error,
        pid,
        spec,
        oci,
    )


def image_row(conn: sqlite3.Connection, name: str) -> ImageRow | None:
    row = conn.execute(f"{_IMAGE} WHERE name = ?", (name,)).fetchone()
    return None if row is None else _image(row)


def ready_image_row(conn: sqlite3.Connection, name: str) -> ImageRow:
    """The row of a ready image, with its root set: NotFound if there is none, Busy if
    it is not ready. (Here, not in casfs.images: a clone needs only this, and importing
    casfs.images cost a clone's start-up a tenth.)"""
    row = image_row(conn, name)
    if row is None:
        raise NotFound(f"no image named {name!r}")
    if row.phase != "ready" or row.root is None:  # ("ready": lifecycle.phases.ImagePhase.READY)
        raise Busy(f"image {name!r} is not ready (phase {row.phase})")
    return row


def image_rows(
    conn: sqlite3.Connection, after: str | None = None, limit: int | None = None
) -> list[ImageRow]:
    """Images by name: those after `after` (a cursor), at most `limit`."""
    query = f"{_IMAGE} WHERE name > ? ORDER BY name LIMIT ?"
    return [_image(r) for r in conn.execute(query, (after or "", -1 if limit is None else limit))]


def insert_queued(
    conn: sqlite3.Connection,
    name: str,
    kind: VolumeKind,
    chunk_size: int,
    source: str,
    spec: str,
    owner_pid: int,
) -> None:
    """The row of an import about to start: phase queued, owned by `owner_pid`."""
    conn.execute(
        "INSERT INTO images (name, kind, phase, chunk_size, source, spec, owner_pid, created) "
        "VALUES (?, ?, 'queued', ?, ?, ?, ?, ?)",
        (name, kind, chunk_size, source, spec, owner_pid, time.time()),
    )


def set_phase(conn: sqlite3.Connection, name: str, phase: str) -> None:
    conn.execute("UPDATE images SET phase = ? WHERE name = ?", (phase, name))


def finish(
    conn: sqlite3.Connection,
    name: str,
    owner_pid: int,
    root: BlobId,
    size: int,
    next_ino: InodeNo,
    digest: str | None,
    oci: str | None = None,
) -> bool:
    """Phase ready with its root, if `owner_pid` still owns the import."""
    done = conn.execute(
        "UPDATE images SET phase = 'ready', root = ?, size = ?, next_ino = ?, digest = ?, oci = ?, "
        "owner_pid = NULL WHERE name = ? AND owner_pid = ?",
        (root, size, next_ino, digest, oci, name, owner_pid),
    )
    return done.rowcount == 1


def chain_root(conn: sqlite3.Connection, chain_id: str, chunk_size: int, devices: bool) -> BlobId | None:
    """The tree of layers with `chain_id`, kept by a ready OCI image made with
    `chunk_size` (and without device nodes unless `devices`), if there is one: all of
    its layers (its root) or its first ones (image_chains)."""
    ready = "i.phase = 'ready' AND i.chunk_size = ? AND (? OR NOT json_extract(i.oci, '$.devices'))"
    row = conn.execute(
        "SELECT c.root FROM image_chains c JOIN images i ON i.name = c.image "
        f"WHERE c.chain_id = ? AND {ready} "
        f"UNION ALL SELECT i.root FROM images i WHERE json_extract(i.oci, '$.chain_id') = ? "
        f"AND i.root IS NOT NULL AND {ready} LIMIT 1",
        (chain_id, chunk_size, devices, chain_id, chunk_size, devices),
    ).fetchone()
    return None if row is None else BlobId(bytes(row[0]))


def chain_holder(conn: sqlite3.Connection, chain_id: str) -> tuple[ImageRow, BlobId] | None:
    """A ready image keeping the tree of the layers `chain_id` names (all of its layers
    or its first ones), and that tree, if any (whatever its chunk size)."""
    found = conn.execute(
        "SELECT c.image, c.root FROM image_chains c JOIN images i ON i.name = c.image "
        "WHERE c.chain_id = ? AND i.phase = 'ready' "
        "UNION ALL SELECT name, root FROM images WHERE json_extract(oci, '$.chain_id') = ? "
        "AND phase = 'ready' AND root IS NOT NULL LIMIT 1",
        (chain_id, chain_id),
    ).fetchone()
    image = None if found is None else image_row(conn, found[0])
    return None if image is None else (image, BlobId(bytes(found[1])))


def insert_chains(conn: sqlite3.Connection, name: str, chains: list[tuple[int, str, BlobId]]) -> None:
    """An image's (layers, chain id, root) rows (the caller counts their references)."""
    conn.executemany(
        "INSERT INTO image_chains (image, layers, chain_id, root) VALUES (?, ?, ?, ?)",
        [(name, k, chain_id, root) for k, chain_id, root in chains],
    )


def chain_roots(conn: sqlite3.Connection, name: str) -> list[BlobId]:
    return [
        BlobId(bytes(r)) for (r,) in conn.execute("SELECT root FROM image_chains WHERE image = ?", (name,))
    ]


def fail(conn: sqlite3.Connection, name: str, owner_pid: int, reason: str) -> None:
    """Phase failed with `reason`, if `owner_pid` still owns the import (not ready)."""
    conn.execute(
        "UPDATE images SET phase = 'failed', error = ?, owner_pid = NULL "
        "WHERE name = ? AND phase != 'ready' AND owner_pid = ?",
        (reason, name, owner_pid),
    )


def delete_unready(
    conn: sqlite3.Connection, name: str, owner_pid: int | None, phase: str | None = None
) -> bool:
    """Remove an import's row (it holds no blob) if it is not ready and `owner_pid` owns
    it (and it is in `phase`, when given)."""
    query = "DELETE FROM images WHERE name = ? AND phase != 'ready' AND owner_pid IS ?"
    args: tuple[object, ...] = (name, owner_pid)
    if phase is not None:
        query, args = query + " AND phase = ?", (*args, phase)
    return bool(conn.execute(query, args).rowcount)


def delete(conn: sqlite3.Connection, name: str) -> None:
    """Remove an image's row and its chains (the caller released their roots)."""
    conn.execute("DELETE FROM image_chains WHERE image = ?", (name,))
    conn.execute("DELETE FROM images WHERE name = ?", (name,))


def ready_totals(conn: sqlite3.Connection) -> tuple[int, int]:
    """(ready images, their logical bytes)."""
    count, size = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM images WHERE phase = 'ready'"
    ).fetchone()
    return int(count), int(size)
