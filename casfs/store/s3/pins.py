"""Two stores, one bucket: a store adopts blobs of another store's packs without copying
them, and the owner never deletes or rewrites a pack an adopter relies on.

Each store keeps its own prefix. An adopter (B) relies on a pack P of an owner (A)
through two objects (packfmt):

    A/refs/P/<B's id>.<tag>    the reference: B relies on P (written first)
    B/adopted/P.<tag>          B's index of the blobs it uses in P (at B's publish)

A's gc (remove_pack: a pack whose blobs are all dead in A, or one repack rewrote) and B's
adoption race for P. On an S3 server with strong read-after-write consistency (AWS
since 2020, Ceph RGW, SeaweedFS, MinIO) a Dekker-style handshake closes it:

    A (may_remove): write A/deleting/P, then list A/refs/P/: any reference -> remove the
                    marker and keep P (a later gc tries again)
    B (pin):        write A/refs/P/…, then look for A/deleting/P and for P itself: the
                    marker there or P gone -> remove the reference and do not adopt P
                    (the caller copies those blobs instead)

Each side writes before it reads, so at least one of them sees the other: A never
deletes a pack B pinned, and B never adopts a pack A is deleting. (A deletes its marker
only after P, so a B that finds no marker and then finds P is safe.) Both may back
off; neither loses data.

B unpins when its own gc drops its last use of the adopted object (the reference first,
then B/adopted/…: a crash in between leaves an adopted object no catalog row names,
whose blobs B's next gc sweeps). A reference written by a batch that died before
publishing is removed by recover_staging (the batch records it in a .ref file first).

A reference can outlive its adopter (a store thrown away holding adopted blobs, a host
that died mid-pull and never came back). So A's gc, finding references on a pack it
would delete, drops those older than STALE_AFTER_S whose adopted object does not exist.
That is safe because an adopter publishes only on pins younger than PIN_VALID_S by its
own clock (staging), half of STALE_AFTER_S: a reference old enough to be reaped is one
no batch will publish on, and one a published adopted object names is never reaped
(B deletes its reference before its adopted object, never after).
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

from casfs.store.s3 import packfmt
from casfs.store.s3.table import Foreign

if TYPE_CHECKING:
    from casfs.store.s3.store import S3BlobStore

log = logging.getLogger(__name__)

STALE_AFTER_S = 24 * 3600.0  # a reference younger than this is never taken for stale
PIN_VALID_S = STALE_AFTER_S / 2  # an adopter publishes only on pins younger than this


def tag_of(name: str) -> str:
    """The tag of an adopted object's name `<pack>.<tag>`."""
    return name.rsplit(".", 1)[1]


def pin(store: S3BlobStore, foreign: Foreign, tag: str) -> bool:
    """The adopter's side: reference `foreign`'s pack for adopted/<pack>.<tag>; False
    (and no reference left) if the owner is deleting the pack or it is gone."""
    owner = store.remote_for(foreign.prefix)
    key = packfmt.ref_key(foreign.pack, store.loc.store_id, tag)
    doc = {"prefix": store.loc.prefix, "adopted": f"{foreign.pack}.{tag}", "time": time.time()}
    owner.put_new(key, json.dumps(doc).encode())
    if owner.exists(packfmt.marker_key(foreign.pack)) or not owner.exists(packfmt.pack_key(foreign.pack)):
        owner.delete([key])
        return False
    return True


def unpin(store: S3BlobStore, foreign: Foreign, tag: str) -> None:
    store.remote_for(foreign.prefix).delete([packfmt.ref_key(foreign.pack, store.loc.store_id, tag)])


def may_remove(store: S3BlobStore, name: str) -> bool:
    """The owner's side, before deleting or rewriting its pack `name`: True if no store
    relies on it (then call removed() once it is gone); False: keep it."""
    store.remote.put_new(packfmt.marker_key(name), json.dumps({"time": time.time()}).encode())
    refs = list(store.remote.list_dated(f"refs/{name}/"))
    if [key for key, made in refs if not _reaped(store, key, made)]:  # (each one looked at)
        store.remote.delete([packfmt.marker_key(name)])
        return False
    return True


def _reaped(store: S3BlobStore, key: str, made: float) -> bool:
    """Remove reference `key` if it is stale (see above); True if it is gone."""
    if time.time() - made < STALE_AFTER_S:
        return False
    try:
        doc = json.loads(store.remote.get(key))
        adopter, adopted = store.remote_for(str(doc["prefix"])), packfmt.adopted_key(str(doc["adopted"]))
    except FileNotFoundError:
        return True
    except (ValueError, KeyError, TypeError):
        return False  # (not one casfs wrote: kept)
    try:
        if adopter.exists(adopted):
            return False
    except OSError as e:  # (the adopter's prefix unreadable with our credentials: kept)
        log.warning("cannot tell whether reference %s is stale: %s", key, e)
        return False
    log.warning("removing stale reference %s: its adopter's %s is gone", key, adopted)
    store.remote.delete([key])
    return True


def removed(store: S3BlobStore, name: str) -> None:
    """The pack is gone: its marker goes last."""
    store.remote.delete([packfmt.marker_key(name)])


def pinned(store: S3BlobStore) -> set[str]:
    """This store's packs that another store relies on (one listing): repack leaves
    them as they are."""
    return {key.split("/")[1] for key, _ in store.remote.list("refs/")}
