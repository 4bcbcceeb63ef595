"""The check every read of a stored blob passes: decode, then re-hash in the id's domain.

One hash when the caller says which domain the id is in (a chunk is data, a tree or a
map metadata); two when it cannot tell, data first (the common case). A blob whose bytes
hash to its id in the other domain than the one asked for is corrupt: ids of the two
domains never name the same content (store.ids), so accepting it would let a file's
bytes pass for a map.
"""

from __future__ import annotations

from collections.abc import Callable

from casfs.errors import Corruption
from casfs.store import Domain, codec
from casfs.store.ids import BlobId, blob_id, meta_id

_HASHES: dict[Domain | None, tuple[Callable[[bytes], BlobId], ...]] = {
    "data": (blob_id,),
    "meta": (meta_id,),
    None: (blob_id, meta_id),
}


def verified(bid: BlobId, stored: bytes, domain: Domain | None) -> bytes:
    """The plaintext of `stored`, the encoded form of blob `bid`; Corruption if it does
    not decode or does not hash to `bid` in `domain` (None: either)."""
    name = bid.hex()
    plain = codec.decode(stored, f"blob {name}")
    hashes = _HASHES[domain]
    if any(h(plain) == bid for h in hashes):
        return plain
    raise Corruption(f"blob {name} is corrupt: its content hashes to {hashes[0](plain).hex()}")
