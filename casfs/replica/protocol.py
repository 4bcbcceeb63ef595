"""The pull protocol: requests and responses over a child's stdin and stdout
(`casfs serve-replica STORE`, run locally or over ssh).

Every message is a frame: a tag byte, a u32 length (little-endian), the payload.

    client -> server   Q  JSON request: {"op": "hello"} | {"op": "volume", "name"} |
                          {"op": "offer", "name", "n"} | {"op": "image", "name"} |
                          {"op": "where", "ids": [hex]}
                       G  blobs wanted: (id 32 bytes, kind u8) each
    server -> client   R  JSON response        E  JSON error {"code": exit code, "message"}
                       b  one blob record (replica.wire), per id of a G, in its order
                       .  the end of a G's blobs

`hello` names the server's bucket when its blobs are in one ({"blobs": {"bucket",
"prefix", "store"}}); `where` answers, per id, the catalog record and where its bytes
are in the bucket (replica.adopt: a pull through the bucket moves only those).

Responses come in the order of the requests, so a client may keep several in flight
(the server reads requests on a thread of its own: it never stops reading while it
writes, and a client writing requests never waits on it).
"""

from __future__ import annotations

import json
import queue
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

from casfs.catalog import volumes as rows
from casfs.errors import CasfsError, Conflict, Corruption, NotFound, UsageError
from casfs.ids import SnapshotNo
from casfs.kinds import BlobKind
from casfs.replica.adopt import bucket_of, where
from casfs.replica.land import offer_of, store_id
from casfs.replica.walk import read_records
from casfs.replica.wire import Reader, Writer
from casfs.repo import Repository
from casfs.store.ids import ID_SIZE, BlobId
from casfs.units import check_name
from casfs.volumes.settle import wait_folded

PROTOCOL = 1
FRAME = struct.Struct("<cI")
WANT = struct.Struct(f"<{ID_SIZE}sB")
MAX_REQUEST = 16 << 20
ERRORS: dict[int, type[CasfsError]] = {2: UsageError, 3: NotFound, 4: Conflict, 5: Corruption}


def frame(tag: bytes, payload: bytes) -> bytes:
    return FRAME.pack(tag, len(payload)) + payload


def read_frame(r: Reader, limit: int = MAX_REQUEST) -> tuple[bytes, bytes]:
    tag, length = FRAME.unpack(r.exact(FRAME.size))
    if length > limit:
        raise Corruption(f"{r.what}: a frame of {length} bytes is over the limit")
    return tag, r.exact(length)


def error_of(payload: bytes) -> CasfsError:
    """The error an E frame carries, as the class of its exit code."""
    doc = json.loads(payload)
    return ERRORS.get(int(doc.get("code", 1)), CasfsError)(f"the source: {doc.get('message')}")


# -- the server ------------------------------------------------------------------


def _handle(repo: Repository, req: dict[str, Any]) -> dict[str, Any]:
    op = req.get("op")
    if op == "hello":
        return {"protocol": PROTOCOL, "store": store_id(repo), "blobs": bucket_of(repo)}
    if op == "where":
        return {"blobs": where(repo, [BlobId(bytes.fromhex(h)) for h in req["ids"]])}
    if op == "image":
        return _image(repo, check_name(str(req.get("name")), "image"))
    name = check_name(str(req.get("name")), "volume")
    if op == "volume":
        row = rows.volume_row(repo.conn, name)
        if row is None:
            raise NotFound(f"no volume named {name!r}")
        roots = {s.n: s.root.hex() for s in rows.snapshot_rows(repo.conn, name)}
        snaps = [{"n": n, "root": roots.get(n)} for n in rows.snapshot_numbers(repo.conn, name)]
        return {"name": name, "kind": row.kind, "snapshots": snaps}
    if op == "offer":
        n = SnapshotNo(int(req["n"]))
        wait_folded(repo, name, n)  # (taken while mounted: its fold may still run)
        return offer_of(repo, name, n).to_json()
    raise UsageError(f"unknown request {op!r}")


def _image(repo: Repository, name: str) -> dict[str, Any]:
    """A ready image, as `image pull` (replica.image) lands it."""
    from casfs.catalog import images

    row = images.image_row(repo.conn, name)
    if row is None or row.root is None or row.phase != "ready":
        raise NotFound(f"no ready image named {name!r}")
    return {
        "name": name, "kind": str(row.kind), "root": row.root.hex(), "size": row.size,
        "chunk_size": row.chunk_size, "next_ino": row.next_ino, "digest": row.digest, "oci": row.oci,
    }  # fmt: skip


def _requests(r: Reader, q: queue.Queue[tuple[bytes, bytes] | BaseException | None]) -> None:
    try:
        while True:
            q.put(read_frame(r))
    except CasfsError:  # the client closed its end: the session is over
        q.put(None)
    except BaseException as e:
        q.put(e)


def serve(repo: Repository, inp: BinaryIO, out: BinaryIO) -> None:
    """Answer requests until the client closes the connection."""
    q: queue.Queue[tuple[bytes, bytes] | BaseException | None] = queue.Queue()
    reader = threading.Thread(target=_requests, args=(Reader(inp, "the request stream"), q), daemon=True)
    reader.start()
    w = Writer(out, role="sender")
    with ThreadPoolExecutor(2) as pool:
        while (item := q.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            tag, payload = item
            try:
                if tag == b"G":
                    wants = [
                        (BlobId(bid), BlobKind(kind))
                        for bid, kind in (
                            WANT.unpack_from(payload, i) for i in range(0, len(payload), WANT.size)
                        )
                    ]
                    for rec in read_records(repo.blobs, wants, pool):
                        w.write(FRAME.pack(b"b", WANT.size + 4 + len(rec.encoded)))
                        w.record(rec)
                    w.write(frame(b".", b""))
                elif tag == b"Q":
                    w.write(frame(b"R", json.dumps(_handle(repo, json.loads(payload))).encode()))
                else:
                    raise UsageError(f"unknown frame {tag!r}")
            except CasfsError as e:
                w.write(frame(b"E", json.dumps({"code": e.exit_code, "message": str(e)}).encode()))
            except (ValueError, KeyError, TypeError) as e:  # a malformed request
                w.write(frame(b"E", json.dumps({"code": 2, "message": f"bad request: {e}"}).encode()))
            out.flush()
