"""A read's geometry: which chunks bytes [offset, end) cover, and the pieces a read of
content made of chunks is (pure functions; the views plan reads with them, on the trio
thread for every read and for each top-up of read-ahead)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from casfs.ids import ChunkNo
from casfs.store.ids import BlobId
from casfs.vfs.api import ReadPiece

# A view's read plan of one file: (offset, size) -> the pieces of those bytes.
Planner = Callable[[int, int], list[ReadPiece]]


def plan_pieces(
    chunk_run: Callable[[int, int], list[BlobId]], size: int, chunk_size: int, offset: int, length: int
) -> list[ReadPiece]:
    """The pieces of a read of [offset, offset+length) of content `size` bytes long whose
    chunks first..first+count-1 are `chunk_run(first, count)`; cut at the end of the
    content."""
    end = min(offset + length, size)
    if offset >= end:
        return []
    first, last = offset // chunk_size, (end - 1) // chunk_size
    ids = chunk_run(first, last - first + 1)
    head = offset - first * chunk_size
    if first == last:
        return [ReadPiece(head, end - first * chunk_size, ids[0])]
    pieces = [ReadPiece(head, chunk_size, ids[0])]
    pieces += [ReadPiece(0, chunk_size, bid) for bid in ids[1:-1]]
    pieces.append(ReadPiece(0, end - last * chunk_size, ids[-1]))
    return pieces


def chunk_spans(offset: int, end: int, chunk_size: int) -> Iterator[tuple[ChunkNo, int, int]]:
    """The chunks bytes [offset, end) cover: (n, start, stop) within each chunk."""
    pos = offset
    while pos < end:
        q, start = divmod(pos, chunk_size)
        stop = min(chunk_size, end - q * chunk_size)
        yield ChunkNo(q), start, stop
        pos = q * chunk_size + stop
