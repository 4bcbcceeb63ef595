"""The children a blob names, by its kind: what its catalog row holds references on."""

from __future__ import annotations

from collections.abc import Iterator

from casfs.kinds import BlobKind
from casfs.snapshots import chunkmap, tree
from casfs.store.ids import BlobId


def children(kind: int, plain: bytes) -> Iterator[tuple[BlobId, BlobKind]]:
    """(child id, child kind) for every reference in a blob, holes left out. `kind` is
    a catalog row's value, which a damaged catalog may hold out of range (ValueError)."""
    if kind == BlobKind.DATA:
        return iter(())
    if kind in (BlobKind.MAP_ROOT, BlobKind.MAP_PAGE):
        return chunkmap.children(BlobKind(kind), plain)
    if kind == BlobKind.TREE:
        return tree.children(plain)
    raise ValueError(f"unknown blob kind {kind}")
