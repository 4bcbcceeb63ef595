"""Ephemeral volumes: created with a grace period (`volume create --grace 10m`), removed
by `casfs gc` once unused for longer than that, like a volume manager's timer for
unclaimed volumes.

"Used" means mounted: the daemon calls catalog.volumes.touch() at mount and at unmount, and a
volume counts as in use while a read/write daemon holds it (phase mounted) or a live
daemon serves it alone read-only (its run file STORE/run/*.json names the volume).
Unused since = last_used, or the creation time. A volume is skipped, not removed, when
another volume was made from one of its snapshots.

Limitation: a whole-store mount (no --volume) reading volumes/NAME read-only does not
count as a use.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from casfs.catalog import transaction
from casfs.catalog import volumes as rows
from casfs.errors import Busy
from casfs.lifecycle.pids import alive

if TYPE_CHECKING:
    from casfs.repo import Repository


def expire(repo: Repository, now: float | None = None, kept: list[str] | None = None) -> list[str]:
    """Remove ephemeral volumes past their grace; returns their names. Why an expired
    volume was kept is appended to `kept` when given."""
    from casfs.volumes import finish_delete, mark_deleting

    now = time.time() if now is None else now
    conn = repo.conn
    names = rows.expired(conn, now)
    served = _served_volumes(repo.path) if names else set()
    removed = []
    for name in names:
        if name in served:
            continue
        try:
            with transaction(conn):
                # Again under the write lock: a mount since the SELECT has touched it.
                if rows.expired(conn, now, name):
                    mark_deleting(conn, name)
                else:
                    continue
        except Busy as e:
            if kept is not None:
                kept.append(f"{name}: {e}")
            continue
        finish_delete(repo, name)
        removed.append(name)
    return removed


def _served_volumes(store: Path) -> set[str]:
    """Volumes a live daemon serves alone (casfs.fuse.daemon writes one run file per mount)."""
    served = set()
    for path in (store / "run").glob("*.json"):
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        if (
            isinstance(doc, dict)
            and doc.get("state") == "mounted"
            and doc.get("volume")
            and alive(doc.get("pid"))
        ):
            served.add(str(doc["volume"]))
    return served
