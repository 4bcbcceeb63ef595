"""A file's data below its upper file, as st_blocks counts it: the base's chunks and
the chunks an older casfs flushed as overlay rows (both kinds; a block volume is one file)."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from casfs.ids import ChunkNo
from casfs.snapshots import chunkmap
from casfs.store.ids import ZERO_ID
from casfs.vfs.overlay.nodes import Node

if TYPE_CHECKING:
    from casfs.vfs.rw.volume import RwVolume


def chunk_blocks(vol: RwVolume, node: Node) -> int:
    """512-byte blocks a file occupies, counted by chunk: a chunk holding data counts
    (up to the end of the file), a hole none. So `du` of a sparse file stays small
    and `cp` out of the mount keeps it sparse. Cost: the base's data chunks are
    listed once per content id; then O(changed chunks) per call."""
    cs = vol.chunk_size
    count = chunkmap.n_chunks(node.attrs.size, cs)
    limit = min(node.base_limit, count)
    base = _base_allocation(vol, node)
    chunks = bisect.bisect_left(base, limit)
    for n in vol.chunk_ids.get(node.ino, ()):
        if n < count:
            chunks += (vol.chunk_ref(node, n) != ZERO_ID) - (n < limit and _contains(base, n))
    used = chunks * cs
    if count and vol.chunk_ref(node, ChunkNo(count - 1)) != ZERO_ID:
        used -= count * cs - node.attrs.size  # the last chunk ends at the end of the file
    return (used + 511) // 512


def _base_allocation(vol: RwVolume, node: Node) -> list[ChunkNo]:
    """The base content's data chunks, listed once per content id (vol.allocated)."""
    if node.base == ZERO_ID or node.base_limit == 0:
        return []
    found = vol.allocated.get(node.base)
    if found is None:
        content = vol.kind.content(node)
        if isinstance(content, chunkmap.ChunkMap):
            found = content.data_chunks()  # a block volume's disk
        elif content.map is not None:
            found = content.map.data_chunks()
        else:
            found = [ChunkNo(0)] if content.chunk(ChunkNo(0)) != ZERO_ID else []
        if len(vol.allocated) > 4096:
            vol.allocated.clear()
        vol.allocated[node.base] = found
    return found


def _contains(ordered: list[ChunkNo], n: ChunkNo) -> bool:
    i = bisect.bisect_left(ordered, n)
    return i < len(ordered) and ordered[i] == n
