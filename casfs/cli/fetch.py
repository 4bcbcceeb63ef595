"""`casfs image fetch NAME`: read every blob of an image once, verified, so that a store
whose blobs are in a bucket has all of it in its local cache (a host about to boot
from it); on a store that keeps its own blobs it is a full read check of the image.

The image's tree is walked a level at a time, each level's blobs fetched in parallel
(FETCH_THREADS requests in flight: an object store's latency, not its bandwidth, is
what one reader waits on)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from casfs.cli.output import Progress
from casfs.cli.store import open_store
from casfs.units import format_size

if TYPE_CHECKING:
    import argparse

    from casfs.repo import Repository
    from casfs.store.ids import BlobId

FETCH_THREADS = 16


def cmd_fetch(args: argparse.Namespace) -> int:
    from casfs.images import get_image

    with open_store(args) as repo:
        info = get_image(repo, args.name)
        if info.root is None:
            from casfs.errors import Busy

            raise Busy(f"image {args.name} is {info.phase}: nothing to fetch yet")
        progress = Progress(f"fetching {args.name}", None, sys.stderr) if sys.stderr.isatty() else None
        try:
            blobs, stored = fetch_all(repo, bytes.fromhex(info.root), progress)
        finally:
            if progress is not None:
                progress.close()
    print(f"image {args.name}: {blobs} blobs, {format_size(stored)} stored, fetched and verified")
    return 0


def fetch_all(repo: Repository, root: bytes, progress: Progress | None) -> tuple[int, int]:
    """Read every blob under `root` once; (blobs, stored bytes)."""
    from concurrent.futures import ThreadPoolExecutor

    from casfs.catalog.blobs import rows_of
    from casfs.kinds import BlobKind
    from casfs.snapshots.children import children
    from casfs.store.ids import BlobId

    seen: set[BlobId] = set()
    level = [BlobId(root)]
    count = stored = 0

    def one(item: tuple[BlobId, int, int]) -> list[BlobId]:
        bid, kind, size = item
        plain = repo.blobs.get(bid, "data" if kind == BlobKind.DATA else "meta")
        if progress is not None:
            progress(size)
        return [c for c, _ in children(kind, plain)]

    with ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="casfs-fetch") as pool:
        while level:
            seen.update(level)
            rows = [(bid, row.kind, row.stored) for bid, row in rows_of(repo.conn, level)]
            count += len(rows)
            stored += sum(r[2] for r in rows)
            found = {c for kids in pool.map(one, rows) for c in kids}
            level = [c for c in found if c not in seen]
    return count, stored
