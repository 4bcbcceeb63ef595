"""`casfs serve-replica STORE`: the source's side of a pull (the frames: replica.protocol).

It answers requests in order until the client closes its end. Its start-up is part of
every pull's fixed cost, so it imports what a copying pull asks for only: the bucket's
`where` (replica.adopt) and the fold of a snapshot still in an overlay
(volumes.settle) are imported when a request needs them.
"""

from __future__ import annotations

import json
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

from casfs.catalog import overlay as overlay_rows
from casfs.catalog import volumes as rows
from casfs.errors import CasfsError, NotFound, UsageError
from casfs.ids import SnapshotNo
from casfs.kinds import BlobKind
from casfs.replica.land import offer_of, store_id
from casfs.replica.protocol import FRAME, PROTOCOL, WANT, frame, read_frame
from casfs.replica.walk import read_records
from casfs.replica.wire import Reader, Writer
from casfs.repo import Repository
from casfs.store.ids import BlobId
from casfs.units import check_name


def _handle(repo: Repository, req: dict[str, Any]) -> dict[str, Any]:
    op = req.get("op")
    if op == "hello":
        from casfs.replica.adopt import bucket_of

        return {"protocol": PROTOCOL, "store": store_id(repo), "blobs": bucket_of(repo)}
    if op == "where":
        from casfs.replica.adopt import where

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
        marks = [{"n": n, "root": r.hex()} for n, r in rows.bookmarks(repo.conn, name).items()]
        return {"name": name, "kind": row.kind, "snapshots": snaps, "bookmarks": marks}
    if op == "offer":
        n = SnapshotNo(int(req["n"]))
        if overlay_rows.pending_snapshot(repo.conn, name, n):  # (taken while mounted: its fold may still run)
            from casfs.volumes.settle import wait_folded

            wait_folded(repo, name, n)
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
