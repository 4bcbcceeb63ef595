"""What CreateVolume was asked, kept per volume in STORE/csi/volumes/<id>.json.

CSI's idempotency is by request: a repeat with a compatible request returns the volume,
another one is ALREADY_EXISTS. casfs's volume spec holds what casfs needs (the source,
the size of a block volume) but not all a request says (a directory volume's capacity,
the StorageClass parameters, a clone's source volume, where the snapshot it was cloned
through is one casfs made). Hence a file beside the catalog rather than a schema change:
it is the CSI layer's alone, and nothing else reads it.

Crash ordering: the record is written after the volume is created, without an fsync
(two fsyncs were half a clone's time): a crash may lose it, and then a repeated
CreateVolume falls back on casfs's own idempotent create, which compares the volume's
casfs spec (its source, a block volume's size), and writes the record again. What only
the record holds (a directory volume's capacity, the parameters) is then taken from the
repeat. An expansion's record is written durably. A record is removed after its volume;
one left behind (the volume deleted with the CLI) names its volume's creation time, so
it never speaks for another volume made later under the same name.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
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


def write(store: Path, volume_id: str, doc: dict[str, Any], durable: bool = False) -> None:
    """Replace the record whole (a reader sees the old one or the new one)."""
    path = _path(store, volume_id)
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, sort_keys=True)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def remove(store: Path, volume_id: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        _path(store, volume_id).unlink()  # (a record outliving a crash: replaced by the next create)
