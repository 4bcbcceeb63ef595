"""`casfs pull SOURCE VOL`: bring the local replica of a volume up to a snapshot of
another store, fetching only the blobs missing here.

The receiver drives: it asks for the source's snapshots, decides what landing one
means (replica.land: refusing a diverged line), then walks the snapshot's tree from
its root, asking in batches for what it lacks (metadata first: it names the rest),
with WINDOW requests in flight. Blobs are verified as they arrive (replica.assemble);
the snapshot appears in one transaction once every blob under it is here. Killed at
any point, a rerun walks again and fetches only what has no row yet: at most one
batch of data, and the metadata, move twice.

When the source's blobs are in the same bucket as this store's, nothing of them moves:
the pull adopts them (replica.adopt) and only catalog records cross the connection.
"""

from __future__ import annotations

import contextlib
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from casfs.catalog import transaction
from casfs.catalog import volumes as rows
from casfs.errors import NotFound
from casfs.ids import SnapshotNo
from casfs.kinds import BlobKind, VolumeKind
from casfs.lifecycle.faults import fault_point
from casfs.replica.assemble import Assembler, Want
from casfs.replica.land import Moved, Offer, Plan, check, land, root_kind, store_id
from casfs.replica.peers import Connection, normalize
from casfs.replica.wire import Record
from casfs.repo import Repository
from casfs.store.ids import BlobId
from casfs.units import check_name

BATCH = 64  # blobs per request
WINDOW = 4  # requests in flight


def listing(link: Connection, volume: str) -> tuple[dict[str, Any], dict[SnapshotNo, BlobId | None]]:
    """The source's hello (its store id, its bucket) and its snapshots of `volume` (root
    None: still folding)."""
    hello, snaps, _ = listing_with_bookmarks(link, volume)
    return hello, snaps


def listing_with_bookmarks(
    link: Connection, volume: str
) -> tuple[dict[str, Any], dict[SnapshotNo, BlobId | None], dict[SnapshotNo, BlobId]]:
    """`listing`, and the source's bookmarks of `volume` (its removed snapshots' roots;
    none from a casfs before them)."""
    hello = link.hello()
    doc = link.request("volume", name=volume)
    snaps = {
        SnapshotNo(int(s["n"])): None if s["root"] is None else BlobId(bytes.fromhex(s["root"]))
        for s in doc["snapshots"]
    }
    marks = {SnapshotNo(int(b["n"])): BlobId(bytes.fromhex(b["root"])) for b in doc.get("bookmarks", [])}
    return hello, snaps, marks


def peer_row(source: str, store: str, remote: str, snaps: dict[SnapshotNo, BlobId | None]) -> rows.Peer:
    newest = max(snaps, default=None)
    return rows.Peer(source, store, remote, newest, None if newest is None else snaps[newest], time.time())


