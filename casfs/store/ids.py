"""Blob ids: the BLAKE3-256 of a blob's plaintext."""

from __future__ import annotations

from typing import NewType

import blake3

BlobId = NewType("BlobId", bytes)

ID_SIZE = 32
# Names "no blob": a hole in a chunk map, an empty file. Never stored.
ZERO_ID = BlobId(bytes(ID_SIZE))
# blake3 releases the GIL for inputs this large; below it threading costs more than it saves.
_THREADED_HASH_MIN = 1 << 20


def blob_id(data: bytes | memoryview) -> BlobId:
    if len(data) >= _THREADED_HASH_MIN:
        return BlobId(blake3.blake3(data, max_threads=blake3.blake3.AUTO).digest())
    return BlobId(blake3.blake3(data).digest())


def hex_id(bid: bytes) -> str:
    return bid.hex()


def parse_hex_id(text: str) -> BlobId:
    raw = bytes.fromhex(text)
    if len(raw) != ID_SIZE:
        raise ValueError(f"a blob id is {ID_SIZE} bytes, got {len(raw)}")
    return BlobId(raw)


def is_zero(data: bytes | memoryview) -> bool:
    """True when every byte is zero (a hole). Fast: compares against a zero buffer
    (with bytes; a memoryview compares item by item, so it is copied first)."""
    if isinstance(data, memoryview):
        data = data.tobytes()
    n = len(data)
    return n == 0 or (data[0] == 0 and data == _zeros(n))


_ZERO_CACHE: dict[int, bytes] = {}


def _zeros(n: int) -> bytes:
    z = _ZERO_CACHE.get(n)
    if z is None:
        z = bytes(n)
        if len(_ZERO_CACHE) < 64:
            _ZERO_CACHE[n] = z
    return z
