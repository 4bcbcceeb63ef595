"""Per-snapshot byte counts for CSI answers, behind one function: what casfs counts
today (refcount.usage walks the metadata of a root) is where a cheaper kept figure can
be switched in without touching the servicers.

The walk reads every tree and map page under the root (about 0.3 s for a 1 GiB disk
here), so its result is kept per root: a root is immutable, and the bytes its blobs
take on disk do not change while it exists (only repacking could move them a little).
Snapshots of an unchanged volume share their root, and so their figure."""

from __future__ import annotations

import threading
from collections import OrderedDict

from casfs.refcount.usage import snapshot_usage
from casfs.repo import Repository
from casfs.volumes import SnapshotInfo

KEPT = 4096  # roots whose figure is kept (a few hundred KiB)
_stored: OrderedDict[str, int] = OrderedDict()
_lock = threading.Lock()


def snapshot_stored_bytes(repo: Repository, snap: SnapshotInfo) -> int:
    """Bytes on disk of every blob snapshot `snap` reaches (Snapshot.size_bytes)."""
    with _lock:
        if snap.root in _stored:
            _stored.move_to_end(snap.root)
            return _stored[snap.root]
    stored = snapshot_usage(repo, snap.volume, snap.n).stored
    with _lock:
        _stored[snap.root] = stored
        while len(_stored) > KEPT:
            _stored.popitem(last=False)
    return stored
