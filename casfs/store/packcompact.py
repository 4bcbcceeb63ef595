"""gc's repack for a local pack store (BlobStore.compact), as the S3 store's
(store.s3.repack): the live blobs of every pack whose live bytes are under `below` of
its blob bytes go into new packs (a staging per round of ROUND_PACKS packs' worth, so
small leftovers merge and the room it needs stays bounded), each checked on the way;
publishing them moves their rows, and the old packs, left with none, go.
A pack with a blob that fails its check stays as it is (fsck reports the blob).
Wholly dead packs go without a rewrite, and so do pack files no index row names.

Runs with the store's lock held exclusively: no batch is between renaming a pack into
packs/ and committing its rows (and a staging directory in tmp/ protects its packs
anyway)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from casfs.store.packfile import PACK_HEADER_SIZE, restage

if TYPE_CHECKING:
    from casfs.store.packstore import PackBlobStore


# Live bytes restaged per publish: the old packs go at each publish, so the extra disk a
# compaction needs at once is about this much, not every partly-dead pack's live data.
ROUND_PACKS: float = 8  # pack targets' worth


def compact(store: PackBlobStore, below: float) -> tuple[int, int]:
    """(packs rewritten or dropped, bytes reclaimed)."""
    packs, reclaimed = _sweep_unindexed(store)
    usage = store.index.pack_usage()
    chosen = [(name, size, live) for name, size, live in usage if live < below * (size - PACK_HEADER_SIZE)]
    for name, size, live in chosen:
        if live == 0 and store.index.drop_pack(name):
            store.unlink_pack(name)
            packs += 1
            reclaimed += size
    partly = [(name, size, live) for name, size, live in chosen if live > 0]
    written = 0
    for round_ in _rounds(partly, int(ROUND_PACKS * store.pack_target)):
        staging = store.staging()
        try:
            for name, _, _ in round_:
                with open(store.pack_path(name), "rb") as f:
                    data = f.read()
                restage(store, staging, name, data, store.index.live(name))
            staging.publish()  # (drops the packs it emptied)
        finally:
            staging.discard()
        written += staging.written
    gone = [size for name, size, _ in partly if not store.index.has_pack(name)]
    return packs + len(gone), max(0, reclaimed + sum(gone) - written)


def _rounds(packs: list[tuple[str, int, int]], most: int) -> list[list[tuple[str, int, int]]]:
    """The packs in runs of at most `most` live bytes each (a larger pack alone)."""
    rounds: list[list[tuple[str, int, int]]] = []
    live_in_last = 0
    for pack in packs:
        if not rounds or live_in_last + pack[2] > most:
            rounds.append([])
            live_in_last = 0
        rounds[-1].append(pack)
        live_in_last += pack[2]
    return rounds


def _sweep_unindexed(store: PackBlobStore) -> tuple[int, int]:
    """Remove pack files no index row names and no staging in tmp/ owns: listed first,
    then the stagings, then the index (a pack renamed in since the listing has its
    staging's directory until its rows are committed)."""
    try:
        files = [
            (e.name[: -len(".pack")], e.stat().st_size)
            for e in os.scandir(store.pack_dir)
            if e.name.endswith(".pack")
        ]
        tags = {name.partition("-")[2] for name in os.listdir(store.tmp_dir)}
    except FileNotFoundError:
        return 0, 0
    indexed = store.index.pack_names()
    removed = [(n, size) for n, size in files if n not in indexed and n.partition("-")[0] not in tags]
    for name, _ in removed:
        store.unlink_pack(name)
    return len(removed), sum(size for _, size in removed)
