"""The replica registry's records and the decisions made over them, as pure functions:
health, lag, who creates a missing replica, whether a replica may be removed, who may
take `active`. No etcd here (casfs.replica.registry stores and reads them), so every
rule is tested without a server (tests/replica/test_records.py).

A volume's record (`PREFIX/volumes/VOL`) says how many replicas it wants and who holds
it read/write; each replica's entry (`PREFIX/volumes/VOL/replicas/NODE`) says what that
node holds; each running agent keeps `PREFIX/nodes/NODE` alive on its lease. A node is
*alive* while that key exists: a dead agent's lease expires and takes the key with it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from casfs.errors import Busy, UsageError

OK, WANTED, LEAVING = "ok", "wanted", "leaving"  # an entry's state


@dataclass(frozen=True)
class Active:
    """The node mounting the volume read/write, on the lease of its agent."""

    node: str
    lease: int
    since: float


@dataclass(frozen=True)
class Takeover:
    """`active` taken from a node whose lease had expired (kept in the record for good)."""

    old: str
    new: str
    at: float
    snapshot: int  # the newest snapshot the registry knew of when it happened


@dataclass(frozen=True)
class Volume:
    """PREFIX/volumes/VOL. `retention`: {"last", "hourly", "daily"} (each an int or None) or
    None; `origin`: {"store": the origin store's id, "volume": its name there}."""

    name: str
    factor: int
    kind: str
    origin: dict[str, str]
    retention: dict[str, int | None] | None = None
    active: Active | None = None
    takeovers: tuple[Takeover, ...] = ()
    snapshot_every: float | None = None  # s: the active node's agent snapshots the mount this often

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Volume:
        active = doc.get("active")
        return cls(
            str(doc["name"]),
            int(doc["factor"]),
            str(doc["kind"]),
            dict(doc.get("origin") or {}),
            doc.get("retention"),
            None
            if active is None
            else Active(str(active["node"]), int(active["lease"]), float(active["since"])),
            tuple(Takeover(**t) for t in doc.get("takeovers", ())),
            doc.get("snapshot_every"),
        )


@dataclass(frozen=True)
class Entry:
    """PREFIX/volumes/VOL/replicas/NODE: what NODE's store holds of VOL (snapshot 0 and
    root None: nothing yet). `state`: ok, wanted (asked for by `replica add`, the
    node's agent pulls it) or leaving (`replica rm` took it out of the count; the
    node's agent deletes the local copy, then the entry)."""

    node: str
    store: str
    reach: str  # how the others pull from it: ssh://… or a path
    snapshot: int = 0
    root: str | None = None
    state: str = OK
    seen: float = field(default_factory=time.time)
    lease: int = 0  # its agent's lease when it last wrote this

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Entry:
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


@dataclass(frozen=True)
class Node:
    """PREFIX/nodes/NODE, on its agent's lease: where it is and how much room it has."""

    name: str
    store: str
    reach: str
    free: int
    lease: int
    seen: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Node:
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


def check_factor(k: int) -> int:
    if k < 1:
        raise UsageError(f"a replication factor is at least 1, not {k}")
    return k


# -- what the entries say ------------------------------------------------------------


def newest(entries: list[Entry]) -> Entry | None:
    """The entry holding the newest snapshot (ties: by node name), None if none has any."""
    held = [e for e in entries if e.snapshot > 0 and e.state != LEAVING]
    return max(held, key=lambda e: (e.snapshot, e.node), default=None)  # (a tie breaks the same everywhere)


def lag(entry: Entry, entries: list[Entry]) -> int:
    """How many snapshots `entry` is behind the newest one."""
    top = newest(entries)
    return 0 if top is None else max(0, top.snapshot - entry.snapshot)


def healthy(entry: Entry, entries: list[Entry], alive: set[str]) -> bool:
    """Counted as a replica: its agent alive, in the count, within one snapshot of the
    newest (and holding one, once one exists)."""
    top = newest(entries)
    if entry.state != OK or entry.node not in alive:
        return False
    return top is None or (entry.snapshot > 0 and lag(entry, entries) <= 1)


def source_for(me: str, entries: list[Entry], alive: set[str]) -> Entry | None:
    """Where `me` pulls from: an alive node with a snapshot newer than mine (the newest)."""
    mine = next((e.snapshot for e in entries if e.node == me), 0)
    others = [e for e in entries if e.node != me and e.node in alive and e.state != LEAVING]
    top = newest(others)
    return top if top is not None and top.snapshot > mine else None


def diverged(me: str, n: int, root: str | None, entries: list[Entry]) -> bool:
    """Another node published snapshot `n` with another root: this node's line is not
    the registry's (the first to publish a number holds it; compare-and-swap orders them)."""
    return n > 0 and any(e.node != me and e.snapshot == n and e.root not in (None, root) for e in entries)


def creator(volume: Volume, entries: list[Entry], nodes: list[Node], load: dict[str, int]) -> str | None:
    """The node that creates the next missing replica, if the volume has fewer than its
    factor: among the alive nodes without one, the one holding the fewest replicas
    (`load`: node -> replicas it holds), then the most free space, then by name."""
    counted = [e for e in entries if e.state != LEAVING]
    if len(counted) >= volume.factor:
        return None
    having = {e.node for e in entries}
    free = [n for n in nodes if n.name not in having]
    best = min(free, key=lambda n: (load.get(n.name, 0), -n.free, n.name), default=None)
    return None if best is None else best.name


def removal_refused(volume: Volume, node: str, entries: list[Entry], alive: set[str]) -> str | None:
    """Why NODE's replica may not go (None: it may): K = the factor others must remain,
    each alive, in the count, holding a snapshot at least as new as the newest. The last
    good copy never goes, whatever the factor."""
    gone = next((e for e in entries if e.node == node), None)
    if gone is None:
        return f"{node} holds no replica of {volume.name}"
    if volume.active is not None and volume.active.node == node:
        return f"{node} holds {volume.name} read/write (active)"
    top = newest(entries)
    need = 0 if top is None else top.snapshot
    good = [e for e in entries if e.node != node and e.state == OK and e.node in alive and e.snapshot >= need]
    want = max(volume.factor, 1)
    if len(good) < want:
        return (
            f"removing {node}'s replica of {volume.name} would leave {len(good)} healthy "
            f"(snapshot >= {need}), fewer than {want}"
        )
    return None


def take_active(volume: Volume, node: str, lease: int, alive: set[str], top: int, now: float) -> Volume:
    """The record with `node` holding `active`: at once when nobody does (or node does
    already, on a new lease), refused (Busy) while another node's agent lives, taken
    over, and the takeover recorded, when it does not."""
    held = volume.active
    if held is not None and held.node != node:
        if held.node in alive:
            raise Busy(f"{volume.name} is mounted read/write on {held.node} (active; its lease is alive)")
        volume = replace(volume, takeovers=(*volume.takeovers, Takeover(held.node, node, now, top)))
    return replace(volume, active=Active(node, lease, now))


def keeper(volume: Volume, entries: list[Entry]) -> str | None:
    """The node whose agent applies the volume's retention: the active one, else the one
    holding the newest snapshot (the others follow what it keeps)."""
    if volume.active is not None:
        return volume.active.node
    top = newest(entries)
    return None if top is None else top.node


def release_active(volume: Volume, node: str) -> Volume | None:
    """The record without `active`, if NODE holds it (else None: nothing to change)."""
    if volume.active is None or volume.active.node != node:
        return None
    return replace(volume, active=None)
