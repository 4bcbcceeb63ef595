"""The sender's side of a transfer: which blobs a snapshot is made of, and reading them.

A snapshot is its root and everything the root names, down to data chunks
(casfs.snapshots.children). The walk is breadth first, parents before children, so a
receiver reading a stream in order learns what it needs before it arrives, and each
blob is listed once however often it is named (hardlinks, deduplicated chunks).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from casfs.kinds import BlobKind
from casfs.replica.wire import Record, encode
from casfs.store import BlobStore
from casfs.store.ids import ZERO_ID, BlobId

GetMeta = Callable[[BlobId], bytes]


def walk(
    get_meta: GetMeta, root: BlobId, kind: BlobKind, skip: Callable[[BlobId], bool]
) -> Iterator[tuple[BlobId, BlobKind]]:
    """(id, kind) of every blob under `root`, parents first, each once; a blob for
    which `skip` is true is left out with everything under it (the receiver holds it)."""
    from casfs.snapshots.children import children  # (here: a server's reads need no codec)

    if root == ZERO_ID or skip(root):
        return
    seen = {root}
    todo: deque[tuple[BlobId, BlobKind]] = deque([(root, kind)])
    while todo:
        bid, k = todo.popleft()
        yield bid, k
        if k == BlobKind.DATA:
            continue
        for child, ck in children(k, get_meta(bid)):
            if child not in seen and not skip(child):
                seen.add(child)
                todo.append((child, ck))


def reachable(get_meta: GetMeta, root: BlobId, kind: BlobKind) -> set[BlobId]:
    """Every blob under `root` (reads only its metadata)."""
    return {bid for bid, _ in walk(get_meta, root, kind, lambda _: False)}


def read_records(
    blobs: BlobStore, items: Iterable[tuple[BlobId, BlobKind]], pool: ThreadPoolExecutor, window: int = 32
) -> Iterator[Record]:
    """Each blob read (verified by the store), encoded for the wire, in order; up to
    `window` at once in `pool` (reading, hashing and compressing release the GIL)."""

    def one(item: tuple[BlobId, BlobKind]) -> Record:
        bid, kind = item
        return encode(bid, kind, blobs.get(bid, "data" if kind == BlobKind.DATA else "meta"))

    pending: deque[Future[Record]] = deque()
    for item in items:
        pending.append(pool.submit(one, item))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()
