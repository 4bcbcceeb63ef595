"""Encoding blobs for disk: zstd, or raw where that is smaller; strict decoding.

On-disk form: one codec byte, then the payload. Decoding refuses trailing data and
bounds the output size, so a corrupt or hostile file can neither smuggle extra bytes
nor balloon memory. zstd (de)compressor objects are not thread-safe: one per thread.

A chunk zstd cannot shrink (random, encrypted or already compressed data) is stored
raw without compressing all of it: when samples of it at its start and middle do not
shrink either, and when zstd's output is no smaller. The samples are 1 KiB: a sample
that shrinks is work thrown away before the whole chunk is compressed, and 4 KiB ones
were 16% of a 32 KiB text chunk's encoding (1 KiB: 5%); on random data 1 KiB ones cost
4 us a chunk against 6 us, and on .gz, .png and .pyc files they sent the same chunks
to zstd as 4 KiB ones did (docs/developer-notes.md, "Raw import at 32 KiB chunks").
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from casfs.errors import Corruption

if TYPE_CHECKING:
    import zstandard

RAW = 0
ZSTD = 1
# No blob casfs writes is larger than this (chunks are at most 4 MiB, pages smaller).
MAX_PLAIN_SIZE = 64 << 20
ZSTD_LEVEL = 1
# The samples: _PROBE bytes each, tried in blobs of at least _PROBE_MIN bytes; a sample
# must shrink by 1/_GAIN of its size for the whole blob to be compressed.
_PROBE = 1024
_PROBE_MIN = 32 * _PROBE
_GAIN = 32

_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    c = getattr(_local, "c", None)
    if c is None:
        import zstandard  # (imported at first use: a CLI command that reads no blob skips it)

        c = _local.c = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "d", None)
    if d is None:
        import zstandard

        d = _local.d = zstandard.ZstdDecompressor()
    return d


_HEADS = (bytes((RAW,)), bytes((ZSTD,)))


def encode(plain: bytes | memoryview) -> bytes:
    return b"".join(encode_parts(plain))


def encode_parts(plain: bytes | memoryview) -> tuple[bytes, bytes | memoryview]:
    """encode() as (codec byte, payload): a raw blob's payload is `plain` itself, not a
    copy (a writer writes both parts at once)."""
    c = _compressor()
    if len(plain) >= _PROBE_MIN and _incompressible(c, memoryview(plain)):
        return _HEADS[RAW], plain
    packed = c.compress(plain)
    if len(packed) < len(plain):
        return _HEADS[ZSTD], packed
    return _HEADS[RAW], plain


def _incompressible(c: zstandard.ZstdCompressor, view: memoryview) -> bool:
    mid = len(view) // 2
    return all(len(c.compress(view[at : at + _PROBE])) > _PROBE - _PROBE // _GAIN for at in (0, mid))


def decode_many(stored: list[memoryview]) -> list[bytes | None]:
    """decode() of the zstd blobs among `stored` in one call of zstd (one pass of the GIL
    for them all, where decode() makes one a blob), as long as each is one whole frame
    (its block headers end where the blob does: decode() refuses trailing bytes) with its
    size declared and within MAX_PLAIN_SIZE; None for every other blob, and for all of
    them if zstd refuses one: decode() those one by one (raw ones cost no pass; a
    malformed one gets its own error)."""
    out: list[bytes | None] = [None] * len(stored)
    if sum(len(blob) > 1 and blob[0] == ZSTD for blob in stored) < 2:
        return out  # (a random read's span of one: no header parsed for nothing)
    frames: list[bytes | bytearray | memoryview] = []
    at: list[int] = []
    for i, blob in enumerate(stored):
        if len(blob) > 1 and blob[0] == ZSTD and _whole_frame(frame := blob[1:]):
            frames.append(frame)
            at.append(i)
    if len(frames) < 2:
        return out
    import zstandard

    try:
        plains = _decompressor().multi_decompress_to_buffer(frames)
    except (zstandard.ZstdError, ValueError, NotImplementedError, AttributeError):
        return out  # (or a zstandard without it: the CFFI backend, a build on a system libzstd)
    for k, i in enumerate(at):
        out[i] = plains[k].tobytes()
    return out


def _whole_frame(frame: memoryview) -> bool:
    """Whether `frame` is exactly one zstd frame (header, blocks, checksum) declaring a
    size within MAX_PLAIN_SIZE, read from its headers without decoding it."""
    import zstandard

    try:
        declared = zstandard.frame_content_size(frame)
        pos = zstandard.frame_header_size(frame)
    except zstandard.ZstdError:
        return False
    if not 0 <= declared <= MAX_PLAIN_SIZE:
        return False
    end = len(frame)
    while pos + 3 <= end:
        head = frame[pos] | frame[pos + 1] << 8 | frame[pos + 2] << 16
        kind = head >> 1 & 3  # raw, RLE (one byte stored), compressed, reserved
        if kind == 3:
            return False
        pos += 3 + (1 if kind == 1 else head >> 3)
        if head & 1:  # the last block; then the checksum, if the descriptor says so
            return pos + (4 if frame[4] & 4 else 0) == end
    return False


def decode(stored: bytes | bytearray | memoryview, what: str = "blob") -> bytes:
    """Plaintext of an encoded blob; raises Corruption on any malformation. (A
    bytearray, as a read into a buffer gives, costs no copy more than bytes.)"""
    if not stored:
        raise Corruption(f"{what}: empty file")
    codec = stored[0]
    if codec == RAW:
        return bytes(memoryview(stored)[1:])
    if codec == ZSTD:
        import zstandard  # (a dictionary look-up once loaded)

        frame = memoryview(stored)[1:]  # (a view: a slice would copy the frame, twice)
        try:
            # max_output_size only binds frames without a declared size: check that too.
            declared = zstandard.frame_content_size(frame)
            if declared > MAX_PLAIN_SIZE:
                raise Corruption(f"{what}: declares {declared} bytes, over the {MAX_PLAIN_SIZE} limit")
            return _decompressor().decompress(frame, max_output_size=MAX_PLAIN_SIZE, allow_extra_data=False)
        except zstandard.ZstdError as e:
            raise Corruption(f"{what}: zstd frame is corrupt: {e}") from None
    raise Corruption(f"{what}: unknown codec byte {codec}")
