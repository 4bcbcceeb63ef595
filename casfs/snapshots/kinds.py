"""The kinds of blob (casfs.snapshots.children says what each kind's blob references)."""

from __future__ import annotations

DATA = 0  # file or disk bytes: no children
MAP_ROOT = 1  # chunk-map root: chunk ids or page ids
MAP_PAGE = 2  # chunk-map page: chunk ids
TREE = 3  # directory: subtrees, files' chunk ids or map roots

KIND_NAMES = {DATA: "data", MAP_ROOT: "map-root", MAP_PAGE: "map-page", TREE: "tree"}
