"""The objects an S3 store writes under its prefix (restic's repository is the model):

    packs/<name>            a pack file (store.packfile: blobs after a header of
                            b"casfspk1" and 16 random bytes). <name> is the BLAKE3 of the
                            whole object; the random bytes make every pack a writer
                            uploads new, so a conditional create never meets an older
                            copy (a damaged one, or one gc is deleting).
    index/<name>            the pack's index, written after the pack: b"casfsix1", the
                            pack's size (u64), the entry count (u32), then per blob its
                            id (32 bytes), offset (u64) and stored length (u32), then the
                            BLAKE3 of all that. A blob is published when an index names it.
    dead/<name>/<id hex>    an empty object: that blob of that pack was deleted (gc);
                            removed with the pack once none of its blobs is live.

    casfs-store.json        which store owns the prefix: {"store": uuid, "host", "path"},
                            written once by `casfs init --blobs`. One store per prefix:
                            a second store's init on it is refused (its gc would see the
                            first store's blobs as orphans and delete them).

Adoption (another store on the same bucket uses this store's packs; store/s3/pins.py):

    adopted/<pack>.<tag>    in the adopter's prefix: blobs it uses from another store's
                            pack: b"casfsad1", u16 length, JSON {"owner": the owner's
                            prefix, "store": its id, "pack": <pack>}, then an index
                            (as above, entries of the blobs adopted). <tag> is random:
                            each adopting batch writes its own.
    refs/<pack>/<store>.<tag>   in the owner's prefix: adopter <store> relies on <pack>
                            through its adopted/<pack>.<tag>; JSON {"prefix", "adopted"}.
                            The owner never deletes or rewrites a pack with a reference.
    deleting/<pack>         in the owner's prefix: its gc is about to delete <pack>
                            (written before it looks for references; removed after).

All are written with If-None-Match: * and never change. Little-endian throughout.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable

import blake3

from casfs.errors import Corruption
from casfs.store.ids import ID_SIZE, BlobId
from casfs.store.packfile import PACK_HEADER_SIZE
from casfs.store.packfile import Entry as Entry

INDEX_MAGIC = b"casfsix1"
ADOPTED_MAGIC = b"casfsad1"
CLAIM = "casfs-store.json"
_HEAD = struct.Struct("<8sQI")
_ENTRY = struct.Struct(f"<{ID_SIZE}sQI")
_U16 = struct.Struct("<H")


def pack_name(pack: bytes | memoryview) -> str:
    return blake3.blake3(pack).hexdigest()


def pack_key(name: str) -> str:
    return f"packs/{name}"


def index_key(name: str) -> str:
    return f"index/{name}"


def dead_key(name: str, bid: BlobId) -> str:
    return f"dead/{name}/{bid.hex()}"


def adopted_key(name: str) -> str:
    return f"adopted/{name}"


def ref_key(pack: str, store: str, tag: str) -> str:
    return f"refs/{pack}/{store}.{tag}"


def marker_key(pack: str) -> str:
    return f"deleting/{pack}"


def encode_index(pack_size: int, entries: Iterable[Entry]) -> bytes:
    body = bytearray()
    n = 0
    for bid, offset, length in entries:
        body += _ENTRY.pack(bid, offset, length)
        n += 1
    out = _HEAD.pack(INDEX_MAGIC, pack_size, n) + body
    return out + blake3.blake3(out).digest()


def decode_index(data: bytes, what: str) -> tuple[int, list[Entry]]:
    """(pack size, entries); Corruption if `data` is not a whole, intact index."""
    if len(data) < _HEAD.size + ID_SIZE or blake3.blake3(data[:-ID_SIZE]).digest() != data[-ID_SIZE:]:
        raise Corruption(f"{what} is corrupt: its checksum does not match")
    magic, size, n = _HEAD.unpack_from(data)
    if magic != INDEX_MAGIC or len(data) != _HEAD.size + n * _ENTRY.size + ID_SIZE:
        raise Corruption(f"{what} is corrupt: bad header")
    entries = []
    for i in range(n):
        bid, offset, length = _ENTRY.unpack_from(data, _HEAD.size + i * _ENTRY.size)
        if offset < PACK_HEADER_SIZE or offset + length > size:
            raise Corruption(f"{what} is corrupt: entry {i} lies outside its pack")
        entries.append((BlobId(bid), offset, length))
    return size, entries


def encode_adopted(owner: str, store: str, pack: str, pack_size: int, entries: Iterable[Entry]) -> bytes:
    head = json.dumps({"owner": owner, "store": store, "pack": pack}).encode()
    return ADOPTED_MAGIC + _U16.pack(len(head)) + head + encode_index(pack_size, entries)


def decode_adopted(data: bytes, what: str) -> tuple[dict[str, str], int, list[Entry]]:
    """(header: owner, store, pack; the pack's size; entries); Corruption if damaged."""
    start = len(ADOPTED_MAGIC) + _U16.size
    if len(data) < start or not data.startswith(ADOPTED_MAGIC):
        raise Corruption(f"{what} is corrupt: bad header")
    (n,) = _U16.unpack_from(data, len(ADOPTED_MAGIC))
    try:
        head = json.loads(data[start : start + n])
        owner = {k: str(head[k]) for k in ("owner", "store", "pack")}
    except (ValueError, KeyError, TypeError):
        raise Corruption(f"{what} is corrupt: bad header") from None
    size, entries = decode_index(data[start + n :], what)
    return owner, size, entries
