"""containerd's snapshots as the snapshotter keeps them: one catalog row each
(catalog.ctrsnapshots), read and changed here in transactions.

A snapshot's phase is its lock across processes and restarts, as a volume's is:

    preparing    its volume is being made and mounted (Prepare, View); a crash: undone
    ready        at rest (committed) or mounted (active, view)
    committing   its volume is being unmounted and snapshotted; a crash: active again
    removing     its mount and volume are being removed; a crash: the removal finished

Names (containerd's keys) are free text; each active snapshot's volume is named from a
hash of its key and a random tail (volume_name), which casfs's volume names allow
whatever the key holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from dataclasses import dataclass, field

from casfs.catalog import ctrsnapshots as rows
from casfs.catalog import read_transaction, transaction
from casfs.errors import Conflict, NotFound, UsageError
from casfs.grpcsvc.codes import InUse, Pending
from casfs.lifecycle import pids
from casfs.repo import Repository

KINDS = ("view", "active", "committed")
PHASES = ("preparing", "ready", "committing", "removing")
MAX_KEY = 4096  # bytes of a key or label (containerd's keys are a few hundred)
VOLUME_PREFIX = "ctr-"


class NotActive(InUse):
    """A commit of a snapshot that is not active, a child of one that is not committed."""


@dataclass
class Record:
    key: str
    kind: str
    parent: str = ""
    volume: str = ""
    snapshot: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    created: float = 0.0
    updated: float = 0.0
    phase: str = "ready"
    owner_pid: int | None = None

    @property
    def ref(self) -> str:
        """The casfs snapshot a committed record is (VOL@N)."""
        return f"{self.volume}@{self.snapshot}"

    def row(self) -> rows.CtrRow:
        return rows.CtrRow(
            self.key,
            self.kind,
            self.phase,
            self.owner_pid,
            self.parent,
            self.volume,
            self.snapshot,
            json.dumps(self.labels, sort_keys=True),
            self.created,
            self.updated,
        )


def _record(r: rows.CtrRow) -> Record:
    labels = json.loads(r.labels)
    return Record(
        r.key, r.kind, r.parent, r.volume, r.snapshot, labels, r.created, r.updated, r.phase, r.owner_pid
    )


def volume_name(key: str, unique: bool = False) -> str:
    """`unique`: a new name each time (a key prepared again after its removal gets a
    volume of its own: the store mount's kernel may still hold the old name's entry)."""
    tail = f"-{secrets.token_hex(4)}" if unique else ""
    return VOLUME_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:32] + tail


def check_key(key: str, what: str = "key") -> str:
    if not key:
        raise UsageError(f"a snapshot {what} is required")
    if len(key.encode()) > MAX_KEY or "\0" in key:
        raise UsageError(f"invalid snapshot {what}: at most {MAX_KEY} bytes, no NUL")
    return key


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    for k, v in labels.items():
        if not k or len(k.encode()) + len(v.encode()) > MAX_KEY:
            raise UsageError(f"invalid label {k[:64]!r}: a key, and key and value at most {MAX_KEY} bytes")
    return dict(labels)


def get(repo: Repository, key: str) -> Record:
    with read_transaction(repo.conn) as conn:
        r = rows.row(conn, key)
    if r is None:
        raise NotFound(f"snapshot {key!r} does not exist")
    return _record(r)


def find(repo: Repository, key: str) -> Record | None:
    r = rows.row(repo.conn, key)
    return None if r is None else _record(r)


def every(repo: Repository) -> list[Record]:
    with read_transaction(repo.conn) as conn:
        return [_record(r) for r in rows.rows(conn)]


def claim_new(repo: Repository, rec: Record) -> None:
    """Record a new snapshot in phase preparing (this process its owner): AlreadyExists
    if the key is taken; NotFound or FailedPrecondition if the parent is not a committed
    snapshot."""
    now = time.time()
    rec.created = rec.updated = now
    rec.phase, rec.owner_pid = "preparing", os.getpid()
    with transaction(repo.conn) as conn:
        if rows.row(conn, rec.key) is not None:
            raise Conflict(f"snapshot {rec.key!r} already exists")
        if rec.parent:
            parent = rows.row(conn, rec.parent)
            if parent is None:
                raise NotFound(f"parent snapshot {rec.parent!r} does not exist")
            if parent.kind != "committed" or parent.phase != "ready":
                raise NotActive(f"parent snapshot {rec.parent!r} is not a committed snapshot")
        rows.insert(conn, rec.row())


def take(repo: Repository, key: str, phase: str, kinds: tuple[str, ...]) -> Record:
    """Move a ready snapshot of one of `kinds` to `phase` (this process its owner); a
    snapshot some live process holds in another phase is ABORTED; a dead one's is
    recovered first by the caller (recover)."""
    with transaction(repo.conn) as conn:
        r = rows.row(conn, key)
        if r is None:
            raise NotFound(f"snapshot {key!r} does not exist")
        if r.phase != "ready":
            raise Pending(f"snapshot {key!r} is {r.phase} (process {r.owner_pid})")
        if r.kind not in kinds:
            raise NotActive(f"snapshot {key!r} is {r.kind}, not {' or '.join(kinds)}")
        if phase == "removing":
            kids = rows.children(conn, key)
            if kids:
                raise InUse(f"snapshot {key!r} has children: {', '.join(kids[:3])}")
        rows.update(conn, key, phase=phase, owner_pid=os.getpid(), updated=time.time())
        return _record(r._replace(phase=phase, owner_pid=os.getpid()))


def settle(repo: Repository, key: str, phase: str = "ready", **values: object) -> None:
    """Set a snapshot's phase (and other columns) back: the end of an operation."""
    with transaction(repo.conn) as conn:
        rows.update(conn, key, phase=phase, owner_pid=None, updated=time.time(), **values)


def committed(repo: Repository, active: Record, name: str, snapshot: int, labels: dict[str, str]) -> Record:
    """In one transaction: the active record `active` gone, the committed `name` in its place."""
    now = time.time()
    rec = Record(name, "committed", active.parent, active.volume, snapshot, labels, now, now)
    with transaction(repo.conn) as conn:
        if rows.row(conn, name) is not None:
            raise Conflict(f"snapshot {name!r} already exists")
        rows.delete(conn, active.key)
        rows.insert(conn, rec.row())
    return rec


def name_free(repo: Repository, name: str) -> None:
    if find(repo, name) is not None:
        raise Conflict(f"snapshot {name!r} already exists")


def forget(repo: Repository, key: str) -> None:
    with transaction(repo.conn) as conn:
        rows.delete(conn, key)


def set_labels(repo: Repository, key: str, labels: dict[str, str]) -> Record:
    with transaction(repo.conn) as conn:
        r = rows.row(conn, key)
        if r is None:
            raise NotFound(f"snapshot {key!r} does not exist")
        rows.update(conn, key, labels=json.dumps(labels, sort_keys=True), updated=time.time())
        r = rows.row(conn, key)
        assert r is not None
        return _record(r)


def orphans(repo: Repository) -> list[Record]:
    """Snapshots in a phase whose owner died (a killed snapshotter): for recover."""
    return [r for r in every(repo) if r.phase != "ready" and not pids.alive(r.owner_pid)]
