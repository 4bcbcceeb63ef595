"""Blob ids: the BLAKE3-256 of a blob's plaintext."""

from __future__ import annotations

from typing import NewType

import blake3

BlobId = NewType("BlobId", bytes)

ID_SIZE = 32
# Names "no blob": a hole in a chunk map, an empty file. Never stored.
ZERO_ID = BlobId(bytes(ID_SIZE))
# blake3 hashes inputs this large on several threads (rayon); below it that costs more than
# it saves. (It releases the GIL from 2 KiB up either way: blake3-py's GIL_MINSIZE.)
_THREADED_HASH_MIN = 1 << 20


def blob_id(data: bytes | memoryview) -> BlobId:
    if len(data) >= _THREADED_HASH_MIN:
        return BlobId(blake3.blake3(data, max_threads=blake3.blake3.AUTO).digest())
    return BlobId(blake3.blake3(data).digest())


# Metadata (trees, chunk maps) is hashed in BLAKE3's key-derivation mode, so its ids
# can never equal a data chunk's: a file whose bytes happen to equal a map root must not
# be deduplicated with that map, or the map's children would go uncounted and be freed.
_META_CONTEXT = "casfs 2026-11 metadata blob v1"


def meta_id(data: bytes | memoryview) -> BlobId:
    return BlobId(blake3.blake3(data, derive_key_context=_META_CONTEXT).digest())


def is_zero(data: bytes | memoryview) -> bool:
    """True when every byte is zero (a hole). Fast: compares against a zero buffer
    (with bytes; a memoryview compares item by item, so one that starts with a zero is
    copied first; most chunks that are not holes are told by their first byte)."""
    n = len(data)
    if n == 0:
        return True
    if data[0] != 0:
        return False
    if isinstance(data, memoryview):
        data = data.tobytes()
    return data == _zeros(n)


_ZERO_CACHE: dict[int, bytes] = {}


def _zeros(n: int) -> bytes:
    z = _ZERO_CACHE.get(n)
    if z is None:
        z = bytes(n)
        if len(_ZERO_CACHE) < 64:
            _ZERO_CACHE[n] = z
    return z