def pull(
    repo: Repository,
    link: Connection,
    volume: str,
    n: SnapshotNo | None = None,
    as_name: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> Moved:
    """Pull snapshot `n` (default: the newest) of `volume` through `link` as `as_name`.
    (The caller starts the connection first: the source starts while this store opens.)"""
    name = check_name(as_name or volume, "volume")
    where = normalize(link.source)
    hello, snaps, marks = listing_with_bookmarks(link, volume)
    theirs_id = str(hello["store"])
    if not snaps:
        raise NotFound(f"{link.source} holds no snapshot of {volume}")
    target = max(snaps) if n is None else n
    if target not in snaps:
        raise NotFound(f"{link.source} holds no snapshot {volume}@{target}")
    offer = Offer.from_json(link.request("offer", name=volume, n=target))
    snaps[target] = offer.root
    theirs = {**marks, **{k: v for k, v in snaps.items() if v is not None}}  # (the line, pruned or not)
    peer = peer_row(where, theirs_id, volume, snaps)
    try:
        moved = _land(repo, link, hello, name, offer, theirs, peer, where, progress)
    except BaseException:
        with contextlib.suppress(Exception):  # the pull's own error is the one to raise
            _seen(repo, name, peer)
        raise
    if moved.plan == Plan.HAVE:
        _seen(repo, name, peer)
    moved.bytes = link.r.meter.bytes
    return moved


def _land(
    repo: Repository,
    link: Connection,
    hello: dict[str, Any],
    name: str,
    offer: Offer,
    theirs: dict[SnapshotNo, BlobId],
    peer: rows.Peer,
    where: str,
    progress: Callable[[int], None] | None,
) -> Moved:
    """The pull's landing (or nothing, if held), the peer recorded in its transaction."""
    mine = store_id(repo)
    moved = Moved(name, offer.n, offer.root.hex(), check(repo.conn, name, offer, theirs, mine))
    if moved.plan == Plan.HAVE:
        return moved

    def then(c: sqlite3.Connection) -> None:
        moved.plan = check(c, name, offer, theirs, mine)
        land(c, name, offer, moved.plan, where)
        rows.record_peer(c, name, peer)

    row = rows.volume_row(repo.conn, name) if moved.plan == Plan.NEXT else None
    base = None if row is None else row.base
    bring(repo, link, hello, offer.root, offer.kind, moved, progress, {}, then, base)
    return moved


def _seen(repo: Repository, name: str, peer: rows.Peer) -> None:
    """The peer as seen, whatever came of the pull (where no landing recorded it)."""
    with transaction(repo.conn) as c:
        if rows.volume_row(c, name) is not None:
            rows.record_peer(c, name, peer)


def bring(
    repo: Repository,
    link: Connection,
    hello: dict[str, Any],
    root: BlobId,
    kind: VolumeKind,
    moved: Moved,
    progress: Callable[[int], None] | None,
    refs: dict[BlobId, int],
    then: Callable[[sqlite3.Connection], None],
    base: BlobId | None = None,
) -> None:
    """Make everything under `root` present here (adopted where the source's blobs share
    this store's bucket, else fetched), then land it: `refs` and the caller's rows
    (`then`) in the transaction that publishes it. `base`: the local volume's, whose
    blobs the new snapshot mostly shares (Assembler.holding)."""
    shared = None
    if isinstance(hello.get("blobs"), dict):  # (the source's blobs are in a bucket)
        from casfs.replica.adopt import shared_bucket

        shared = shared_bucket(repo, hello)
    with ThreadPoolExecutor(2) as pool, Assembler(repo, root, root_kind(kind), pool) as asm:
        if base is not None:
            asm.holding(base, root_kind(kind))
        if shared is not None:
            from casfs.replica.adopt import adopt

            adopt(link, asm, shared, moved, progress)
        else:
            _fetch(link, asm, moved, progress)
        link.end()
        asm.finish(refs, then)


def _fetch(link: Connection, asm: Assembler, moved: Moved, progress: Callable[[int], None] | None) -> None:
    """Walk and fetch until nothing under the root is missing. A thread reads the
    answers (in the order asked) while this one verifies and stores the last ones."""
    meta: deque[Want] = deque()
    data: deque[Want] = deque()

    def add(wants: list[Want]) -> None:
        for w in wants:
            (data if w[1] == BlobKind.DATA else meta).append(w)

    asked: queue.Queue[list[Want] | None] = queue.Queue()
    answers: queue.Queue[list[Record] | BaseException] = queue.Queue()  # (at most WINDOW)

    def read() -> None:
        try:
            while (wants := asked.get()) is not None:
                answers.put(link.blobs(wants))
        except BaseException as e:
            answers.put(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        add(asm.start())
        waiting = 0
        while meta or data or waiting:
            while (meta or data) and waiting < WINDOW:
                part: list[Want] = []
                while len(part) < BATCH and (meta or data):
                    part.append((meta or data).popleft())
                link.ask(part)
                asked.put(part)
                waiting += 1
            link.flush()
            before = link.r.meter.bytes
            records = answers.get()
            if isinstance(records, BaseException):
                raise records
            waiting -= 1
            moved.blobs += len(records)
            add(asm.arrive(records))
            fault_point("pull:batch")
            if progress is not None:
                progress(link.r.meter.bytes - before)
    finally:
        asked.put(None)
