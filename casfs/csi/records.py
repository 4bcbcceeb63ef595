"""What CreateVolume was asked, kept per volume in STORE/csi/volumes/<id>.json.

CSI's idempotency is by request: a repeat with a compatible request returns the volume,
another one is ALREADY_EXISTS. casfs's volume spec holds what casfs needs (the source,
the size of a block volume) but not all a request says (a directory volume's capacity,
the StorageClass parameters, a clone's source volume, where the snapshot it was cloned
through is one casfs made). Hence a file beside the catalog rather than a schema change:
it is the CSI layer's alone, and nothing else reads it.

Crash ordering: the record is written (durably) before the volume is created and
removed after it is deleted, so a volume CSI made always has one; a record without a
volume is a create or delete that did not finish, and the next CreateVolume of that
name replaces it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from casfs.store.local import fsync_dir


def _path(store: Path, volume_id: str) -> Path:
    return store / "csi" / "volumes" / f"{volume_id}.json"


def read(store: Path, volume_id: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(_path(store, volume_id).read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def write(store: Path, volume_id: str, doc: dict[str, Any]) -> None:
    path = _path(store, volume_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def remove(store: Path, volume_id: str) -> None:
    path = _path(store, volume_id)
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)
