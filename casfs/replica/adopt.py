"""Pull through the bucket: when the source keeps its blobs in the same bucket as this
store (another prefix), a pull adopts them (casfs.store.s3.pins) instead of copying
them, and only catalog records cross the connection.

The receiver walks the snapshot as a copying pull does (replica.pull), but asks `where`
instead of for the blobs: per missing id, the source's catalog record (kind, size) and
where its bytes are (a pack in the bucket, offset, length; a blob the source itself
adopted is named in its owner's pack). It reads the metadata among them from the
bucket (verified: their children are the next ids to ask for), pins the packs, and
stages every blob as adopted; the landing commit is the copying pull's. A pack its
owner is deleting (the pin refused) is read from the bucket and its blobs copied.

The same bucket is proven, not assumed: the source's claim object (casfs-store.json in
its prefix), read with this store's client, must name the source's store id.
"""

from __future__ import annotations

import json
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from casfs.catalog import blobs as blob_rows
from casfs.errors import CasfsError, Corruption
from casfs.kinds import BlobKind
from casfs.repo import Repository
from casfs.store.ids import BlobId

if TYPE_CHECKING:
    from casfs.replica.assemble import Assembler, Want
    from casfs.replica.land import Moved
    from casfs.replica.peers import Connection
    from casfs.store.s3.staging import S3Staging
    from casfs.store.s3.store import S3BlobStore
    from casfs.store.s3.table import Foreign

BATCH = 1024  # ids per `where` request


def _s3(repo: Repository) -> S3BlobStore | None:
    if type(repo.blobs).__name__ != "S3BlobStore":  # (no S3 import for a file store)
        return None
    return cast("S3BlobStore", repo.blobs)


# -- the source's side --------------------------------------------------------------


def bucket_of(repo: Repository) -> dict[str, str] | None:
    """Where this store's blobs are, for `hello`: None if not in a bucket."""
    s3 = _s3(repo)
    if s3 is None:
        return None
    return {"bucket": s3.loc.bucket, "prefix": s3.loc.prefix, "store": s3.loc.store_id}


def where(repo: Repository, ids: Sequence[BlobId]) -> list[list[Any] | None]:
    """Per id: [kind, size, owner prefix, owner store, pack, pack size, offset, length],
    or None if this store has no row for it (or no bytes)."""
    s3 = _s3(repo)
    records = dict(blob_rows.rows_of(repo.conn, ids))
    out: list[list[Any] | None] = []
    for bid in ids:
        row = records.get(bid)
        found = s3.where(bid) if s3 is not None and row is not None else None
        if row is None or found is None:
            out.append(None)
            continue
        f, pack_size, offset, length = found
        out.append([row.kind, row.size, f.prefix, f.store, f.pack, pack_size, offset, length])
    return out


# -- the receiver's side ------------------------------------------------------------


def shared_bucket(repo: Repository, hello: dict[str, Any]) -> S3BlobStore | None:
    """This store's blobs, if the source's are in another prefix of the same bucket
    (and this store's client reads the source's claim there); None: copy."""
    s3 = _s3(repo)
    theirs = hello.get("blobs")
    if s3 is None or not isinstance(theirs, dict):
        return None
    if theirs.get("bucket") != s3.loc.bucket or theirs.get("prefix") == s3.loc.prefix:
        return None
    from casfs.store.s3 import packfmt

    try:
        claim = json.loads(s3.remote_for(str(theirs["prefix"])).get(packfmt.CLAIM))
    except (OSError, ValueError):  # (absent, unreadable: another server's bucket of that name)
        return None
    return s3 if isinstance(claim, dict) and claim.get("store") == theirs.get("store") else None


@dataclass(frozen=True)
class Located:
    kind: BlobKind
    size: int
    foreign: Foreign
    pack_size: int
    offset: int
    length: int


def _located(bid: BlobId, doc: Any) -> Located:
    from casfs.store.s3.table import Foreign

    if doc is None:
        raise Corruption(f"the source has no blob {bid.hex()} of the snapshot it offers")
    try:
        kind, size, prefix, store, pack, pack_size, offset, length = doc
        return Located(
            BlobKind(kind), int(size), Foreign(str(prefix), str(store), str(pack)), int(pack_size),
            int(offset), int(length),
        )  # fmt: skip
    except (ValueError, TypeError) as e:
        raise Corruption(f"the source said where blob {bid.hex()} is in a form not understood: {e}") from None


def adopt(
    conn: Connection,
    asm: Assembler,
    s3: S3BlobStore,
    moved: Moved,
    progress: Callable[[int], None] | None,
) -> None:
    """Walk and adopt until nothing under the root is missing (all in the metadata
    batch: one publish, one commit, and a rerun after a crash moves only records)."""
    todo: deque[Want] = deque(asm.start())
    while todo:
        part = [todo.popleft() for _ in range(min(BATCH, len(todo)))]
        before = conn.r.meter.bytes
        answer = conn.request("where", ids=[bid.hex() for bid, _ in part])["blobs"]
        if not isinstance(answer, list) or len(answer) != len(part):
            raise Corruption(f"{conn.source} answered where for another number of blobs")
        todo.extend(
            _take(asm, s3, part, [_located(b, d) for (b, _), d in zip(part, answer, strict=True)], moved)
        )
        moved.blobs += len(part)
        if progress is not None:
            progress(conn.r.meter.bytes - before)


def _take(
    asm: Assembler, s3: S3BlobStore, part: Sequence[Want], located: Sequence[Located], moved: Moved
) -> list[Want]:
    """Adopt (or copy) one batch; returns what its metadata names that is missing."""
    from casfs.snapshots.children import children  # (here: `hello` imports this module)
    from casfs.store.verified import verified

    for (bid, kind), loc in zip(part, located, strict=True):
        if loc.kind != kind:
            raise Corruption(f"blob {bid.hex()} is a {loc.kind.label} there, wanted as a {kind.label}")
    staging = cast("S3Staging", asm.meta.staging)
    refused = staging.pin({loc.foreign: loc.pack_size for loc in located})
    items = list(zip(part, located, strict=True))

    def read(item: tuple[Want, Located]) -> tuple[bytes, bytes]:
        (bid, kind), loc = item
        try:
            stored = s3.read_foreign(loc.foreign, loc.offset, loc.length)
        except FileNotFoundError:
            raise CasfsError(
                f"blob {bid.hex()}: its pack {loc.foreign.pack} in {loc.foreign.prefix} was deleted "
                "by the source's gc during the pull: run it again"
            ) from None
        return stored, verified(bid, stored, "data" if kind == BlobKind.DATA else "meta")

    needed = [it for it in items if it[0][1] != BlobKind.DATA or it[1].foreign in refused]
    read_back = dict(zip([it[0][0] for it in needed], asm.pool.map(read, needed), strict=True))
    found: list[Want] = []
    for (bid, kind), loc in items:
        stored, plain = read_back.get(bid, (b"", b""))
        named = list(children(kind, plain)) if kind != BlobKind.DATA else []
        moved.bucket_bytes += len(stored)
        if loc.foreign in refused:
            if asm.meta.put(plain, kind) != bid:
                raise Corruption(f"blob {bid.hex()} does not store under its id")
            moved.copied += 1
        else:
            staging.adopt(bid, loc.foreign, loc.offset, loc.length)
            asm.meta.adopted(bid, kind, loc.size, loc.length, Counter(c for c, _ in named))
            if stored:
                s3.cache.put(bid, stored)  # (metadata: what a mount reads first)
            moved.adopted += 1
        asm.took(bid)
        found.extend(asm.missing(named))
    return found
