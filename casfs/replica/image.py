"""`casfs image pull SOURCE IMAGE`: another store's image, by its root, moving only the
blobs missing here, or none when both stores keep their blobs in one bucket (then the
blobs are adopted where they are: replica.adopt). The image lands ready, with the
source's root, size and digests, in one transaction once every blob under it is here.
(The source's side is the `image` request of replica.protocol.)
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable

from casfs.catalog import images as rows
from casfs.errors import Conflict
from casfs.ids import InodeNo, SnapshotNo
from casfs.kinds import VolumeKind
from casfs.replica.land import Moved, Plan
from casfs.replica.peers import Connection, normalize
from casfs.repo import Repository
from casfs.store.ids import BlobId
from casfs.units import check_name


def pull_image(
    repo: Repository,
    conn: Connection,
    image: str,
    as_name: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> Moved:
    """Pull image `image` of the source as `as_name` (default: the same name)."""
    from casfs.replica.pull import bring

    name = check_name(as_name or image, "image")
    hello = conn.hello()
    doc = conn.request("image", name=image)
    root = BlobId(bytes.fromhex(doc["root"]))
    kind = VolumeKind(doc["kind"])
    moved = Moved(name, SnapshotNo(0), root.hex(), Plan.NEW)
    if _held(repo, name, root):
        moved.plan = Plan.HAVE
        return moved

    def then(c: sqlite3.Connection) -> None:
        if rows.image_row(c, name) is not None:
            raise Conflict(f"image {name!r} was made here during the pull")
        spec = json.dumps({"pulled": f"{image}@{root.hex()}"}, sort_keys=True)
        source = f"pulled from {normalize(conn.source)}"
        rows.insert_queued(c, name, kind, int(doc["chunk_size"]), source, spec, os.getpid())
        size, next_ino = int(doc["size"]), InodeNo(int(doc["next_ino"]))
        rows.finish(c, name, os.getpid(), root, size, next_ino, doc["digest"], doc["oci"])

    bring(repo, conn, hello, root, kind, moved, progress, {root: 1}, then)
    moved.bytes = conn.r.meter.bytes
    return moved


def _held(repo: Repository, name: str, root: BlobId) -> bool:
    """True if image `name` is here with that root; Conflict if with another."""
    row = rows.image_row(repo.conn, name)
    if row is None:
        return False
    if row.root == root and row.phase == "ready":
        return True
    raise Conflict(f"image {name!r} exists here with other content: pull with --as NAME")
