"""Importing a raw disk image: split into fixed chunks, in parallel, into a chunk map.

The reader thread reads big blocks in order; worker threads hash, compress and stage
each block's chunks (blake3 and zstd release the GIL, so both cores work); the map is
assembled in order at the end. Memory stays bounded: at most `_INFLIGHT` blocks.

A regular file is read with O_DIRECT into a ring of reused page-aligned buffers, one
read ahead of the workers: copying a cold image out of the page cache cost as much CPU
as hashing it (perf: 28% of an import's samples in _copy_to_iter), and fresh buffers
for each block cost page faults besides. Anything else (a pipe, a file system that
refuses O_DIRECT) is read with read().
"""

from __future__ import annotations

import mmap
import os
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor

from casfs.importers import Readable
from casfs.refcount.ledger import Batch
from casfs.snapshots import chunkmap
from casfs.store.ids import BlobId
from casfs.store.verify import HashingReader

_BLOCK = 8 << 20
_WORKERS = 3
_INFLIGHT = 6

Progress = Callable[[int], None]
Block = bytes | memoryview
Blocks = Generator[Block, None, None]


def _put_block(batch: Batch, block: Block, chunk_size: int) -> list[BlobId]:
    # Views, not copies: hashing, compressing and writing take them as they are (and
    # is_zero copies only a chunk that starts with a zero byte).
    view = memoryview(block)
    return batch.put_many([view[i : i + chunk_size] for i in range(0, len(block), chunk_size)])


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


def _read_blocks(source: Readable, block_size: int, done: Callable[[], None]) -> Blocks:
    while block := _read_full(source, block_size):
        yield block
        done()


def _direct_blocks(
    source: HashingReader, fd: int, block_size: int, done: Callable[[], None]
) -> Blocks | None:
    """The file's blocks read through `fd` (O_DIRECT), each hashed by `source`; None if
    the first read fails (a file system that accepts the flag and refuses the read).

    Each block is a view of a buffer of the ring, read into again once the caller has
    stored it: after each block the caller stores it (or hands it to a worker), and
    done() returns only when fewer than _INFLIGHT blocks are pending, so the buffer
    read ahead (two past the oldest pending) is never one a worker still reads."""
    ring = [mmap.mmap(-1, block_size) for _ in range(_INFLIGHT + 2)]
    try:
        first = os.preadv(fd, [ring[0]], 0)
    except OSError:
        return None
    end = os.fstat(fd).st_size

    def blocks() -> Blocks:
        with ThreadPoolExecutor(1, thread_name_prefix="casfs-read") as reader:
            n, offset, i = first, 0, 0
            while n:
                offset += n
                if n < block_size and offset != end:  # (O_DIRECT reads short only at the end)
                    raise OSError(f"short read at {offset} of {end} bytes")
                ahead = (
                    reader.submit(os.preadv, fd, [ring[(i + 1) % len(ring)]], offset)
                    if n == block_size
                    else None
                )
                block = memoryview(ring[i % len(ring)])[:n]
                source.feed(block)
                yield block
                done()
                n, i = (ahead.result() if ahead else 0), i + 1
        source.skip_to_end()

    return blocks()


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

    def settle() -> None:
        """Wait until fewer than _INFLIGHT blocks are pending (and collect those done)."""
        while len(pending) >= _INFLIGHT or (pending and pending[0].done()):
            ids.extend(pending.popleft().result())

    fd = source.reopen_direct() if isinstance(source, HashingReader) else None
    blocks = None
    if fd is not None:
        assert isinstance(source, HashingReader)
        blocks = _direct_blocks(source, fd, block_size, settle)
    try:
        if blocks is None:
            blocks = _read_blocks(source, block_size, settle)
        with ThreadPoolExecutor(_WORKERS, thread_name_prefix="casfs-import") as pool:
            for block in blocks:
                size += len(block)
                pending.append(pool.submit(_put_block, batch, block, chunk_size))
                if progress:
                    progress(len(block))
            while pending:
                ids.extend(pending.popleft().result())
    finally:
        if blocks is not None:
            blocks.close()  # (on an error: its read ahead is waited for before the fd goes)
        if fd is not None:
            os.close(fd)
    return chunkmap.build_map(batch.put_kind, ids, size, chunk_size), size
