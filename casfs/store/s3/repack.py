"""gc's repack for an S3 store: packs mostly dead rewritten, all-dead ones dropped."""

from __future__ import annotations

from typing import TYPE_CHECKING

from casfs.store.packfile import restage
from casfs.store.s3 import packfmt

if TYPE_CHECKING:
    from casfs.store.s3.store import S3BlobStore


def repack(store: S3BlobStore, below: float) -> tuple[int, int]:
    """Repack: the live blobs of every pack whose live bytes are under `below` of
    its blob bytes go into new packs (one staging, so small leftovers merge), each
    checked on the way; then the old packs go. A pack with a blob that fails its
    check is left as it is (fsck reports the blob).

    Packs another store relies on (pins) are not rewritten; an adopted pack (another
    store's) is dropped once all its blobs are dead here, never rewritten: the owner
    keeps its bytes anyway."""
    from casfs.store.s3 import pins

    store.refresh()
    chosen = []
    pinned: set[str] | None = None
    for name in sorted(store.table.names()):
        pack = store.table.pack(name)
        if pack is None:
            continue
        live = [(b, o, n) for b, (o, n) in pack.entries.items() if b not in pack.dead]
        total = sum(n for _, n in pack.entries.values())
        if live and (pack.foreign is not None or sum(n for _, _, n in live) >= below * total):
            continue
        if live:
            pinned = pins.pinned(store) if pinned is None else pinned
            if name in pinned:
                continue
        chosen.append((name, pack.size if pack.foreign is None else 0, live))
    if not chosen:
        return 0, 0
    staging = store.staging()
    done: list[tuple[str, int]] = []
    try:
        for name, size, live in chosen:
            if live and not restage(store, staging, name, store.remote.get(packfmt.pack_key(name)), live):
                continue
            done.append((name, size))
        staging.publish()
    finally:
        staging.discard()
    written = sum(store.table.packs[n].size for n in staging.published_names if n in store.table.packs)
    removed = []
    for name, size in done:
        pack = store.table.pack(name)
        if store.remove_pack(name, tuple(pack.entries) if pack else ()):
            removed.append(size)
    return len(removed), max(0, sum(removed) - written)
