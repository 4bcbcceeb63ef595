"""Importing a raw disk image: split into fixed chunks, in parallel, into a chunk map.

The reader thread reads big blocks in order; worker threads hash, compress and stage
each block's chunks (blake3 and zstd release the GIL, so both cores work); the map is
assembled in order at the end. Memory stays bounded: at most `_INFLIGHT` blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from casfs.importers import Readable
from casfs.refcount.ledger import Batch
from casfs.snapshots import chunkmap
from casfs.store.ids import BlobId

_BLOCK = 8 << 20
_WORKERS = 3
_INFLIGHT = 6

Progress = Callable[[int], None]


def _put_block(batch: Batch, block: bytes, chunk_size: int) -> list[BlobId]:
    # Views, not copies: hashing, compressing and writing take them as they are (and
    # is_zero copies only a chunk that starts with a zero byte).
    view = memoryview(block)
    return [batch.put(view[i : i + chunk_size]) for i in range(0, len(block), chunk_size)]


def _read_full(source: Readable, n: int) -> bytes:
    """n bytes, or fewer only at the end: blocks must stay chunk-aligned even when the
    source (a pipe, a hashing reader) returns short reads."""
    parts = []
    while n:
        part = source.read(n)
        if not part:
            break
        parts.append(part)
        n -= len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def import_raw(
    batch: Batch,
    source: Readable,
    chunk_size: int,
    progress: Progress | None = None,
) -> tuple[BlobId, int]:
    """Stage a raw image read from `source` to its end; returns (map root, size)."""
    block_size = max(chunk_size, _BLOCK // chunk_size * chunk_size)
    ids: list[BlobId] = []
    size = 0
    pending: deque[Future[list[BlobId]]] = deque()
    with ThreadPoolExecutor(_WORKERS, thread_name_prefix="casfs-import") as pool:
        while True:
            block = _read_full(source, block_size)
            if not block:
                break
            size += len(block)
            pending.append(pool.submit(_put_block, batch, block, chunk_size))
            if progress:
                progress(len(block))
            while len(pending) >= _INFLIGHT or (pending and pending[0].done()):
                ids.extend(pending.popleft().result())
        while pending:
            ids.extend(pending.popleft().result())
    return chunkmap.build_map(batch.put_kind, ids, size, chunk_size), size
