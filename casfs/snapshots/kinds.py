"""The kinds of blob, and the children each kind names (what its catalog row references)."""

from __future__ import annotations

from collections.abc import Iterator

from casfs.store.ids import BlobId

DATA = 0  # file or disk bytes: no children
MAP_ROOT = 1  # chunk-map root: chunk ids or page ids
MAP_PAGE = 2  # chunk-map page: chunk ids
TREE = 3  # directory: subtrees, files' chunk ids or map roots

KIND_NAMES = {DATA: "data", MAP_ROOT: "map-root", MAP_PAGE: "map-page", TREE: "tree"}


def children(kind: int, plain: bytes) -> Iterator[tuple[BlobId, int]]:
    """(child id, child kind) for every reference in a blob, holes left out."""
    if kind == DATA:
        return iter(())
    from casfs.snapshots import chunkmap, tree  # local: those modules import this one

    if kind in (MAP_ROOT, MAP_PAGE):
        return chunkmap.children(kind, plain)
    if kind == TREE:
        return tree.children(plain)
    raise ValueError(f"unknown blob kind {kind}")
