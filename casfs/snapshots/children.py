"""The children a blob names, by its kind: what its catalog row holds references on."""

from __future__ import annotations

from collections.abc import Iterator

from casfs.snapshots import chunkmap, tree
from casfs.snapshots.kinds import DATA, MAP_PAGE, MAP_ROOT, TREE
from casfs.store.ids import BlobId


def children(kind: int, plain: bytes) -> Iterator[tuple[BlobId, int]]:
    """(child id, child kind) for every reference in a blob, holes left out."""
    if kind == DATA:
        return iter(())
    if kind in (MAP_ROOT, MAP_PAGE):
        return chunkmap.children(kind, plain)
    if kind == TREE:
        return tree.children(plain)
    raise ValueError(f"unknown blob kind {kind}")
