"""Which pack bytes to read for a run of blobs: blobs that lie close together in one
pack are read with one pread (a span), and each blob is then checked on its own slice
of it (PackBlobStore.get_many).

Why: a pack holds an import's or a fold's chunks in the order of the disk or file they
came from, so the chunks a sequential reader's read-ahead asks for next lie side by side
in a pack. One pread of 1 MiB costs the kernel one request, where sixteen preads of 64
KiB cost sixteen (and sixteen fd look-ups, buffers and Python calls).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from casfs.store.ids import BlobId
from casfs.store.packindex import Location

# Blobs of a run at most this far apart in a pack are read with one pread, the bytes
# between them read and dropped (a deleted blob, or one the run does not need): the
# copy of a few KiB costs less than another read. A span stops growing at SPAN_MAX:
# longer reads save little more (in the page cache, 28 us per MiB read whole against
# 42 us in 64 KiB reads) and would need bigger buffers.
SPAN_GAP = 16 << 10
SPAN_MAX = 1 << 20

InPack = tuple[BlobId, int, int]  # id, offset in the pack, stored length


def spans(
    where: Mapping[BlobId, Location],
    order: Sequence[BlobId],
    gap: int = SPAN_GAP,
    most: int = SPAN_MAX,
) -> list[tuple[str, list[InPack]]]:
    """The spans to read for the blobs located in `where` (id -> pack, offset, length):
    (pack, its blobs by offset), each blob in exactly one; a span's blobs at most `gap`
    bytes apart, and it at most `most` bytes long (or one blob, if longer). Spans are
    ordered by where their blobs come first in `order` (the reader's), so the chunks
    wanted first come first."""
    by_pack: dict[str, list[InPack]] = {}
    for bid, (name, offset, length) in where.items():
        by_pack.setdefault(name, []).append((bid, offset, length))
    out: list[tuple[str, list[InPack]]] = []
    for name, blobs in by_pack.items():
        blobs.sort(key=lambda b: b[1])
        span = [blobs[0]]
        for b in blobs[1:]:
            start, (_, last, last_len) = span[0][1], span[-1]
            if b[1] - (last + last_len) > gap or b[1] + b[2] - start > most:
                out.append((name, span))
                span = []
            span.append(b)
        out.append((name, span))
    rank = {bid: i for i, bid in enumerate(order)}
    out.sort(key=lambda s: min(rank.get(b[0], len(rank)) for b in s[1]))
    return out


class SpanBuffers:
    """Buffers spans are read into, reused: a fresh buffer for each 1 MiB span cost the
    kernel a page fault per 4 KiB (a cold sequential read of a 1 GiB image: 31,000 minor
    faults in the daemon, against 5,800 reading chunk by chunk). A buffer is taken out
    while a span's blobs are checked from it (a run suspended half-way keeps its own),
    and at most `keep` wait for reuse. Thread-safe: list.pop and list.append are atomic."""

    def __init__(self, keep: int = 4) -> None:
        self._free: list[bytearray] = []
        self._keep = keep

    @contextmanager
    def take(self, size: int) -> Iterator[memoryview]:
        """A buffer of `size` bytes (a view of a reused one, if one is big enough)."""
        try:
            buf = self._free.pop()
        except IndexError:
            buf = bytearray(size)
        if len(buf) < size:
            buf = bytearray(size)
        try:
            yield memoryview(buf)[:size]
        finally:
            if len(self._free) < self._keep:
                self._free.append(buf)
