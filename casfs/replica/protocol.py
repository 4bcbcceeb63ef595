"""The pull protocol: requests and responses over a child's stdin and stdout
(`casfs serve-replica STORE`, run locally or over ssh: replica.serve).

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
(the server, replica.serve, reads requests on a thread of its own: it never stops
reading while it writes, and a client writing requests never waits on it). This module
is the framing both sides share: a pull imports none of the server.
"""

from __future__ import annotations

import json
import struct

from casfs.errors import CasfsError, Conflict, Corruption, NotFound, UsageError
from casfs.replica.wire import Reader
from casfs.store.ids import ID_SIZE

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
