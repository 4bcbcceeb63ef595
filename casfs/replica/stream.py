"""Snapshot streams: `casfs snapshot send VOL@N [--since VOL@M] | casfs snapshot receive`.

Format 1, self-describing, every multi-byte integer little-endian:

    magic      b"CASFS-STREAM" u16 format (1)
    header     u32 length, JSON: {"offer": the snapshot (replica.land.Offer: volume, kind,
               mode, chunk size, number, root id, size, next inode, label, time, the id of
               the store that took it), "since": {"n", "root"} or null}
    blobs      b"B" then a blob record (replica.wire: id, kind, length, encoded bytes),
               parents before children; with --since, none reachable from VOL@M
    trailer    b"T" u64 blobs u64 record bytes, then the BLAKE3-256 of every byte before it

The receiver verifies each blob as it arrives (exit 5 if one is not what its id says),
and lands the snapshot (replica.land) in one transaction only after the trailer's
counts and hash matched: a truncated or tampered stream leaves nothing visible (blobs
that arrived verified may stay, unreferenced, for the next try; gc frees them).

Every format, this one and any later one, starts with the magic and the u16 format and
ends with the BLAKE3-256 of every byte before it. So a refusal the header decides (a
format this casfs cannot read, an invalid name, a base this store lacks, a snapshot
held already) is given only once the rest of the stream is read and found intact: a
damaged stream exits 5 whichever byte was hit, as any other corruption does.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

from casfs.catalog import volumes as rows
from casfs.errors import CasfsError, Conflict, Corruption, NotFound, UnsupportedFormat
from casfs.ids import SnapshotNo
from casfs.replica.assemble import Assembler
from casfs.replica.land import Moved, Offer, Plan, check, land, offer_of, root_kind, store_id
from casfs.replica.walk import reachable, read_records, walk
from casfs.replica.wire import Reader, Record, Writer
from casfs.repo import Repository
from casfs.store.ids import BlobId
from casfs.units import check_name
from casfs.volumes.settle import wait_folded

MAGIC = b"CASFS-STREAM"
FORMAT = 1
_HEAD = struct.Struct("<H")
_LEN = struct.Struct("<I")
_COUNTS = struct.Struct("<QQ")
MAX_HEADER = 1 << 20
GROUP = 32  # records verified together (in parallel)


def send(repo: Repository, volume: str, n: SnapshotNo, since: SnapshotNo | None, out: BinaryIO) -> Moved:
    """Write snapshot `volume@n` as a stream (with `since`: only what `volume@since` lacks)."""
    wait_folded(repo, volume, n)
    offer = offer_of(repo, volume, n)
    kind = root_kind(offer.kind)
    skip: set[BlobId] = set()
    base = None
    if since is not None:
        wait_folded(repo, volume, since)
        old = rows.snapshot_row(repo.conn, volume, since)
        if old is None:
            raise NotFound(f"no snapshot {volume}@{since}")
        skip = reachable(repo.get_meta, old.root, kind)
        base = {"n": since, "root": old.root.hex()}
    w = Writer(out, hashing=True, role="sender")
    header = json.dumps({"offer": offer.to_json(), "since": base}).encode()
    w.write(MAGIC + _HEAD.pack(FORMAT) + _LEN.pack(len(header)) + header)
    count = payload = 0
    with ThreadPoolExecutor(2) as pool:
        for r in read_records(repo.blobs, walk(repo.get_meta, offer.root, kind, skip.__contains__), pool):
            w.write(b"B")
            w.record(r)
            count += 1
            payload += len(r.encoded)
    w.write(b"T" + _COUNTS.pack(count, payload))
    assert w.hasher is not None
    w.write(w.hasher.digest())
    out.flush()
    return Moved(volume, n, offer.root.hex(), Plan.NEW, count, w.meter.bytes)


def _header(r: Reader) -> tuple[Offer, dict[str, Any] | None]:
    if r.exact(len(MAGIC)) != MAGIC:
        raise Corruption("not a casfs snapshot stream (bad magic)")
    (version,) = _HEAD.unpack(r.exact(_HEAD.size))
    if version != FORMAT:
        raise UnsupportedFormat(f"stream format {version}; this casfs reads format {FORMAT}")
    (length,) = _LEN.unpack(r.exact(_LEN.size))
    if length > MAX_HEADER:
        raise Corruption(f"stream header of {length} bytes is over the limit")
    try:
        doc = json.loads(r.exact(length))
        return Offer.from_json(doc["offer"]), doc.get("since")
    except (ValueError, KeyError, TypeError) as e:
        raise Corruption(f"stream header is malformed: {e}") from None


def _records(r: Reader) -> Iterator[list[Record]]:
    """The blob records in groups, then the trailer checked (Corruption if it is wrong)."""
    group: list[Record] = []
    count = payload = 0
    while True:
        tag = r.exact(1)
        if tag == b"B":
            rec = r.record()
            group.append(rec)
            count += 1
            payload += len(rec.encoded)
            if len(group) >= GROUP:
                yield group
                group = []
        elif tag == b"T":
            break
        else:
            raise Corruption(f"stream holds an unknown record {tag!r} after {count} blobs")
    if group:
        yield group
    said = _COUNTS.unpack(r.exact(_COUNTS.size))
    assert r.hasher is not None
    digest = r.hasher.digest()
    if r.exact(32) != digest:
        raise Corruption("stream hash mismatch: the stream was changed or damaged on the way")
    if said != (count, payload):
        raise Corruption(f"stream trailer says {said[0]} blobs, {count} arrived")
    if r.f.read(1):
        raise Corruption("stream has bytes after its trailer")


def receive(repo: Repository, inp: BinaryIO, as_name: str | None = None) -> Moved:
    """Read a stream and land its snapshot as volume `as_name` (default: its name)."""
    r = Reader(inp, "the stream", hashing=True, role="receiver")
    try:
        name, offer, base, moved = _plan(repo, r, as_name, mine := store_id(repo))
    except CasfsError as e:
        if e.exit_code != Corruption.exit_code and not _rest_intact(r):
            raise Corruption(
                f"the stream is damaged: its hash does not match (its header read as: {e})"
            ) from None
        raise
    if moved.plan == Plan.HAVE:
        # (the rest read to its end: a pipeline's sender finishes, `set -o pipefail` holds)
        if not _rest_intact(r):
            raise Corruption("stream hash mismatch: the stream was changed or damaged on the way")
        return moved
    with ThreadPoolExecutor(2) as pool, Assembler(repo, offer.root, root_kind(offer.kind), pool) as asm:
        asm.start()
        for group in _records(r):
            asm.arrive(group)
            moved.blobs += len(group)

        def then(conn: Any) -> None:
            moved.plan = check(conn, name, offer, None, mine, base)
            land(conn, name, offer, moved.plan, "stream")

        asm.finish({}, then)
    moved.bytes = r.meter.bytes
    return moved


def _plan(
    repo: Repository, r: Reader, as_name: str | None, mine: str
) -> tuple[str, Offer, SnapshotNo | None, Moved]:
    """What the header asks of this store: the volume's name, the offer, its base, and
    what landing it would do; refused (Corruption, or what the header made of it) if it
    cannot be done."""
    offer, since = _header(r)
    name = check_name(as_name or offer.volume, "volume")
    base: SnapshotNo | None = None
    if since is not None:
        try:
            base, root = SnapshotNo(int(since["n"])), str(since["root"])
        except (ValueError, KeyError, TypeError) as e:
            raise Corruption(f"stream header is malformed: {e}") from None
        held = rows.snapshot_row(repo.conn, name, base)
        if held is None:
            raise NotFound(f"the stream is incremental from {name}@{base}, which this store does not hold")
        if held.root.hex() != root:
            raise Conflict(
                f"the stream is incremental from {name}@{base} of root {root}; "
                f"{name}@{base} here is {held.root.hex()}"
            )
    moved = Moved(name, offer.n, offer.root.hex(), check(repo.conn, name, offer, None, mine, base))
    return name, offer, base, moved


def _rest_intact(r: Reader) -> bool:
    """Read the stream to its end: whether its last 32 bytes are the BLAKE3-256 of every
    byte before them, as every stream format's are. What a header decided (another
    format, a name, a base this store lacks) is said only of an intact stream: a damaged
    one is refused as such (exit 5), whatever byte was hit."""
    assert r.hasher is not None
    tail = b""
    while part := r.f.read(1 << 20):
        tail += part
        if len(tail) > 32:
            r.hasher.update(tail[:-32])
            tail = tail[-32:]
    return len(tail) == 32 and r.hasher.digest() == tail
