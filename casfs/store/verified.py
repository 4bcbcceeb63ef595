"""The check every read of a stored blob passes: decode, then re-hash in the id's domain.

One hash when the caller says which domain the id is in (a chunk is data, a tree or a
map metadata) and the blob is in it; the other domain is tried only after a mismatch.
Either domain's hash proves the bytes are the ones written under that id: the domains
keep a data chunk from being *deduplicated* with a map when blobs are written (store.ids),
while stores made before metadata had its own domain (catalog format 1) named their trees
and maps by the data hash, and must stay readable (tests/test_migration.py opens one).
"""

from __future__ import annotations

from collections.abc import Callable

from casfs.errors import Corruption
from casfs.store import BlobStore, Domain, codec
from casfs.store.ids import BlobId, blob_id, meta_id

_HASHES: dict[Domain | None, tuple[Callable[[bytes], BlobId], Callable[[bytes], BlobId]]] = {
    "data": (blob_id, meta_id),
    "meta": (meta_id, blob_id),
    None: (blob_id, meta_id),
}


Stored = bytes | bytearray | memoryview  # (a memoryview: a blob's slice of a run's read)


def verified(bid: BlobId, stored: Stored, domain: Domain | None, plain: bytes | None = None) -> bytes:
    """The plaintext of `stored`, the encoded form of blob `bid`; Corruption if it does
    not decode or does not hash to `bid` (in `domain` first; None: data first). `plain`:
    `stored` already decoded (codec.decode_many), still to be checked."""
    try:
        if plain is None:
            plain = codec.decode(stored)
    except Corruption as e:  # (named here, not for every read: the hex costs as much as the check)
        raise Corruption(f"blob {bid.hex()}{str(e).removeprefix('blob')}") from None
    first, other = _HASHES[domain]
    if first(plain) == bid or other(plain) == bid:
        return plain
    raise Corruption(f"blob {bid.hex()} is corrupt: its content hashes to {first(plain).hex()}")


def checked(
    store: BlobStore, bid: BlobId, stored: Stored, domain: Domain | None, plain: bytes | None = None
) -> bytes:
    """verified(); a blob that fails it is first recorded damaged in `store` (get's promise)."""
    try:
        return verified(bid, stored, domain, plain)
    except Corruption:
        store.mark_damaged(bid)
        raise
